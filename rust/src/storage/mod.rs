//! The storage layer: models in and out of files and memory.
//!
//! Reading sources ([`read`], [`source`]): the model into memory fastseq owns, its large
//! weights left in their files as ranges ([`ranges`]) that are copied in the kernel
//! ([`copy`]) when a model is written; external data ([`external`]), the one writer
//! ([`writer`]) and its data files ([`data_file`]) with its export lock and clean-up ([`export_lock`], [`temp`]), the session's
//! private copy and the spill onto it ([`spill`]), and digests ([`digest`]).
//!
//! The one rule: it imports the codec layer only (and the bottom modules), never merge or
//! the bindings. Every file fastseq writes is written here.
pub mod copy;
pub mod data_file;
pub mod digest;
pub mod export_lock;
pub mod external;
pub mod mapped;
pub mod ranges;
pub mod read;
pub mod source;
pub mod spill;
pub mod temp;
pub mod writer;
