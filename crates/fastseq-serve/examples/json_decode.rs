//! Where an HTTP JSON infer request's time goes on the server: the CNN benchmark's body
//! (benches/bench_netserve.py: one row of FP32 `[1, 3, 20, 20]`, each value written as Python
//! writes a float32's float64) decoded end to end by [`decode_http`], as the HTTP transport
//! calls it, and its parts timed alone: the document read (the quick reader the decode takes,
//! and serde_json's), the `data` scan with its float parse, `str::parse` alone on the same
//! numbers, and the answer's encode.
//!
//!     cargo run --release -p fastseq-serve --example json_decode [body.json]
//!
//! A body file given (benches/out/netserve/cnn/body.json) is decoded instead of the one made
//! here; its input must be `image`, FP32. A part named after it (`decode`, `scan` or `parse`)
//! is run alone, 20,000 times, for `perf stat` or `perf record`.
use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use fastseq_serve::protocol::reader::{Document, Shaped};
use fastseq_serve::protocol::{decode_http, encode_http, values};
use fastseq_serve::tensor::{Datatype, ModelSpec, Tensor, TensorSpec};

fn model() -> ModelSpec {
    let spec =
        |name: &str, shape: Vec<i64>| TensorSpec { name: name.into(), datatype: Datatype::Fp32, shape: Some(shape) };
    ModelSpec {
        name: "m".into(),
        version: "1".into(),
        inputs: vec![spec("image", vec![-1, 3, 20, 20])],
        outputs: vec![spec("logits", vec![-1, 10])],
        max_batch_size: 32,
        max_delay_us: 500,
    }
}

/// Numbers in [0, 1) as float32, written as the shortest text of their float64 (Python's
/// `json.dumps(row.tolist())`); a fixed sequence (xorshift).
fn body() -> String {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let values: Vec<String> = (0..1200)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 24) as f32;
            format!("{:?}", f64::from(v))
        })
        .collect();
    format!(r#"{{"inputs":[{{"name":"image","shape":[1,3,20,20],"datatype":"FP32","data":[{}]}}]}}"#, values.join(","))
}

/// The mean time of `f` in microseconds, over enough calls to take about `ms` milliseconds.
fn time<T>(ms: u64, mut f: impl FnMut() -> T) -> f64 {
    let mut n = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..n {
            black_box(f());
        }
        let took = t.elapsed();
        if took.as_millis() as u64 >= ms {
            return took.as_secs_f64() * 1e6 / n as f64;
        }
        n *= 2;
    }
}

fn main() {
    let text = match std::env::args().nth(1) {
        Some(path) => std::fs::read_to_string(path).expect("the body file"),
        None => body(),
    };
    let body = Bytes::from(text.clone());
    let m = model();
    let request = decode_http(&m, &body, None).expect("the body decodes");
    let data = {
        let doc = Document::read(&text).unwrap();
        let Shaped::Is(items) = doc.inputs else { panic!("inputs") };
        let Shaped::Is(fields) = &items[0] else { panic!("inputs[0]") };
        fields.get("data").unwrap().get()
    };
    let numbers: Vec<&str> = data.trim_matches(['[', ']']).split(',').collect();
    let outputs = vec![Tensor {
        datatype: Datatype::Fp32,
        shape: vec![1, 10],
        data: (0..10).flat_map(|k| (k as f32 * 0.37 - 1.1).to_le_bytes()).collect::<Vec<u8>>().into(),
    }];
    // `json_decode BODY PART`: one part alone, 20,000 times (for `perf stat` or `perf record`).
    if let Some(part) = std::env::args().nth(2) {
        for _ in 0..20_000 {
            match part.as_str() {
                "decode" => drop(black_box(decode_http(&m, &body, None).unwrap())),
                "scan" => drop(black_box(values::from_json("image", data, Datatype::Fp32, &[1, 3, 20, 20], 1200))),
                "parse" => drop(black_box(numbers.iter().map(|s| s.parse::<f64>().unwrap() as f32).sum::<f32>())),
                _ => panic!("decode, scan or parse"),
            }
        }
        return;
    }
    println!("body: {} bytes, {} values", text.len(), numbers.len());
    for round in 1..=3 {
        let whole = time(300, || decode_http(&m, &body, None).unwrap());
        let read = time(300, || Document::read(&text).unwrap().fields.get("x").is_some());
        let quick = time(300, || Document::read_quick(&text).unwrap().fields.get("x").is_some());
        let scan = time(300, || values::from_json("image", data, Datatype::Fp32, &[1, 3, 20, 20], 1200).unwrap());
        let parse = time(300, || numbers.iter().map(|s| s.parse::<f64>().unwrap() as f32).sum::<f32>());
        let encode = time(300, || encode_http(&m, None, &request.outputs, &outputs).unwrap());
        println!(
            "round {round}: decode_http {whole:.1} us = quick document read {quick:.1} + data scan {scan:.1} (of \
             which str::parse alone {parse:.1}) + the rest {:.1}; serde_json's document read {read:.1}; \
             encode_http of 10 FP32 {encode:.2} us",
            whole - quick - scan
        );
    }
}
