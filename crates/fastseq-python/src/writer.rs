//! The writer: bytes and staging folders committed beside the user's file.
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;
use fastseq::{Error, Result};

/// What a write produced: the model's size, its data files' sizes together, and the data
/// files it refers to, relative to its folder (`fastseq::Saved`). Every writer returns one.
#[pyclass(frozen, get_all, module = "fastseq._core")]
pub(crate) struct Saved {
    model_bytes: u64,
    data_bytes: u64,
    data_files: Vec<String>,
}

impl From<fastseq::Saved> for Saved {
    fn from(s: fastseq::Saved) -> Saved {
        Saved { model_bytes: s.model_bytes, data_bytes: s.data_bytes, data_files: s.data_files }
    }
}

#[pymethods]
impl Saved {
    fn __repr__(&self) -> String {
        let Self { model_bytes, data_bytes, data_files } = self;
        format!("Saved(model_bytes={model_bytes}, data_bytes={data_bytes}, data_files={data_files:?})")
    }
}

/// Writes `data` (a model without external data, in any format, or any other file) to
/// `path`; `owner`: the name of the file it is written beside (see `fastseq::commit_bytes`).
#[pyfunction]
#[pyo3(signature = (data, path, owner=None))]
pub(crate) fn commit_bytes(py: Python<'_>, data: &[u8], path: PathBuf, owner: Option<String>) -> PyResult<Saved> {
    py.detach(|| fastseq::commit_bytes(data, &path, owner.as_deref())).map(Saved::from).map_err(to_py)
}

/// Checks that `path` can be written (see `fastseq::check_target`): an ExportError naming
/// it if not.
#[pyfunction]
#[pyo3(signature = (path, owner=None))]
pub(crate) fn check_target(py: Python<'_>, path: PathBuf, owner: Option<String>) -> PyResult<()> {
    py.detach(|| fastseq::check_target(&path, owner.as_deref())).map_err(to_py)
}

/// A staging folder beside a target (made by `stage`) for another program to write a model
/// into; `commit` puts that model in place. Removed on `close()` or leaving a `with` block
/// (or by the next write into that folder if the process is killed).
#[pyclass(module = "fastseq._core")]
pub(crate) struct Staging {
    inner: Option<fastseq::Staging>,
}

impl Staging {
    fn inner(&self) -> PyResult<&fastseq::Staging> {
        self.inner.as_ref().ok_or_else(|| to_py(Error::export("this staging folder is closed")))
    }
}

/// A staging folder beside `target` (see `Staging`).
#[pyfunction]
pub(crate) fn stage(py: Python<'_>, target: PathBuf) -> PyResult<Staging> {
    let inner = py.detach(|| fastseq::stage(&target)).map_err(to_py)?;
    Ok(Staging { inner: Some(inner) })
}

#[pymethods]
impl Staging {
    /// The folder to write into.
    fn folder(&self) -> PyResult<PathBuf> {
        Ok(self.inner()?.path().to_path_buf())
    }

    /// Commits the protobuf model `model_file` of the folder (and the external data files it
    /// refers to there) to the target; `metadata` pairs are set in its metadata_props;
    /// `encode(bytes) -> bytes` turns the final model into another format. Returns what was
    /// written.
    #[pyo3(signature = (model_file, metadata=None,
                        encode: "collections.abc.Callable[[bytes], bytes] | None" = None))]
    fn commit(
        &self,
        py: Python<'_>,
        model_file: &str,
        metadata: Option<Vec<(String, String)>>,
        encode: Option<Py<PyAny>>,
    ) -> PyResult<Saved> {
        let staging = self.inner()?;
        let metadata = metadata.unwrap_or_default();
        let saved = py
            .detach(|| {
                let mut call = |model: Vec<u8>| -> Result<Vec<u8>> {
                    Python::attach(|py| {
                        let f = encode.as_ref().expect("called only with an encoder");
                        f.call1(py, (PyBytes::new(py, &model),))?.extract::<Vec<u8>>(py)
                    })
                    .map_err(|e| Error::export(format!("cannot encode {}: {e}", staging.target().display())))
                };
                let encoder: Option<&mut fastseq::Encoder<'_>> = if encode.is_some() { Some(&mut call) } else { None };
                fastseq::commit_staged(staging, model_file, &metadata, encoder)
            })
            .map_err(to_py)?;
        Ok(saved.into())
    }

    /// Removes the folder and what it holds.
    fn close(&mut self) {
        self.inner = None;
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&mut self, _exc_type: Py<PyAny>, _exc: Py<PyAny>, _tb: Py<PyAny>) {
        self.close();
    }
}
