//! The protocol over gRPC: Triton's messages ([`messages`]), an infer request decoded and
//! checked as HTTP's are (the same checks and words: inputs as `raw_input_contents`, slices of
//! the message's buffer, or as typed `contents`, never both for one input), the answer as
//! Triton gives it (`raw_output_contents`), and the documents as messages.
use std::borrow::Cow;

use bytes::Bytes;

use crate::error::{client_bytes, RequestError};
use crate::metrics::Statistics;
use crate::tensor::{Datatype, InferRequest, ModelSpec, Tensor};

use crate::protocol::documents::{dims_of, shape_of, BACKEND, EXTENSIONS, PLATFORM};
use crate::protocol::json::{datatype_named, input_index, output_index};
use crate::protocol::params::{request_timeout, Param};
use crate::protocol::shape::{self, Dim};
use crate::protocol::values::int_range;
use crate::protocol::{binary, chosen, list, values_word, Checks};

pub mod cost;
pub mod messages;
pub use messages::*;

/// A string field's text: the client's bytes where they are UTF-8 (the workspace's prost
/// keeps odd bytes as escape characters, see `fastseq::__prost_fidelity`), or how a message
/// shows them where they are not.
pub fn text(s: &str) -> Result<Cow<'_, str>, String> {
    match fastseq::__prost_fidelity::bytes_of(s) {
        Cow::Borrowed(_) => Ok(Cow::Borrowed(s)),
        Cow::Owned(b) => String::from_utf8(b).map(Cow::Owned).map_err(|e| client_bytes(e.as_bytes())),
    }
}

/// A string field that must be text: a 400 naming `what` where it is not.
fn named<'a>(s: &'a str, what: &str) -> Result<Cow<'a, str>, RequestError> {
    text(s).map_err(|shown| RequestError::bad(format!("{what} {shown} is not UTF-8 text")))
}

fn param(p: &InferParameter) -> Param<'_> {
    match &p.parameter_choice {
        None => Param::Null,
        Some(ParameterChoice::BoolParam(b)) => Param::Bool(*b),
        Some(ParameterChoice::Int64Param(v)) => Param::Int(Some((*v).into())),
        Some(ParameterChoice::Uint64Param(v)) => Param::Int(Some((*v).into())),
        Some(ParameterChoice::DoubleParam(v)) => Param::Float(*v),
        Some(ParameterChoice::StringParam(s)) => Param::Str(s.as_str().into()),
    }
}

/// The `contents` field that carries each datatype (FP16 comes raw only).
fn contents_field(d: Datatype) -> Option<&'static str> {
    Some(match d {
        Datatype::Bool => "bool_contents",
        Datatype::Int8 | Datatype::Int16 | Datatype::Int32 => "int_contents",
        Datatype::Int64 => "int64_contents",
        Datatype::Uint8 | Datatype::Uint16 | Datatype::Uint32 => "uint_contents",
        Datatype::Uint64 => "uint64_contents",
        Datatype::Fp32 => "fp32_contents",
        Datatype::Fp64 => "fp64_contents",
        Datatype::Bytes => "bytes_contents",
        Datatype::Fp16 => return None,
    })
}

fn has_values(c: &InferTensorContents) -> bool {
    !(c.bool_contents.is_empty()
        && c.int_contents.is_empty()
        && c.int64_contents.is_empty()
        && c.uint_contents.is_empty()
        && c.uint64_contents.is_empty()
        && c.fp32_contents.is_empty()
        && c.fp64_contents.is_empty()
        && c.bytes_contents.is_empty())
}

/// An input's typed `contents` as `count` values of `datatype` in the tensor's binary form:
/// the count first, then each value in its datatype's range.
fn from_contents(
    name: &str,
    c: &InferTensorContents,
    datatype: Datatype,
    shape: &[usize],
    count: u64,
) -> Result<Bytes, RequestError> {
    let Some(field) = contents_field(datatype) else {
        return Err(RequestError::bad(format!("input '{name}' is {}: send it as raw_input_contents", datatype.name())));
    };
    let found = match datatype {
        Datatype::Bool => c.bool_contents.len(),
        Datatype::Int8 | Datatype::Int16 | Datatype::Int32 => c.int_contents.len(),
        Datatype::Int64 => c.int64_contents.len(),
        Datatype::Uint8 | Datatype::Uint16 | Datatype::Uint32 => c.uint_contents.len(),
        Datatype::Uint64 => c.uint64_contents.len(),
        Datatype::Fp32 => c.fp32_contents.len(),
        Datatype::Fp64 => c.fp64_contents.len(),
        _ => c.bytes_contents.len(),
    } as u64;
    if found != count {
        return Err(RequestError::bad(format!(
            "input '{name}' has shape {}, {}, but its {field} holds {}",
            list(shape),
            values_word(count),
            values_word(found)
        )));
    }
    let size = datatype.size().unwrap_or(0);
    let out_of_range = || {
        let (min, max) = int_range(datatype);
        RequestError::bad(format!("input '{name}' is {}: a value of its data is outside {min}..{max}", datatype.name()))
    };
    let mut out = Vec::with_capacity(count as usize * size);
    match datatype {
        Datatype::Bool => out.extend(c.bool_contents.iter().map(|&b| b as u8)),
        Datatype::Int8 | Datatype::Int16 | Datatype::Int32 | Datatype::Uint8 | Datatype::Uint16 | Datatype::Uint32 => {
            let (min, max) = int_range(datatype);
            let ints: Box<dyn Iterator<Item = i128>> = if field == "int_contents" {
                Box::new(c.int_contents.iter().map(|&v| i128::from(v)))
            } else {
                Box::new(c.uint_contents.iter().map(|&v| i128::from(v)))
            };
            for v in ints {
                if !(min..=max).contains(&v) {
                    return Err(out_of_range());
                }
                out.extend_from_slice(&v.to_le_bytes()[..size]);
            }
        }
        Datatype::Int64 => c.int64_contents.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Datatype::Uint64 => c.uint64_contents.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Datatype::Fp32 => c.fp32_contents.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Datatype::Fp64 => c.fp64_contents.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        _ => {
            for e in &c.bytes_contents {
                if let Err(why) = std::str::from_utf8(e) {
                    return Err(RequestError::bad(format!(
                        "input '{name}': a BYTES element is not UTF-8 text ({why}); ONNX strings are text"
                    )));
                }
            }
            out = binary::from_elements(c.bytes_contents.iter().map(|e| &e[..]));
        }
    }
    Ok(out.into())
}

/// A ModelInferRequest for `model`, every input of the model given (see [`decode_infer_with`]).
pub fn decode_infer(model: &ModelSpec, request: ModelInferRequest) -> Result<InferRequest, RequestError> {
    decode_infer_with(model, request, Checks::default())
}

/// A ModelInferRequest as the request the batcher runs, checked as HTTP's are: each input's
/// data from `raw_input_contents` (given for every input or none; a slice, no copy) or its
/// typed `contents`, never both; outputs always go back raw.
pub fn decode_infer_with(
    model: &ModelSpec,
    request: ModelInferRequest,
    checks: Checks,
) -> Result<InferRequest, RequestError> {
    let raw = &request.raw_input_contents;
    if !raw.is_empty() && raw.len() != request.inputs.len() {
        return Err(RequestError::bad(format!(
            "the request has {} raw_input_contents for {} inputs: give every input's data raw, or none",
            raw.len(),
            request.inputs.len()
        )));
    }
    if request.inputs.is_empty() {
        let takes: Vec<&str> = model.inputs.iter().map(|t| t.name.as_str()).collect();
        return Err(RequestError::bad(format!(
            "the request has no inputs; model '{}' takes {}",
            model.name,
            takes.join(", ")
        )));
    }
    let mut given: Vec<Option<Tensor>> = vec![None; model.inputs.len()];
    let mut order = Vec::with_capacity(request.inputs.len());
    for (k, input) in request.inputs.iter().enumerate() {
        let name = named(&input.name, &format!("inputs[{k}]'s name"))?;
        let index = input_index(model, &given, &name)?;
        let name = model.inputs[index].name.as_str();
        let datatype = datatype_named(model, index, &named(&input.datatype, &format!("input '{name}''s datatype"))?)?;
        let shown: Vec<String> = input.shape.iter().map(i64::to_string).collect();
        let dims: Vec<Dim<'_>> = input
            .shape
            .iter()
            .zip(&shown)
            .map(|(&d, s)| if d >= 0 { Dim::Size(d as u64) } else { Dim::Bad(s) })
            .collect();
        let (shape, count) = shape::declared(name, &dims)?;
        if input.parameters.contains_key("shared_memory_region") {
            return Err(RequestError::bad(format!(
                "input '{name}': shared memory is not supported by fastseq serve; send the data"
            )));
        }
        let contents = input.contents.as_ref().filter(|c| has_values(c));
        let data = match (raw.get(k), contents) {
            (Some(_), Some(_)) => {
                return Err(RequestError::bad(format!(
                    "input '{name}' has both contents and raw_input_contents: give one"
                )))
            }
            (Some(bytes), None) => binary::checked(name, bytes.clone(), datatype, &shape, count)?,
            (None, c) => from_contents(name, c.unwrap_or(&InferTensorContents::default()), datatype, &shape, count)?,
        };
        given[index] = Some(Tensor { datatype, shape, data });
        order.push(index);
    }
    let timeout = request_timeout(
        |key| request.parameters.get(key).map(param),
        |key| request.parameters.get(key).map_or(String::new(), |p| format!("{:?}", p.parameter_choice)),
    )?;
    let mut outputs: Vec<(usize, bool)> = Vec::new();
    for (k, o) in request.outputs.iter().enumerate() {
        let name = named(&o.name, &format!("outputs[{k}]'s name"))?;
        let index = output_index(model, &outputs, &name)?;
        let name = model.outputs[index].name.as_str();
        if o.parameters.get("classification").is_some_and(|p| param(p).truthy()) {
            return Err(RequestError::bad(format!(
                "output '{name}': the classification extension is not supported by fastseq serve"
            )));
        }
        if o.parameters.contains_key("shared_memory_region") {
            return Err(RequestError::bad(format!("output '{name}': shared memory is not supported by fastseq serve")));
        }
        outputs.push((index, true));
    }
    if outputs.is_empty() {
        outputs = (0..model.outputs.len()).map(|k| (k, true)).collect();
    }
    let id = match named(&request.id, "the request's id")? {
        id if id.is_empty() => None,
        id => Some(id.into_owned()),
    };
    let inputs = shape::against_model(model, given, &order, checks)?;
    Ok(InferRequest { id, inputs, outputs, timeout })
}

/// The answer to a request of `model` (its `id`): the outputs `asked` out of `outputs` (every
/// output of the model, in order), each as `raw_output_contents` (as Triton answers; the
/// bytes are the engine's, not copies).
pub fn encode_infer(
    model: &ModelSpec,
    id: Option<&str>,
    asked: &[(usize, bool)],
    outputs: &[Tensor],
) -> ModelInferResponse {
    // The asked indices come from the decode, which checked them against the model.
    let items = chosen(model, asked, outputs).unwrap_or_default();
    let mut response = ModelInferResponse {
        model_name: model.name.clone(),
        model_version: model.version.clone(),
        id: id.unwrap_or_default().to_string(),
        ..Default::default()
    };
    for (k, _, tensor) in items {
        response.outputs.push(InferOutputTensor {
            name: model.outputs[k].name.clone(),
            datatype: tensor.datatype.name().to_string(),
            shape: tensor.shape.iter().map(|&d| d as i64).collect(),
            ..Default::default()
        });
        response.raw_output_contents.push(tensor.data.clone());
    }
    response
}

pub fn server_metadata(version: &str) -> ServerMetadataResponse {
    ServerMetadataResponse {
        name: "fastseq".into(),
        version: version.into(),
        extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
    }
}

pub fn model_metadata(model: &ModelSpec) -> ModelMetadataResponse {
    let tensors = |ts: &[crate::tensor::TensorSpec]| {
        ts.iter()
            .map(|t| TensorMetadata { name: t.name.clone(), datatype: t.datatype.name().into(), shape: shape_of(t) })
            .collect()
    };
    ModelMetadataResponse {
        name: model.name.clone(),
        versions: vec![model.version.clone()],
        platform: PLATFORM.into(),
        inputs: tensors(&model.inputs),
        outputs: tensors(&model.outputs),
    }
}

/// Triton's model configuration of `model`, as HTTP's `/config` gives it.
pub fn model_config(model: &ModelSpec) -> ModelConfigResponse {
    ModelConfigResponse {
        config: Some(ModelConfig {
            name: model.name.clone(),
            platform: PLATFORM.into(),
            backend: BACKEND.into(),
            max_batch_size: model.max_batch_size.min(i32::MAX as usize) as i32,
            input: model
                .inputs
                .iter()
                .map(|t| ModelInput {
                    name: t.name.clone(),
                    data_type: t.datatype.config_number(),
                    dims: dims_of(model, t),
                })
                .collect(),
            output: model
                .outputs
                .iter()
                .map(|t| ModelOutput {
                    name: t.name.clone(),
                    data_type: t.datatype.config_number(),
                    dims: dims_of(model, t),
                })
                .collect(),
            dynamic_batching: model.batched().then(|| ModelDynamicBatching {
                preferred_batch_size: vec![],
                max_queue_delay_microseconds: model.max_delay_us,
            }),
        }),
    }
}

/// Triton's statistics extension as its message (see [`crate::protocol::documents::model_statistics`]).
pub fn model_statistics(stats: &[Statistics]) -> ModelStatisticsResponse {
    let d = |(count, ns): (u64, u64)| Some(StatisticDuration { count, ns });
    ModelStatisticsResponse {
        model_stats: stats
            .iter()
            .map(|s| ModelStatistics {
                name: s.name.clone(),
                version: s.version.clone(),
                last_inference: s.last_inference_ms,
                inference_count: s.inference_count,
                execution_count: s.execution_count,
                inference_stats: Some(InferStatistics {
                    success: d(s.success),
                    fail: d(s.fail),
                    queue: d(s.queue),
                    compute_input: d((s.compute_infer.0, 0)),
                    compute_infer: d(s.compute_infer),
                    compute_output: d((s.compute_infer.0, 0)),
                    cache_hit: d((0, 0)),
                    cache_miss: d((0, 0)),
                }),
                batch_stats: s
                    .batches
                    .iter()
                    .map(|&(size, runs, ns)| InferBatchStatistics {
                        batch_size: size,
                        compute_input: d((runs, 0)),
                        compute_infer: d((runs, ns)),
                        compute_output: d((runs, 0)),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
