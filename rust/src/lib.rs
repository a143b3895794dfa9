//! fastseq: compose ONNX models into one graph in one pass.
//!
//! The core (`model`, `names`, `opset`, `compose`) is plain Rust; the `python` feature adds
//! the PyO3 bindings below, which only convert types and release the GIL around the work.
pub mod assemble;
pub mod compose;
pub mod digest;
pub mod error;
pub mod external;
#[doc(hidden)]
pub mod fuzzing;
pub mod load;
pub mod metadata;
pub mod model;
pub mod names;
pub mod naming;
pub mod node;
pub mod opset;
pub mod plan;
mod pool;
pub mod proto;
pub mod spill;

pub use compose::{compose, compose_graph, Composition, Keep, Options, Report};
pub use plan::{Adapt, Edge};

// Rayon's threads allocate and free side by side; mimalloc made a node-heavy merge about
// 10% faster than glibc's allocator (and 2x before nodes were kept as bytes).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc (v3, see its mimalloc.h) asks for transparent huge pages for its memory. Each
/// first touch of a 2 MB page then zeroes all of it, and on a busy machine the kernel may
/// compact memory to find one: a node-heavy merge (about 10 MB of tables) went from a
/// median of 15 ms to 23 ms, with outliers at 60. This turns that off for mimalloc's own
/// memory only; `MIMALLOC_ALLOW_THP=0` would disable huge pages for the whole process.
pub fn tune_allocator() {
    const MI_OPTION_ALLOW_THP: std::ffi::c_int = 43;
    unsafe extern "C" {
        fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    }
    // SAFETY: sets one integer option; mimalloc reads it on each request for OS memory.
    unsafe { mi_option_set(MI_OPTION_ALLOW_THP, 0) }
}
pub use error::{Error, Kind, Result};

#[cfg(feature = "python")]
mod bindings {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use bytes::Bytes;
    use prost::Message;
    use pyo3::create_exception;
    use pyo3::exceptions::PyException;
    use pyo3::prelude::*;
    use pyo3::types::{PyBool, PyBytes, PyDict};

    use crate::compose::{Origins, Report};
    use crate::load::{self, Source};
    use crate::proto::ModelProto;
    use crate::{external, model, Adapt, Edge, Error, Keep, Kind, Options};

    create_exception!(_core, FastseqError, PyException, "Base class of every fastseq error.");
    create_exception!(_core, LoadError, FastseqError, "A source is not a usable ONNX model.");
    create_exception!(_core, CompositionError, FastseqError, "The models cannot be joined as asked.");
    create_exception!(_core, OpsetMismatchError, CompositionError, "Opset versions of one domain differ.");
    create_exception!(_core, ExportError, FastseqError, "Writing a model failed.");

    fn to_py(e: Error) -> PyErr {
        match e.kind {
            Kind::Load => LoadError::new_err(e.message),
            Kind::Composition => CompositionError::new_err(e.message),
            Kind::Opset => OpsetMismatchError::new_err(e.message),
            Kind::Export => ExportError::new_err(e.message),
        }
    }

    /// The buffer of a Python `bytes` object, shared with the core instead of copied: `bytes`
    /// are immutable and keep their data inside the object, which `_object` keeps alive.
    struct PyBytesOwner {
        ptr: *const u8,
        len: usize,
        _object: Py<PyBytes>,
    }

    // SAFETY: the buffer is immutable and outlives this owner (it holds a reference to the
    // object); PyO3 defers the decref when the owner is dropped on a thread without the GIL.
    unsafe impl Send for PyBytesOwner {}

    impl AsRef<[u8]> for PyBytesOwner {
        fn as_ref(&self) -> &[u8] {
            // SAFETY: see above; ptr and len come from the live object's own buffer.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        }
    }

    /// A model source (see [`crate::load::Source`]): Python `bytes` (shared, not copied), a
    /// path or (path, root folder), or a model the core already holds.
    struct PySource(Source);

    impl<'a, 'py> FromPyObject<'a, 'py> for PySource {
        type Error = PyErr;
        fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
            if let Ok(b) = ob.cast::<PyBytes>() {
                let data = b.as_bytes();
                let owner = PyBytesOwner { ptr: data.as_ptr(), len: data.len(), _object: b.to_owned().unbind() };
                return Ok(PySource(Source::Bytes(Bytes::from_owner(owner))));
            }
            if let Ok(c) = ob.cast::<Composed>() {
                // Nodes and weights are shared slices (reference counts); the rest is copied.
                return Ok(PySource(Source::Model(Box::new(c.get().model.clone()))));
            }
            if let Ok((path, root)) = ob.extract::<(PathBuf, PathBuf)>() {
                return Ok(PySource(Source::Path(path, Some(root))));
            }
            Ok(PySource(Source::Path(ob.extract::<PathBuf>()?, None)))
        }
    }

    /// A model held by the core: decoded once, weights as slices of the sources' bytes (read
    /// into memory the core owns, see `model::read_path`).
    #[pyclass(frozen, module = "fastseq._core")]
    struct Composed {
        model: ModelProto,
        /// External tensors still point at their sources' files (link mode).
        linked: bool,
        /// What the composition pruned, deduplicated and adapted (empty for a loaded model).
        report: Report,
        /// Where the merged graph's nodes and renamed names come from.
        origins: Origins,
        labels: Vec<String>,
    }

    impl Composed {
        fn of(model: ModelProto, linked: bool) -> Composed {
            Composed { model, linked, report: Report::default(), origins: Origins::default(), labels: Vec::new() }
        }

        /// The same pipeline over `model` (its metadata changed, or its bytes spilled): what
        /// the composition reported and where names come from still hold.
        fn with_model(&self, model: ModelProto) -> Composed {
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
            self.model.encoded_len()
        }

        /// The serialized model.
        fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
            if self.linked {
                return Err(to_py(Error::export(
                    "this model refers to its sources' data files (external_data='reuse'): save() it instead",
                )));
            }
            PyBytes::new_with(py, self.model.encoded_len(), |buf| {
                py.detach(|| model::encode_into(&self.model, buf)).map_err(to_py)
            })
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
            let saved =
                py.detach(|| model::save(&self.model, &path, external_data, self.linked, threshold)).map_err(to_py)?;
            let d = PyDict::new(py);
            d.set_item("model_bytes", saved.model_bytes)?;
            d.set_item("data_bytes", saved.data_bytes)?;
            d.set_item("data_file", saved.data_file)?;
            Ok(d)
        }

        /// The model serialized without its initializers of at least `threshold` bytes.
        #[pyo3(signature = (threshold=1024))]
        fn stripped_bytes<'py>(&self, py: Python<'py>, threshold: usize) -> PyResult<Bound<'py, PyBytes>> {
            let stripped = py.detach(|| model::strip_weights(&self.model, threshold));
            PyBytes::new_with(py, stripped.encoded_len(), |buf| model::encode_into(&stripped, buf).map_err(to_py))
        }

        /// `stripped` (a transformed copy of `stripped_bytes()`) with this model's weights put back.
        fn with_weights(&self, py: Python<'_>, stripped: &[u8], label: &str) -> PyResult<Composed> {
            let data = Bytes::copy_from_slice(stripped);
            let model =
                py.detach(|| model::restore_weights(model::decode(label, data)?, &self.model, label)).map_err(to_py)?;
            let mut c = Composed::of(model, self.linked);
            c.labels = self.labels.clone();
            Ok(c)
        }

        /// Raises LoadError naming the file if a source file this model still refers to
        /// (external data kept for `external_data="reuse"`) is no longer the file loaded.
        /// Other sources were read into memory and cannot change. For the runtime to call
        /// before it creates a session.
        fn check_sources(&self, py: Python<'_>) -> PyResult<()> {
            py.detach(|| external::check_sources(&self.model)).map_err(to_py)
        }

        /// A copy with `pairs` (key, value) set in its metadata_props: a key keeps its first
        /// position and takes its last value. Nodes and weights are shared, not copied.
        fn with_metadata(&self, py: Python<'_>, pairs: Vec<(String, String)>) -> Composed {
            self.with_model(py.detach(|| crate::metadata::with_metadata(&self.model, &pairs)))
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
            let s = model::summary(&self.model);
            let d = PyDict::new(py);
            d.set_item("ir_version", s.ir_version)?;
            d.set_item("producer", s.producer)?;
            d.set_item("opsets", s.opsets)?;
            d.set_item("inputs", io_infos(py, s.inputs)?)?;
            d.set_item("outputs", io_infos(py, s.outputs)?)?;
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
            for (k, renamed) in o.values.iter().chain(&o.node_names).enumerate() {
                let stage = k % o.values.len().max(1);
                for (new, old) in renamed.iter() {
                    // A graph input feeding several stages is named after the first.
                    if !names.contains(new)? {
                        names.set_item(new, (stage, old))?;
                    }
                }
            }
            Ok((stages, names))
        }
    }

    /// (name, dtype, dims) with numpy's dtype names and int dimensions where static.
    fn io_infos<'py>(py: Python<'py>, items: Vec<(String, String, Vec<String>)>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        items
            .into_iter()
            .map(|(name, dtype, dims)| {
                let dtype = match dtype.as_str() {
                    "float" => "float32".to_string(),
                    "double" => "float64".to_string(),
                    _ => dtype,
                };
                let dims: Vec<Bound<'py, PyAny>> = dims
                    .into_iter()
                    .map(|d| match d.parse::<i64>() {
                        Ok(v) => v.into_pyobject(py).map(|v| v.into_any()).map_err(PyErr::from),
                        Err(_) if d == "?" => Ok(py.None().into_bound(py)),
                        Err(_) => d.into_pyobject(py).map(|v| v.into_any()).map_err(PyErr::from),
                    })
                    .collect::<PyResult<_>>()?;
                (name, dtype, pyo3::types::PyTuple::new(py, dims)?).into_pyobject(py).map(|t| t.into_any())
            })
            .collect()
    }

    fn keep_outputs(k: Option<Bound<'_, PyAny>>) -> PyResult<Keep> {
        Ok(match k {
            None => Keep::Last,
            Some(k) if k.is_instance_of::<PyBool>() => {
                if k.extract::<bool>()? {
                    Keep::Unconsumed
                } else {
                    Keep::Last
                }
            }
            Some(k) => Keep::Names(k.extract::<Vec<String>>()?),
        })
    }

    fn adapt(a: Option<Bound<'_, PyAny>>) -> PyResult<Adapt> {
        Ok(match a {
            None => Adapt::Off,
            Some(a) if a.is_instance_of::<PyBool>() => {
                if a.extract::<bool>()? {
                    Adapt::All
                } else {
                    Adapt::Off
                }
            }
            Some(a) => Adapt::Edges(a.extract::<Vec<usize>>()?),
        })
    }

    /// Loads and composes the models; every argument but the sources and labels is optional.
    /// `edges`: (from stage, output, to stage, input) tuples, any earlier stage to any later
    /// one (instead of `io_maps`); `graph_inputs`: (exposed name, [(stage, input), ...]);
    /// `graph_outputs`: (exposed name, stage, output). `prune` and `dedupe` default to on in
    /// that graph form and off in the linear one; `adapt`: True, or a list of edge indices.
    #[pyfunction(name = "compose")]
    #[pyo3(signature = (sources, labels, io_maps=None, edges=None, graph_inputs=None, graph_outputs=None,
                        keep_outputs=None, prefixes=None, inputs=None, outputs=None, ir_version=None, meta=None,
                        model_version=None, link_external=false, prune=None, dedupe=None, adapt=None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn compose_models(
        py: Python<'_>,
        sources: Vec<PySource>,
        labels: Vec<String>,
        io_maps: Option<Vec<Vec<(String, String)>>>,
        edges: Option<Vec<(usize, String, usize, String)>>,
        graph_inputs: Option<Vec<(String, Vec<(usize, String)>)>>,
        graph_outputs: Option<Vec<(String, usize, String)>>,
        keep_outputs: Option<Bound<'_, PyAny>>,
        prefixes: Option<Vec<Option<String>>>,
        inputs: Option<Vec<String>>,
        outputs: Option<Vec<String>>,
        ir_version: Option<i64>,
        meta: Option<HashMap<String, String>>,
        model_version: Option<i64>,
        link_external: bool,
        prune: Option<bool>,
        dedupe: Option<bool>,
        adapt: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Composed> {
        if sources.len() != labels.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("one label per source"));
        }
        let meta = meta.unwrap_or_default();
        let opts = Options {
            io_maps,
            edges: edges
                .map(|es| es.into_iter().map(|(from, output, to, input)| Edge { from, output, to, input }).collect()),
            graph_inputs,
            graph_outputs,
            keep_outputs: self::keep_outputs(keep_outputs)?,
            prefixes: prefixes.unwrap_or_default(),
            inputs,
            outputs,
            prune,
            dedupe,
            adapt: self::adapt(adapt)?,
            ir_version,
            graph_name: meta.get("name").cloned(),
            doc_string: meta.get("doc_string").cloned(),
            producer_name: meta.get("producer_name").cloned(),
            producer_version: meta.get("producer_version").cloned(),
            domain: meta.get("domain").cloned(),
            model_version,
        };
        let sources: Vec<Source> = sources.into_iter().map(|s| s.0).collect();
        let composed = py
            .detach(|| {
                let mode = if link_external { external::Mode::Link } else { external::Mode::InPlace };
                load::load_all(sources, &labels, mode).and_then(|ms| crate::compose::compose_graph(ms, &labels, &opts))
            })
            .map_err(to_py)?;
        Ok(Composed {
            model: composed.model,
            linked: link_external,
            report: composed.report,
            origins: composed.origins,
            labels,
        })
    }

    /// Loads one model (external data resolved) without composing it.
    #[pyfunction]
    #[pyo3(signature = (source, label=None))]
    fn load_model(py: Python<'_>, source: PySource, label: Option<String>) -> PyResult<Composed> {
        let source = source.0;
        let label = label.unwrap_or_else(|| source.default_label());
        let model = py.detach(|| load::load(&label, source, external::Mode::InPlace)).map_err(to_py)?;
        let mut c = Composed::of(model, false);
        c.labels = vec![label];
        Ok(c)
    }

    /// Loads several models in parallel (external data resolved), one Composed each: the
    /// stages a pipeline keeps so that it can be composed again without reading its sources.
    #[pyfunction]
    fn load_models(py: Python<'_>, sources: Vec<PySource>, labels: Vec<String>) -> PyResult<Vec<Composed>> {
        if sources.len() != labels.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("one label per source"));
        }
        let sources: Vec<Source> = sources.into_iter().map(|s| s.0).collect();
        let models = py.detach(|| load::load_all(sources, &labels, external::Mode::InPlace)).map_err(to_py)?;
        Ok(models
            .into_iter()
            .zip(labels)
            .map(|(model, label)| {
                let mut c = Composed::of(model, false);
                c.labels = vec![label];
                c
            })
            .collect())
    }

    /// The external-data files that the model at `path` refers to (not opened).
    #[pyfunction]
    fn external_data_locations(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
        py.detach(|| {
            let label = path.display().to_string();
            let mut m = model::decode(&label, model::read_path(&path)?)?;
            Ok(external::locations(&mut m))
        })
        .map_err(to_py)
    }

    /// Raises LoadError unless `location` is a safe relative external-data location.
    #[pyfunction]
    fn check_external_location(location: &str) -> PyResult<()> {
        external::check_relative(location).map_err(to_py)
    }

    /// The XXH3-128 digest of a file's bytes, as hex.
    #[pyfunction]
    fn file_digest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
        py.detach(|| crate::digest::file_digest(&path))
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))
    }

    /// `(digest, bytes mapped, spilled copies or None)`: see `spill::private_copy`.
    #[pyfunction]
    #[pyo3(signature = (models, path, spill_min=None))]
    fn write_private_copy(
        py: Python<'_>,
        models: Vec<PyRef<'_, Composed>>,
        path: PathBuf,
        spill_min: Option<u64>,
    ) -> PyResult<(String, u64, Option<Vec<Composed>>)> {
        let refs: Vec<&ModelProto> = models.iter().map(|c| &c.model).collect();
        let (digest, mapped, copies) =
            py.detach(|| crate::spill::private_copy(&refs, &path, spill_min)).map_err(to_py)?;
        let spilled = copies.map(|copies| models.iter().zip(copies).map(|(c, m)| c.with_model(m)).collect());
        Ok((digest, mapped, spilled))
    }

    /// " (did you mean 'x'?)" for `name` among `candidates`, or "".
    #[pyfunction]
    fn did_you_mean(name: &str, candidates: Vec<String>) -> String {
        crate::names::did_you_mean(name, candidates.iter().map(String::as_str))
    }

    #[pymodule]
    fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
        crate::tune_allocator();
        let py = m.py();
        m.add("FastseqError", py.get_type::<FastseqError>())?;
        m.add("LoadError", py.get_type::<LoadError>())?;
        m.add("CompositionError", py.get_type::<CompositionError>())?;
        m.add("OpsetMismatchError", py.get_type::<OpsetMismatchError>())?;
        m.add("ExportError", py.get_type::<ExportError>())?;
        m.add("MAX_IR_VERSION", model::MAX_IR_VERSION)?;
        m.add("PROTOBUF_LIMIT", model::PROTOBUF_LIMIT)?;
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add_class::<Composed>()?;
        m.add_function(wrap_pyfunction!(compose_models, m)?)?;
        m.add_function(wrap_pyfunction!(load_model, m)?)?;
        m.add_function(wrap_pyfunction!(load_models, m)?)?;
        m.add_function(wrap_pyfunction!(external_data_locations, m)?)?;
        m.add_function(wrap_pyfunction!(did_you_mean, m)?)?;
        m.add_function(wrap_pyfunction!(file_digest, m)?)?;
        m.add_function(wrap_pyfunction!(write_private_copy, m)?)?;
        m.add_function(wrap_pyfunction!(check_external_location, m)?)?;
        Ok(())
    }
}
