//! The codec layer: one model as bytes and back.
//!
//! The ONNX protobuf types ([`proto`], generated; unknown fields and strings of any bytes kept through [`fidelity`]), decoding and checking one model
//! ([`model`]), reading its graph ([`graph`]), encoding it as a stream ([`stream`]), the naming rules a merge can break ([`structure`]), graph
//! nodes kept as their bytes ([`node`]), tensors and their sizes ([`tensor`]), weights left
//! in their source file as ranges of it ([`range`]), and a model's summary ([`summary`]).
//!
//! The one rule: nothing here knows about files, sources or compositions. It imports nothing
//! of fastseq above it (only the bottom modules: `error`, `near_miss`, `pool`).
pub mod fidelity;
pub mod graph;
pub mod model;
pub mod node;
pub mod proto;
pub mod range;
pub mod stream;
pub mod structure;
pub mod summary;
pub mod tensor;
#[cfg(test)]
pub(crate) mod testing;
