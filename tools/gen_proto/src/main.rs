//! Generates the prost types for ONNX with a pure-Rust protobuf compiler (protox), so no
//! system `protoc` is needed, and writes them into the source tree where they are checked in.
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let proto_dir = root.join("rust/proto");
    let out_dir = root.join("rust/src/proto");
    let fds = protox::compile([proto_dir.join("onnx-ml.proto")], [&proto_dir])
        .expect("compile onnx-ml.proto");
    let mut config = prost_build::Config::new();
    // Weights stay `Bytes`: decoding from a `Bytes` over an mmap slices instead of copying.
    config.bytes([".onnx.TensorProto.raw_data"]);
    config.out_dir(&out_dir);
    config.compile_fds(fds).expect("generate rust code");
    println!("wrote {}", out_dir.join("onnx.rs").display());
}
