//! The core as a Rust library: a program loads models from files, bytes and (path, root)
//! sources, composes them, writes the result to a file and to bytes, digests it and makes a
//! session's private copy, through the crate's own API (`fastseq::...`) alone.
use std::path::Path;

use bytes::Bytes;
use prost::Message;

use fastseq::codec::proto::tensor_shape_proto::{dimension::Value as Dim, Dimension};
use fastseq::codec::proto::{
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use fastseq::{compose, load, load_all, private_copy, Kind, Mode, Options, Source, LAYOUT};

fn vi(name: &str) -> ValueInfoProto {
    let dim = Dimension { value: Some(Dim::DimValue(16384)), ..Default::default() };
    let tensor = type_proto::Tensor {
        elem_type: Some(1),
        shape: Some(TensorShapeProto { dim: vec![dim], ..Default::default() }),
        ..Default::default()
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(tensor)), ..Default::default() }),
        ..Default::default()
    }
}

/// y = x * w: one float weight of 64 KB holding `seed`s, large enough to stay in its file.
fn scale(seed: u8) -> ModelProto {
    let node = NodeProto {
        op_type: Some("Mul".into()),
        input: vec!["x".into(), "w".into()],
        output: vec!["y".into()],
        name: Some("mul".into()),
        ..Default::default()
    };
    let w = TensorProto {
        name: Some("w".into()),
        dims: vec![16384],
        data_type: Some(1),
        raw_data: Some(Bytes::from(vec![seed; 65536])),
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17), ..Default::default() }],
        graph: Some(GraphProto {
            name: Some("scale".into()),
            node: vec![Bytes::from(node.encode_to_vec())],
            initializer: vec![w],
            input: vec![vi("x")],
            output: vec![vi("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn labels(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_rust_program_loads_composes_writes_digests_and_copies() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.onnx"), dir.path().join("b.onnx"));
    std::fs::write(&a, scale(1).encode_to_vec()).unwrap();
    std::fs::write(&b, scale(2).encode_to_vec()).unwrap();

    // Every form of source: a path, a path under a root folder, bytes.
    let sources = vec![Source::path(&a), Source::path_in(&b, dir.path()), Source::bytes(scale(3).encode_to_vec())];
    let merged = compose(sources, &labels(&["a", "b", "c"]), Options::default(), Mode::Range).unwrap();
    assert_eq!(merged.composition().labels, labels(&["a", "b", "c"]));
    assert_eq!(merged.summary().initializers, 3);
    assert!(!merged.is_linked());

    // Written with external data: the data file is the one the layout names.
    let out = dir.path().join("out.onnx");
    let saved = merged.save(&out, Some(true), LAYOUT.threshold).unwrap();
    assert_eq!(saved.data_files, [LAYOUT.data_file("out.onnx")]);
    assert_eq!(saved.model_bytes, std::fs::metadata(&out).unwrap().len());
    assert_eq!(saved.data_bytes, std::fs::metadata(dir.path().join("out.onnx.data")).unwrap().len());

    // Read back, it is the composition as the writer writes it: the same model, with the
    // stage map in its metadata, and the same stages.
    let back = load(Source::path(&out), None).unwrap();
    let written = merged.for_file();
    assert_eq!(back.to_bytes().unwrap(), written.to_bytes().unwrap());
    assert_ne!(written.to_bytes().unwrap(), merged.to_bytes().unwrap());
    let stages = |c: &fastseq::Composed| -> Vec<_> {
        c.composition().stages().into_iter().map(|s| (s.label, s.first, s.end)).collect()
    };
    assert_eq!(stages(&back), stages(&merged));
    let encoded = merged.encoded().unwrap();
    let mut buf = vec![0u8; encoded.len()];
    encoded.encode_into(&mut buf).unwrap();
    assert_eq!(buf, merged.to_bytes().unwrap());

    // The session cache's key is the model's, wherever its weights are.
    assert_eq!(back.digest().unwrap(), written.digest().unwrap());
    let other =
        compose(vec![Source::path(&b), Source::path(&a)], &labels(&["b", "a"]), Options::default(), Mode::Range)
            .unwrap();
    assert_ne!(other.digest().unwrap(), merged.digest().unwrap());

    // The private copy: the weights copied by the kernel, the models spilled onto it no
    // longer need their sources.
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let stages = load_all(vec![Source::path(&a), Source::path(&b)], &labels(&["a", "b"])).unwrap();
    let copy = private_copy(&[&merged, &stages[0], &stages[1]], &private.join("model.onnx"), Some(u64::MAX)).unwrap();
    assert!(private.join(LAYOUT.data_file("model.onnx")).is_file());
    let spilled = copy.spilled.expect("the models held ranges of their sources");
    let (want, digest) = (merged.to_bytes().unwrap(), merged.digest().unwrap());
    std::fs::remove_file(&a).unwrap();
    std::fs::remove_file(&b).unwrap();
    assert_eq!(spilled[0].to_bytes().unwrap(), want);
    assert_eq!(spilled[0].digest().unwrap(), digest);
    // The originals still point at the sources, now gone: a load error naming the file.
    let gone = merged.check_sources().unwrap_err();
    assert_eq!(gone.kind, Kind::Load);
    assert!(gone.message.contains("a.onnx"), "{}", gone.message);
}

#[test]
fn linked_models_are_saved_not_encoded_and_bad_sources_are_load_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, scale(1).encode_to_vec()).unwrap();
    let linked = compose(vec![Source::path(&path)], &labels(&["m"]), Options::default(), Mode::Link).unwrap();
    assert!(linked.is_linked());
    assert_eq!(linked.to_bytes().unwrap_err().kind, Kind::Export);
    let saved = linked.save(&dir.path().join("copy.onnx"), Some(true), LAYOUT.threshold).unwrap();
    assert_eq!(saved.model_bytes, std::fs::metadata(dir.path().join("copy.onnx")).unwrap().len());

    let missing = load(Source::path(Path::new("/nowhere/m.onnx")), Some("m")).unwrap_err();
    assert_eq!(missing.kind, Kind::Load);
    let garbage = load(Source::bytes(b"not a model".to_vec()), None).unwrap_err();
    assert_eq!(garbage.kind, Kind::Load);
}
