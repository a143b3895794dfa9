//! fastseq: compose ONNX models into one graph in one pass.
//!
//! The core (`model`, `names`, `opset`, `compose`) is plain Rust; the `python` feature adds
//! the PyO3 bindings below, which only convert types and release the GIL around the work.
pub mod compose;
pub mod error;
pub mod model;
pub mod names;
pub mod opset;
pub mod proto;

pub use compose::{compose, Keep, Options};
pub use error::{Error, Kind, Result};

#[cfg(feature = "python")]
mod bindings {
    use std::path::PathBuf;

    use bytes::Bytes;
    use prost::Message;
    use pyo3::create_exception;
    use pyo3::exceptions::PyException;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;

    use crate::{compose, model, Error, Keep, Kind, Options};

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

    /// A model source: serialized bytes (copied once, under the GIL) or a path (mmapped).
    enum Source {
        Bytes(Bytes),
        Path(PathBuf),
    }

    impl<'a, 'py> FromPyObject<'a, 'py> for Source {
        type Error = PyErr;
        fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
            if let Ok(b) = ob.cast::<PyBytes>() {
                return Ok(Source::Bytes(Bytes::copy_from_slice(b.as_bytes())));
            }
            Ok(Source::Path(ob.extract::<PathBuf>()?))
        }
    }

    fn load(label: &str, src: Source) -> crate::Result<crate::proto::ModelProto> {
        let data = match src {
            Source::Bytes(b) => b,
            Source::Path(p) => model::read_path(&p).map_err(|e| Error::load(format!("{label}: {}", e.message)))?,
        };
        model::decode(label, data)
    }

    fn load_all(sources: Vec<Source>, labels: &[String]) -> crate::Result<Vec<crate::proto::ModelProto>> {
        use rayon::prelude::*;
        sources
            .into_par_iter()
            .zip(labels.par_iter())
            .map(|(s, l)| load(l, s))
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn options(
        io_maps: Option<Vec<Vec<(String, String)>>>,
        keep_outputs: Option<Bound<'_, PyAny>>,
        prefixes: Option<Vec<Option<String>>>,
        inputs: Option<Vec<String>>,
        outputs: Option<Vec<String>>,
        ir_version: Option<i64>,
        meta: Option<std::collections::HashMap<String, String>>,
        model_version: Option<i64>,
    ) -> PyResult<Options> {
        let keep_outputs = match keep_outputs {
            None => Keep::Last,
            Some(k) if k.is_instance_of::<pyo3::types::PyBool>() => {
                if k.extract::<bool>()? {
                    Keep::Unconsumed
                } else {
                    Keep::Last
                }
            }
            Some(k) => Keep::Names(k.extract::<Vec<String>>()?),
        };
        let meta = meta.unwrap_or_default();
        Ok(Options {
            io_maps,
            keep_outputs,
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
        })
    }

    /// Composes the models and returns the merged model's serialized bytes.
    #[pyfunction]
    #[pyo3(signature = (sources, labels, io_maps=None, keep_outputs=None, prefixes=None, inputs=None,
                        outputs=None, ir_version=None, meta=None, model_version=None))]
    #[allow(clippy::too_many_arguments)]
    fn compose_bytes<'py>(
        py: Python<'py>,
        sources: Vec<Source>,
        labels: Vec<String>,
        io_maps: Option<Vec<Vec<(String, String)>>>,
        keep_outputs: Option<Bound<'py, PyAny>>,
        prefixes: Option<Vec<Option<String>>>,
        inputs: Option<Vec<String>>,
        outputs: Option<Vec<String>>,
        ir_version: Option<i64>,
        meta: Option<std::collections::HashMap<String, String>>,
        model_version: Option<i64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        check_labels(&sources, &labels)?;
        let opts = options(io_maps, keep_outputs, prefixes, inputs, outputs, ir_version, meta, model_version)?;
        let merged = py.detach(|| load_all(sources, &labels).and_then(|ms| compose(ms, &labels, &opts))).map_err(to_py)?;
        let len = merged.encoded_len();
        PyBytes::new_with(py, len, |buf| py.detach(|| model::encode_into(&merged, buf)).map_err(to_py))
    }

    /// Composes the models and writes the result to `path` atomically; returns its size.
    #[pyfunction]
    #[pyo3(signature = (sources, labels, path, io_maps=None, keep_outputs=None, prefixes=None, inputs=None,
                        outputs=None, ir_version=None, meta=None, model_version=None))]
    #[allow(clippy::too_many_arguments)]
    fn compose_to_file<'py>(
        py: Python<'py>,
        sources: Vec<Source>,
        labels: Vec<String>,
        path: PathBuf,
        io_maps: Option<Vec<Vec<(String, String)>>>,
        keep_outputs: Option<Bound<'py, PyAny>>,
        prefixes: Option<Vec<Option<String>>>,
        inputs: Option<Vec<String>>,
        outputs: Option<Vec<String>>,
        ir_version: Option<i64>,
        meta: Option<std::collections::HashMap<String, String>>,
        model_version: Option<i64>,
    ) -> PyResult<u64> {
        check_labels(&sources, &labels)?;
        let opts = options(io_maps, keep_outputs, prefixes, inputs, outputs, ir_version, meta, model_version)?;
        py.detach(|| {
            let merged = compose(load_all(sources, &labels)?, &labels, &opts)?;
            model::write_atomic(&merged, &path)
        })
        .map_err(to_py)
    }

    /// The external-data files that the model at `path` refers to.
    #[pyfunction]
    fn external_data_locations(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
        py.detach(|| {
            let label = path.display().to_string();
            let m = load(&label, Source::Path(path))?;
            Ok(model::external_locations(&m))
        })
        .map_err(to_py)
    }

    fn check_labels(sources: &[Source], labels: &[String]) -> PyResult<()> {
        if sources.len() != labels.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("one label per source"));
        }
        Ok(())
    }

    #[pymodule]
    fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        m.add("FastseqError", py.get_type::<FastseqError>())?;
        m.add("LoadError", py.get_type::<LoadError>())?;
        m.add("CompositionError", py.get_type::<CompositionError>())?;
        m.add("OpsetMismatchError", py.get_type::<OpsetMismatchError>())?;
        m.add("ExportError", py.get_type::<ExportError>())?;
        m.add("MAX_IR_VERSION", model::MAX_IR_VERSION)?;
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add_function(wrap_pyfunction!(compose_bytes, m)?)?;
        m.add_function(wrap_pyfunction!(compose_to_file, m)?)?;
        m.add_function(wrap_pyfunction!(external_data_locations, m)?)?;
        Ok(())
    }
}
