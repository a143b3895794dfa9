//! fastseq: compose ONNX models into one graph in one pass.
//!
//! One crate in layers, each a folder whose `mod.rs` says what it is; a layer imports only
//! the layers below it, and no module imports another in a circle (`crates/fastseq/tests/layers.rs`
//! checks both on every `cargo test`):
//!
//! - [`codec`]: one model as bytes and back (protobuf types, decode, streaming encode,
//!   nodes kept as bytes, tensor sizes, summaries).
//! - [`storage`]: sources read into memory fastseq owns, external data, the one writer,
//!   spill, digests. Imports codec.
//! - [`merge`]: the plan (order, edges, checks, exposure, pruning, adapters), final names,
//!   renaming, assembly, opsets, metadata. Imports codec.
//! - `bindings` (the `python` feature) and [`fuzzing`]: on top; they only convert and call.
//!
//! Below them all: [`error`], [`near_miss`], the thread pool and the allocator.
pub mod allocator;
pub mod error;
pub mod near_miss;
pub mod pool;

pub mod codec;
pub mod merge;
pub mod storage;

#[doc(hidden)]
pub mod fuzzing;

pub use allocator::tune_allocator;
pub use error::{Error, Kind, Result};
pub use merge::compose::{compose, Composition, Report};
pub use merge::options::{Adapt, Edge, Keep, Options};
