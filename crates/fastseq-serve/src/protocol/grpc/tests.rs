//! gRPC decode and encode: every datatype raw and typed, the same hostile declarations as
//! HTTP, contents beside raw data refused by name (issue 40), names that are not UTF-8, the
//! documents as messages, and the bytes on the wire as prost writes them.
use std::time::Duration;

use bytes::Bytes;
use prost::Message;

use super::*;
use crate::error::Status;
use crate::protocol::testing::{every, model};

fn partial() -> Checks {
    Checks { every_input: false }
}

fn input(d: Datatype, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: format!("in_{}", d.name().to_lowercase()),
        datatype: d.name().into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

fn refused(request: ModelInferRequest) -> String {
    let e = decode_infer_with(&model(), request, partial()).unwrap_err();
    assert_eq!(e.status, Status::BadRequest, "{}", e.message);
    assert!(e.message.len() < 600, "{}", e.message);
    e.message
}

/// Typed contents of every datatype but FP16 (raw only), from the binary form.
fn typed(d: Datatype, bytes: &[u8]) -> InferTensorContents {
    let mut c = InferTensorContents::default();
    let chunks = |n: usize| bytes.chunks_exact(n).map(|c| c.to_vec()).collect::<Vec<_>>();
    match d {
        Datatype::Bool => c.bool_contents = bytes.iter().map(|&b| b != 0).collect(),
        Datatype::Uint8 => c.uint_contents = bytes.iter().map(|&b| b.into()).collect(),
        Datatype::Uint16 => {
            c.uint_contents = chunks(2).iter().map(|c| u16::from_le_bytes([c[0], c[1]]).into()).collect()
        }
        Datatype::Uint32 => {
            c.uint_contents = chunks(4).iter().map(|c| u32::from_le_bytes(c[..4].try_into().unwrap())).collect()
        }
        Datatype::Uint64 => {
            c.uint64_contents = chunks(8).iter().map(|c| u64::from_le_bytes(c[..8].try_into().unwrap())).collect()
        }
        Datatype::Int8 => c.int_contents = bytes.iter().map(|&b| (b as i8).into()).collect(),
        Datatype::Int16 => c.int_contents = chunks(2).iter().map(|c| i16::from_le_bytes([c[0], c[1]]).into()).collect(),
        Datatype::Int32 => {
            c.int_contents = chunks(4).iter().map(|c| i32::from_le_bytes(c[..4].try_into().unwrap())).collect()
        }
        Datatype::Int64 => {
            c.int64_contents = chunks(8).iter().map(|c| i64::from_le_bytes(c[..8].try_into().unwrap())).collect()
        }
        Datatype::Fp32 => {
            c.fp32_contents = chunks(4).iter().map(|c| f32::from_le_bytes(c[..4].try_into().unwrap())).collect()
        }
        Datatype::Fp64 => {
            c.fp64_contents = chunks(8).iter().map(|c| f64::from_le_bytes(c[..8].try_into().unwrap())).collect()
        }
        Datatype::Bytes => c.bytes_contents = binary::elements(bytes).map(Bytes::copy_from_slice).collect(),
        Datatype::Fp16 => {}
    }
    c
}

#[test]
fn every_datatype_raw_and_typed_through_the_wire() {
    let m = model();
    let raw = ModelInferRequest {
        model_name: "m".into(),
        id: "r1".into(),
        inputs: every().iter().map(|(d, _, _)| input(*d, &[1, 3])).collect(),
        raw_input_contents: every().into_iter().map(|(_, _, b)| Bytes::from(b)).collect(),
        ..Default::default()
    };
    // encoded and decoded from Bytes as the transport does: raw contents are slices of it
    let wire = Bytes::from(raw.encode_to_vec());
    let got = decode_infer(&m, ModelInferRequest::decode(wire.clone()).unwrap()).unwrap();
    assert_eq!(got.id.as_deref(), Some("r1"));
    for ((d, _, bytes), t) in every().iter().zip(&got.inputs) {
        assert_eq!((t.datatype, &t.shape, &t.data[..]), (*d, &vec![1, 3], &bytes[..]), "{d:?}");
        assert!(wire.as_ptr_range().contains(&t.data.as_ptr()), "{d:?} was copied");
    }
    assert_eq!(got.outputs, (0..13).map(|k| (k, true)).collect::<Vec<_>>());
    for (d, _, bytes) in every() {
        let mut i = input(d, &[1, 3]);
        i.contents = Some(typed(d, &bytes));
        let request = ModelInferRequest { inputs: vec![i], ..Default::default() };
        match decode_infer_with(&m, request, partial()) {
            Ok(got) => assert_eq!(&got.inputs[0].data[..], &bytes[..], "{d:?}"),
            Err(e) => {
                assert!(d == Datatype::Fp16 && e.message.contains("send it as raw_input_contents"), "{}", e.message)
            }
        }
    }
    // the answer: raw_output_contents in the order asked, the engine's bytes
    let outputs: Vec<Tensor> =
        every().into_iter().map(|(d, _, b)| Tensor { datatype: d, shape: vec![1, 3], data: b.into() }).collect();
    let answer = encode_infer(&m, Some("r1"), &[(12, true), (0, true)], &outputs);
    let answer = ModelInferResponse::decode(Bytes::from(answer.encode_to_vec())).unwrap();
    assert_eq!((answer.model_name.as_str(), answer.model_version.as_str(), answer.id.as_str()), ("m", "1", "r1"));
    assert_eq!(answer.outputs[0].name, "out_bytes");
    assert_eq!(answer.outputs[1].shape, vec![1, 3]);
    assert_eq!(answer.raw_output_contents, vec![outputs[12].data.clone(), outputs[0].data.clone()]);
    let empty = [Tensor { datatype: Datatype::Fp32, shape: vec![0, 3], data: Bytes::new() }];
    let answer = encode_infer(&m, None, &[(0, true)], &empty);
    assert_eq!((answer.raw_output_contents[0].len(), answer.outputs[0].shape.clone()), (0, vec![0, 3]));
}

#[test]
fn requested_outputs_and_parameters() {
    let mut i = input(Datatype::Fp32, &[1, 3]);
    i.contents = Some(InferTensorContents { fp32_contents: vec![1.0, 2.0, 3.0], ..Default::default() });
    let p = |c: ParameterChoice| InferParameter { parameter_choice: Some(c) };
    let request = ModelInferRequest {
        inputs: vec![i],
        outputs: vec![
            InferRequestedOutputTensor { name: "out_int64".into(), ..Default::default() },
            InferRequestedOutputTensor { name: "out_fp32".into(), ..Default::default() },
        ],
        parameters: [("timeout".to_string(), p(ParameterChoice::Int64Param(2500)))].into(),
        ..Default::default()
    };
    let got = decode_infer_with(&model(), request.clone(), partial()).unwrap();
    assert_eq!(got.outputs, vec![(8, true), (10, true)]);
    assert_eq!(got.timeout, Some(Duration::from_micros(2500)));
    let with = |key: &str, c: ParameterChoice| {
        let mut r = request.clone();
        r.parameters = [(key.to_string(), p(c))].into();
        refused(r)
    };
    assert!(with("timeout", ParameterChoice::Int64Param(-5)).contains("timeout must be a positive integer"));
    assert!(with("timeout", ParameterChoice::DoubleParam(1e300)).contains("timeout must be a positive integer"));
    assert!(with("sequence_id", ParameterChoice::Uint64Param(3)).contains("sequence batching"));
    let mut twice = request.clone();
    twice.outputs[1].name = "out_int64".into();
    assert!(refused(twice).contains("asked for twice"));
    let mut unknown = request;
    unknown.outputs[1].name = "out_fp32x".into();
    let m = refused(unknown);
    assert!(m.contains("'out_fp32x' is not an output of model 'm' (did you mean 'out_fp"), "{m}");
}

#[test]
fn hostile_declarations_are_refused() {
    let raw = |i: InferInputTensor, b: &[u8]| ModelInferRequest {
        inputs: vec![i],
        raw_input_contents: vec![Bytes::copy_from_slice(b)],
        ..Default::default()
    };
    assert!(refused(raw(input(Datatype::Fp32, &[1_000_000_000, 3]), &[0; 12])).contains("binary_data_size is 12"));
    assert!(refused(raw(input(Datatype::Fp32, &[-1, 3]), &[0; 12])).contains("each axis must be an integer from 0"));
    assert!(refused(raw(input(Datatype::Fp32, &[1; 33]), &[0; 4])).contains("33 axes, more than 32"));
    assert!(refused(raw(input(Datatype::Fp32, &[1 << 62, 1 << 62]), &[0; 4])).contains("multiply past"));
    assert!(refused(raw(input(Datatype::Bytes, &[1, 3]), &[0; 8])).contains("only 8 bytes"));
    let lying = [&(1u32 << 31).to_le_bytes()[..], b"abcd"].concat();
    assert!(refused(raw(input(Datatype::Bytes, &[1]), &lying)).contains("runs past"));
    // contents beside raw data: refused by name (issue 40, item 5)
    let mut both = input(Datatype::Fp32, &[1, 3]);
    both.contents = Some(InferTensorContents { fp32_contents: vec![1.0; 3], ..Default::default() });
    assert!(refused(raw(both, &[0; 12])).contains("input 'in_fp32' has both contents and raw_input_contents"));
    let mut two = raw(input(Datatype::Fp32, &[1, 3]), &[0; 12]);
    two.inputs.push(input(Datatype::Int64, &[1, 3]));
    assert!(refused(two).contains("1 raw_input_contents for 2 inputs"));
    assert!(refused(ModelInferRequest::default()).contains("the request has no inputs; model 'm' takes in_bool"));
    // typed contents: the count, the range, UTF-8
    let typed_input = |d: Datatype, c: InferTensorContents| {
        let mut i = input(d, &[1, 3]);
        i.contents = Some(c);
        ModelInferRequest { inputs: vec![i], ..Default::default() }
    };
    let c = InferTensorContents { int_contents: vec![300, 0, 0], ..Default::default() };
    assert!(refused(typed_input(Datatype::Int8, c)).contains("outside -128..127"));
    let c = InferTensorContents { uint_contents: vec![1 << 20, 0, 0], ..Default::default() };
    assert!(refused(typed_input(Datatype::Uint16, c)).contains("outside 0..65535"));
    let c = InferTensorContents { fp64_contents: vec![1.0; 3], ..Default::default() };
    assert!(refused(typed_input(Datatype::Fp32, c)).contains("its fp32_contents holds 0 values"));
    let c = InferTensorContents { bytes_contents: vec![Bytes::from_static(b"\xff"); 3], ..Default::default() };
    assert!(refused(typed_input(Datatype::Bytes, c)).contains("not UTF-8"));
}

#[test]
fn names_that_are_not_utf8_are_shown_not_fatal() {
    // a message whose strings hold odd bytes decodes (the workspace's prost keeps them)
    let mut wire = Vec::new();
    let name = b"in_\xff\xfe";
    wire.extend_from_slice(&[0x2a, (name.len() + 2) as u8, 0x0a, name.len() as u8]); // inputs { name }
    wire.extend_from_slice(name);
    wire.extend_from_slice(&[0x0a, 3, b'm', 0xff, b'x']); // model_name
    let request = ModelInferRequest::decode(&wire[..]).unwrap();
    assert_eq!(text(&request.model_name), Err("'m\\xffx'".to_string()));
    let m = refused(request);
    assert!(m.contains("inputs[0]'s name 'in_\\xff\\xfe' is not UTF-8 text"), "{m}");
    let mut id = ModelInferRequest { inputs: vec![input(Datatype::Fp32, &[0])], ..Default::default() };
    id.id = ModelInferRequest::decode(&[0x1a, 1, 0x80][..]).unwrap().id;
    assert!(refused(id).contains("the request's id '\\x80' is not UTF-8 text"));
    assert_eq!(text("plain").unwrap(), "plain");
    let long = "Z\n".repeat(1_000_000);
    let mut i = input(Datatype::Fp32, &[1]);
    i.datatype = long;
    let m = refused(ModelInferRequest { inputs: vec![i], ..Default::default() });
    assert!(m.len() < 300 && !m.contains('\n'), "{m}");
}

#[test]
fn documents_as_messages() {
    let m = model();
    let config = model_config(&m).config.unwrap();
    assert_eq!((config.max_batch_size, config.input.len(), config.backend.as_str()), (8, 13, "fastseq"));
    assert_eq!((config.input[12].data_type, config.input[12].dims.clone()), (13, vec![3]));
    assert_eq!(config.dynamic_batching.unwrap().max_queue_delay_microseconds, 500);
    // The config's fields at Triton's numbers: max_batch_size 4, dynamic_batching 11, backend 17.
    let wire = model_config(&m).config.unwrap().encode_to_vec();
    assert!(
        wire.windows(2).any(|w| w == [0x20, 8])
            && wire.windows(3).any(|w| w == [0x8a, 0x01, 0x07])
            && wire.contains(&0x5a)
    );
    let meta = model_metadata(&m);
    assert_eq!((meta.inputs[0].name.as_str(), meta.inputs[0].shape.clone()), ("in_bool", vec![-1, 3]));
    assert_eq!(server_metadata("0.1.0").extensions.len(), 3);
    let s = Statistics {
        name: "m".into(),
        version: "1".into(),
        last_inference_ms: 5,
        inference_count: 4,
        execution_count: 2,
        success: (2, 20),
        fail: (0, 0),
        queue: (2, 4),
        compute_infer: (2, 10),
        batches: vec![(2, 2, 10)],
    };
    let stats = model_statistics(&[s]);
    let got = ModelStatisticsResponse::decode(Bytes::from(stats.encode_to_vec())).unwrap();
    let one = &got.model_stats[0];
    assert_eq!(one.inference_stats.as_ref().unwrap().compute_infer, Some(StatisticDuration { count: 2, ns: 10 }));
    assert_eq!(one.batch_stats[0].batch_size, 2);
}
