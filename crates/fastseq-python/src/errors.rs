//! The mapping of the core's errors onto fastseq's exception classes.
//!
//! The classes are defined in Python (`python/fastseq/errors.py`, `__module__ = "fastseq"`),
//! so that they pickle by name and tracebacks print `fastseq.LoadError`; the core looks each
//! one up in `fastseq.errors` the first time it needs it (`_core` re-exports them). That
//! module imports nothing from `_core`, so `_core`'s own start can import it.
use pyo3::prelude::*;
use pyo3::types::PyType;

use fastseq::{Error, Kind};

pyo3::import_exception!(fastseq.errors, FastseqError);
pyo3::import_exception!(fastseq.errors, LoadError);
pyo3::import_exception!(fastseq.errors, CompositionError);
pyo3::import_exception!(fastseq.errors, OpsetMismatchError);
pyo3::import_exception!(fastseq.errors, ExportError);

/// `CompositionError(FastseqError, ValueError)`: the models cannot be joined as asked.
pub(crate) fn composition_error(py: Python<'_>) -> Bound<'_, PyType> {
    py.get_type::<CompositionError>()
}

/// `OpsetMismatchError(CompositionError)`: opset versions of one domain differ.
pub(crate) fn opset_mismatch_error(py: Python<'_>) -> Bound<'_, PyType> {
    py.get_type::<OpsetMismatchError>()
}

pub(crate) fn to_py(e: Error) -> PyErr {
    match e.kind {
        Kind::Load => LoadError::new_err(e.message),
        Kind::Composition => CompositionError::new_err(e.message),
        Kind::Opset => OpsetMismatchError::new_err(e.message),
        Kind::Export => ExportError::new_err(e.message),
    }
}
