//! fastseq: compose ONNX models into one graph in one pass.
//!
//! One crate in layers, each a folder whose `mod.rs` says what it is; a layer names only the
//! layers below it, and no file names another in a circle (`tests/layers.rs` checks both on
//! every `cargo test`; Cargo keeps the Python bindings, a crate of their own, above it all):
//!
//! - [`codec`]: one model as bytes and back (protobuf types, decode, streaming encode,
//!   nodes kept as bytes, tensor sizes, summaries).
//! - [`storage`]: sources read into memory fastseq owns, external data, the [`Layout`] of
//!   data files, the one writer, spill, digests. Names codec.
//! - [`merge`]: the plan (order, edges, checks, exposure, pruning, adapters), final names,
//!   renaming, assembly, opsets, metadata. Names codec; beside storage, never naming it.
//! - [`pipeline`]: load -> compose -> write, the Rust API of the whole job (re-exported
//!   here), where storage and merge meet. Names storage and merge.
//! - [`fuzzing`]: on top.
//!
//! Below them all: [`error`], [`near_miss`], the thread pool and the allocator.
pub mod allocator;
pub mod error;
pub mod near_miss;
pub mod pool;

pub mod codec;
pub mod merge;
pub mod pipeline;
pub mod storage;

// The vendored prost-derive calls this module by this path (codec::fidelity's doc).
#[doc(hidden)]
pub use codec::fidelity as __prost_fidelity;

#[doc(hidden)]
pub mod fuzzing;

// The Rust API: what the Python bindings use, and a Rust program may.
pub use allocator::tune_allocator;
pub use codec::fidelity::text_of as name_text;
pub use codec::model::{MAX_IR_VERSION, PROTOBUF_LIMIT};
pub use codec::summary::{DimInfo, IoInfo, Summary};
pub use error::{Error, Kind, Result};
pub use merge::compose::{Composition, Report};
pub use merge::metadata::merged as merge_metadata;
pub use merge::onnx_rules::Prefixed;
pub use merge::options::{Adapt, Edge, IoMap, Keep, Options, Rules};
pub use merge::plan::view::PlanView;
pub use merge::rows::Finding;
pub use merge::rows::MAX_BATCH_ROWS;
pub use near_miss::did_you_mean;
pub use pipeline::composed::Composed;
pub use pipeline::load::{compose, decode, load, load_all};
pub use pipeline::write::{memory_bytes, private_copy, Encoded, PrivateCopy};
pub use storage::digest::file_digest;
pub use storage::external::{locations_in_file as external_data_locations, Mode};
pub use storage::layout::{Layout, LAYOUT};
pub use storage::read::{open_input, NotRegular};
pub use storage::source::Source;
pub use storage::writer::{check as check_target, commit_bytes, commit_staged, stage, Encoder, Saved, Staging};
