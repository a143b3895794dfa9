//! `Composed`: a model held by the core, with what its composition reported.
use std::path::PathBuf;

use bytes::Bytes;
use prost::Message;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::bindings::errors::to_py;
use crate::bindings::io_infos::io_infos;
use crate::bindings::plan::plan_dict;
use crate::codec::model::{decode_without_weights, encode_into, restore_weights, strip_weights};
use crate::codec::node;
use crate::codec::proto::ModelProto;
use crate::codec::range::inline_len;
use crate::codec::summary::summary;
use crate::error::Error;
use crate::merge::compose::Composition;
use crate::merge::metadata::with_metadata;
use crate::merge::onnx_rules::{prefix_names, Prefixed};
use crate::merge::rename::rename_values;
use crate::storage::external::check_sources;
use crate::storage::ranges::inline;
use crate::storage::writer::save;

/// A model held by the core: decoded once, large weights as ranges of the source files until
/// a session's private copy holds them (see `storage::spill`), the rest as slices of the
/// sources' bytes read into memory the core owns (see `storage::read`), with its
/// composition's plan, report and origins (a loaded model is a composition of one).
#[pyclass(frozen, module = "fastseq._core")]
pub(crate) struct Composed {
    pub(crate) composition: Composition,
    /// External tensors still point at their sources' files (link mode).
    pub(crate) linked: bool,
}

impl Composed {
    /// The same pipeline over `model` (its metadata changed, or its bytes spilled): its
    /// plan, what the composition reported and where names come from still hold.
    pub(crate) fn with_model(&self, model: ModelProto) -> Composed {
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
}

impl Drop for Composed {
    /// Freeing a model (tens of thousands of nodes, the sources' buffers) happens on
    /// a worker thread, off the caller's path.
    fn drop(&mut self) {
        let composition = std::mem::take(&mut self.composition);
        crate::pool::spawn(move || drop(composition));
    }
}

#[pymethods]
impl Composed {
    /// Size of the serialized model in bytes (weights inline).
    fn encoded_len(&self) -> usize {
        inline_len(&self.composition.model)
    }

    /// The serialized model.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if self.linked {
            return Err(to_py(Error::export(
                "this model refers to its sources' data files (external_data='reuse'): save() it instead",
            )));
        }
        // Weights still in their source files are read first (checked against them).
        let model = py.detach(|| inline(&self.composition.model)).map_err(to_py)?;
        PyBytes::new_with(py, model.encoded_len(), |buf| py.detach(|| encode_into(&model, buf)).map_err(to_py))
    }

    /// Writes the model to `path` atomically. `external_data`: True puts tensors of at
    /// least `threshold` bytes in a data file beside it, False keeps them inline, None
    /// decides by size (external above the 2 GB protobuf limit); a model composed with
    /// `link_external` links its sources' data files beside it. Returns a dict with
    /// the bytes written and the data file's name.
    #[pyo3(signature = (path, external_data=None, threshold=1024))]
    fn save<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        external_data: Option<bool>,
        threshold: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let saved = py
            .detach(|| save(&self.composition.for_file(), &path, external_data, self.linked, threshold))
            .map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("model_bytes", saved.model_bytes)?;
        d.set_item("data_bytes", saved.data_bytes)?;
        d.set_item("data_file", saved.data_files.into_iter().next())?;
        Ok(d)
    }

    /// The model's graph alone, serialized (a `GraphProto`).
    fn graph_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        // Weights still in their source files are read first (checked against them).
        let g = py
            .detach(|| inline(&self.composition.model).map(|m| m.graph.clone().unwrap_or_default()))
            .map_err(to_py)?;
        Ok(PyBytes::new(py, &py.detach(|| g.encode_to_vec())))
    }

    /// A copy with the names `onnx.compose.add_prefix` would prefix prefixed (its flags),
    /// every reference renamed in every scope, and the value names renamed as (old, new).
    #[pyo3(signature = (prefix, nodes=true, edges=true, inputs=true, outputs=true, initializers=true,
                        value_infos=true, functions=true))]
    #[allow(clippy::too_many_arguments)]
    fn with_prefix(
        &self,
        py: Python<'_>,
        prefix: &str,
        nodes: bool,
        edges: bool,
        inputs: bool,
        outputs: bool,
        initializers: bool,
        value_infos: bool,
        functions: bool,
    ) -> (Composed, Vec<(String, String)>) {
        let what = Prefixed { nodes, edges, inputs, outputs, initializers, value_infos, functions };
        let (model, renamed) = py.detach(|| {
            let mut model = self.composition.model.clone();
            let renamed = prefix_names(&mut model, prefix, what);
            (model, renamed)
        });
        (self.with_model(model), renamed)
    }

    /// A copy with values renamed as `mapping` says (old, new): see `rename::rename_values`.
    fn with_renamed(&self, py: Python<'_>, mapping: Vec<(String, String)>) -> PyResult<Composed> {
        let model = py
            .detach(|| {
                let mut model = self.composition.model.clone();
                rename_values(&mut model, &mapping).map(|()| model)
            })
            .map_err(to_py)?;
        Ok(self.with_model(model))
    }

    /// The model serialized without its initializers of at least `threshold` bytes.
    #[pyo3(signature = (threshold=1024))]
    fn stripped_bytes<'py>(&self, py: Python<'py>, threshold: usize) -> PyResult<Bound<'py, PyBytes>> {
        let stripped = py.detach(|| strip_weights(&self.composition.model, threshold));
        PyBytes::new_with(py, stripped.encoded_len(), |buf| encode_into(&stripped, buf).map_err(to_py))
    }

    /// `stripped` (a transformed copy of `stripped_bytes()`) with this model's weights put back.
    fn with_weights(&self, py: Python<'_>, stripped: &[u8], label: &str) -> PyResult<Composed> {
        let data = Bytes::copy_from_slice(stripped);
        let model = py
            .detach(|| restore_weights(decode_without_weights(label, data)?, &self.composition.model, label))
            .map_err(to_py)?;
        let label = self.composition.labels.first().map_or(label, String::as_str);
        Ok(Composed { composition: Composition::single(model, label), linked: self.linked })
    }

    /// Raises LoadError naming the file if a source file this model still refers to (weights
    /// left in it, external data kept for `external_data="reuse"`) is no longer the file
    /// loaded. Other sources were read into memory and cannot change. For the runtime to
    /// call before it creates a session.
    fn check_sources(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| check_sources(&self.composition.model)).map_err(to_py)
    }

    /// A copy with `pairs` (key, value) set in its metadata_props: a key keeps its first
    /// position and takes its last value. Nodes and weights are shared, not copied.
    fn with_metadata(&self, py: Python<'_>, pairs: Vec<(String, String)>) -> Composed {
        self.with_model(py.detach(|| with_metadata(&self.composition.model, &pairs)))
    }

    /// The model's metadata_props, as (key, value) pairs in order.
    fn metadata(&self) -> Vec<(String, String)> {
        let text = |s: &Option<String>| s.clone().unwrap_or_default();
        self.composition.model.metadata_props.iter().map(|p| (text(&p.key), text(&p.value))).collect()
    }

    /// Inputs, outputs, opsets, counts and sizes. Element types use numpy's spelling
    /// (float32, as `TensorInfo` prints them); dimensions are ints when static, the
    /// parameter's name when symbolic, None when unknown (as `TensorInfo.shape`).
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = summary(&self.composition.model);
        let d = PyDict::new(py);
        d.set_item("ir_version", s.ir_version)?;
        d.set_item("producer", s.producer)?;
        d.set_item("opsets", s.opsets)?;
        d.set_item("inputs", io_infos(py, &s.inputs)?)?;
        d.set_item("outputs", io_infos(py, &s.outputs)?)?;
        d.set_item("nodes", s.nodes)?;
        d.set_item("initializers", s.initializers)?;
        d.set_item("weight_bytes", s.weight_bytes)?;
        d.set_item("functions", s.functions)?;
        d.set_item("encoded_len", s.encoded_len)?;
        Ok(d)
    }

    /// The plan as the core decided it, as plain data (see `bindings::plan::plan_dict`).
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        plan_dict(py, &self.composition.plan)
    }

    /// What the composition did besides merging: `pruned` (dict: `stages` (labels),
    /// `nodes`, `initializers`, `inputs`), `deduped_initializers`, `deduped_bytes`,
    /// `adapters` (list of (edge index, description)) and `unused_outputs` (list of
    /// (stage index, output name)).
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = &self.composition.report;
        let pruned = PyDict::new(py);
        let label = |k: usize| self.composition.labels.get(k).cloned().unwrap_or_else(|| format!("stage {k}"));
        pruned.set_item("stages", r.pruned.stages.iter().map(|&k| label(k)).collect::<Vec<_>>())?;
        pruned.set_item("nodes", r.pruned.nodes)?;
        pruned.set_item("initializers", r.pruned.initializers)?;
        pruned.set_item("inputs", &r.pruned.inputs)?;
        let d = PyDict::new(py);
        d.set_item("pruned", pruned)?;
        d.set_item("deduped_initializers", r.deduped.initializers)?;
        d.set_item("deduped_bytes", r.deduped.bytes)?;
        d.set_item("adapters", &r.adapters)?;
        d.set_item("unused_outputs", &r.unused_outputs)?;
        Ok(d)
    }

    /// Where the merged graph came from: a list, per stage, of (label, first node index,
    /// end node index) in the merged graph, and a dict from every renamed value or node
    /// name of the merged graph to (stage index, original name).
    #[allow(clippy::type_complexity)]
    fn origins<'py>(&self, py: Python<'py>) -> PyResult<(Vec<(String, usize, usize)>, Bound<'py, PyDict>)> {
        let o = &self.composition.origins;
        let stages = self.composition.stages().into_iter().map(|s| (s.label, s.first, s.end)).collect();
        let names = PyDict::new(py);
        for (new, stage, old) in o.renamed() {
            names.set_item(new, (stage, old))?;
        }
        Ok((stages, names))
    }

    /// Every top-level node of the graph, in order: (name, op_type, domain, stage), the
    /// stage an index into :meth:`origins`' stages, -1 for a node the merge inserted
    /// between stages (an adapter) or a model without stages (loaded, without a stage map
    /// that fits).
    fn nodes(&self, py: Python<'_>) -> Vec<(String, String, String, i64)> {
        let c = &self.composition;
        py.detach(|| {
            let g = c.model.graph.as_ref();
            let count = g.map_or(0, |g| g.node.len());
            let mut stage = vec![-1i64; count];
            for (k, s) in c.stages().iter().enumerate() {
                let first = (s.first + s.inserted).min(s.end);
                for x in stage.iter_mut().take(s.end.min(count)).skip(first) {
                    *x = k as i64;
                }
            }
            g.map(|g| {
                g.node
                    .iter()
                    .zip(stage)
                    .map(|(raw, k)| {
                        let (name, op, domain) = node::head(raw);
                        (name.to_string(), op.to_string(), domain.to_string(), k)
                    })
                    .collect()
            })
            .unwrap_or_default()
        })
    }

    /// Why the stage map in the model's metadata was ignored (it does not fit its nodes: the
    /// file was changed after fastseq wrote it), or None.
    fn stage_map_note(&self) -> Option<String> {
        self.composition.origins.note.clone()
    }

    /// A copy with the model as fastseq writes it to a file: its stage map in its metadata
    /// (see `merge::stage_map`), for the writes that go through onnx.save.
    fn for_file(&self, py: Python<'_>) -> Composed {
        self.with_model(py.detach(|| self.composition.for_file().into_owned()))
    }

    /// Per stage, how many nodes at the start of its range in :meth:`origins` the merge
    /// inserted (adapters on its incoming edges; 0 for a loaded model).
    fn inserted_nodes(&self) -> Vec<usize> {
        let o = &self.composition.origins;
        (0..o.nodes.len()).map(|k| o.inserted.get(k).copied().unwrap_or(0)).collect()
    }
}
