//! The documents the protocol answers with over HTTP: errors, the server's and a model's
//! metadata, Triton's model configuration (what `perf_analyzer` and tritonclient's
//! `get_model_config` read) and Triton's statistics extension, each as Triton writes it.
use bytes::Bytes;
use serde_json::{json, Value};

use crate::metrics::Statistics;
use crate::tensor::{ModelSpec, TensorSpec};

/// The platform every model is served as (ONNX Runtime runs it).
pub const PLATFORM: &str = "onnxruntime_onnx";
/// The backend Triton's configuration names.
pub const BACKEND: &str = "fastseq";
/// The protocol's extensions the server speaks.
pub const EXTENSIONS: [&str; 3] = ["binary_tensor_data", "model_configuration", "statistics"];

/// `{"error": message}`, as the protocol answers a failure.
pub fn error_json(message: &str) -> Bytes {
    document(json!({ "error": message }))
}

/// `GET /v2`: the server's name, version and extensions.
pub fn server_metadata(version: &str) -> Bytes {
    document(json!({ "name": "fastseq", "version": version, "extensions": EXTENSIONS }))
}

/// A tensor's shape as the metadata says it: -1 for a dynamic axis, `[-1]` where the model
/// declares none.
pub fn shape_of(t: &TensorSpec) -> Vec<i64> {
    t.shape.clone().unwrap_or_else(|| vec![-1])
}

/// `GET /v2/models/{name}`: its version, platform, inputs and outputs.
pub fn model_metadata(model: &ModelSpec) -> Bytes {
    let tensors = |ts: &[TensorSpec]| -> Vec<Value> {
        ts.iter().map(|t| json!({ "name": t.name, "datatype": t.datatype.name(), "shape": shape_of(t) })).collect()
    };
    document(json!({
        "name": model.name,
        "versions": [model.version],
        "platform": PLATFORM,
        "inputs": tensors(&model.inputs),
        "outputs": tensors(&model.outputs),
    }))
}

/// A tensor's dims in Triton's configuration: without the batch axis where the model is
/// batched.
pub fn dims_of(model: &ModelSpec, t: &TensorSpec) -> Vec<i64> {
    let shape = shape_of(t);
    if model.batched() && !shape.is_empty() {
        shape[1..].to_vec()
    } else {
        shape
    }
}

/// `GET /v2/models/{name}/config`: Triton's model configuration, as far as it describes the
/// model (with batching: `max_batch_size`, dims without the batch axis, `dynamic_batching`).
pub fn model_config(model: &ModelSpec) -> Bytes {
    let tensors = |ts: &[TensorSpec]| -> Vec<Value> {
        ts.iter()
            .map(|t| json!({ "name": t.name, "data_type": t.datatype.config_name(), "dims": dims_of(model, t) }))
            .collect()
    };
    let mut config = json!({
        "name": model.name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "max_batch_size": model.max_batch_size,
        "input": tensors(&model.inputs),
        "output": tensors(&model.outputs),
    });
    if model.batched() {
        config["dynamic_batching"] = json!({ "max_queue_delay_microseconds": model.max_delay_us });
    }
    document(config)
}

fn duration((count, ns): (u64, u64)) -> Value {
    json!({ "count": count, "ns": ns })
}

/// `GET /v2/models[/{name}[/versions/{v}]]/stats`: Triton's statistics extension, as Triton
/// writes it (`perf_analyzer` reads it). fastseq times no separate input and output copies,
/// nor a cache: those are counted with no time, as Triton counts them without a cache.
pub fn model_statistics(stats: &[Statistics]) -> Bytes {
    let models: Vec<Value> = stats
        .iter()
        .map(|s| {
            let computed = (s.compute_infer.0, 0);
            json!({
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference_ms,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": duration(s.success),
                    "fail": duration(s.fail),
                    "queue": duration(s.queue),
                    "compute_input": duration(computed),
                    "compute_infer": duration(s.compute_infer),
                    "compute_output": duration(computed),
                    "cache_hit": duration((0, 0)),
                    "cache_miss": duration((0, 0)),
                },
                "response_stats": {},
                "batch_stats": s.batches.iter().map(|&(size, runs, ns)| json!({
                    "batch_size": size,
                    "compute_input": duration((runs, 0)),
                    "compute_infer": duration((runs, ns)),
                    "compute_output": duration((runs, 0)),
                })).collect::<Vec<_>>(),
                "memory_usage": [],
            })
        })
        .collect();
    document(json!({ "model_stats": models }))
}

fn document(v: Value) -> Bytes {
    serde_json::to_vec(&v).unwrap_or_default().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::model;

    fn parsed(b: Bytes) -> Value {
        serde_json::from_slice(&b).unwrap()
    }

    #[test]
    fn errors_are_always_valid_json() {
        for m in ["plain", "quote \" and \\ and \n", "\u{0}\u{2028}é", ""] {
            assert_eq!(parsed(error_json(m))["error"], m);
        }
    }

    #[test]
    fn metadata_and_config_describe_the_model() {
        let m = model();
        let meta = parsed(model_metadata(&m));
        assert_eq!(meta["versions"], json!(["1"]));
        assert_eq!(meta["inputs"][0], json!({"name": "in_bool", "datatype": "BOOL", "shape": [-1, 3]}));
        let config = parsed(model_config(&m));
        assert_eq!(config["max_batch_size"], 8);
        assert_eq!(config["input"][12], json!({"name": "in_bytes", "data_type": "TYPE_STRING", "dims": [3]}));
        assert_eq!(config["dynamic_batching"]["max_queue_delay_microseconds"], 500);
        let unbatched = ModelSpec { max_batch_size: 0, ..m };
        let config = parsed(model_config(&unbatched));
        assert_eq!(config["input"][0]["dims"], json!([-1, 3]));
        assert!(config.get("dynamic_batching").is_none());
        let server = parsed(server_metadata("0.1.0"));
        assert_eq!(server["extensions"], json!(["binary_tensor_data", "model_configuration", "statistics"]));
    }

    #[test]
    fn statistics_as_triton_writes_them() {
        let s = Statistics {
            name: "cnn".into(),
            version: "1".into(),
            last_inference_ms: 1700,
            inference_count: 6,
            execution_count: 2,
            success: (3, 3000),
            fail: (1, 10),
            queue: (3, 300),
            compute_infer: (3, 900),
            batches: vec![(1, 1, 100), (4, 1, 200)],
        };
        let doc = parsed(model_statistics(&[s]));
        let m = &doc["model_stats"][0];
        assert_eq!((m["name"].as_str(), m["version"].as_str()), (Some("cnn"), Some("1")));
        assert_eq!((m["inference_count"].as_u64(), m["execution_count"].as_u64()), (Some(6), Some(2)));
        assert_eq!(m["inference_stats"]["success"], json!({"count": 3, "ns": 3000}));
        assert_eq!(m["inference_stats"]["compute_infer"], json!({"count": 3, "ns": 900}));
        assert_eq!(m["inference_stats"]["cache_miss"], json!({"count": 0, "ns": 0}));
        assert_eq!(m["batch_stats"][1]["batch_size"], 4);
        assert_eq!(m["batch_stats"][1]["compute_infer"], json!({"count": 1, "ns": 200}));
        assert_eq!(parsed(model_statistics(&[])), json!({"model_stats": []}));
    }
}
