//! The core's [`fastseq::Layout`] (`_core.LAYOUT`), and its metadata rule: what Python asks
//! instead of deciding again.
use pyo3::prelude::*;

use crate::errors::to_py;

/// How fastseq lays out a model with external data (`fastseq::LAYOUT`): tensors of at
/// least `threshold` bytes go to the data file, which is named after the model
/// (`data_file`), and a tensor's location must stay inside the model's folder
/// (`allows_location`).
#[pyclass(frozen, name = "Layout", module = "fastseq._core")]
pub(crate) struct PyLayout(pub(crate) fastseq::Layout);

#[pymethods]
impl PyLayout {
    /// Tensors of at least this many bytes go to the data file.
    #[getter]
    fn threshold(&self) -> usize {
        self.0.threshold
    }

    /// The data file of a model file is its name followed by this.
    #[getter]
    fn data_suffix(&self) -> &'static str {
        self.0.data_suffix
    }

    /// The data file's name for the model file named `model_file`.
    fn data_file(&self, model_file: &str) -> String {
        self.0.data_file(model_file)
    }

    /// Whether `location` may name a data file: a relative path inside the model's folder.
    fn allows_location(&self, location: &str) -> bool {
        self.0.allows_location(location)
    }

    /// Raises LoadError unless `location` may name a data file (see `allows_location`).
    fn check_location(&self, location: &str) -> PyResult<()> {
        self.0.check_location(location).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        format!("Layout(threshold={}, data_suffix={:?})", self.0.threshold, self.0.data_suffix)
    }
}

/// `existing` metadata pairs with `pairs` set: each key once, where it first appeared, with
/// its last value (see `fastseq::merge_metadata`).
#[pyfunction]
pub(crate) fn merge_metadata(existing: Vec<(String, String)>, pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    fastseq::merge_metadata(existing, &pairs)
}
