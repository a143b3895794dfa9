//! The KServe v2 inference protocol (Triton's) as pure functions over bytes, testable without
//! a socket: infer requests decoded and checked against their model, answers encoded, the
//! documents (metadata, config, statistics), over HTTP ([`json`], [`encode`]) and gRPC
//! ([`grpc`]).
//!
//! Everything a request declares is checked against the bytes it brings before anything is
//! sized by it: a shape that claims 10^9 values with one value of data, a binary size past the
//! body's end, a header length past the body, BYTES lengths that run past their data, are
//! each a 400 naming the model's own tensor. Binary inputs stay slices of the body. JSON
//! values are checked to keep their meaning in their datatype (300 is no UINT8, 1e39 no FP32),
//! and a request's text is shown cut and escaped ([`crate::error::client_text`]).
use bytes::Bytes;

use crate::error::RequestError;
use crate::tensor::{ModelSpec, Tensor};

pub mod binary;
pub mod documents;
pub mod encode;
pub mod grpc;
pub mod json;
pub mod params;
pub mod reader;
pub mod shape;
pub mod values;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod testing;

pub use documents::{error_json, model_config, model_metadata, model_statistics, server_metadata};
pub use encode::encode_http;
pub use json::{decode_http, decode_http_indexed, decode_http_with};

/// The most axes a tensor of a request may have (numpy 1.x's limit; numpy 2's is 64).
pub const MAX_RANK: usize = 32;
/// The largest size a request may declare for one axis.
pub const MAX_DIM: u64 = 1 << 62;
/// The most elements the axes of a shape may multiply to, zero axes taken as 1: a tensor of
/// no values whose other axes multiply past what an array indexes (`[0, 2**62, 2**62]`) is
/// refused too.
pub const MAX_SPAN: u64 = 1 << 58;
/// The deepest JSON a request may nest (serde_json's own recursion limit).
pub const MAX_DEPTH: usize = 128;

/// What a decode checks beyond the protocol itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    /// Every input of the model given (false: the inputs given are checked and returned, in
    /// the model's order, the others left out; the caller's input rule decides).
    pub every_input: bool,
}

impl Default for Checks {
    fn default() -> Self {
        Checks { every_input: true }
    }
}

/// An answer's body: JSON alone (`header_length` None), or Triton's binary extension (the
/// JSON header, its length in `Inference-Header-Content-Length`, then each binary output's
/// bytes). The parts are written in order; binary outputs are the engine's bytes, not copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub parts: Vec<Bytes>,
    pub header_length: Option<usize>,
}

impl Encoded {
    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The body in one buffer (a copy where there are several parts).
    pub fn concat(&self) -> Bytes {
        match self.parts.as_slice() {
            [one] => one.clone(),
            parts => {
                let mut out = Vec::with_capacity(self.len());
                for p in parts {
                    out.extend_from_slice(p);
                }
                out.into()
            }
        }
    }
}

/// `[a, b, c]` as Python lists print.
pub(crate) fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let parts: Vec<String> = items.iter().map(T::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// `N value(s)`.
pub(crate) fn values_word(count: u64) -> String {
    format!("{count} value{}", if count == 1 { "" } else { "s" })
}

/// The outputs answered: each asked output's index, whether it goes back binary, and its
/// tensor (from `outputs`, every output of the model in order). A server bug (an index past
/// the model's outputs) is a 500, never a panic.
pub(crate) fn chosen<'a>(
    model: &ModelSpec,
    asked: &[(usize, bool)],
    outputs: &'a [Tensor],
) -> Result<Vec<(usize, bool, &'a Tensor)>, RequestError> {
    asked
        .iter()
        .map(|&(k, binary)| match outputs.get(k) {
            Some(t) if k < model.outputs.len() => Ok((k, binary, t)),
            _ => Err(RequestError::new(
                crate::error::Status::Internal,
                format!("model '{}' answered {} outputs; output {k} was asked for", model.name, outputs.len()),
            )),
        })
        .collect()
}
