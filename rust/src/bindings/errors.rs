//! The exception classes of `fastseq._core` and the mapping of the core's errors onto them.
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::error::{Error, Kind};

create_exception!(_core, FastseqError, PyException, "Base class of every fastseq error.");
create_exception!(_core, LoadError, FastseqError, "A source is not a usable ONNX model.");
create_exception!(_core, CompositionError, FastseqError, "The models cannot be joined as asked.");
create_exception!(_core, OpsetMismatchError, CompositionError, "Opset versions of one domain differ.");
create_exception!(_core, ExportError, FastseqError, "Writing a model failed.");

pub(crate) fn to_py(e: Error) -> PyErr {
    match e.kind {
        Kind::Load => LoadError::new_err(e.message),
        Kind::Composition => CompositionError::new_err(e.message),
        Kind::Opset => OpsetMismatchError::new_err(e.message),
        Kind::Export => ExportError::new_err(e.message),
    }
}
