//! Decoding and encoding one model: bytes in, a [`ModelProto`] whose weights
//! (`TensorProto.raw_data`) stay `Bytes` slices of the input buffer, checked as prost would
//! check them (nodes are kept as bytes, see [`crate::codec::node`]) and against the tensor
//! sizes their types and dims need.
use bytes::Bytes;
use prost::Message;

use crate::codec::proto::{GraphProto, ModelProto, TensorProto};
use crate::codec::range::FileRange;
use crate::codec::tensor::{elem_type_name, expected_bytes};
use crate::error::{Error, Result};

/// The highest IR version the vendored schema describes. A newer model may carry fields
/// this schema does not know; prost would drop them silently, so such models are refused.
pub const MAX_IR_VERSION: i64 = 14;

/// Decodes one model. `label` names the source in every error message.
pub fn decode(label: &str, data: Bytes) -> Result<ModelProto> {
    if data.is_empty() {
        return Err(Error::load(format!("{label}: empty input (0 bytes), not an ONNX model")));
    }
    let size = data.len();
    let model = ModelProto::decode(data).map_err(|e| {
        Error::load(format!(
            "{label}: not a valid ONNX model ({size} bytes; truncated, corrupt or another file type): {e}"
        ))
    })?;
    check_decoded(label, &model)?;
    check_nodes(&model).map_err(|e| match e {
        Invalid::Node(e) => {
            Error::load(format!("{label}: not a valid ONNX model ({size} bytes; corrupt or another file type): {e}"))
        }
        Invalid::Size(e) => Error::load(format!("{label}: {e}")),
    })?;
    Ok(model)
}

enum Invalid {
    Node(String),
    Size(String),
}

/// A tensor's `raw_data` must be as long as its type and dims need: ONNX Runtime refuses
/// it otherwise, and exported with external data it would no longer load.
fn check_raw_size(t: &TensorProto) -> std::result::Result<(), Invalid> {
    let Some(raw) = &t.raw_data else { return Ok(()) };
    size_error(t, raw.len() as u64).map_or(Ok(()), |e| Err(Invalid::Size(e)))
}

/// What is wrong with a tensor holding `len` bytes of `raw_data`, if its type and dims need
/// another number (or are invalid).
pub fn size_error(t: &TensorProto, len: u64) -> Option<String> {
    match expected_bytes(t) {
        Err(e) => Some(format!("tensor '{}': {e}", t.name())),
        Ok(Some(need)) if need != len => Some(format!(
            "tensor '{}' ({} {:?}) holds {len} bytes of raw_data but its type and dims need {need}",
            t.name(),
            elem_type_name(t.data_type.unwrap_or(0)),
            t.dims,
        )),
        Ok(_) => None,
    }
}

/// Nodes are kept as bytes (see [`crate::codec::node`]), so what prost would have checked in them
/// (UTF-8 strings, well-formed attributes, subgraphs at any depth) is checked here, with the
/// sizes of the tensors in graphs and attributes.
fn check_nodes(model: &ModelProto) -> std::result::Result<(), Invalid> {
    fn graph(g: &GraphProto, depth: usize) -> std::result::Result<(), Invalid> {
        if depth > crate::codec::node::MAX_NESTING {
            return Err(Invalid::Node(format!("subgraphs nested more than {} deep", crate::codec::node::MAX_NESTING)));
        }
        g.initializer.iter().try_for_each(check_raw_size)?;
        for s in &g.sparse_initializer {
            s.values.iter().chain(s.indices.iter()).try_for_each(check_raw_size)?;
        }
        for (k, raw) in g.node.iter().enumerate() {
            let decoded = crate::codec::node::check(raw)
                .map_err(|e| Invalid::Node(format!("node {k} of graph '{}': {e}", g.name())))?;
            if let Some(n) = decoded {
                attributes(&n)?;
                crate::codec::node::subgraphs(&n).try_for_each(|sub| graph(sub, depth + 1))?;
            }
        }
        Ok(())
    }
    fn attributes(n: &crate::codec::proto::NodeProto) -> std::result::Result<(), Invalid> {
        n.attribute.iter().flat_map(|a| a.t.iter().chain(a.tensors.iter())).try_for_each(check_raw_size)
    }
    fn nodes(ns: &[crate::codec::proto::NodeProto], depth: usize) -> std::result::Result<(), Invalid> {
        ns.iter().try_for_each(attributes)?;
        ns.iter().flat_map(crate::codec::node::subgraphs).try_for_each(|sub| graph(sub, depth + 1))
    }
    model.graph.iter().try_for_each(|g| graph(g, 0))?;
    for t in &model.training_info {
        t.initialization.iter().chain(t.algorithm.iter()).try_for_each(|g| graph(g, 0))?;
    }
    model.functions.iter().try_for_each(|f| nodes(&f.node, 0))
}

fn check_decoded(label: &str, model: &ModelProto) -> Result<()> {
    let ir = model.ir_version.unwrap_or(0);
    if model.graph.is_none() || ir <= 0 {
        return Err(Error::load(format!(
            "{label}: not an ONNX model (no graph or no IR version; is it a tensor or another protobuf?)"
        )));
    }
    if ir > MAX_IR_VERSION {
        return Err(Error::load(format!(
            "{label}: IR version {ir} is newer than this fastseq understands (up to {MAX_IR_VERSION}); \
             fields it does not know would be lost, so it is refused. Upgrade fastseq."
        )));
    }
    Ok(())
}

/// C++ protobuf (onnx, ONNX Runtime) cannot parse a message of 2 GiB or more; a margin
/// leaves room for what a reader adds.
pub const PROTOBUF_LIMIT: u64 = (2u64 << 30) - (16 << 20);

/// Encodes into a caller-provided buffer of exactly `model.encoded_len()` bytes.
pub fn encode_into(model: &ModelProto, mut buf: &mut [u8]) -> Result<()> {
    model.encode(&mut buf).map_err(|e| Error::export(format!("cannot encode the merged model: {e}")))
}

/// A copy of `model` whose main-graph initializers of at least `threshold` bytes (and those
/// still in their source files) have no data: what a tool that only reads the structure (the
/// opset converter) needs.
pub fn strip_weights(model: &ModelProto, threshold: usize) -> ModelProto {
    let mut m = model.clone();
    if let Some(g) = m.graph.as_mut() {
        for t in &mut g.initializer {
            if FileRange::of(t).is_some() {
                t.external_data.clear();
                t.data_location = None;
            }
            if t.raw_data.as_ref().is_some_and(|r| r.len() >= threshold) {
                t.raw_data = None;
            }
        }
    }
    m
}

/// Puts back the weights that [`strip_weights`] took out, by initializer name, from
/// `original` (slices of the same buffers, or the same ranges: nothing is copied).
pub fn restore_weights(mut stripped: ModelProto, original: &ModelProto, label: &str) -> Result<ModelProto> {
    let Some(src) = original.graph.as_ref() else { return Ok(stripped) };
    let weights: std::collections::HashMap<&str, &TensorProto> = src
        .initializer
        .iter()
        .filter(|t| t.raw_data.is_some() || FileRange::of(t).is_some())
        .filter_map(|t| Some((t.name.as_deref()?, t)))
        .collect();
    if let Some(g) = stripped.graph.as_mut() {
        for t in &mut g.initializer {
            if t.raw_data.is_none() && t.float_data.is_empty() && t.int32_data.is_empty() && t.int64_data.is_empty() {
                match weights.get(t.name()) {
                    Some(w) => match (&w.raw_data, FileRange::of(w)) {
                        (_, Some(r)) => r.put(t),
                        (Some(raw), None) => t.raw_data = Some(raw.clone()),
                        (None, None) => {}
                    },
                    None if t.dims.contains(&0) => {}
                    None => {
                        return Err(Error::load(format!(
                            "{label}: after conversion, initializer '{}' has no weights to restore",
                            t.name()
                        )))
                    }
                }
            }
        }
    }
    Ok(stripped)
}
