//! Graph inputs and outputs as Python tuples: (name, dtype, dims).
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use fastseq::{DimInfo, IoInfo};

/// (name, dtype, dims) tuples: dims are ints when static, the parameter's name when
/// symbolic, None when unknown.
pub(crate) fn io_infos<'py>(py: Python<'py>, items: &[IoInfo]) -> PyResult<Vec<Bound<'py, PyAny>>> {
    items
        .iter()
        .map(|io| (io.name.as_str(), io.dtype.as_str(), dims(py, &io.dims)?).into_pyobject(py).map(|t| t.into_any()))
        .collect()
}

/// Dims as a tuple of int, str or None.
pub(crate) fn dims<'py>(py: Python<'py>, dims: &[DimInfo]) -> PyResult<Bound<'py, PyTuple>> {
    let items: Vec<Bound<'py, PyAny>> = dims
        .iter()
        .map(|d| match d {
            DimInfo::Static(v) => v.into_pyobject(py).map(|v| v.into_any()).map_err(PyErr::from),
            DimInfo::Symbolic(p) => p.into_pyobject(py).map(|v| v.into_any()).map_err(PyErr::from),
            DimInfo::Unknown => Ok(py.None().into_bound(py)),
        })
        .collect::<PyResult<_>>()?;
    PyTuple::new(py, items)
}
