//! An HTTP infer answer: the JSON document, and with Triton's binary extension each binary
//! output's bytes after it, as they are (the engine's buffers, not copies). Always valid
//! JSON: an output that JSON cannot carry (NaN or infinities, BYTES that are not text) and
//! that was asked for as JSON is a 400 naming it and saying how to ask for it as binary data
//! (Triton writes `NaN` into its JSON, which no strict parser reads).
use bytes::Bytes;

use crate::error::{RequestError, Status};
use crate::tensor::{ModelSpec, Tensor};

use crate::protocol::values::{write_json, Unwritable};
use crate::protocol::{chosen, Encoded};

/// The answer to a request of `model` (its `id`): the outputs `asked` (each output's index in
/// the model and whether it goes back binary) out of `outputs`, every output of the model in
/// order.
pub fn encode_http(
    model: &ModelSpec,
    id: Option<&str>,
    asked: &[(usize, bool)],
    outputs: &[Tensor],
) -> Result<Encoded, RequestError> {
    encode_chosen(model, id, &chosen(model, asked, outputs)?)
}

/// The answer for the outputs `items`: (index in the model, binary, tensor) each.
pub fn encode_chosen(
    model: &ModelSpec,
    id: Option<&str>,
    items: &[(usize, bool, &Tensor)],
) -> Result<Encoded, RequestError> {
    let mut head: Vec<u8> = Vec::with_capacity(128 + 96 * items.len());
    head.extend_from_slice(b"{\"model_name\":");
    string(&mut head, &model.name);
    head.extend_from_slice(b",\"model_version\":");
    string(&mut head, &model.version);
    if let Some(id) = id {
        head.extend_from_slice(b",\"id\":");
        string(&mut head, id);
    }
    head.extend_from_slice(b",\"outputs\":[");
    let mut parts = vec![Bytes::new()];
    for (n, &(k, binary, tensor)) in items.iter().enumerate() {
        let spec = &model.outputs[k];
        let internal = |what: &str| {
            RequestError::new(Status::Internal, format!("model '{}': output '{}' {what}", model.name, spec.name))
        };
        if n > 0 {
            head.push(b',');
        }
        head.extend_from_slice(b"{\"name\":");
        string(&mut head, &spec.name);
        head.extend_from_slice(b",\"datatype\":\"");
        head.extend_from_slice(tensor.datatype.name().as_bytes());
        head.extend_from_slice(b"\",\"shape\":[");
        for (a, d) in tensor.shape.iter().enumerate() {
            if a > 0 {
                head.push(b',');
            }
            head.extend_from_slice(d.to_string().as_bytes());
        }
        head.push(b']');
        let count = tensor.shape.iter().try_fold(1usize, |c, &d| c.checked_mul(d));
        let count = count.ok_or_else(|| internal("has a shape past any array"))?;
        if binary {
            if let Some(size) = tensor.datatype.size() {
                if Some(tensor.data.len()) != count.checked_mul(size) {
                    return Err(internal(&format!(
                        "has {} bytes for shape {:?} of {}",
                        tensor.data.len(),
                        tensor.shape,
                        tensor.datatype.name()
                    )));
                }
            }
            head.extend_from_slice(
                format!(",\"parameters\":{{\"binary_data_size\":{}}}}}", tensor.data.len()).as_bytes(),
            );
            parts.push(tensor.data.clone());
        } else {
            head.extend_from_slice(b",\"data\":");
            match write_json(tensor.datatype, &tensor.data, count, &mut head) {
                Ok(()) => head.push(b'}'),
                Err(Unwritable::NonFinite) => {
                    return Err(RequestError::bad(format!(
                        "output '{}' holds NaN or infinite values, which JSON cannot carry: ask for it as binary data \
                         (its parameters: {{\"binary_data\": true}})",
                        spec.name
                    )))
                }
                Err(Unwritable::NotText) => {
                    return Err(RequestError::bad(format!(
                        "output '{}' holds BYTES that are not UTF-8 text, which JSON cannot carry: ask for it as \
                         binary data (its parameters: {{\"binary_data\": true}})",
                        spec.name
                    )))
                }
                Err(Unwritable::Malformed) => {
                    return Err(internal(&format!(
                        "has {} bytes that do not hold shape {:?} of {}",
                        tensor.data.len(),
                        tensor.shape,
                        tensor.datatype.name()
                    )))
                }
            }
        }
    }
    head.extend_from_slice(b"]}");
    let header_length = (parts.len() > 1).then_some(head.len());
    parts[0] = head.into();
    Ok(Encoded { parts, header_length })
}

/// `s` as a JSON string (escaped by serde_json: always valid).
fn string(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}
