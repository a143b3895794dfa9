//! fastseq: compose ONNX models into one graph in one pass.
//!
//! The core (`model`, `names`, `opset`, `compose`) is plain Rust; the `python` feature adds
//! the PyO3 bindings below, which only convert types and release the GIL around the work.
pub mod compose;
pub mod error;
pub mod external;
#[doc(hidden)]
pub mod fuzzing;
pub mod model;
pub mod names;
pub mod node;
pub mod opset;
mod pool;
pub mod proto;

pub use compose::{compose, Keep, Options};

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

    use crate::proto::ModelProto;
    use crate::{external, model, Error, Keep, Kind, Options};

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

    /// A model source: serialized bytes (shared with Python, not copied), a path (mmapped,
    /// external data resolved in place beside it) or a model the core already holds.
    enum Source {
        Bytes(Bytes),
        /// A model file, and the folder its external data may resolve into (default: the
        /// file's own folder; a Hub cache's repo folder, whose files are links into blobs/).
        Path(PathBuf, Option<PathBuf>),
        Model(Box<ModelProto>),
    }

    impl<'a, 'py> FromPyObject<'a, 'py> for Source {
        type Error = PyErr;
        fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
            if let Ok(b) = ob.cast::<PyBytes>() {
                let data = b.as_bytes();
                let owner = PyBytesOwner { ptr: data.as_ptr(), len: data.len(), _object: b.to_owned().unbind() };
                return Ok(Source::Bytes(Bytes::from_owner(owner)));
            }
            if let Ok(c) = ob.cast::<Composed>() {
                // Nodes and weights are shared slices (reference counts); the rest is copied.
                return Ok(Source::Model(Box::new(c.get().model.clone())));
            }
            if let Ok((path, root)) = ob.extract::<(PathBuf, PathBuf)>() {
                return Ok(Source::Path(path, Some(root)));
            }
            Ok(Source::Path(ob.extract::<PathBuf>()?, None))
        }
    }

    fn load(label: &str, src: Source, mode: external::Mode) -> crate::Result<ModelProto> {
        match src {
            Source::Model(m) => Ok(*m),
            Source::Bytes(b) => {
                let mut m = model::decode(label, b)?;
                if external::has_external(&mut m) {
                    return Err(Error::load(format!(
                        "{label}: the model keeps its weights in external data files; pass it as a path \
                         so that they can be found beside it"
                    )));
                }
                Ok(m)
            }
            Source::Path(p, root) => {
                let data = model::read_path(&p)?;
                let mut m = model::decode(label, data)?;
                let base = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
                external::resolve(&mut m, base, root.as_deref().unwrap_or(base), label, mode)?;
                Ok(m)
            }
        }
    }

    fn load_all(sources: Vec<Source>, labels: &[String], mode: external::Mode) -> crate::Result<Vec<ModelProto>> {
        use rayon::prelude::*;
        crate::pool::install(|| sources.into_par_iter().zip(labels.par_iter()).map(|(s, l)| load(l, s, mode)).collect())
    }

    /// A model held by the core: decoded once, weights as slices of the sources' bytes.
    #[pyclass(frozen, module = "fastseq._core")]
    struct Composed {
        model: ModelProto,
        /// External tensors still point at their sources' files (link mode).
        linked: bool,
    }

    impl Drop for Composed {
        /// Freeing a model (tens of thousands of nodes, the sources' buffers) happens on
        /// a worker thread, off the caller's path.
        fn drop(&mut self) {
            let model = std::mem::take(&mut self.model);
            crate::pool::spawn(move || drop(model));
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
            Ok(Composed { model, linked: self.linked })
        }

        /// Raises LoadError naming the file if a source file this model still refers to
        /// (external data kept for `external_data="reuse"`) is no longer the file loaded.
        /// Other sources were read into memory and cannot change. For the runtime to call
        /// before it creates a session.
        fn check_sources(&self, py: Python<'_>) -> PyResult<()> {
            py.detach(|| external::check_sources(&self.model)).map_err(to_py)
        }

        /// Inputs, outputs, opsets, counts and sizes.
        fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let s = model::summary(&self.model);
            let d = PyDict::new(py);
            d.set_item("ir_version", s.ir_version)?;
            d.set_item("producer", s.producer)?;
            d.set_item("opsets", s.opsets)?;
            d.set_item("inputs", s.inputs)?;
            d.set_item("outputs", s.outputs)?;
            d.set_item("nodes", s.nodes)?;
            d.set_item("initializers", s.initializers)?;
            d.set_item("weight_bytes", s.weight_bytes)?;
            d.set_item("functions", s.functions)?;
            d.set_item("encoded_len", s.encoded_len)?;
            Ok(d)
        }
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

    /// Loads and composes the models; every argument but the sources is optional.
    #[pyfunction(name = "compose")]
    #[pyo3(signature = (sources, labels, io_maps=None, keep_outputs=None, prefixes=None, inputs=None,
                        outputs=None, ir_version=None, meta=None, model_version=None, link_external=false))]
    #[allow(clippy::too_many_arguments)]
    fn compose_models(
        py: Python<'_>,
        sources: Vec<Source>,
        labels: Vec<String>,
        io_maps: Option<Vec<Vec<(String, String)>>>,
        keep_outputs: Option<Bound<'_, PyAny>>,
        prefixes: Option<Vec<Option<String>>>,
        inputs: Option<Vec<String>>,
        outputs: Option<Vec<String>>,
        ir_version: Option<i64>,
        meta: Option<HashMap<String, String>>,
        model_version: Option<i64>,
        link_external: bool,
    ) -> PyResult<Composed> {
        if sources.len() != labels.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("one label per source"));
        }
        let meta = meta.unwrap_or_default();
        let opts = Options {
            io_maps,
            keep_outputs: self::keep_outputs(keep_outputs)?,
            prefixes: prefixes.unwrap_or_default(),
            inputs,
            outputs,
            ir_version,
            graph_name: meta.get("name").cloned(),
            doc_string: meta.get("doc_string").cloned(),
            producer_name: meta.get("producer_name").cloned(),
            producer_version: meta.get("producer_version").cloned(),
            domain: meta.get("domain").cloned(),
            model_version,
        };
        let model = py
            .detach(|| {
                let mode = if link_external { external::Mode::Link } else { external::Mode::InPlace };
                load_all(sources, &labels, mode).and_then(|ms| crate::compose::compose(ms, &labels, &opts))
            })
            .map_err(to_py)?;
        Ok(Composed { model, linked: link_external })
    }

    /// Loads one model (external data resolved) without composing it.
    #[pyfunction]
    #[pyo3(signature = (source, label=None))]
    fn load_model(py: Python<'_>, source: Source, label: Option<String>) -> PyResult<Composed> {
        let label = label.unwrap_or_else(|| match &source {
            Source::Path(p, _) => p.display().to_string(),
            Source::Bytes(_) | Source::Model(_) => "model".to_string(),
        });
        let model = py.detach(|| load(&label, source, external::Mode::InPlace)).map_err(to_py)?;
        Ok(Composed { model, linked: false })
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
        m.add_function(wrap_pyfunction!(external_data_locations, m)?)?;
        m.add_function(wrap_pyfunction!(did_you_mean, m)?)?;
        m.add_function(wrap_pyfunction!(check_external_location, m)?)?;
        Ok(())
    }
}
