//! Files: external-data locations, digests and the session's private copy.
use std::path::PathBuf;

use pyo3::prelude::*;

use crate::composed::Composed;
use crate::errors::{to_py, LoadError};

/// The external-data files that the model at `path` refers to (not opened).
#[pyfunction]
pub(crate) fn external_data_locations(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
    py.detach(|| fastseq::external_data_locations(&path)).map_err(to_py)
}

/// Opens a file named by input for reading (`fastseq::open_input`: what is not a regular
/// file is refused without blocking) and returns its descriptor, for `os.fdopen`. A FIFO, a
/// device, a socket or a directory is a LoadError naming it; an OS error an `OSError` with
/// its errno and the path, as Python's `open` raises it.
#[pyfunction]
pub(crate) fn open_input(py: Python<'_>, path: PathBuf) -> PyResult<i32> {
    use std::os::fd::IntoRawFd;
    match py.detach(|| fastseq::open_input(&path)) {
        Ok((file, _)) => Ok(file.into_raw_fd()),
        Err(e) => Err(match fastseq::NotRegular::of(&e) {
            Some(refused) => LoadError::new_err(format!("{}: {refused}", path.display())),
            None => {
                let errno = e.raw_os_error().unwrap_or(0);
                let strerror: String = py.import("os")?.call_method1("strerror", (errno,))?.extract()?;
                pyo3::exceptions::PyOSError::new_err((errno, strerror, path.into_os_string()))
            }
        }),
    }
}

/// The XXH3-128 digest of a file's bytes, as hex.
#[pyfunction]
pub(crate) fn file_digest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| fastseq::file_digest(&path))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))
}

/// The digest of the composed model as it is written for a session (the session cache's
/// key), read where its weights are without writing or keeping them: see
/// `Composed::digest`. A source file that is no longer the one loaded is a LoadError.
#[pyfunction]
pub(crate) fn model_digest(py: Python<'_>, model: PyRef<'_, Composed>) -> PyResult<String> {
    let model = &model.0;
    py.detach(|| model.digest()).map_err(to_py)
}

/// The bytes `models` hold in memory of their own (see `fastseq::memory_bytes`).
#[pyfunction]
pub(crate) fn memory_bytes(models: Vec<PyRef<'_, Composed>>) -> u64 {
    let refs: Vec<&fastseq::Composed> = models.iter().map(|c| &c.0).collect();
    fastseq::memory_bytes(&refs)
}

/// What a private copy moved: `copied`, the bytes the kernel copied from the sources (of
/// those, `by_sendfile` across file systems); `written`, the bytes written from memory;
/// `mapped`, the bytes the spilled copies map (see `fastseq::private_copy`).
#[pyclass(frozen, get_all, module = "fastseq._core")]
pub(crate) struct PrivateCopyInfo {
    copied: u64,
    by_sendfile: u64,
    written: u64,
    mapped: u64,
}

#[pymethods]
impl PrivateCopyInfo {
    fn __repr__(&self) -> String {
        let Self { copied, by_sendfile, written, mapped } = self;
        format!("PrivateCopyInfo(copied={copied}, by_sendfile={by_sendfile}, written={written}, mapped={mapped})")
    }
}

/// Writes the session's private copy of `models[0]` at `path`; with `spill_min`, also the
/// copies of `models` spilled onto it, or None (see `fastseq::private_copy`).
#[pyfunction]
#[pyo3(signature = (models, path, spill_min=None))]
pub(crate) fn write_private_copy(
    py: Python<'_>,
    models: Vec<PyRef<'_, Composed>>,
    path: PathBuf,
    spill_min: Option<u64>,
) -> PyResult<(PrivateCopyInfo, Option<Vec<Composed>>)> {
    let refs: Vec<&fastseq::Composed> = models.iter().map(|c| &c.0).collect();
    let done = py.detach(|| fastseq::private_copy(&refs, &path, spill_min)).map_err(to_py)?;
    let info = PrivateCopyInfo {
        copied: done.copied,
        by_sendfile: done.by_sendfile,
        written: done.written,
        mapped: done.mapped,
    };
    Ok((info, done.spilled.map(|copies| copies.into_iter().map(Composed).collect())))
}
