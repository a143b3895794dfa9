//! `Composed`: a model held by the core, with what its composition reported.
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffers::shared;
use crate::errors::to_py;
use crate::io_infos::io_infos;
use crate::plan::plan_dict;
use crate::writer::Saved;
use fastseq::Prefixed;

/// A model held by the core (`fastseq::Composed`): decoded once, large weights as ranges of
/// the source files until a session's private copy holds them, the rest as slices of the
/// sources' bytes read into memory the core owns, with its composition's plan, report and
/// origins (a loaded model is a composition of one).
#[pyclass(frozen, module = "fastseq._core")]
pub(crate) struct Composed(pub(crate) fastseq::Composed);

#[pymethods]
impl Composed {
    /// Size of the serialized model in bytes (weights inline).
    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    /// The serialized model.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        // Weights still in their source files are read first (checked against them), then
        // encoded straight into the new object.
        let model = py.detach(|| self.0.encoded()).map_err(to_py)?;
        PyBytes::new_with(py, model.len(), |buf| py.detach(|| model.encode_into(buf)).map_err(to_py))
    }

    /// Writes the model to `path` atomically. `external_data`: True puts tensors of at
    /// least `threshold` bytes in a data file beside it, False keeps them inline, None
    /// decides by size (external above the 2 GB protobuf limit); a model composed with
    /// `link_external` links its sources' data files beside it. `threshold`: None stands for
    /// `LAYOUT.threshold`. Returns what was written.
    #[pyo3(signature = (path, external_data=None, threshold=None))]
    fn save(
        &self,
        py: Python<'_>,
        path: PathBuf,
        external_data: Option<bool>,
        threshold: Option<usize>,
    ) -> PyResult<Saved> {
        let threshold = threshold.unwrap_or(fastseq::LAYOUT.threshold);
        py.detach(|| self.0.save(&path, external_data, threshold)).map(Saved::from).map_err(to_py)
    }

    /// The model's graph alone, serialized (a `GraphProto`).
    fn graph_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        // Weights still in their source files are read first (checked against them).
        let g = py.detach(|| self.0.graph_bytes()).map_err(to_py)?;
        Ok(PyBytes::new(py, &g))
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
        let (model, renamed) = py.detach(|| self.0.with_prefix(prefix, what));
        (Composed(model), renamed)
    }

    /// The first naming rule of `onnx.checker` the model breaks (a name defined twice, read
    /// before it is defined, an undefined graph output), or None: what a rename or a merge
    /// can break in models that pass the checker.
    fn naming_problem(&self, py: Python<'_>) -> Option<String> {
        py.detach(|| self.0.naming_problem())
    }

    /// A copy with values renamed as `mapping` says (old, new): see `rename::rename_values`.
    fn with_renamed(&self, py: Python<'_>, mapping: Vec<(String, String)>) -> PyResult<Composed> {
        py.detach(|| self.0.with_renamed(&mapping)).map(Composed).map_err(to_py)
    }

    /// The model serialized without its initializers of at least `threshold` bytes (None:
    /// `LAYOUT.threshold`).
    #[pyo3(signature = (threshold=None))]
    fn stripped_bytes<'py>(&self, py: Python<'py>, threshold: Option<usize>) -> PyResult<Bound<'py, PyBytes>> {
        let threshold = threshold.unwrap_or(fastseq::LAYOUT.threshold);
        let stripped = py.detach(|| self.0.stripped(threshold));
        PyBytes::new_with(py, stripped.len(), |buf| stripped.encode_into(buf).map_err(to_py))
    }

    /// `stripped` (a transformed copy of `stripped_bytes()`) with this model's weights put back.
    fn with_weights(&self, py: Python<'_>, stripped: Bound<'_, PyBytes>, label: &str) -> PyResult<Composed> {
        let data = shared(&stripped); // not copied
        py.detach(|| self.0.with_weights(data, label)).map(Composed).map_err(to_py)
    }

    /// Raises LoadError naming the file if a source file this model still refers to (weights
    /// left in it, external data kept for `external_data="reuse"`) is no longer the file
    /// loaded. Other sources were read into memory and cannot change. For the runtime to
    /// call before it creates a session.
    fn check_sources(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.0.check_sources()).map_err(to_py)
    }

    /// A copy with `pairs` (key, value) set in its metadata_props: a key keeps its first
    /// position and takes its last value. Nodes and weights are shared, not copied.
    fn with_metadata(&self, py: Python<'_>, pairs: Vec<(String, String)>) -> Composed {
        Composed(py.detach(|| self.0.with_metadata(&pairs)))
    }

    /// The model's metadata_props, as (key, value) pairs in order.
    fn metadata(&self) -> Vec<(String, String)> {
        self.0.metadata()
    }

    /// Inputs, outputs, opsets, counts and sizes. Element types use numpy's spelling
    /// (float32, as `TensorInfo` prints them); dimensions are ints when static, the
    /// parameter's name when symbolic, None when unknown (as `TensorInfo.shape`): `ir_version`,
    /// `producer`, `opsets` ([(domain, version)]), `inputs` and `outputs` ([(name, dtype,
    /// dims)]), `nodes`, `initializers`, `weight_bytes`, `functions`, `encoded_len`.
    #[pyo3(signature = () -> "dict[str, typing.Any]")]
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.0.summary();
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

    /// The plan as the core decided it, as plain data: `form` ("graph" or "chain");
    /// `stages` in graph order, dicts of `label`, `given` (position in the given order),
    /// `inputs` and `outputs` (the stage's own, as :meth:`summary` gives them) and `pruned`;
    /// `edges` in the caller's order, (from, output, to, input, edge index); `inputs`, the
    /// merged model's graph inputs in order, (name, [(stage, input), ...]); `outputs`, its
    /// graph outputs, (name, stage, output); `pruned` (stage labels); `unused_outputs`
    /// ([(stage, output)], in the given order); `adapters` ([(edge index, description)]).
    /// A loaded model is a plan of one stage.
    #[pyo3(signature = () -> "dict[str, typing.Any]")]
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        plan_dict(py, &self.0.composition().plan)
    }

    /// What the composition did besides merging: `pruned` (dict: `stages` (labels),
    /// `nodes`, `initializers`, `inputs`), `deduped_initializers`, `deduped_bytes`,
    /// `adapters` (list of (edge index, description)), `unused_outputs` (list of
    /// (stage index, output name)) and, under onnx.compose's rules, `unproven` (why the
    /// merge cannot vouch that the result passes onnx's checker; empty when it can).
    #[pyo3(signature = () -> "dict[str, typing.Any]")]
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.0.composition();
        let r = &c.report;
        let pruned = PyDict::new(py);
        let label = |k: usize| c.labels.get(k).cloned().unwrap_or_else(|| format!("stage {k}"));
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
        d.set_item("unproven", &r.unproven)?;
        Ok(d)
    }

    /// Where the merged graph came from: a list, per stage, of (label, first node index,
    /// end node index) in the merged graph, and a dict from every renamed value or node
    /// name of the merged graph to (stage index, original name).
    #[pyo3(signature = () -> "tuple[list[tuple[str, int, int]], dict[str, tuple[int, str]]]")]
    #[allow(clippy::type_complexity)]
    fn origins<'py>(&self, py: Python<'py>) -> PyResult<(Vec<(String, usize, usize)>, Bound<'py, PyDict>)> {
        let c = self.0.composition();
        let o = &c.origins;
        // The composition's stages, or those of the stage map of a model written by fastseq.
        let stages = c.stages().into_iter().map(|s| (s.label, s.first, s.end)).collect();
        let names = PyDict::new(py);
        for (new, stage, old) in o.renamed() {
            names.set_item(new, (stage, old))?;
        }
        Ok((stages, names))
    }

    /// Why the rows of a batch run through this model may depend on other rows (see the
    /// core's `merge::rows`): per reason, (top-level node index or None, the node's name in
    /// the merged graph, its op type, the node inside it at fault (a function's or a
    /// branch's) or None, the reason). Empty when every output keeps each row apart.
    #[allow(clippy::type_complexity)]
    fn row_mixing(&self, py: Python<'_>) -> Vec<(Option<usize>, String, String, Option<String>, String)> {
        py.detach(|| self.0.row_findings())
            .into_iter()
            .map(|f| (f.node, f.name, f.op_type, f.inner, f.reason))
            .collect()
    }

    /// The same model with a symbolic batch axis in place of its inputs' fixed first axis
    /// of 1, where the core's analysis proves the rows stay apart: (the new model, []), or
    /// (None, the reasons, as :meth:`row_mixing` gives them).
    #[allow(clippy::type_complexity)]
    fn dynamic_batch(
        &self,
        py: Python<'_>,
    ) -> (Option<Composed>, Vec<(Option<usize>, String, String, Option<String>, String)>) {
        match py.detach(|| self.0.dynamic_batch()) {
            Ok(c) => (Some(Composed(c)), Vec::new()),
            Err(found) => (None, found.into_iter().map(|f| (f.node, f.name, f.op_type, f.inner, f.reason)).collect()),
        }
    }

    /// Every top-level node of the graph, in order: (name, op_type, domain, stage), the
    /// stage an index into :meth:`origins`' stages, -1 for a node the merge inserted between
    /// stages (an adapter) or of a model without stages (loaded, without a stage map that
    /// fits). How a profile attributes ONNX Runtime's kernels to the stages.
    #[pyo3(signature = () -> "list[tuple[str, str, str, int]]")]
    fn nodes(&self, py: Python<'_>) -> Vec<(String, String, String, i64)> {
        py.detach(|| {
            let nodes = self.0.composition().nodes();
            nodes.into_iter().map(|n| (n.name, n.op_type, n.domain, n.stage.map_or(-1, |k| k as i64))).collect()
        })
    }

    /// Why the stage map in the model's metadata was ignored (it does not fit its nodes: the
    /// file was changed after fastseq wrote it), or None.
    #[pyo3(signature = () -> "str | None")]
    fn stage_map_note(&self) -> Option<String> {
        self.0.composition().origins.note.clone()
    }

    /// A copy with the model as fastseq writes it to a file: its stage map in its metadata
    /// (two stages or more; see the core's `merge::stage_map`), for the writes that go
    /// through onnx.save.
    fn for_file(&self, py: Python<'_>) -> Composed {
        Composed(py.detach(|| self.0.for_file()))
    }

    /// Per stage, how many nodes at the start of its range in :meth:`origins` the merge
    /// inserted (adapters on its incoming edges; 0 for a loaded model).
    fn inserted_nodes(&self) -> Vec<usize> {
        self.0.composition().stages().into_iter().map(|s| s.inserted).collect()
    }
}
