//! The serving protocol's decode and encode (`fastseq_serve::protocol`) for the Python server
//! (`fastseq.serving.protocol`): a served model's description ([`ServedSpec`]), an HTTP infer
//! request decoded into its tensors' buffers, an answer encoded from numpy arrays. Binary
//! inputs come back as offsets into the body (numpy reads them in place); outputs are read in
//! place from the arrays' buffers. The GIL is released while a large body is decoded.
use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use fastseq_serve::error::RequestError as ProtocolError;
use fastseq_serve::protocol::{self, binary, Checks};
use fastseq_serve::tensor::{Datatype, ModelSpec, Tensor, TensorSpec};

use crate::buffers::shared;

pyo3::import_exception!(fastseq.errors, RequestError);

/// Bodies at least this long are decoded without the GIL (shorter ones take less time than
/// handing it over).
const DETACHED_BYTES: usize = 64 << 10;

fn request_error(e: ProtocolError) -> PyErr {
    RequestError::new_err((e.message, e.status.http()))
}

fn datatype(name: &str) -> PyResult<Datatype> {
    Datatype::parse(name).ok_or_else(|| PyValueError::new_err(format!("{name:?} is not a KServe datatype")))
}

/// A served model as the protocol checks requests against it: its name and version, its
/// inputs and outputs (name, KServe datatype, shape with -1 for a dynamic axis or None), and
/// its batching.
#[pyclass(frozen, module = "fastseq._core")]
pub struct ServedSpec(pub(crate) ModelSpec);

type Described = (String, String, Option<Vec<i64>>);

/// The protocol's description of a served model (see [`ServedSpec`]): each tensor as (name,
/// KServe datatype, shape or None).
#[pyfunction]
#[pyo3(signature = (name, version, inputs, outputs, max_batch_size = 0, max_delay_us = 0))]
pub fn served_spec(
    name: String,
    version: String,
    inputs: Vec<Described>,
    outputs: Vec<Described>,
    max_batch_size: usize,
    max_delay_us: u64,
) -> PyResult<ServedSpec> {
    let tensors = |ts: Vec<Described>| -> PyResult<Vec<TensorSpec>> {
        ts.into_iter().map(|(name, d, shape)| Ok(TensorSpec { name, datatype: datatype(&d)?, shape })).collect()
    };
    Ok(ServedSpec(ModelSpec {
        name,
        version,
        inputs: tensors(inputs)?,
        outputs: tensors(outputs)?,
        max_batch_size,
        max_delay_us,
    }))
}

/// The model's metadata and Triton configuration documents (JSON), as the protocol writes them.
#[pyfunction]
pub fn served_documents<'py>(py: Python<'py>, spec: &ServedSpec) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
    (PyBytes::new(py, &protocol::model_metadata(&spec.0)), PyBytes::new(py, &protocol::model_config(&spec.0)))
}

#[pymethods]
impl ServedSpec {
    #[getter]
    fn name(&self) -> &str {
        &self.0.name
    }
}

/// One decoded input: its name, datatype, shape, and its values: an offset into the body
/// (binary data, read in place), bytes (values read from JSON or widened), or a list of str
/// (BYTES).
type Decoded = (String, &'static str, Vec<usize>, Py<PyAny>);

/// The HTTP infer request in `body` for `spec` (see `fastseq_serve::protocol::decode_http`):
/// `(id, inputs in the model's order, outputs as (index, binary), timeout in seconds)`; a
/// `fastseq.RequestError` for a request the protocol refuses. `every_input=False` leaves
/// missing inputs to the caller's input rule.
#[pyfunction]
#[pyo3(signature = (spec, body, header_length = None, every_input = true))]
#[allow(clippy::type_complexity)]
pub fn decode_http(
    py: Python<'_>,
    spec: &ServedSpec,
    body: &Bound<'_, PyAny>,
    header_length: Option<usize>,
    every_input: bool,
) -> PyResult<(Option<String>, Vec<Decoded>, Vec<(usize, bool)>, Option<f64>)> {
    let data: Bytes = match body.cast::<PyBytes>() {
        Ok(b) => shared(b),
        Err(_) => Bytes::from(body.extract::<Vec<u8>>()?),
    };
    let checks = Checks { every_input };
    let model = &spec.0;
    let decoded = if data.len() >= DETACHED_BYTES {
        py.detach(|| protocol::decode_http_indexed(model, &data, header_length, checks))
    } else {
        protocol::decode_http_indexed(model, &data, header_length, checks)
    };
    let (request, indices) = decoded.map_err(request_error)?;
    let body_range = data.as_ptr_range();
    let mut given = Vec::with_capacity(request.inputs.len());
    for (t, &k) in request.inputs.iter().zip(&indices) {
        let values: Py<PyAny> = if t.datatype == Datatype::Bytes {
            // checked to be UTF-8 by the decode
            let texts =
                binary::elements(&t.data).map(|e| PyString::new(py, std::str::from_utf8(e).unwrap_or_default()));
            PyList::new(py, texts)?.into_any().unbind()
        } else if !t.data.is_empty() && body_range.contains(&t.data.as_ptr()) {
            (t.data.as_ptr() as usize - data.as_ptr() as usize).into_pyobject(py)?.into_any().unbind()
        } else {
            PyBytes::new(py, &t.data).into_any().unbind()
        };
        given.push((model.inputs[k].name.clone(), t.datatype.name(), t.shape.clone(), values));
    }
    let timeout = request.timeout.map(|d| d.as_secs_f64());
    Ok((request.id, given, request.outputs, timeout))
}

/// The buffer of a numpy array (C-contiguous bytes), shared with the encoder.
struct ArrayBuffer(PyBuffer<u8>);

impl AsRef<[u8]> for ArrayBuffer {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the buffer is C-contiguous (checked when taken) and held until this owner
        // drops; the array is not written while the answer is encoded (the GIL is held).
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.0.len_bytes()) }
    }
}

/// The answer to a request for `spec` (its `id`): `items` as (output index, binary, datatype,
/// shape, values), values a C-contiguous uint8 view of the array, or a list of str or bytes
/// for BYTES. Returns `(body, header_length)` (None: the body is JSON alone).
#[pyfunction]
#[pyo3(signature = (spec, id, items))]
#[allow(clippy::type_complexity)]
pub fn encode_http<'py>(
    py: Python<'py>,
    spec: &ServedSpec,
    id: Option<&str>,
    items: Vec<(usize, bool, String, Vec<usize>, Bound<'py, PyAny>)>,
) -> PyResult<(Bound<'py, PyBytes>, Option<usize>)> {
    let model = &spec.0;
    let mut tensors = Vec::with_capacity(items.len());
    for (k, binary, d, shape, values) in &items {
        if *k >= model.outputs.len() {
            return Err(PyValueError::new_err(format!("model '{}' has no output {k}", model.name)));
        }
        let datatype = datatype(d)?;
        let data = if datatype == Datatype::Bytes {
            let elements: Vec<Vec<u8>> = values
                .try_iter()?
                .map(|v| {
                    let v = v?;
                    match v.cast::<PyString>() {
                        Ok(s) => Ok(s.to_str()?.as_bytes().to_vec()),
                        Err(_) => v.extract::<Vec<u8>>(),
                    }
                })
                .collect::<PyResult<_>>()?;
            Bytes::from(binary::from_elements(elements.iter().map(Vec::as_slice)))
        } else {
            let buffer = PyBuffer::<u8>::get(values)?;
            if !buffer.is_c_contiguous() {
                return Err(PyValueError::new_err("an output's values must be C-contiguous bytes"));
            }
            Bytes::from_owner(ArrayBuffer(buffer))
        };
        tensors.push((*k, *binary, Tensor { datatype, shape: shape.clone(), data }));
    }
    let chosen: Vec<(usize, bool, &Tensor)> = tensors.iter().map(|(k, b, t)| (*k, *b, t)).collect();
    let encoded = protocol::encode::encode_chosen(model, id, &chosen).map_err(request_error)?;
    let body = PyBytes::new_with(py, encoded.len(), |out| {
        let mut at = 0;
        for part in &encoded.parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(())
    })?;
    Ok((body, encoded.header_length))
}

/// `{"error": message}`, always valid JSON.
#[pyfunction]
pub fn error_json<'py>(py: Python<'py>, message: &str) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &protocol::error_json(message))
}
