//! Streaming encode: a model written to any `Write` field by field, its weights copied
//! straight from their buffers (never a second copy of the whole model in memory).
use std::io::Write;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::codec::proto::{GraphProto, ModelProto, TensorProto};

/// Streams the protobuf encoding of `model` into `out`, byte-identical in content to
/// `encode_to_vec` up to field order (the graph and the initializers' `raw_data` go last,
/// which every protobuf parser accepts). Only one tensor's header is buffered at a time;
/// weights go straight from their source buffer to the writer.
pub fn write_streaming(model: &ModelProto, out: &mut impl Write) -> std::io::Result<u64> {
    let header = clone_without_graph(model).encode_to_vec();
    out.write_all(&header)?;
    let Some(graph) = model.graph.as_ref() else { return Ok(header.len() as u64) };

    // The graph's own small fields; its nodes and initializers are written one by one.
    let mut rest = Vec::with_capacity(1 << 12);
    encode_graph_fields(graph, &mut rest);
    let nodes_len: usize = graph.node.iter().map(|n| field_len(1, n.len())).sum();
    // A tensor streamed with its raw_data last has the same fields, so the same length.
    let init_len: usize = graph.initializer.iter().map(|t| field_len(5, t.encoded_len())).sum();
    let graph_len = nodes_len + rest.len() + init_len;
    let mut key = Vec::with_capacity(16);
    encode_key(7, WireType::LengthDelimited, &mut key);
    encode_varint(graph_len as u64, &mut key);
    out.write_all(&key)?;
    // Nodes are kept as bytes: each is copied as it is, behind its key and length.
    for node in &graph.node {
        key.clear();
        encode_key(1, WireType::LengthDelimited, &mut key);
        encode_varint(node.len() as u64, &mut key);
        out.write_all(&key)?;
        out.write_all(node)?;
    }
    out.write_all(&rest)?;
    // The initializers are counted as they are written, not in graph_len's share.
    let mut written = (header.len() + field_len(7, graph_len) - init_len) as u64;
    for tensor in &graph.initializer {
        written += write_tensor(5, tensor, out)?;
    }
    Ok(written)
}

/// The model's own fields (not the graph): small next to the graph, cloned to encode them.
fn clone_without_graph(m: &ModelProto) -> ModelProto {
    ModelProto {
        ir_version: m.ir_version,
        opset_import: m.opset_import.clone(),
        producer_name: m.producer_name.clone(),
        producer_version: m.producer_version.clone(),
        domain: m.domain.clone(),
        model_version: m.model_version,
        doc_string: m.doc_string.clone(),
        graph: None,
        metadata_props: m.metadata_props.clone(),
        training_info: m.training_info.clone(),
        functions: m.functions.clone(),
        configuration: m.configuration.clone(),
        unknown_fields: m.unknown_fields.clone(),
    }
}

/// Every field of `g` but its nodes and initializers, as prost would encode them.
fn encode_graph_fields(g: &GraphProto, buf: &mut Vec<u8>) {
    use crate::codec::fidelity::string;
    use prost::encoding::message;
    if let Some(name) = &g.name {
        string::encode(2, name, buf);
    }
    if let Some(doc) = &g.doc_string {
        string::encode(10, doc, buf);
    }
    message::encode_repeated(11, &g.input, buf);
    message::encode_repeated(12, &g.output, buf);
    message::encode_repeated(13, &g.value_info, buf);
    message::encode_repeated(14, &g.quantization_annotation, buf);
    message::encode_repeated(15, &g.sparse_initializer, buf);
    message::encode_repeated(16, &g.metadata_props, buf);
    buf.extend_from_slice(&g.unknown_fields);
}

fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn write_tensor(tag: u32, t: &TensorProto, out: &mut impl Write) -> std::io::Result<u64> {
    let mut rest = t.clone();
    let raw = rest.raw_data.take();
    let body_len = rest.encoded_len() + raw.as_ref().map_or(0, |r| field_len(9, r.len()));
    let mut buf = Vec::with_capacity(32 + rest.encoded_len());
    encode_key(tag, WireType::LengthDelimited, &mut buf);
    encode_varint(body_len as u64, &mut buf);
    rest.encode(&mut buf).expect("Vec grows");
    if let Some(raw) = &raw {
        encode_key(9, WireType::LengthDelimited, &mut buf);
        encode_varint(raw.len() as u64, &mut buf);
    }
    out.write_all(&buf)?;
    let mut n = buf.len() as u64;
    if let Some(raw) = raw {
        out.write_all(&raw)?;
        n += raw.len() as u64;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::codec::model::decode;
    use crate::codec::testing::sample_model;

    #[test]
    fn a_streamed_model_decodes_to_the_same_model() {
        let model = sample_model();
        let mut out = Vec::new();
        let written = write_streaming(&model, &mut out).unwrap();
        assert_eq!((written as usize, out.len()), (model.encoded_len(), model.encoded_len()));
        assert_eq!(decode("streamed", Bytes::from(out)).unwrap(), model);
    }
}
