//! The messages of Triton's `inference.GRPCInferenceService` that fastseq answers, written
//! out with the field numbers of Triton's `grpc_service.proto` and `model_config.proto`
//! (triton-inference-server/common, `protobuf/`): the same bytes on the wire, without
//! generated code. Nested messages are named here without their parent (the wire does not
//! name them). `string` fields keep bytes that are not UTF-8 (the workspace's prost-derive,
//! see `crates/vendor/prost-derive`): a model or tensor name of odd bytes is a 400 or 404 that
//! shows them, never a message that fails to decode whole. `ModelConfig` carries only what
//! describes a fastseq model (the other fields are skipped by readers as absent).
use std::collections::HashMap;

use bytes::Bytes;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerLiveRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerLiveResponse {
    #[prost(bool, tag = "1")]
    pub live: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerReadyRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerReadyResponse {
    #[prost(bool, tag = "1")]
    pub ready: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelReadyRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelReadyResponse {
    #[prost(bool, tag = "1")]
    pub ready: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMetadataRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMetadataResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, repeated, tag = "3")]
    pub extensions: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelMetadataRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `ModelMetadataResponse.TensorMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelMetadataResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "2")]
    pub versions: Vec<String>,
    #[prost(string, tag = "3")]
    pub platform: String,
    #[prost(message, repeated, tag = "4")]
    pub inputs: Vec<TensorMetadata>,
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<TensorMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferParameter {
    #[prost(oneof = "ParameterChoice", tags = "1, 2, 3, 4, 5")]
    pub parameter_choice: Option<ParameterChoice>,
}

/// `InferParameter.parameter_choice`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ParameterChoice {
    #[prost(bool, tag = "1")]
    BoolParam(bool),
    #[prost(int64, tag = "2")]
    Int64Param(i64),
    #[prost(string, tag = "3")]
    StringParam(String),
    #[prost(double, tag = "4")]
    DoubleParam(f64),
    #[prost(uint64, tag = "5")]
    Uint64Param(u64),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferTensorContents {
    #[prost(bool, repeated, tag = "1")]
    pub bool_contents: Vec<bool>,
    #[prost(int32, repeated, tag = "2")]
    pub int_contents: Vec<i32>,
    #[prost(int64, repeated, tag = "3")]
    pub int64_contents: Vec<i64>,
    #[prost(uint32, repeated, tag = "4")]
    pub uint_contents: Vec<u32>,
    #[prost(uint64, repeated, tag = "5")]
    pub uint64_contents: Vec<u64>,
    #[prost(float, repeated, tag = "6")]
    pub fp32_contents: Vec<f32>,
    #[prost(double, repeated, tag = "7")]
    pub fp64_contents: Vec<f64>,
    #[prost(bytes = "bytes", repeated, tag = "8")]
    pub bytes_contents: Vec<Bytes>,
}

/// `ModelInferRequest.InferInputTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferInputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, optional, tag = "5")]
    pub contents: Option<InferTensorContents>,
}

/// `ModelInferRequest.InferRequestedOutputTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferRequestedOutputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(map = "string, message", tag = "2")]
    pub parameters: HashMap<String, InferParameter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInferRequest {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, repeated, tag = "5")]
    pub inputs: Vec<InferInputTensor>,
    #[prost(message, repeated, tag = "6")]
    pub outputs: Vec<InferRequestedOutputTensor>,
    /// Slices of the message's buffer where it was decoded from `Bytes` (no copy).
    #[prost(bytes = "bytes", repeated, tag = "7")]
    pub raw_input_contents: Vec<Bytes>,
}

/// `ModelInferResponse.InferOutputTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InferOutputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, optional, tag = "5")]
    pub contents: Option<InferTensorContents>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInferResponse {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<InferOutputTensor>,
    #[prost(bytes = "bytes", repeated, tag = "6")]
    pub raw_output_contents: Vec<Bytes>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelConfigRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelConfigResponse {
    #[prost(message, optional, tag = "1")]
    pub config: Option<ModelConfig>,
}

/// `ModelInput` of model_config.proto (`data_type`: the `DataType` enum's number).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInput {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(int64, repeated, tag = "4")]
    pub dims: Vec<i64>,
}

/// `ModelOutput` of model_config.proto.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelOutput {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

/// `ModelDynamicBatching` of model_config.proto.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelDynamicBatching {
    #[prost(int32, repeated, tag = "1")]
    pub preferred_batch_size: Vec<i32>,
    #[prost(uint64, tag = "2")]
    pub max_queue_delay_microseconds: u64,
}

/// `ModelConfig` of model_config.proto, the fields that describe a fastseq model
/// (`dynamic_batching` is one choice of its `scheduling_choice` oneof: the same bytes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelConfig {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub platform: String,
    #[prost(int32, tag = "4")]
    pub max_batch_size: i32,
    #[prost(message, repeated, tag = "5")]
    pub input: Vec<ModelInput>,
    #[prost(message, repeated, tag = "6")]
    pub output: Vec<ModelOutput>,
    #[prost(message, optional, tag = "11")]
    pub dynamic_batching: Option<ModelDynamicBatching>,
    #[prost(string, tag = "17")]
    pub backend: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStatisticsRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct StatisticDuration {
    #[prost(uint64, tag = "1")]
    pub count: u64,
    #[prost(uint64, tag = "2")]
    pub ns: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferStatistics {
    #[prost(message, optional, tag = "1")]
    pub success: Option<StatisticDuration>,
    #[prost(message, optional, tag = "2")]
    pub fail: Option<StatisticDuration>,
    #[prost(message, optional, tag = "3")]
    pub queue: Option<StatisticDuration>,
    #[prost(message, optional, tag = "4")]
    pub compute_input: Option<StatisticDuration>,
    #[prost(message, optional, tag = "5")]
    pub compute_infer: Option<StatisticDuration>,
    #[prost(message, optional, tag = "6")]
    pub compute_output: Option<StatisticDuration>,
    #[prost(message, optional, tag = "7")]
    pub cache_hit: Option<StatisticDuration>,
    #[prost(message, optional, tag = "8")]
    pub cache_miss: Option<StatisticDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferResponseStatistics {
    #[prost(message, optional, tag = "1")]
    pub compute_infer: Option<StatisticDuration>,
    #[prost(message, optional, tag = "2")]
    pub compute_output: Option<StatisticDuration>,
    #[prost(message, optional, tag = "3")]
    pub success: Option<StatisticDuration>,
    #[prost(message, optional, tag = "4")]
    pub fail: Option<StatisticDuration>,
    #[prost(message, optional, tag = "5")]
    pub empty_response: Option<StatisticDuration>,
    #[prost(message, optional, tag = "6")]
    pub cancel: Option<StatisticDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferBatchStatistics {
    #[prost(uint64, tag = "1")]
    pub batch_size: u64,
    #[prost(message, optional, tag = "2")]
    pub compute_input: Option<StatisticDuration>,
    #[prost(message, optional, tag = "3")]
    pub compute_infer: Option<StatisticDuration>,
    #[prost(message, optional, tag = "4")]
    pub compute_output: Option<StatisticDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MemoryUsage {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(uint64, tag = "3")]
    pub byte_size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStatistics {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "3")]
    pub last_inference: u64,
    #[prost(uint64, tag = "4")]
    pub inference_count: u64,
    #[prost(uint64, tag = "5")]
    pub execution_count: u64,
    #[prost(message, optional, tag = "6")]
    pub inference_stats: Option<InferStatistics>,
    #[prost(message, repeated, tag = "7")]
    pub batch_stats: Vec<InferBatchStatistics>,
    #[prost(message, repeated, tag = "8")]
    pub memory_usage: Vec<MemoryUsage>,
    #[prost(map = "string, message", tag = "9")]
    pub response_stats: HashMap<String, InferResponseStatistics>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStatisticsResponse {
    #[prost(message, repeated, tag = "1")]
    pub model_stats: Vec<ModelStatistics>,
}
