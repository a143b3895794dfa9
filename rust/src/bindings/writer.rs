//! The writer: bytes and staging folders committed beside the user's file.
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::bindings::errors::to_py;
use crate::error::{Error, Result};
use crate::storage::writer::{self, Saved};

fn written<'py>(py: Python<'py>, saved: Saved) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("model_bytes", saved.model_bytes)?;
    d.set_item("data_bytes", saved.data_bytes)?;
    d.set_item("data_files", saved.data_files)?;
    Ok(d)
}

/// Writes `data` (a model without external data, in any format, or any other file) to
/// `path`; `owner`: the name of the file it is written beside (see `writer::commit_bytes`).
/// Returns a dict with the bytes written.
#[pyfunction]
#[pyo3(signature = (data, path, owner=None))]
pub(crate) fn commit_bytes<'py>(
    py: Python<'py>,
    data: &[u8],
    path: PathBuf,
    owner: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let saved = py.detach(|| writer::commit_bytes(data, &path, owner.as_deref())).map_err(to_py)?;
    written(py, saved)
}

/// Checks that `path` can be written (see `writer::check`): an ExportError naming it if not.
#[pyfunction]
#[pyo3(signature = (path, owner=None))]
pub(crate) fn check_target(py: Python<'_>, path: PathBuf, owner: Option<String>) -> PyResult<()> {
    py.detach(|| writer::check(&path, owner.as_deref())).map_err(to_py)
}

/// A staging folder beside a target (made by `stage`) for another program to write a model
/// into; `commit` puts that model in place. Removed on `close()` or leaving a `with` block
/// (or by the next write into that folder if the process is killed).
#[pyclass(module = "fastseq._core")]
pub(crate) struct Staging {
    inner: Option<writer::Staging>,
}

impl Staging {
    fn inner(&self) -> PyResult<&writer::Staging> {
        self.inner.as_ref().ok_or_else(|| to_py(Error::export("this staging folder is closed")))
    }
}

/// A staging folder beside `target` (see `Staging`).
#[pyfunction]
pub(crate) fn stage(py: Python<'_>, target: PathBuf) -> PyResult<Staging> {
    let inner = py.detach(|| writer::stage(&target)).map_err(to_py)?;
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
    /// `encode(bytes) -> bytes` turns the final model into another format. Returns a dict
    /// with the bytes written and the data files' names.
    #[pyo3(signature = (model_file, metadata=None, encode=None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        model_file: &str,
        metadata: Option<Vec<(String, String)>>,
        encode: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
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
                let encoder: Option<&mut writer::Encoder<'_>> = if encode.is_some() { Some(&mut call) } else { None };
                writer::commit_staged(staging, model_file, &metadata, encoder)
            })
            .map_err(to_py)?;
        written(py, saved)
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
