//! A model held by the core, as a pipeline holds it: decoded once, its large weights ranges
//! of the source files until a session's private copy holds them (see `storage::spill`),
//! the rest slices of the sources' bytes read into memory the core owns, with what its
//! composition decided (plan, report, origins). A loaded model is a composition of one.
use bytes::Bytes;

use crate::codec::graph::graph;
use crate::codec::model::{decode_without_weights, restore_weights};
use crate::codec::proto::ModelProto;
use crate::codec::range::inline_len;
use crate::codec::summary::{summary, Summary};
use crate::error::Result;
use crate::merge::compose::Composition;
use crate::merge::metadata::with_metadata;
use crate::merge::onnx_rules::{overlapping_names, prefix_names, Prefixed};
use crate::merge::rename::rename_values;
use crate::merge::rows::{dynamic_batch, row_findings, Finding};
use crate::storage::external::check_sources;

/// See the module's notes.
#[derive(Debug, Default)]
pub struct Composed {
    composition: Composition,
    /// External tensors still point at their sources' files (loaded with `Mode::Link`).
    linked: bool,
}

impl Composed {
    /// `composition`'s model held; `linked` when its external tensors point at their
    /// sources' files.
    pub fn new(composition: Composition, linked: bool) -> Composed {
        Composed { composition, linked }
    }

    /// One model on its own (see [`Composition::single`]).
    pub fn single(model: ModelProto, label: &str, linked: bool) -> Composed {
        Composed::new(Composition::single(model, label), linked)
    }

    pub fn model(&self) -> &ModelProto {
        &self.composition.model
    }

    /// The plan, report, origins and stage labels of the composition.
    pub fn composition(&self) -> &Composition {
        &self.composition
    }

    /// Whether external tensors still point at the sources' files (they are linked, not
    /// copied, when it is saved; it has no bytes of its own).
    pub fn is_linked(&self) -> bool {
        self.linked
    }

    /// The same pipeline over `model` (its metadata changed, or its bytes spilled): its
    /// plan, what the composition reported and where names come from still hold.
    pub fn with_model(&self, model: ModelProto) -> Composed {
        let c = &self.composition;
        let composition = Composition {
            model,
            labels: c.labels.clone(),
            plan: c.plan.clone(),
            report: c.report.clone(),
            origins: c.origins.clone(),
        };
        Composed { composition, linked: self.linked }
    }

    /// Size of the serialized model in bytes (weights inline).
    pub fn encoded_len(&self) -> usize {
        inline_len(self.model())
    }

    /// A copy with the names `onnx.compose.add_prefix` would prefix prefixed (`what`), every
    /// reference renamed in every scope, and the value names renamed, (old, new).
    pub fn with_prefix(&self, prefix: &str, what: Prefixed) -> (Composed, Vec<(String, String)>) {
        let mut model = self.model().clone();
        let renamed = prefix_names(&mut model, prefix, what);
        (self.with_model(model), renamed)
    }

    /// A copy with values renamed as `mapping` says, (old, new): see `rename::rename_values`.
    pub fn with_renamed(&self, mapping: &[(String, String)]) -> Result<Composed> {
        let mut model = self.model().clone();
        rename_values(&mut model, mapping)?;
        Ok(self.with_model(model))
    }

    /// A copy with `pairs` (key, value) set in its metadata_props (see `metadata::merged`).
    /// Nodes and weights are shared, not copied.
    pub fn with_metadata(&self, pairs: &[(String, String)]) -> Composed {
        self.with_model(with_metadata(self.model(), pairs))
    }

    /// The model's metadata_props, as (key, value) pairs in order.
    pub fn metadata(&self) -> Vec<(String, String)> {
        let text = |s: &Option<String>| s.clone().unwrap_or_default();
        self.model().metadata_props.iter().map(|p| (text(&p.key), text(&p.value))).collect()
    }

    /// `stripped` (the bytes of a transformed `Composed::stripped`) with this model's
    /// weights put back, by initializer name: nothing is copied.
    pub fn with_weights(&self, stripped: Bytes, label: &str) -> Result<Composed> {
        let model = restore_weights(decode_without_weights(label, stripped)?, self.model(), label)?;
        let label = self.composition.labels.first().map_or(label, String::as_str);
        Ok(Composed::single(model, label, self.linked))
    }

    /// Inputs, outputs, opsets, counts and sizes.
    pub fn summary(&self) -> Summary {
        summary(self.model())
    }

    /// Why the rows of a batch run through this model may depend on other rows (see
    /// [`crate::merge::rows`]): empty when every output keeps each row apart.
    pub fn row_findings(&self) -> Vec<Finding> {
        row_findings(self.model())
    }

    /// The same pipeline with a symbolic batch axis where its inputs' first axis is a fixed
    /// 1 (a batch-1 export; see [`crate::merge::rows::dynamic_batch`]), or why not. Only
    /// constants and value infos change: the nodes keep their places, so origins still hold.
    pub fn dynamic_batch(&self) -> std::result::Result<Composed, Vec<Finding>> {
        dynamic_batch(self.model()).map(|m| self.with_model(m))
    }

    /// A load error naming the file if a source file this model still refers to (weights
    /// left in it, external data kept for linking) is no longer the file loaded. Other
    /// sources were read into memory and cannot change.
    pub fn check_sources(&self) -> Result<()> {
        check_sources(self.model())
    }

    /// The names this model and `other` both define, by kind, as
    /// `onnx.compose.check_overlapping_names` lists them (`io_map_inputs`: inputs of
    /// `other` that an io_map feeds, which may overlap).
    pub fn overlapping_names(&self, other: &Composed, io_map_inputs: &[String]) -> Vec<(&'static str, Vec<String>)> {
        overlapping_names(graph(self.model()), graph(other.model()), io_map_inputs)
    }

    /// The first naming rule of onnx.checker that the model breaks (see
    /// `codec::structure`), or `None`.
    pub fn naming_problem(&self) -> Option<String> {
        crate::codec::structure::naming_problem(self.model())
    }
}

impl Drop for Composed {
    /// Freeing a model (tens of thousands of nodes, the sources' buffers) happens on a
    /// worker thread, off the caller's path.
    fn drop(&mut self) {
        let composition = std::mem::take(&mut self.composition);
        crate::pool::spawn(move || drop(composition));
    }
}
