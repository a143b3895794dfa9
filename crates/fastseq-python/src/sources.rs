//! Model sources from Python: `bytes` (shared, not copied), paths, or models the core holds.
use std::path::PathBuf;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{type_hint_identifier, type_hint_subscript, type_hint_union};

use crate::composed::Composed;
use fastseq::Source;

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

/// The buffer of `b`, shared (not copied) for as long as the returned `Bytes` live.
pub(crate) fn shared(b: &Bound<'_, PyBytes>) -> Bytes {
    let data = b.as_bytes();
    Bytes::from_owner(PyBytesOwner { ptr: data.as_ptr(), len: data.len(), _object: b.clone().unbind() })
}

/// A model source (see [`Source`]): Python `bytes` (shared, not copied), a
/// path or (path, root folder), or a model the core already holds.
pub(crate) struct PySource(pub(crate) Source);

/// A path as the bindings take it: `str | os.PathLike[str]` (a `PathBuf`).
const PATH: pyo3::inspect::PyStaticExpr = type_hint_union!(
    type_hint_identifier!("builtins", "str"),
    type_hint_subscript!(type_hint_identifier!("os", "PathLike"), type_hint_identifier!("builtins", "str"))
);

impl<'a, 'py> FromPyObject<'a, 'py> for PySource {
    type Error = PyErr;
    /// Every form [`PySource::extract`] takes, for the stub (`Source` there).
    const INPUT_TYPE: pyo3::inspect::PyStaticExpr = type_hint_union!(
        type_hint_identifier!("builtins", "bytes"),
        PATH,
        type_hint_subscript!(type_hint_identifier!("builtins", "tuple"), PATH, PATH),
        <Composed as pyo3::PyTypeInfo>::TYPE_HINT
    );

    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = ob.cast::<PyBytes>() {
            return Ok(PySource(Source::Bytes(shared(&b))));
        }
        if let Ok(c) = ob.cast::<Composed>() {
            // Nodes and weights are shared slices (reference counts); the rest is copied.
            return Ok(PySource(Source::Model(Box::new(c.get().0.model().clone()))));
        }
        if let Ok((path, root)) = ob.extract::<(PathBuf, PathBuf)>() {
            return Ok(PySource(Source::Path(path, Some(root))));
        }
        Ok(PySource(Source::Path(ob.extract::<PathBuf>()?, None)))
    }
}
