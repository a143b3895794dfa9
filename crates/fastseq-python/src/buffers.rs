//! Python `bytes` shared with the core, not copied: what model sources and `Composed` both
//! take (a module of its own, so that neither names the other for it).
use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
