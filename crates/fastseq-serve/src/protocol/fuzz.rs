//! A seeded fuzz test of both transports' decoders (issue 40, item 4): valid requests mutated
//! field by field (random Unicode, lone surrogates, huge and non-finite numbers, deep nesting,
//! every JSON kind where another is due) and byte by byte (invalid UTF-8, cuts, flips), for
//! HTTP JSON, HTTP binary and gRPC messages. Every request must decode or be refused with a
//! 4xx (never a panic, never a 500), and what decodes must hold exactly its shape's bytes and
//! encode back to valid JSON (or a 400 saying why not).
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use prost::Message;
use serde_json::{json, Value};

use super::grpc::{self, InferInputTensor, InferParameter, InferTensorContents, ModelInferRequest, ParameterChoice};
use super::json::decode_read;
use super::testing::{every, model, Rng};
use super::{decode_http_with, encode_http, Checks};
use crate::error::{RequestError, Status};
use crate::tensor::{Datatype, InferRequest, ModelSpec, Tensor};

/// Text spliced into JSON as it is: what serde_json's Value cannot hold.
const RAW: [&str; 12] = [
    "\"\\ud800\"",
    "\"a\\udc00b\"",
    "1e400",
    "-1e400",
    "100000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "NaN",
    "-Infinity",
    "1.5e-400",
    "18446744073709551616",
    "-9223372036854775809",
    "\"\\u0000\\n\\u2028\"",
    "{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
];

fn random_string(rng: &mut Rng) -> String {
    let n = rng.below(12);
    (0..n)
        .map(|_| match rng.below(6) {
            0 => char::from_u32(rng.below(0x20) as u32).unwrap(),
            1 => char::from_u32(0x10000 + rng.below(0x100000) as u32).unwrap_or('x'),
            2 => *rng.pick(&['\'', '"', '\\', '\u{2028}', '\u{85}', 'é', '\u{10ff41}']),
            _ => char::from(b'a' + rng.below(26) as u8),
        })
        .collect()
}

/// A hostile JSON value (its text): random kinds, strings, numbers and spliced raw text.
fn hostile(rng: &mut Rng) -> String {
    match rng.below(9) {
        0 => RAW[rng.below(RAW.len())].to_string(),
        1 => serde_json::to_string(&random_string(rng)).unwrap(),
        2 => (rng.next() as i64 >> rng.below(64)).to_string(),
        3 => format!("{:e}", f64::from_bits(rng.next()).clamp(-1e300, 1e300)),
        4 => format!("{}1{}", "[".repeat(rng.below(300)), "]".repeat(rng.below(300))),
        5 => "null".into(),
        6 => "true".into(),
        7 => "{}".into(),
        _ => format!(
            "[{}]",
            (0..rng.below(5)).map(|_| (rng.below(400) as i64 - 100).to_string()).collect::<Vec<_>>().join(",")
        ),
    }
}

/// A valid HTTP request of some of the model's inputs (JSON or binary each) and its binary parts.
fn valid_http(rng: &mut Rng) -> (Value, Vec<Vec<u8>>) {
    let mut items = Vec::new();
    let mut binary = Vec::new();
    for (d, data, bytes) in every() {
        if !rng.chance(3) {
            continue;
        }
        let name = format!("in_{}", d.name().to_lowercase());
        if rng.chance(2) {
            items.push(json!({"name": name, "datatype": d.name(), "shape": [1, 3],
                              "data": serde_json::from_str::<Value>(data).unwrap()}));
        } else {
            items.push(json!({"name": name, "datatype": d.name(), "shape": [1, 3],
                              "parameters": {"binary_data_size": bytes.len()}}));
            binary.push(bytes);
        }
    }
    let mut doc = json!({ "inputs": items });
    if rng.chance(2) {
        doc["id"] = json!("req");
        doc["parameters"] = json!({"timeout": 1000, "binary_data_output": rng.chance(2)});
        doc["outputs"] =
            json!([{"name": "out_fp32", "parameters": {"binary_data": rng.chance(2)}}, {"name": "out_bytes"}]);
    }
    (doc, binary)
}

/// Every place in a JSON document where a value sits, as pointers (`/inputs/0/shape/1`).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| pointers(v, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(k, v)| pointers(v, format!("{at}/{k}"), out)),
        _ => {}
    }
    out.push(at);
}

/// An HTTP body from a valid request, mutated.
fn mutated_http(rng: &mut Rng) -> (Bytes, Option<usize>) {
    let (mut doc, binary) = valid_http(rng);
    let mut spliced = Vec::new();
    for _ in 0..rng.below(3) {
        let mut places = Vec::new();
        pointers(&doc, String::new(), &mut places);
        let place = rng.pick(&places).clone();
        let marker = format!("@@{}@@", spliced.len());
        if let Some(slot) = doc.pointer_mut(&place) {
            *slot = Value::String(marker);
            spliced.push(hostile(rng));
        }
    }
    let mut text = serde_json::to_string(&doc).unwrap();
    for (k, raw) in spliced.iter().enumerate() {
        text = text.replace(&format!("\"@@{k}@@\""), raw);
    }
    let mut body = text.into_bytes();
    let mut header = body.len();
    for b in &binary {
        body.extend_from_slice(b);
    }
    if rng.chance(4) {
        for _ in 0..1 + rng.below(4) {
            if body.is_empty() {
                break;
            }
            let at = rng.below(body.len());
            match rng.below(4) {
                0 => body[at] = rng.next() as u8,
                1 => body.insert(at, *rng.pick(&[0xff, 0xc3, 0xed, 0x80, b'"', b'\\', b'[', b'{'])),
                2 => body.truncate(at),
                _ => body.splice(at..at, b"\xed\xa0\x80".iter().copied()).for_each(drop),
            }
        }
        header = header.min(body.len());
    }
    let header = match rng.below(8) {
        0 => Some(rng.below(body.len() + 10)),
        1 => None,
        _ if binary.is_empty() => None,
        _ => Some(header),
    };
    (body.into(), header)
}

/// A gRPC request from a valid one, mutated field by field or on the wire.
fn mutated_grpc(rng: &mut Rng) -> Option<ModelInferRequest> {
    let raw = rng.chance(2);
    let mut request = ModelInferRequest { model_name: "m".into(), ..Default::default() };
    for (d, _, bytes) in every() {
        if !rng.chance(3) {
            continue;
        }
        let mut input = InferInputTensor {
            name: format!("in_{}", d.name().to_lowercase()),
            datatype: d.name().into(),
            shape: vec![1, 3],
            ..Default::default()
        };
        if raw {
            request.raw_input_contents.push(bytes.into());
        } else if d == Datatype::Fp32 {
            input.contents =
                Some(InferTensorContents { fp32_contents: vec![1.0, f32::NAN, -0.0], ..Default::default() });
        } else {
            input.contents = Some(InferTensorContents { int64_contents: vec![1, 2, 3], ..Default::default() });
        }
        request.inputs.push(input);
    }
    for _ in 0..rng.below(4) {
        let Some(input) = (!request.inputs.is_empty()).then(|| rng.below(request.inputs.len())) else { break };
        let i = &mut request.inputs[input];
        match rng.below(8) {
            0 => i.name = random_string(rng),
            1 => i.datatype = random_string(rng),
            2 => i.shape = (0..rng.below(40)).map(|_| rng.next() as i64 >> rng.below(64)).collect(),
            3 => {
                i.contents = Some(InferTensorContents {
                    uint_contents: vec![rng.next() as u32; rng.below(5)],
                    ..Default::default()
                })
            }
            4 => request.raw_input_contents.push(Bytes::from(vec![0xff; rng.below(16)])),
            5 => {
                let choice = match rng.below(4) {
                    0 => ParameterChoice::Int64Param(rng.next() as i64),
                    1 => ParameterChoice::DoubleParam(f64::from_bits(rng.next())),
                    2 => ParameterChoice::StringParam(random_string(rng)),
                    _ => ParameterChoice::Uint64Param(rng.next()),
                };
                let key = rng.pick(&["timeout", "sequence_id", "x", "classification"]).to_string();
                request.parameters.insert(key, InferParameter { parameter_choice: Some(choice) });
            }
            6 => request
                .outputs
                .push(grpc::InferRequestedOutputTensor { name: random_string(rng), ..Default::default() }),
            _ => request.id = random_string(rng),
        }
    }
    if !rng.chance(3) {
        return Some(request);
    }
    let mut wire = request.encode_to_vec();
    for _ in 0..1 + rng.below(4) {
        if wire.is_empty() {
            break;
        }
        let at = rng.below(wire.len());
        match rng.below(3) {
            0 => wire[at] = rng.next() as u8,
            1 => wire.insert(at, 0xff),
            _ => wire.truncate(at),
        }
    }
    // A message prost cannot read is the transport's INVALID_ARGUMENT; what it reads goes on.
    ModelInferRequest::decode(Bytes::from(wire)).ok()
}

/// What a decode gave: a 4xx, or tensors that hold exactly their shapes, and an answer of
/// them (as outputs) that is valid JSON or a 400.
fn check(m: &ModelSpec, got: Result<InferRequest, RequestError>, what: &dyn Fn() -> String) {
    let request = match got {
        Err(e) => {
            assert_eq!(e.status, Status::BadRequest, "{}: {}", what(), e.message);
            assert!(e.message.len() < 1000, "{}: a long message: {}", what(), e.message);
            return;
        }
        Ok(r) => r,
    };
    for t in &request.inputs {
        if let Some(size) = t.datatype.size() {
            assert_eq!(t.data.len(), t.elements() * size, "{}", what());
        } else {
            super::binary::strings("x", &t.data, &t.shape, t.elements() as u64).unwrap();
        }
    }
    let outputs: Vec<Tensor> = m
        .outputs
        .iter()
        .map(|s| {
            request.inputs.iter().find(|t| t.datatype == s.datatype).cloned().unwrap_or(Tensor {
                datatype: s.datatype,
                shape: vec![0, 3],
                data: Bytes::new(),
            })
        })
        .collect();
    match encode_http(m, request.id.as_deref(), &request.outputs, &outputs) {
        Ok(e) => {
            let body = e.concat();
            let head = &body[..e.header_length.unwrap_or(body.len())];
            serde_json::from_slice::<Value>(head).unwrap_or_else(|x| panic!("{}: invalid answer: {x}", what()));
        }
        Err(e) => assert_eq!(e.status, Status::BadRequest, "{}: {}", what(), e.message),
    }
    let _ = grpc::encode_infer(m, request.id.as_deref(), &request.outputs, &outputs).encode_to_vec();
}

#[test]
fn seeded_fuzz_of_both_decoders() {
    let m = model();
    let mut rng = Rng(0x5eed_f00d_cafe_d00d);
    let (mut decoded, mut refused) = (0, 0);
    for n in 0..100_000 {
        let checks = Checks { every_input: rng.chance(4) };
        if n % 2 == 0 {
            let (body, header) = mutated_http(&mut rng);
            let got =
                catch_unwind(AssertUnwindSafe(|| decode_http_with(&m, &body, header, checks))).unwrap_or_else(|_| {
                    panic!("HTTP decode panicked on {:?} (header {header:?})", String::from_utf8_lossy(&body))
                });
            if got.is_ok() {
                decoded += 1
            } else {
                refused += 1
            }
            // the quick reader's answer is serde_json's, word for word
            let full = decode_read(&m, &body, header, checks, false).map(|(request, _)| request);
            assert_eq!(got, full, "HTTP {:?}", String::from_utf8_lossy(&body));
            check(&m, got, &|| format!("HTTP {:?}", String::from_utf8_lossy(&body[..body.len().min(400)])));
        } else if let Some(request) = mutated_grpc(&mut rng) {
            let shown = format!("{request:?}");
            let got = catch_unwind(AssertUnwindSafe(|| grpc::decode_infer_with(&m, request, checks)))
                .unwrap_or_else(|_| panic!("gRPC decode panicked on {shown}"));
            if got.is_ok() {
                decoded += 1
            } else {
                refused += 1
            }
            check(&m, got, &|| format!("gRPC {}", &shown[..shown.len().min(400)]));
        }
    }
    println!("decoded {decoded}, refused {refused}");
    // both outcomes were reached often: the mutations are neither all fatal nor all harmless
    assert!(decoded > 10_000 && refused > 30_000, "decoded {decoded}, refused {refused}");
}

/// Data lists mutated a byte at a time among JSON's own characters, where the quick reader
/// leaves the checking to `from_json`: every request decodes as serde_json's reader decodes
/// it, or is refused in its words.
#[test]
fn quick_reads_are_full_reads() {
    const SOUP: &[u8] = b"0123456789-+.eE,[] \t\n\"\\tfnrulasx{}:\x01";
    let m = model();
    let every = every();
    let mut rng = Rng(0x0dd_ba11_5eed);
    let (mut decoded, mut refused) = (0, 0);
    for _ in 0..100_000 {
        let (d, data, _) = rng.pick(&every);
        let mut data = if rng.chance(4) { format!("[{data}]") } else { data.to_string() }.into_bytes();
        for _ in 0..rng.below(4) {
            let at = rng.below(data.len() + 1);
            match rng.below(3) {
                0 if at < data.len() => drop(data.remove(at)),
                1 if at < data.len() => data[at] = *rng.pick(SOUP),
                _ => data.insert(at, *rng.pick(SOUP)),
            }
        }
        let body = format!(
            r#"{{"inputs":[{{"name":"in_{}","datatype":"{}","shape":[1,3],"data":{}}}]}}"#,
            d.name().to_lowercase(),
            d.name(),
            String::from_utf8_lossy(&data)
        );
        let body = Bytes::from(body);
        let checks = Checks { every_input: false };
        let quick = decode_read(&m, &body, None, checks, true);
        assert_eq!(quick, decode_read(&m, &body, None, checks, false), "{:?}", String::from_utf8_lossy(&body));
        if quick.is_ok() {
            decoded += 1
        } else {
            refused += 1
        }
    }
    assert!(decoded > 10_000 && refused > 10_000, "decoded {decoded}, refused {refused}");
}
