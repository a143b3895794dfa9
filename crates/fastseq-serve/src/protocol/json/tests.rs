//! HTTP decode and encode: every datatype both ways, requested outputs and parameters, and
//! the hostile and malformed requests of tests/serving/test_protocol.py, refused in its words.
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::*;
use crate::error::Status;
use crate::protocol::encode_http;
use crate::protocol::testing::{every, http, model};

fn partial() -> Checks {
    Checks { every_input: false }
}

fn decode(body: &Bytes, header: Option<usize>) -> Result<InferRequest, RequestError> {
    decode_http_with(&model(), body, header, partial())
}

/// The error's message, checked to be a 400.
fn refused(body: impl Into<Bytes>, header: Option<usize>) -> String {
    let e = decode(&body.into(), header).unwrap_err();
    assert_eq!(e.status, Status::BadRequest, "{}", e.message);
    assert!(e.message.len() < 600, "{}", e.message);
    e.message
}

fn doc(item: Value) -> String {
    let mut base = json!({"name": "in_fp32", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]});
    for (k, v) in item.as_object().unwrap() {
        base[k] = v.clone();
    }
    json!({ "inputs": [base] }).to_string()
}

fn input_name(d: Datatype) -> String {
    format!("in_{}", d.name().to_lowercase())
}

#[test]
fn every_datatype_decodes_exactly_json_and_binary() {
    let m = model();
    let items: Vec<Value> = every()
        .iter()
        .map(|(d, data, _)| {
            let data: Value = serde_json::from_str(data).unwrap();
            json!({"name": input_name(*d), "datatype": d.name(), "shape": [1, 3], "data": data})
        })
        .collect();
    let (body, header) = http(json!({ "inputs": items }), &[]);
    let got = decode_http(&m, &body, header).unwrap();
    for ((d, _, bytes), t) in every().iter().zip(&got.inputs) {
        assert_eq!((t.datatype, &t.shape, &t.data[..]), (*d, &vec![1, 3], &bytes[..]), "{d:?}");
    }
    // binary, in reverse order: the tensors still come in the model's order, as slices of the body
    let mut items = Vec::new();
    let mut raws = Vec::new();
    for (d, _, bytes) in every().iter().rev() {
        items.push(json!({"name": input_name(*d), "datatype": d.name(), "shape": [1, 3],
                          "parameters": {"binary_data_size": bytes.len()}}));
        raws.push(bytes.clone());
    }
    let raw_refs: Vec<&[u8]> = raws.iter().map(Vec::as_slice).collect();
    let (body, header) = http(json!({ "inputs": items }), &raw_refs);
    let got = decode_http(&m, &body, header).unwrap();
    for ((d, _, bytes), t) in every().iter().zip(&got.inputs) {
        assert_eq!((t.datatype, &t.data[..]), (*d, &bytes[..]), "{d:?}");
        let within = body.as_ptr_range();
        assert!(within.contains(&t.data.as_ptr()) || t.data.is_empty(), "{d:?} was copied");
    }
    assert_eq!(got.outputs, (0..13).map(|k| (k, false)).collect::<Vec<_>>());
}

#[test]
fn requested_outputs_ids_and_parameters() {
    let mut d: Value = serde_json::from_str(&doc(json!({}))).unwrap();
    d["id"] = json!("abc");
    d["parameters"] = json!({"timeout": 2500, "binary_data_output": true, "unknown": [1, {"x": null}]});
    d["outputs"] = json!([{"name": "out_int64", "parameters": {"binary_data": false}}, {"name": "out_fp32"}]);
    let got = decode(&d.to_string().into(), None).unwrap();
    assert_eq!(got.id.as_deref(), Some("abc"));
    assert_eq!(got.timeout, Some(Duration::from_micros(2500)));
    assert_eq!(got.outputs, vec![(8, false), (10, true)]);
    d["outputs"] = json!([]); // as none: every output, binary as the request says
    let got = decode(&d.to_string().into(), None).unwrap();
    assert_eq!(got.outputs, (0..13).map(|k| (k, true)).collect::<Vec<_>>());
    d["id"] = Value::Null;
    assert_eq!(decode(&d.to_string().into(), None).unwrap().id, None);
}

#[test]
fn every_input_is_needed_by_default() {
    let e = decode_http(&model(), &doc(json!({})).into(), None).unwrap_err();
    assert!(e.message.starts_with("missing inputs: in_bool, in_uint8"), "{}", e.message);
}

#[test]
fn hostile_requests_are_refused_before_allocation() {
    assert!(refused(doc(json!({"shape": [1_000_000_000u64], "data": [1.0]})), None).contains("1000000000 values"));
    for shape in [json!([-1, 3]), json!([9223372036854775808u64, 3]), json!([1.5, 3]), json!([true, 3]), json!(["3"])] {
        assert!(refused(doc(json!({ "shape": shape })), None).contains("each axis must be an integer from 0"));
    }
    assert!(refused(doc(json!({"shape": vec![1; 33]})), None).contains("33 axes, more than 32"));
    assert!(refused(doc(json!({"shape": [0u64, 1u64 << 62], "data": []})), None).contains("multiply past"));
    assert!(refused(doc(json!({"shape": [1u64 << 62, 0, 1u64 << 62], "data": []})), None).contains("multiply past"));
    assert!(refused(doc(json!({"shape": [1u64 << 62, 1u64 << 62, 1u64 << 62], "data": [1.0]})), None)
        .contains("multiply past"));
    let x = [0u8; 12];
    let binary = |shape: Value, size: Value| {
        http(
            json!({"inputs": [{"name": "in_fp32", "shape": shape, "datatype": "FP32",
                                "parameters": {"binary_data_size": size}}]}),
            &[&x],
        )
    };
    let (body, n) = binary(json!([1_000_000_000, 3]), json!(12));
    assert!(refused(body, n).contains("binary_data_size is 12"));
    let (body, n) = binary(json!([1, 3]), json!(1_000_000_000_000u64));
    assert!(refused(body, n).contains("past the end of the body"));
    let (body, _) = binary(json!([1, 3]), json!(12));
    assert!(refused(body.clone(), Some(99999)).contains("Inference-Header-Content-Length is 99999"));
    let (body, n) = binary(json!([1, 3]), json!(12));
    let junk = [&body[..], b"junk"].concat();
    assert!(refused(junk, n).contains("4 bytes after the binary data"));
    let (body, n) = http(
        json!({"inputs": [{"name": "in_fp32", "shape": [1, 3], "datatype": "FP32",
        "parameters": {"binary_data_size": format!("1{}", "0".repeat(400))}}]}),
        &[&x],
    );
    assert!(refused(body, n).contains("binary_data_size must be an integer >= 0"));
    let huge = format!("1{}", "0".repeat(400));
    let text = format!(
        r#"{{"inputs": [{{"name": "in_fp32", "shape": [1, 3], "datatype": "FP32", "parameters": {{"binary_data_size": {huge}}}}}]}}"#
    );
    let m = refused([text.as_bytes(), &x].concat(), Some(text.len()));
    assert!(m.contains("past the end of the body") && m.len() < 300, "{m}");
    // BYTES: more elements than 4-byte lengths could fit, a length past the end, not UTF-8
    let strings = |shape: Value, raw: &[u8]| {
        http(
            json!({"inputs": [{"name": "in_bytes", "shape": shape, "datatype": "BYTES",
                                "parameters": {"binary_data_size": raw.len()}}]}),
            &[raw],
        )
    };
    let (body, n) = strings(json!([1, 3]), &[0; 8]);
    assert!(refused(body, n).contains("only 8 bytes"));
    let (body, n) = strings(json!([1, 1]), &[&(1u32 << 31).to_le_bytes()[..], b"abcd"].concat());
    assert!(refused(body, n).contains("runs past"));
    let (body, n) = strings(json!([1, 1]), &[&4u32.to_le_bytes()[..], b"\xff\xfe\xfd\xfc"].concat());
    assert!(refused(body, n).contains("not UTF-8"));
    // data and binary both
    let (body, n) = http(
        json!({"inputs": [{"name": "in_fp32", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3],
                                            "parameters": {"binary_data_size": 12}}]}),
        &[&x],
    );
    assert!(refused(body, n).contains("has both 'data' and binary_data_size"));
}

#[test]
fn malformed_requests_name_what_is_wrong() {
    assert!(refused("{nope", None).contains("not valid JSON"));
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(refused(deep, None).contains("not valid JSON"));
    let deep = format!(r#"{{"inputs": [], "x": {}{}}}"#, "[".repeat(200), "]".repeat(200));
    assert!(refused(deep, None).contains("not valid JSON"));
    let deep = doc(json!({"parameters": {"x": Value::Null}}))
        .replace("null", &format!("{}{}", "[".repeat(200), "]".repeat(200)));
    assert!(refused(deep, None).contains("nested deeper than 128"));
    assert!(refused(&b"\xff\xfe garbage"[..], None).contains("not valid JSON"));
    assert!(refused("[1, 2]", None).contains("must be a JSON object, got a list"));
    assert!(refused("{}", None).contains("needs 'inputs'"));
    assert!(refused(r#"{"inputs": [5]}"#, None).contains("inputs[0] must be a JSON object, got a number"));
    assert!(refused(r#"{"inputs": [{"name": 5}]}"#, None).contains("inputs[0] needs a 'name', a string"));
    assert!(refused(doc(json!({"name": "in_fp32x"})), None)
        .contains("'in_fp32x' is not an input of model 'm' (did you mean 'in_fp32'?)"));
    assert!(refused(doc(json!({"datatype": "FLOAT32"})), None)
        .contains("input 'in_fp32': 'FLOAT32' is not a KServe datatype; model 'm' takes FP32"));
    assert!(refused(doc(json!({"datatype": 5})), None).contains("a number is not a KServe datatype"));
    let one = serde_json::from_str::<Value>(&doc(json!({}))).unwrap()["inputs"][0].clone();
    let twice = json!({ "inputs": vec![one; 2] });
    assert!(refused(twice.to_string(), None).contains("given twice"));
    assert!(refused(r#"{"inputs": [{"name": "in_fp32", "shape": [1], "datatype": "FP32"}]}"#, None)
        .contains("neither 'data'"));
    assert!(refused(doc(json!({"data": [1, 2]})), None).contains("its data holds 2 values"));
    assert!(refused(doc(json!({"shape": [2, 2], "data": [[1, 2], [3]]})), None).contains("its data holds 3 values"));
    assert!(refused(doc(json!({"shape": [2, 2], "data": [[1, 2], [3, [4, [5, [6]]]]]})), None)
        .contains("its data holds 5 values"));
    assert!(refused(doc(json!({"data": ["a", "b", "c"]})), None).contains("must be numbers"));
    assert!(refused(doc(json!({"data": Value::Null})), None).contains("holds 1 value"));
    assert!(refused(doc(json!({"data": [1e39, 0, 0]})), None).contains("past FP32's range"));
    assert!(refused(doc(json!({"data": [1, 2, 3]})).replace("[1,2,3]", "[1e400, 0, 0]"), None)
        .contains("past FP32's range"));
    assert!(refused(doc(json!({"data": [1, 2, 3]})).replace("[1,2,3]", "[NaN, 0, 0]"), None).contains("not valid JSON"));
    assert!(refused(doc(json!({"name": "in_uint8", "datatype": "UINT8", "data": [300, 0, 0]})), None)
        .contains("outside 0..255"));
    assert!(refused(doc(json!({"name": "in_int32", "datatype": "INT32", "data": [1.5, 0, 0]})), None)
        .contains("must be integers"));
    assert!(refused(doc(json!({"name": "in_bool", "datatype": "BOOL", "data": [1, 0, 1]})), None)
        .contains("must be true or false"));
    assert!(refused(doc(json!({"name": "in_bytes", "datatype": "BYTES", "data": [1, 2, 3]})), None)
        .contains("must be strings"));
    let with = |key: &str, v: Value| {
        let mut d: Value = serde_json::from_str(&doc(json!({}))).unwrap();
        d[key] = v;
        refused(d.to_string(), None)
    };
    assert!(with("outputs", json!([{"name": "out_fp32x"}]))
        .contains("'out_fp32x' is not an output of model 'm' (did you mean 'out_fp32'"));
    assert!(with("outputs", json!([{"name": "out_fp32"}, {"name": "out_fp32"}])).contains("asked for twice"));
    assert!(
        with("outputs", json!([{"name": "out_fp32", "parameters": {"classification": 3}}])).contains("classification")
    );
    assert!(with("outputs", json!([{"name": "out_fp32", "parameters": {"binary_data": 1}}]))
        .contains("binary_data must be true or false"));
    assert!(with("outputs", json!({"name": "out_fp32"})).contains("'outputs' must be a list, got an object"));
    assert!(with("outputs", json!([{"nam": "out_fp32"}])).contains("outputs[0] must be a JSON object with a 'name'"));
    assert!(with("parameters", json!({"timeout": -5})).contains("timeout must be a positive integer"));
    assert!(with("parameters", json!({"sequence_id": 4})).contains("sequence batching"));
    assert!(
        with("parameters", json!({"binary_data_output": "yes"})).contains("binary_data_output must be true or false")
    );
    assert!(with("parameters", json!([1])).contains("the request's parameters must be a JSON object, got a list"));
    assert!(with("id", json!(5)).contains("id must be a string, got a number"));
    assert!(refused(doc(json!({"parameters": {"shared_memory_region": "r"}})), None).contains("shared memory"));
    // a timeout of 10**400 and lone surrogates: 400s, never a 500
    let d = doc(json!({}));
    let huge = d.replacen('{', &format!("{{\"parameters\": {{\"timeout\": 1{}}}, ", "0".repeat(400)), 1);
    assert!(refused(huge, None).contains("timeout must be a positive integer"));
    assert!(refused(d.replace("in_fp32", "\\ud800"), None).contains("not valid JSON"));
    assert!(refused(d.replacen('{', "{\"id\": \"\\udc00x\", ", 1), None).contains("not valid JSON"));
}

#[test]
fn client_strings_are_cut_and_escaped() {
    let long = "Z\n".repeat(12_000_000); // a 24 MB datatype
    let m = refused(doc(json!({ "datatype": long })), None);
    assert!(m.len() < 300 && !m.contains('\n') && m.contains("(24000000 bytes)"), "{m}");
    let m = refused(doc(json!({ "name": "x\n".repeat(1000) })), None);
    assert!(m.len() < 300 && !m.contains('\n'), "{m}");
}

#[test]
fn json_nested_as_the_shape_and_unknown_members() {
    let got = decode(&doc(json!({"shape": [1, 3], "data": [[1, 2, 3]], "extra": {"a": [1]}})).into(), None).unwrap();
    assert_eq!(&got.inputs[0].data[..], [1f32, 2., 3.].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
}

#[test]
fn every_datatype_encodes_json_and_binary() {
    let m = model();
    let outputs: Vec<Tensor> =
        every().into_iter().map(|(d, _, data)| Tensor { datatype: d, shape: vec![1, 3], data: data.into() }).collect();
    for binary in [false, true] {
        let asked: Vec<(usize, bool)> = (0..13).map(|k| (k, binary)).collect();
        let e = encode_http(&m, Some("req-7"), &asked, &outputs).unwrap();
        assert_eq!(e.header_length.is_some(), binary);
        let body = e.concat();
        let head: Value = serde_json::from_slice(&body[..e.header_length.unwrap_or(body.len())]).unwrap();
        assert_eq!((head["id"].as_str(), head["model_name"].as_str()), (Some("req-7"), Some("m")));
        let mut at = e.header_length.unwrap_or(0);
        for ((d, data, bytes), o) in every().iter().zip(head["outputs"].as_array().unwrap()) {
            assert_eq!((o["datatype"].as_str(), &o["shape"]), (Some(d.name()), &json!([1, 3])));
            if binary {
                let n = o["parameters"]["binary_data_size"].as_u64().unwrap() as usize;
                assert_eq!(&body[at..at + n], &bytes[..], "{d:?}");
                at += n;
            } else {
                let want: Value = serde_json::from_str(data).unwrap();
                if *d == Datatype::Fp32 {
                    // float32 written as the float64 it is: equal once read back as float32
                    let f32s = |v: &Value| -> Vec<f32> {
                        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
                    };
                    assert_eq!(f32s(&o["data"]), f32s(&want));
                } else {
                    assert_eq!(o["data"], want, "{d:?}");
                }
            }
        }
    }
}

#[test]
fn answers_are_always_valid_json() {
    let m = model();
    let nan = Tensor {
        datatype: Datatype::Fp32,
        shape: vec![2],
        data: [f32::NAN, f32::NEG_INFINITY].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>().into(),
    };
    let mut outputs: Vec<Tensor> =
        every().into_iter().map(|(d, _, data)| Tensor { datatype: d, shape: vec![1, 3], data: data.into() }).collect();
    outputs[10] = nan;
    let e = encode_http(&m, None, &[(10, false)], &outputs).unwrap_err();
    assert_eq!(e.status, Status::BadRequest);
    assert!(e.message.contains("output 'out_fp32' holds NaN") && e.message.contains("binary_data"), "{}", e.message);
    let ok = encode_http(&m, None, &[(10, true)], &outputs).unwrap();
    assert_eq!(ok.len(), ok.header_length.unwrap() + 8);
    // 0 rows, binary and JSON; an id that needs escaping
    let empty = Tensor { datatype: Datatype::Fp32, shape: vec![0, 3], data: Bytes::new() };
    outputs[10] = empty;
    for binary in [true, false] {
        let e = encode_http(&m, Some("a\"\n\u{2028}"), &[(10, binary)], &outputs).unwrap();
        let body = e.concat();
        let head: Value = serde_json::from_slice(&body[..e.header_length.unwrap_or(body.len())]).unwrap();
        assert_eq!(head["id"], "a\"\n\u{2028}");
        assert_eq!(head["outputs"][0]["shape"], json!([0, 3]));
    }
    let short = Tensor { datatype: Datatype::Fp32, shape: vec![2, 3], data: Bytes::from_static(&[0; 4]) };
    outputs[10] = short;
    assert_eq!(encode_http(&m, None, &[(10, true)], &outputs).unwrap_err().status, Status::Internal);
    assert_eq!(encode_http(&m, None, &[(99, true)], &outputs).unwrap_err().status, Status::Internal);
}

/// `cargo test --release -p fastseq-serve timing -- --ignored --nocapture`: decode and encode
/// of a [1, 3, 224, 224] FP32 request, JSON and binary.
#[test]
#[ignore]
fn timing() {
    use crate::tensor::TensorSpec;
    let spec =
        |name: &str, shape: Vec<i64>| TensorSpec { name: name.into(), datatype: Datatype::Fp32, shape: Some(shape) };
    let m = ModelSpec {
        name: "cnn".into(),
        version: "1".into(),
        inputs: vec![spec("image", vec![-1, 3, 224, 224])],
        outputs: vec![spec("logits", vec![-1, 1000])],
        max_batch_size: 32,
        max_delay_us: 0,
    };
    let n = 3 * 224 * 224;
    let values: Vec<f32> = (0..n).map(|k| ((k * 7919) % 1000) as f32 / 997.0 - 0.5).collect();
    let (json_body, _) = http(
        json!({"inputs": [{"name": "image", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": values}]}),
        &[],
    );
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (bin_body, header) = http(
        json!({"inputs": [{"name": "image", "shape": [1, 3, 224, 224], "datatype": "FP32",
        "parameters": {"binary_data_size": raw.len()}}]}),
        &[&raw],
    );
    let logits = Tensor { datatype: Datatype::Fp32, shape: vec![1, 1000], data: raw[..4000].to_vec().into() };
    let time = |what: &str, rounds: u32, f: &mut dyn FnMut()| {
        f();
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            f();
        }
        println!("{what}: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / rounds as f64);
    };
    println!("JSON body {} bytes", json_body.len());
    time("decode JSON [1,3,224,224] FP32", 50, &mut || {
        decode_http(&m, &json_body, None).unwrap();
    });
    time("decode binary [1,3,224,224] FP32", 20000, &mut || {
        decode_http(&m, &bin_body, header).unwrap();
    });
    time("encode JSON [1,1000] FP32", 2000, &mut || {
        encode_http(&m, Some("1"), &[(0, false)], std::slice::from_ref(&logits)).unwrap();
    });
    time("encode binary [1,1000] FP32", 20000, &mut || {
        encode_http(&m, Some("1"), &[(0, true)], std::slice::from_ref(&logits)).unwrap();
    });
}

#[test]
#[ignore]
fn timing_parts() {
    let n = 3 * 224 * 224;
    let values: Vec<f32> = (0..n).map(|k| ((k * 7919) % 1000) as f32 / 997.0 - 0.5).collect();
    let text = serde_json::to_string(&values).unwrap();
    let long: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    let long_text = serde_json::to_string(&long).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..20 {
        crate::protocol::values::from_json("x", &long_text, Datatype::Fp32, &[n], n as u64).unwrap();
    }
    println!("from_json of float64 text ({} bytes): {:.1} us", long_text.len(), t.elapsed().as_secs_f64() * 1e6 / 20.0);
    let t = std::time::Instant::now();
    for _ in 0..20 {
        crate::protocol::values::from_json("x", &text, Datatype::Fp32, &[n], n as u64).unwrap();
    }
    println!("from_json: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 20.0);
    let t = std::time::Instant::now();
    for _ in 0..20 {
        let _: &serde_json::value::RawValue = serde_json::from_str(&text).unwrap();
    }
    println!("serde skip: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 20.0);
    let nums: Vec<&str> = text[1..text.len() - 1].split(',').collect();
    let t = std::time::Instant::now();
    let mut s = 0.0;
    for _ in 0..20 {
        for x in &nums {
            s += x.parse::<f64>().unwrap();
        }
    }
    println!("parse f64 only: {:.1} us {s}", t.elapsed().as_secs_f64() * 1e6 / 20.0);
}

#[test]
fn what_a_body_costs_is_bounded() {
    // A shape of a million axes: counted, not kept; objects and lists past MAX_MEMBERS refused.
    let axes = format!("[{}1]", "1,".repeat(1_000_000));
    let m = refused(doc(json!({})).replace("[1,3]", &axes), None);
    assert!(m.contains("1000001 axes, more than 32"), "{m}");
    let wide = format!("{{{}\"inputs\": []}}", (0..70_000).map(|k| format!("\"k{k}\": 0, ")).collect::<String>());
    assert!(refused(wide, None).contains("more than 65536 members"));
    let long = format!("[{}0]", "0,".repeat(1_000_000)); // a top-level list: checked, not built
    assert!(refused(long, None).contains("must be a JSON object, got a list"));
}

#[test]
fn a_partial_decode_says_which_inputs_it_returns() {
    let mut d: Value = serde_json::from_str(&doc(json!({}))).unwrap();
    let one = json!({"name": "in_bool", "shape": [1, 3], "datatype": "BOOL", "data": [true, false, true]});
    d["inputs"].as_array_mut().unwrap().push(one);
    let (request, indices) = decode_http_indexed(&model(), &d.to_string().into(), None, partial()).unwrap();
    assert_eq!(indices, vec![0, 10]); // the model's order: in_bool, then in_fp32
    assert_eq!((request.inputs[0].datatype, request.inputs[1].datatype), (Datatype::Bool, Datatype::Fp32));
}
