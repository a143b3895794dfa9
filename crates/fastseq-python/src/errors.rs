//! The exception classes of `fastseq._core` and the mapping of the core's errors onto them.
//!
//! `CompositionError` (and with it `OpsetMismatchError`) is also a `ValueError`: code written
//! for `onnx.compose`, which raises `ValueError` for the same mistakes, keeps catching it.
//! `create_exception!` takes one base, so that class is made with two through the C API.
use std::ffi::CStr;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use fastseq::{Error, Kind};

create_exception!(_core, FastseqError, PyException, "Base class of every fastseq error.");
create_exception!(_core, LoadError, FastseqError, "A source is not a usable ONNX model.");
create_exception!(_core, ExportError, FastseqError, "Writing a model failed.");

/// A new exception class `name` ("module.Class") with `bases`.
fn new_class(py: Python<'_>, name: &CStr, doc: &CStr, bases: Bound<'_, PyTuple>) -> Py<PyType> {
    // SAFETY: the strings are NUL-terminated and outlive the call; `bases` is a live tuple
    // of classes. The call returns a new reference, or NULL with an exception set.
    unsafe {
        let ptr =
            pyo3::ffi::PyErr_NewExceptionWithDoc(name.as_ptr(), doc.as_ptr(), bases.as_ptr(), std::ptr::null_mut());
        Bound::from_owned_ptr_or_err(py, ptr)
            .and_then(|t| t.cast_into::<PyType>().map_err(PyErr::from))
            .expect("creating an exception class")
            .unbind()
    }
}

/// `CompositionError(FastseqError, ValueError)`: the models cannot be joined as asked.
pub(crate) fn composition_error(py: Python<'_>) -> &Bound<'_, PyType> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLASS
        .get_or_init(py, || {
            let bases = PyTuple::new(py, [py.get_type::<FastseqError>(), py.get_type::<PyValueError>()])
                .expect("a tuple of two classes");
            new_class(py, c"_core.CompositionError", c"The models cannot be joined as asked.", bases)
        })
        .bind(py)
}

/// `OpsetMismatchError(CompositionError)`: opset versions of one domain differ.
pub(crate) fn opset_mismatch_error(py: Python<'_>) -> &Bound<'_, PyType> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLASS
        .get_or_init(py, || {
            let bases = PyTuple::new(py, [composition_error(py).clone()]).expect("a tuple of one class");
            new_class(py, c"_core.OpsetMismatchError", c"Opset versions of one domain differ.", bases)
        })
        .bind(py)
}

pub(crate) fn to_py(e: Error) -> PyErr {
    match e.kind {
        Kind::Load => LoadError::new_err(e.message),
        Kind::Composition => Python::attach(|py| PyErr::from_type(composition_error(py).clone(), e.message)),
        Kind::Opset => Python::attach(|py| PyErr::from_type(opset_mismatch_error(py).clone(), e.message)),
        Kind::Export => ExportError::new_err(e.message),
    }
}
