//! An HTTP infer request decoded: its JSON (the whole body, or the header that Triton's
//! binary extension puts first, `Inference-Header-Content-Length` long) read into borrowed
//! fields, each input's `data` read from its text straight into its bytes
//! ([`crate::protocol::values::from_json`]), each binary input a slice of the body
//! ([`crate::protocol::binary::checked`]); everything checked as Python's protocol did, in its order,
//! with its words; then the tensors against the model ([`crate::protocol::shape::against_model`]).

use crate::error::{client_text, did_you_mean, RequestError};
use crate::tensor::{Datatype, InferRequest, ModelSpec, Tensor};
use bytes::Bytes;

use crate::protocol::params::{self, kind, shown, Param};
use crate::protocol::reader::{capped_list, too_deep, Document, Fields, Inputs, Raw, Shaped, MAX_MEMBERS};
use crate::protocol::shape::{self, Dim};
use crate::protocol::{binary, values, Checks, MAX_DEPTH, MAX_RANK};

/// The request's parameters that the decode reads.
const REQUEST_PARAMETERS: [&str; 5] =
    ["binary_data_output", "timeout", "sequence_id", "sequence_start", "sequence_end"];

/// A member that must be an object (or absent): its fields.
fn object<'a>(raw: Option<Raw<'a>>, what: &str, known: &[&str]) -> Result<Fields<'a>, RequestError> {
    match raw {
        None => Ok(Fields::default()),
        Some(v) if v.get().starts_with('{') => Fields::parse(v)?.known(known),
        Some(v) => Err(RequestError::bad(format!("{what} must be a JSON object, got {}", kind(v)))),
    }
}

/// A list's items (the first [`MAX_MEMBERS`]; no request needs more).
fn list(raw: Raw<'_>) -> Result<Vec<Raw<'_>>, RequestError> {
    capped_list(raw, MAX_MEMBERS).map(|(items, _)| items)
}

/// The infer request in `body` for `model`, every input of the model given (see
/// [`decode_http_with`]).
pub fn decode_http(
    model: &ModelSpec,
    body: &Bytes,
    header_length: Option<usize>,
) -> Result<InferRequest, RequestError> {
    decode_http_with(model, body, header_length, Checks::default())
}

/// The infer request in `body` for `model`: `header_length` from the
/// `Inference-Header-Content-Length` header (None: the whole body is JSON). Each input is
/// checked against its declaration and then against the model; binary inputs are slices of
/// `body`. The tensors come in the model's order; `outputs` names every output answered.
pub fn decode_http_with(
    model: &ModelSpec,
    body: &Bytes,
    header_length: Option<usize>,
    checks: Checks,
) -> Result<InferRequest, RequestError> {
    decode_http_indexed(model, body, header_length, checks).map(|(request, _)| request)
}

/// [`decode_http_with`], and the index in the model of each input returned (where
/// `checks.every_input` is false, the inputs given, in the model's order).
pub fn decode_http_indexed(
    model: &ModelSpec,
    body: &Bytes,
    header_length: Option<usize>,
    checks: Checks,
) -> Result<(InferRequest, Vec<usize>), RequestError> {
    decode_read(model, body, header_length, checks, true)
}

/// [`decode_http_indexed`], read quickly first where `quick` (else by serde_json alone: the
/// tests compare the two).
pub(crate) fn decode_read(
    model: &ModelSpec,
    body: &Bytes,
    header_length: Option<usize>,
    checks: Checks,
    quick: bool,
) -> Result<(InferRequest, Vec<usize>), RequestError> {
    let size = body.len();
    let header_length = match header_length {
        None => size,
        Some(n) if n <= size => n,
        Some(n) => {
            return Err(RequestError::bad(format!(
                "Inference-Header-Content-Length is {n}, but the body has {size} bytes"
            )))
        }
    };
    let text = std::str::from_utf8(&body[..header_length])
        .map_err(|e| RequestError::bad(format!("the request is not valid JSON: it is not UTF-8 ({e})")))?;
    // Read quickly, each input's data checked as JSON as its values are read (once, not
    // twice: serde_json's reader checks every number's text, and from_json reads it again).
    // A request that this refuses is read again by serde_json, whose check of the whole text
    // comes first: its refusal is the one a full read gives (invalid JSON before anything else).
    if let Some(Document { fields, inputs }) = if quick { Document::read_quick(text) } else { None } {
        if let Ok(decoded) = decode_document(model, body, header_length, checks, fields, inputs) {
            return Ok(decoded);
        }
    }
    let (fields, inputs) = document(text)?;
    decode_document(model, body, header_length, checks, fields, inputs)
}

/// The request read into `doc` (the top-level object's members but `inputs`) and `inputs`,
/// from `body`'s first `header_length` bytes.
fn decode_document(
    model: &ModelSpec,
    body: &Bytes,
    header_length: usize,
    checks: Checks,
    doc: Fields<'_>,
    inputs: Inputs<'_>,
) -> Result<(InferRequest, Vec<usize>), RequestError> {
    let size = body.len();
    let mut doc = doc.known(&["id", "parameters", "outputs"])?;
    let id = match doc.take("id") {
        None => None,
        Some(v) if v.get().starts_with('"') => Some(params::string(v)?),
        Some(v) => return Err(RequestError::bad(format!("the request's id must be a string, got {}", kind(v)))),
    };
    let parameters = object(doc.take("parameters"), "the request's parameters", &REQUEST_PARAMETERS)?;
    let items = match inputs {
        Shaped::Is(items) if !items.is_empty() => items,
        _ => {
            return Err(RequestError::bad(format!(
                "the request needs 'inputs', a list of the tensors of model '{}': {}",
                model.name,
                names(&model.inputs)
            )))
        }
    };
    let mut given: Vec<Option<Tensor>> = vec![None; model.inputs.len()];
    let mut order = Vec::with_capacity(items.len());
    let mut offset = header_length;
    for (k, item) in items.into_iter().enumerate() {
        let mut fields = match item {
            Shaped::Is(fields) => fields.known(&["name", "datatype", "shape", "parameters", "data"])?,
            Shaped::Null => return Err(RequestError::bad(format!("inputs[{k}] must be a JSON object, got null"))),
            Shaped::Not(kind) => {
                return Err(RequestError::bad(format!("inputs[{k}] must be a JSON object, got {kind}")))
            }
        };
        let name = match fields.take("name") {
            Some(v) if v.get().starts_with('"') => params::string(v)?,
            _ => return Err(RequestError::bad(format!("inputs[{k}] needs a 'name', a string"))),
        };
        let (index, datatype) = input_datatype(model, &given, &name, fields.take("datatype"))?;
        let name = model.inputs[index].name.as_str();
        let (shape, count) = declared_shape(name, fields.take("shape"))?;
        let mut params =
            object(fields.take("parameters"), &format!("input '{name}''s parameters"), &["binary_data_size"])?;
        if params.has("shared_memory_region") {
            return Err(RequestError::bad(format!(
                "input '{name}': shared memory is not supported by fastseq serve; send the data"
            )));
        }
        let data = match params.take("binary_data_size") {
            Some(v) => {
                if fields.has("data") {
                    return Err(RequestError::bad(format!(
                        "input '{name}' has both 'data' and binary_data_size: give one"
                    )));
                }
                let text = v.get();
                if !text.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(RequestError::bad(format!(
                        "input '{name}': binary_data_size must be an integer >= 0, got {}",
                        shown(v)
                    )));
                }
                let left = size - offset;
                let n = text.parse::<usize>().ok().filter(|&n| n <= left).ok_or_else(|| {
                    RequestError::bad(format!(
                        "input '{name}' has binary_data_size {}, past the end of the body ({left} bytes left after \
                         the JSON and the inputs before it)",
                        shown(v)
                    ))
                })?;
                let raw = body.slice(offset..offset + n);
                offset += n;
                binary::checked(name, raw, datatype, &shape, count)?
            }
            // null is data too (one value, of no datatype's kind), as Python read it
            None => match fields.remove("data") {
                Some(v) => values::from_json(name, v.get(), datatype, &shape, count)?.into(),
                None => {
                    return Err(RequestError::bad(format!(
                        "input '{name}' has neither 'data' nor parameters.binary_data_size"
                    )))
                }
            },
        };
        given[index] = Some(Tensor { datatype, shape, data });
        order.push(index);
    }
    if offset != size {
        return Err(RequestError::bad(format!(
            "the body has {} bytes after the binary data of its inputs: each binary input's binary_data_size must \
             give its exact length",
            size - offset
        )));
    }
    let binary_output = match parameters.get("binary_data_output").map(|v| (v.get(), v)) {
        None => false,
        Some(("true", _)) => true,
        Some(("false", _)) => false,
        Some((_, v)) => {
            return Err(RequestError::bad(format!(
                "the parameter binary_data_output must be true or false, got {}",
                shown(v)
            )))
        }
    };
    let timeout = {
        let p = &parameters;
        let got = |key: &str| p.get(key).map(params::from_raw);
        for key in ["timeout", "sequence_id", "sequence_start", "sequence_end"] {
            if let Some(Err(e)) = got(key) {
                return Err(e);
            }
        }
        params::request_timeout(|key| got(key).and_then(Result::ok), |key| p.get(key).map_or(String::new(), shown))?
    };
    let outputs = match doc.take("outputs") {
        None => Vec::new(),
        Some(v) => requested(model, v, binary_output)?,
    };
    let outputs =
        if outputs.is_empty() { (0..model.outputs.len()).map(|k| (k, binary_output)).collect() } else { outputs };
    let indices = (0..given.len()).filter(|&k| given[k].is_some()).collect();
    let inputs = shape::against_model(model, given, &order, checks)?;
    Ok((InferRequest { id, inputs, outputs, timeout }, indices))
}

/// The request's top-level object (and its inputs); a non-object answered as Python's json
/// did (invalid JSON, nesting too deep included, or the kind it is).
fn document(text: &str) -> Result<(Fields<'_>, Inputs<'_>), RequestError> {
    let start = text.trim_start_matches([' ', '\n', '\r', '\t']);
    if start.starts_with('{') {
        let doc = Document::read(text)?;
        return Ok((doc.fields, doc.inputs));
    }
    // Checked whole without building it (a tree of a body's values would take many times
    // its size): it is an error either way, and invalid JSON (too deep included) says so first.
    if too_deep(text) {
        return Err(RequestError::bad(format!("the request is not valid JSON: nested deeper than {MAX_DEPTH}")));
    }
    Err(RequestError::bad(format!("the request must be a JSON object, got {}", kind(Raw::parse(text)?))))
}

fn names(tensors: &[crate::tensor::TensorSpec]) -> String {
    tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
}

/// The model's input named `name` and the datatype the request gives it: a 400 for a name
/// that is no input (with the near miss), one given already, or no KServe datatype.
pub(crate) fn input_index(model: &ModelSpec, given: &[Option<Tensor>], name: &str) -> Result<usize, RequestError> {
    let Some(index) = model.input_index(name) else {
        return Err(RequestError::bad(format!(
            "{} is not an input of model '{}'{}; inputs: {}",
            client_text(name),
            model.name,
            did_you_mean(name, model.inputs.iter().map(|t| t.name.as_str())),
            names(&model.inputs)
        )));
    };
    if given[index].is_some() {
        return Err(RequestError::bad(format!("input '{name}' is given twice")));
    }
    Ok(index)
}

/// The datatype named `text` for the model's input `index`.
pub(crate) fn datatype_named(model: &ModelSpec, index: usize, text: &str) -> Result<Datatype, RequestError> {
    Datatype::parse(text).ok_or_else(|| {
        let spec = &model.inputs[index];
        RequestError::bad(format!(
            "input '{}': {} is not a KServe datatype{}; model '{}' takes {}",
            spec.name,
            client_text(text),
            did_you_mean(text, Datatype::ALL.iter().map(|d| d.name())),
            model.name,
            spec.datatype.name()
        ))
    })
}

fn input_datatype(
    model: &ModelSpec,
    given: &[Option<Tensor>],
    name: &str,
    datatype: Option<Raw<'_>>,
) -> Result<(usize, Datatype), RequestError> {
    let index = input_index(model, given, name)?;
    match datatype {
        Some(v) if v.get().starts_with('"') => Ok((index, datatype_named(model, index, &params::string(v)?)?)),
        other => {
            let spec = &model.inputs[index];
            Err(RequestError::bad(format!(
                "input '{}': {} is not a KServe datatype; model '{}' takes {}",
                spec.name,
                other.map_or("null", kind),
                model.name,
                spec.datatype.name()
            )))
        }
    }
}

fn declared_shape(name: &str, raw: Option<Raw<'_>>) -> Result<(Vec<usize>, u64), RequestError> {
    // Stored up to one past the most axes a shape may have, counted past that.
    let (items, total) = match raw {
        Some(v) if v.get().starts_with('[') => capped_list(v, MAX_RANK + 1)?,
        other => {
            return Err(RequestError::bad(format!(
                "input '{name}' needs a 'shape', a list of integers, got {}",
                other.map_or("null", kind)
            )))
        }
    };
    if total > MAX_RANK {
        return Err(RequestError::bad(format!("input '{name}' has {total} axes, more than {MAX_RANK}")));
    }
    let dims: Vec<Dim<'_>> = items
        .iter()
        .map(|v| {
            let t = v.get();
            let digits = t.strip_prefix('-').filter(|d| d.bytes().all(|b| b == b'0')).map_or(t, |_| "0");
            match digits.parse::<u64>() {
                Ok(n) if digits.bytes().all(|b| b.is_ascii_digit()) => Dim::Size(n),
                _ => Dim::Bad(t),
            }
        })
        .collect();
    shape::declared(name, &dims)
}

/// The outputs a request names: each output's index and whether it goes back binary.
fn requested(model: &ModelSpec, raw: Raw<'_>, binary_output: bool) -> Result<Vec<(usize, bool)>, RequestError> {
    if !raw.get().starts_with('[') {
        return Err(RequestError::bad(format!("the request's 'outputs' must be a list, got {}", kind(raw))));
    }
    let mut asked: Vec<(usize, bool)> = Vec::new();
    for (k, item) in list(raw)?.into_iter().enumerate() {
        let named = || RequestError::bad(format!("outputs[{k}] must be a JSON object with a 'name'"));
        if !item.get().starts_with('{') {
            return Err(named());
        }
        let mut fields = Fields::parse(item)?.known(&["name", "parameters"])?;
        let name = match fields.take("name") {
            Some(v) if v.get().starts_with('"') => params::string(v)?,
            _ => return Err(named()),
        };
        let index = output_index(model, &asked, &name)?;
        let name = model.outputs[index].name.as_str();
        let mut params = object(
            fields.take("parameters"),
            &format!("output '{name}''s parameters"),
            &["classification", "binary_data"],
        )?;
        if let Some(v) = params.take("classification") {
            if params::from_raw(v)?.truthy() {
                return Err(RequestError::bad(format!(
                    "output '{name}': the classification extension is not supported by fastseq serve"
                )));
            }
        }
        if params.has("shared_memory_region") {
            return Err(RequestError::bad(format!("output '{name}': shared memory is not supported by fastseq serve")));
        }
        let binary = match params.remove("binary_data").map(|v| (params::from_raw(v), v)) {
            None => binary_output,
            Some((Ok(Param::Bool(b)), _)) => b,
            Some((_, v)) => {
                return Err(RequestError::bad(format!(
                    "output '{name}': binary_data must be true or false, got {}",
                    shown(v)
                )))
            }
        };
        asked.push((index, binary));
    }
    Ok(asked)
}

/// The model's output named `name`: a 400 for one that is no output (with the near miss) or
/// is asked for twice.
pub(crate) fn output_index(model: &ModelSpec, asked: &[(usize, bool)], name: &str) -> Result<usize, RequestError> {
    let Some(index) = model.output_index(name) else {
        return Err(RequestError::bad(format!(
            "{} is not an output of model '{}'{}; outputs: {}",
            client_text(name),
            model.name,
            did_you_mean(name, model.outputs.iter().map(|t| t.name.as_str())),
            names(&model.outputs)
        )));
    };
    if asked.iter().any(|&(k, _)| k == index) {
        return Err(RequestError::bad(format!("output '{name}' is asked for twice")));
    }
    Ok(index)
}

#[cfg(test)]
mod tests;
