//! Model sources from Python: `bytes` (shared, not copied), paths, or models the core holds.
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{type_hint_identifier, type_hint_subscript, type_hint_union};

use crate::buffers::shared;
use crate::composed::Composed;
use fastseq::Source;

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
