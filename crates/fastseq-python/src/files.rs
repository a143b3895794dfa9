//! Files: external-data locations, digests and the session's private copy.
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::composed::Composed;
use crate::errors::to_py;
use fastseq::codec::proto::ModelProto;
use fastseq::storage::digest;
use fastseq::storage::external::{check_relative, locations_in_file};
use fastseq::storage::spill::private_copy;

/// The external-data files that the model at `path` refers to (not opened).
#[pyfunction]
pub(crate) fn external_data_locations(py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
    py.detach(|| locations_in_file(&path)).map_err(to_py)
}

/// Raises LoadError unless `location` is a safe relative external-data location.
#[pyfunction]
pub(crate) fn check_external_location(location: &str) -> PyResult<()> {
    check_relative(location).map_err(to_py)
}

/// The XXH3-128 digest of a file's bytes, as hex.
#[pyfunction]
pub(crate) fn file_digest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| digest::file_digest(&path))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))
}

/// The digest of the composed model as it is written for a session (the session cache's
/// key), read where its weights are without writing or keeping them: see
/// `digest::model_digest`. A source file that is no longer the one loaded is a LoadError.
#[pyfunction]
pub(crate) fn model_digest(py: Python<'_>, model: PyRef<'_, Composed>) -> PyResult<String> {
    let m = &model.composition.model;
    py.detach(|| digest::model_digest(m, 1024)).map_err(to_py)
}

/// The bytes `models` hold in memory of their own (see `spill::memory_bytes`).
#[pyfunction]
pub(crate) fn memory_bytes(models: Vec<PyRef<'_, Composed>>) -> u64 {
    let refs: Vec<&ModelProto> = models.iter().map(|c| &c.composition.model).collect();
    fastseq::storage::spill::memory_bytes(&refs)
}

/// `({"copied", "sendfile", "written", "mapped"}, spilled copies or None)`:
/// see `spill::private_copy`. `copied`: bytes the kernel copied from the sources
/// (`sendfile`: of those, across file systems); `written`: bytes written from memory;
/// `mapped`: bytes the spilled copies map.
#[pyfunction]
#[pyo3(signature = (models, path, spill_min=None))]
pub(crate) fn write_private_copy<'py>(
    py: Python<'py>,
    models: Vec<PyRef<'_, Composed>>,
    path: PathBuf,
    spill_min: Option<u64>,
) -> PyResult<(Bound<'py, PyDict>, Option<Vec<Composed>>)> {
    let refs: Vec<&ModelProto> = models.iter().map(|c| &c.composition.model).collect();
    let done = py.detach(|| private_copy(&refs, &path, spill_min)).map_err(to_py)?;
    let info = PyDict::new(py);
    info.set_item("copied", done.copied)?;
    info.set_item("sendfile", done.by_sendfile)?;
    info.set_item("written", done.written)?;
    info.set_item("mapped", done.mapped)?;
    let spilled = done.spilled.map(|copies| models.iter().zip(copies).map(|(c, m)| c.with_model(m)).collect());
    Ok((info, spilled))
}
