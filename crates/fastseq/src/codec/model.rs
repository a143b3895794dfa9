//! Decoding and encoding one model: bytes in, a [`ModelProto`] whose weights
//! (`TensorProto.raw_data`) stay `Bytes` slices of the input buffer, checked as prost would
//! check them (nodes are kept as bytes, see [`crate::codec::node`]) and against the tensor
//! sizes their types and dims need.
use bytes::Bytes;
use prost::Message;

use crate::codec::proto::{GraphProto, ModelProto, TensorProto};
use crate::codec::range::FileRange;
use crate::codec::tensor::{elem_type_name, expected_bytes, is_external};
use crate::error::{Error, Result};

/// The highest IR version the vendored schema describes. A newer model may carry fields
/// this schema does not know; prost would drop them silently, so such models are refused.
pub const MAX_IR_VERSION: i64 = 14;

/// Decodes one model. `label` names the source in every error message.
pub fn decode(label: &str, data: Bytes) -> Result<ModelProto> {
    decode_checked(label, data, true)
}

/// [`decode`] for a model whose weights were taken out on purpose ([`strip_weights`]):
/// initializers without data are expected until [`restore_weights`] puts them back.
pub fn decode_without_weights(label: &str, data: Bytes) -> Result<ModelProto> {
    decode_checked(label, data, false)
}

fn decode_checked(label: &str, data: Bytes, weights: bool) -> Result<ModelProto> {
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
    check_nodes(&model, weights).map_err(|e| match e {
        Invalid::Node(e) => {
            Error::load(format!("{label}: not a valid ONNX model ({size} bytes; corrupt or another file type): {e}"))
        }
        Invalid::Size(e) => Error::load(format!("{label}: {e}")),
    })?;
    Ok(model)
}

/// Decodes a serialized `GraphProto` as the graph of a model that has nothing else (its IR
/// version the newest this schema describes), checked as a model's graph is.
pub fn decode_graph(label: &str, data: &[u8]) -> Result<ModelProto> {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let mut buf = Vec::with_capacity(data.len() + 16);
    encode_key(1, WireType::Varint, &mut buf);
    encode_varint(MAX_IR_VERSION as u64, &mut buf);
    encode_key(7, WireType::LengthDelimited, &mut buf);
    encode_varint(data.len() as u64, &mut buf);
    buf.extend_from_slice(data);
    decode(label, Bytes::from(buf))
}

enum Invalid {
    Node(String),
    Size(String),
}

/// A tensor's data must be what its type and dims say: `raw_data` exactly as long as they
/// need, or typed data with one value per element. ONNX Runtime refuses it otherwise (some
/// only later: dims of `[2^40, 2^40]` and no data fail there as an overflow), and exported
/// with external data it would no longer load. External tensors are sized when their data
/// is resolved; `weights` false skips the check that data is present (a model whose
/// weights were taken out on purpose, see [`strip_weights`]).
fn check_tensor_size(t: &TensorProto, weights: bool) -> std::result::Result<(), Invalid> {
    if is_external(t) {
        return Ok(());
    }
    let shown = || format!("tensor '{}' ({} {:?})", t.name(), elem_type_name(t.data_type.unwrap_or(0)), t.dims);
    let need = expected_bytes(t).map_err(|e| Invalid::Size(format!("tensor '{}': {e}", t.name())))?;
    let count = element_count(t).map_err(|e| Invalid::Size(format!("tensor '{}': {e}", t.name())))?;
    if let Some(raw) = &t.raw_data {
        return match need {
            Some(need) if need != raw.len() as u64 => Err(Invalid::Size(format!(
                "{} holds {} bytes of raw_data but its type and dims need {need}",
                shown(),
                raw.len()
            ))),
            _ => Ok(()),
        };
    }
    let typed = t.float_data.len()
        + t.int32_data.len()
        + t.string_data.len()
        + t.int64_data.len()
        + t.double_data.len()
        + t.uint64_data.len();
    if typed == 0 {
        if weights && count > 0 {
            return Err(Invalid::Size(format!("{} has no data, but its dims say {count} elements", shown())));
        }
        return Ok(());
    }
    // One value per element in the field its type uses (complex: two); packed types aside.
    let per_element: Option<(usize, u64)> = match t.data_type.unwrap_or(0) {
        1 => Some((t.float_data.len(), 1)),
        2..=6 | 9 | 10 | 16 => Some((t.int32_data.len(), 1)),
        7 => Some((t.int64_data.len(), 1)),
        8 => Some((t.string_data.len(), 1)),
        11 => Some((t.double_data.len(), 1)),
        12 | 13 => Some((t.uint64_data.len(), 1)),
        14 => Some((t.float_data.len(), 2)),
        15 => Some((t.double_data.len(), 2)),
        _ => None,
    };
    match per_element {
        Some((have, k)) if have as u64 != count.saturating_mul(k) => {
            Err(Invalid::Size(format!("{} holds {have} values but its dims say {count} elements", shown())))
        }
        _ => Ok(()),
    }
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

/// The number of elements a tensor's dims say it has.
fn element_count(t: &TensorProto) -> std::result::Result<u64, String> {
    t.dims.iter().try_fold(1u64, |n, &d| {
        let d = u64::try_from(d).map_err(|_| format!("negative dimension {d} in {:?}", t.dims))?;
        n.checked_mul(d).ok_or_else(|| format!("dims {:?} overflow", t.dims))
    })
}

/// Nodes are kept as bytes (see [`crate::codec::node`]), so what prost would have checked in them
/// (UTF-8 strings, well-formed attributes, subgraphs at any depth) is checked here, with the
/// sizes of the tensors in graphs and attributes (`weights`: see [`check_tensor_size`]).
fn check_nodes(model: &ModelProto, weights: bool) -> std::result::Result<(), Invalid> {
    let c = Checker { weights };
    model.graph.iter().try_for_each(|g| c.graph(g, 0))?;
    for t in &model.training_info {
        t.initialization.iter().chain(t.algorithm.iter()).try_for_each(|g| c.graph(g, 0))?;
    }
    model.functions.iter().try_for_each(|f| c.nodes(&f.node, 0))
}

struct Checker {
    weights: bool,
}

impl Checker {
    fn tensor(&self, t: &TensorProto) -> std::result::Result<(), Invalid> {
        check_tensor_size(t, self.weights)
    }

    fn graph(&self, g: &GraphProto, depth: usize) -> std::result::Result<(), Invalid> {
        if depth > crate::codec::node::MAX_NESTING {
            return Err(Invalid::Node(format!("subgraphs nested more than {} deep", crate::codec::node::MAX_NESTING)));
        }
        g.initializer.iter().try_for_each(|t| self.tensor(t))?;
        for s in &g.sparse_initializer {
            s.values.iter().chain(s.indices.iter()).try_for_each(|t| self.tensor(t))?;
        }
        for (k, raw) in g.node.iter().enumerate() {
            let decoded = crate::codec::node::check(raw)
                .map_err(|e| Invalid::Node(format!("node {k} of graph '{}': {e}", g.name())))?;
            if let Some(n) = decoded {
                self.attributes(&n)?;
                crate::codec::node::subgraphs(&n).try_for_each(|sub| self.graph(sub, depth + 1))?;
            }
        }
        Ok(())
    }

    fn attributes(&self, n: &crate::codec::proto::NodeProto) -> std::result::Result<(), Invalid> {
        n.attribute.iter().flat_map(|a| a.t.iter().chain(a.tensors.iter())).try_for_each(|t| self.tensor(t))
    }

    fn nodes(&self, ns: &[crate::codec::proto::NodeProto], depth: usize) -> std::result::Result<(), Invalid> {
        ns.iter().try_for_each(|n| self.attributes(n))?;
        ns.iter().flat_map(crate::codec::node::subgraphs).try_for_each(|sub| self.graph(sub, depth + 1))
    }
}

/// The check [`decode`] makes that [`decode_without_weights`] skips, on the main graph's
/// initializers: each holds the data its type and dims say (a weight left in its source file
/// is external, sized when it was left there).
pub fn check_weights_present(label: &str, model: &ModelProto) -> Result<()> {
    let Some(g) = model.graph.as_ref() else { return Ok(()) };
    for t in &g.initializer {
        check_tensor_size(t, true).map_err(|e| match e {
            Invalid::Node(e) | Invalid::Size(e) => Error::load(format!("{label}: {e}")),
        })?;
    }
    Ok(())
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

#[cfg(test)]
mod size_tests {
    use super::*;

    fn model_with(t: TensorProto) -> Bytes {
        let g = GraphProto { name: Some("g".into()), initializer: vec![t], ..Default::default() };
        Bytes::from(ModelProto { ir_version: Some(8), graph: Some(g), ..Default::default() }.encode_to_vec())
    }

    fn tensor(dims: &[i64]) -> TensorProto {
        TensorProto { name: Some("w".into()), data_type: Some(1), dims: dims.to_vec(), ..Default::default() }
    }

    #[test]
    fn tensor_data_must_match_its_dims() {
        let huge = tensor(&[1 << 40, 1 << 40]);
        let e = decode("m.onnx", model_with(huge)).unwrap_err();
        assert!(e.message.contains("m.onnx: tensor 'w'") && e.message.contains("overflow"), "{}", e.message);
        let empty = tensor(&[2, 3]);
        let e = decode("m.onnx", model_with(empty.clone())).unwrap_err();
        assert!(e.message.contains("has no data, but its dims say 6 elements"), "{}", e.message);
        // Taken out on purpose: fine until the weights are put back.
        assert!(decode_without_weights("m.onnx", model_with(empty)).is_ok());
        let short = TensorProto { float_data: vec![1.0; 5], ..tensor(&[2, 3]) };
        let e = decode("m.onnx", model_with(short)).unwrap_err();
        assert!(e.message.contains("holds 5 values but its dims say 6 elements"), "{}", e.message);
        let right = TensorProto { float_data: vec![1.0; 6], ..tensor(&[2, 3]) };
        assert!(decode("m.onnx", model_with(right)).is_ok());
        assert!(decode("m.onnx", model_with(tensor(&[0, 3]))).is_ok(), "an empty tensor needs no data");
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message;

    use super::*;
    use crate::codec::testing::sample_model;
    use crate::error::Kind;

    #[test]
    fn decode_encode_decode_round_trips() {
        let model = sample_model();
        let bytes = model.encode_to_vec();
        let once = decode("m", Bytes::from(bytes.clone())).unwrap();
        assert_eq!(once, model);
        let again = once.encode_to_vec();
        assert_eq!(again, bytes, "the same bytes out");
        assert_eq!(decode("m", Bytes::from(again)).unwrap(), once);
        let mut buf = vec![0u8; once.encoded_len()];
        encode_into(&once, &mut buf).unwrap();
        assert_eq!(buf, bytes);
    }

    #[test]
    fn stripped_weights_come_back() {
        let model = sample_model();
        let stripped = strip_weights(&model, 1024);
        let inits = &stripped.graph.as_ref().unwrap().initializer;
        assert!(inits[0].raw_data.is_some() && inits[1].raw_data.is_none(), "only the large one goes");
        let decoded = decode_without_weights("s", Bytes::from(stripped.encode_to_vec())).unwrap();
        assert_eq!(restore_weights(decoded, &model, "s").unwrap(), model);
    }

    #[test]
    fn bad_bytes_are_load_errors() {
        assert!(decode("e", Bytes::new()).unwrap_err().message.contains("empty input"));
        let err = decode("junk", Bytes::from_static(b"\xff\xff\xff\xff")).unwrap_err();
        assert_eq!(err.kind, Kind::Load);
        assert!(err.message.starts_with("junk: not a valid ONNX model"));
        let mut cut = sample_model().encode_to_vec();
        cut.truncate(cut.len() - 3);
        assert_eq!(decode("cut", Bytes::from(cut)).unwrap_err().kind, Kind::Load);
        let mut short = sample_model();
        short.graph.as_mut().unwrap().initializer[0].raw_data = Some(Bytes::from_static(&[0; 4]));
        let err = decode("short", Bytes::from(short.encode_to_vec())).unwrap_err();
        assert!(err.message.ends_with("holds 4 bytes of raw_data but its type and dims need 16"), "{}", err.message);
    }
}
