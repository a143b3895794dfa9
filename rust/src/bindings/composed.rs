//! `Composed`: a model held by the core, with what its composition reported.
use std::path::PathBuf;

use bytes::Bytes;
use prost::Message;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::bindings::errors::to_py;
use crate::codec::model::{decode, encode_into, restore_weights, strip_weights};
use crate::codec::proto::ModelProto;
use crate::codec::range::inline_len;
use crate::codec::summary::{summary, DimInfo, IoInfo};
use crate::error::Error;
use crate::merge::compose::{Origins, Report};
use crate::merge::metadata::with_metadata;
use crate::storage::external::check_sources;
use crate::storage::ranges::inline;
use crate::storage::writer::save;

/// A model held by the core: decoded once, large weights as ranges of the source files until
/// a session's private copy holds them (see `storage::spill`), the rest as slices of the
/// sources' bytes read into memory the core owns (see `storage::read`).
#[pyclass(frozen, module = "fastseq._core")]
pub(crate) struct Composed {
    pub(crate) model: ModelProto,
    /// External tensors still point at their sources' files (link mode).
    pub(crate) linked: bool,
    /// What the composition pruned, deduplicated and adapted (empty for a loaded model).
    pub(crate) report: Report,
    /// Where the merged graph's nodes and renamed names come from.
    pub(crate) origins: Origins,
    pub(crate) labels: Vec<String>,
}

impl Composed {
    pub(crate) fn of(model: ModelProto, linked: bool) -> Composed {
        Composed { model, linked, report: Report::default(), origins: Origins::default(), labels: Vec::new() }
    }

    /// The same pipeline over `model` (its metadata changed, or its bytes spilled): what
    /// the composition reported and where names come from still hold.
    pub(crate) fn with_model(&self, model: ModelProto) -> Composed {
        Composed {
            model,
            linked: self.linked,
            report: self.report.clone(),
            origins: self.origins.clone(),
            labels: self.labels.clone(),
        }
    }
}

impl Drop for Composed {
    /// Freeing a model (tens of thousands of nodes, the sources' buffers) happens on
    /// a worker thread, off the caller's path.
    fn drop(&mut self) {
        let model = std::mem::take(&mut self.model);
        let origins = std::mem::take(&mut self.origins);
        crate::pool::spawn(move || drop((model, origins)));
    }
}

#[pymethods]
impl Composed {
    /// Size of the serialized model in bytes (weights inline).
    fn encoded_len(&self) -> usize {
        inline_len(&self.model)
    }

    /// The serialized model.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if self.linked {
            return Err(to_py(Error::export(
                "this model refers to its sources' data files (external_data='reuse'): save() it instead",
            )));
        }
        // Weights still in their source files are read first (checked against them).
        let model = py.detach(|| inline(&self.model)).map_err(to_py)?;
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
        let saved = py.detach(|| save(&self.model, &path, external_data, self.linked, threshold)).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("model_bytes", saved.model_bytes)?;
        d.set_item("data_bytes", saved.data_bytes)?;
        d.set_item("data_file", saved.data_file)?;
        Ok(d)
    }

    /// The model serialized without its initializers of at least `threshold` bytes.
    #[pyo3(signature = (threshold=1024))]
    fn stripped_bytes<'py>(&self, py: Python<'py>, threshold: usize) -> PyResult<Bound<'py, PyBytes>> {
        let stripped = py.detach(|| strip_weights(&self.model, threshold));
        PyBytes::new_with(py, stripped.encoded_len(), |buf| encode_into(&stripped, buf).map_err(to_py))
    }

    /// `stripped` (a transformed copy of `stripped_bytes()`) with this model's weights put back.
    fn with_weights(&self, py: Python<'_>, stripped: &[u8], label: &str) -> PyResult<Composed> {
        let data = Bytes::copy_from_slice(stripped);
        let model = py.detach(|| restore_weights(decode(label, data)?, &self.model, label)).map_err(to_py)?;
        let mut c = Composed::of(model, self.linked);
        c.labels = self.labels.clone();
        Ok(c)
    }

    /// Raises LoadError naming the file if a source file this model still refers to (weights
    /// left in it, external data kept for `external_data="reuse"`) is no longer the file
    /// loaded. Other sources were read into memory and cannot change. For the runtime to
    /// call before it creates a session.
    fn check_sources(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| check_sources(&self.model)).map_err(to_py)
    }

    /// A copy with `pairs` (key, value) set in its metadata_props: a key keeps its first
    /// position and takes its last value. Nodes and weights are shared, not copied.
    fn with_metadata(&self, py: Python<'_>, pairs: Vec<(String, String)>) -> Composed {
        self.with_model(py.detach(|| with_metadata(&self.model, &pairs)))
    }

    /// The model's metadata_props, as (key, value) pairs in order.
    fn metadata(&self) -> Vec<(String, String)> {
        let text = |s: &Option<String>| s.clone().unwrap_or_default();
        self.model.metadata_props.iter().map(|p| (text(&p.key), text(&p.value))).collect()
    }

    /// Inputs, outputs, opsets, counts and sizes. Element types use numpy's spelling
    /// (float32, as `TensorInfo` prints them); dimensions are ints when static, the
    /// parameter's name when symbolic, None when unknown (as `TensorInfo.shape`).
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = summary(&self.model);
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

    /// What the composition did besides merging: `pruned` (dict: `stages` (labels),
    /// `nodes`, `initializers`, `inputs`), `deduped_initializers`, `deduped_bytes`,
    /// `adapters` (list of (edge index, description)) and `unused_outputs` (list of
    /// (stage index, output name)).
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = &self.report;
        let pruned = PyDict::new(py);
        let label = |k: usize| self.labels.get(k).cloned().unwrap_or_else(|| format!("stage {k}"));
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
        let o = &self.origins;
        let stages = o
            .nodes
            .iter()
            .enumerate()
            .map(|(k, &(a, b))| (self.labels.get(k).cloned().unwrap_or_default(), a, b))
            .collect();
        let names = PyDict::new(py);
        for (new, stage, old) in o.renamed() {
            names.set_item(new, (stage, old))?;
        }
        Ok((stages, names))
    }
}

/// (name, dtype, dims) tuples: dims are ints when static, the parameter's name when
/// symbolic, None when unknown.
pub(crate) fn io_infos<'py>(py: Python<'py>, items: &[IoInfo]) -> PyResult<Vec<Bound<'py, PyAny>>> {
    items
        .iter()
        .map(|io| (io.name.as_str(), io.dtype.as_str(), dims(py, &io.dims)?).into_pyobject(py).map(|t| t.into_any()))
        .collect()
}

/// Dims as a tuple of int, str or None.
pub(crate) fn dims<'py>(py: Python<'py>, dims: &[DimInfo]) -> PyResult<Bound<'py, PyTuple>> {
    let items: Vec<Bound<'py, PyAny>> = dims
        .iter()
        .map(|d| match d {
            DimInfo::Static(v) => v.into_pyobject(py).map(|v| v.into_any()).map_err(PyErr::from),
            DimInfo::Symbolic(p) => p.into_pyobject(py).map(|v| v.into_any()).map_err(PyErr::from),
            DimInfo::Unknown => Ok(py.None().into_bound(py)),
        })
        .collect::<PyResult<_>>()?;
    PyTuple::new(py, items)
}
