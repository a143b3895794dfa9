//! What is served and what a request carries: the KServe datatypes, a model's tensors as it
//! declares them ([`ModelSpec`]), a tensor's values as bytes ([`Tensor`]) and a decoded
//! request ([`InferRequest`]).
use std::time::Duration;

use bytes::Bytes;

/// A KServe v2 datatype. BF16 is not served: ONNX Runtime's Python API cannot hand it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Datatype {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bytes,
}

impl Datatype {
    pub const ALL: [Datatype; 13] = [
        Datatype::Bool,
        Datatype::Uint8,
        Datatype::Uint16,
        Datatype::Uint32,
        Datatype::Uint64,
        Datatype::Int8,
        Datatype::Int16,
        Datatype::Int32,
        Datatype::Int64,
        Datatype::Fp16,
        Datatype::Fp32,
        Datatype::Fp64,
        Datatype::Bytes,
    ];

    /// Its name in the protocol (`"FP32"`).
    pub fn name(self) -> &'static str {
        match self {
            Datatype::Bool => "BOOL",
            Datatype::Uint8 => "UINT8",
            Datatype::Uint16 => "UINT16",
            Datatype::Uint32 => "UINT32",
            Datatype::Uint64 => "UINT64",
            Datatype::Int8 => "INT8",
            Datatype::Int16 => "INT16",
            Datatype::Int32 => "INT32",
            Datatype::Int64 => "INT64",
            Datatype::Fp16 => "FP16",
            Datatype::Fp32 => "FP32",
            Datatype::Fp64 => "FP64",
            Datatype::Bytes => "BYTES",
        }
    }

    pub fn parse(name: &str) -> Option<Datatype> {
        Datatype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes an element takes; None for BYTES, whose elements each have their own length.
    pub fn size(self) -> Option<usize> {
        Some(match self {
            Datatype::Bool | Datatype::Uint8 | Datatype::Int8 => 1,
            Datatype::Uint16 | Datatype::Int16 | Datatype::Fp16 => 2,
            Datatype::Uint32 | Datatype::Int32 | Datatype::Fp32 => 4,
            Datatype::Uint64 | Datatype::Int64 | Datatype::Fp64 => 8,
            Datatype::Bytes => return None,
        })
    }

    /// Triton's model-configuration type name (`"TYPE_FP32"`; BYTES is `"TYPE_STRING"`).
    pub fn config_name(self) -> &'static str {
        match self {
            Datatype::Bytes => "TYPE_STRING",
            Datatype::Bool => "TYPE_BOOL",
            Datatype::Uint8 => "TYPE_UINT8",
            Datatype::Uint16 => "TYPE_UINT16",
            Datatype::Uint32 => "TYPE_UINT32",
            Datatype::Uint64 => "TYPE_UINT64",
            Datatype::Int8 => "TYPE_INT8",
            Datatype::Int16 => "TYPE_INT16",
            Datatype::Int32 => "TYPE_INT32",
            Datatype::Int64 => "TYPE_INT64",
            Datatype::Fp16 => "TYPE_FP16",
            Datatype::Fp32 => "TYPE_FP32",
            Datatype::Fp64 => "TYPE_FP64",
        }
    }

    /// Triton's `DataType` enum number in `model_config.proto` (TYPE_BOOL = 1 ... TYPE_STRING = 13).
    pub fn config_number(self) -> i32 {
        match self {
            Datatype::Bool => 1,
            Datatype::Uint8 => 2,
            Datatype::Uint16 => 3,
            Datatype::Uint32 => 4,
            Datatype::Uint64 => 5,
            Datatype::Int8 => 6,
            Datatype::Int16 => 7,
            Datatype::Int32 => 8,
            Datatype::Int64 => 9,
            Datatype::Fp16 => 10,
            Datatype::Fp32 => 11,
            Datatype::Fp64 => 12,
            Datatype::Bytes => 13,
        }
    }
}

/// One input or output of a served model as it declares it: its name, datatype and shape
/// (-1 for a dynamic axis; None where the model declares no shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: Datatype,
    pub shape: Option<Vec<i64>>,
}

/// A served model: its name and version, its inputs and outputs in the session's order, and
/// how it is batched (`max_batch_size` 0: each request runs alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub name: String,
    pub version: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub max_batch_size: usize,
    pub max_delay_us: u64,
}

impl ModelSpec {
    pub fn batched(&self) -> bool {
        self.max_batch_size > 0
    }

    pub fn input_index(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|t| t.name == name)
    }

    pub fn output_index(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|t| t.name == name)
    }
}

/// A tensor's values: its elements little-endian and contiguous in row-major order; BYTES
/// elements each as a 4-byte little-endian length and its bytes (Triton's binary form). Where
/// a request's binary data carried it, `data` is a slice of the body, not a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub datatype: Datatype,
    pub shape: Vec<usize>,
    pub data: Bytes,
}

impl Tensor {
    /// The number of elements its shape holds.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Its rows: the length of its first axis (a scalar has none: None).
    pub fn rows(&self) -> Option<usize> {
        self.shape.first().copied()
    }
}

/// A decoded infer request, checked against its model: its id, one tensor per input of the
/// model in the model's order, the outputs to answer (the output's index in the model and
/// whether it goes back as binary data; every output, in order, where the request named
/// none), and its own timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    pub id: Option<String>,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<(usize, bool)>,
    pub timeout: Option<Duration>,
}

impl InferRequest {
    /// The bytes its tensors hold.
    pub fn bytes(&self) -> usize {
        self.inputs.iter().map(|t| t.data.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatypes_round_trip_by_name() {
        for d in Datatype::ALL {
            assert_eq!(Datatype::parse(d.name()), Some(d));
        }
        assert_eq!(Datatype::parse("BF16"), None);
        assert_eq!(Datatype::Bytes.config_name(), "TYPE_STRING");
    }
}
