//! Generates the prost types for ONNX with a pure-Rust protobuf compiler (protox), so no
//! system `protoc` is needed, and writes them into the source tree where they are checked in.
use std::path::PathBuf;

use prost_types::field_descriptor_proto::Type;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let proto_dir = root.join("crates/fastseq/proto");
    let out_dir = root.join("crates/fastseq/src/codec/proto");
    let mut fds = protox::compile([proto_dir.join("onnx-ml.proto")], [&proto_dir]).expect("compile onnx-ml.proto");
    // Graph nodes are kept as their encoded bytes (the wire format of an embedded message and
    // of `bytes` is the same): decoding a graph then allocates nothing per node, and
    // `fastseq::node` reads and rewrites them in place. See crates/fastseq/src/codec/node.rs.
    let node = fds
        .file
        .iter_mut()
        .flat_map(|f| f.message_type.iter_mut())
        .filter(|m| m.name() == "GraphProto")
        .flat_map(|m| m.field.iter_mut())
        .find(|f| f.name() == "node")
        .expect("GraphProto.node");
    node.set_type(Type::Bytes);
    node.type_name = None;
    let mut config = prost_build::Config::new();
    // Weights and nodes stay `Bytes`: decoding from a `Bytes` over an mmap slices instead of copying.
    config.bytes([".onnx.TensorProto.raw_data", ".onnx.GraphProto.node"]);
    config.out_dir(&out_dir);
    config.compile_fds(fds).expect("generate rust code");
    keep_unknown_fields(&out_dir.join("onnx.rs"));
    println!("wrote {}", out_dir.join("onnx.rs").display());
}

/// Gives every message an `unknown_fields` member, which fastseq's prost-derive
/// (crates/vendor/prost-derive) fills with the fields the schema does not know, as protobuf
/// keeps them (see crates/fastseq/src/codec/fidelity.rs). A `Vec<u8>` is not `Copy`: a
/// message deriving it no longer does.
fn keep_unknown_fields(path: &std::path::Path) {
    let text = std::fs::read_to_string(path).expect("read the generated code");
    let mut out = String::with_capacity(text.len() + 8192);
    let mut in_message = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with("#[derive(") && trimmed.contains("::prost::Message") {
            in_message = true;
            out.push_str(&line.replace("Copy, ", ""));
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if in_message && trimmed.starts_with("pub struct ") && trimmed.ends_with('{') {
            in_message = false;
            out.push_str(&format!(
                "{indent}    /// Fields this schema does not know, as read (see `codec::fidelity`).\n\
                 {indent}    pub unknown_fields: ::prost::alloc::vec::Vec<u8>,\n"
            ));
        }
    }
    std::fs::write(path, out).expect("write the generated code");
}
