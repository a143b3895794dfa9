//! The storage layer: models in and out of files and memory.
//!
//! Reading sources into memory fastseq owns ([`read`], [`source`]), external data
//! ([`external`]), the one writer ([`writer`]) with its export lock and clean-up
//! ([`export_lock`], [`temp`]), the session's private copy and the spill onto it ([`spill`]),
//! and digests ([`digest`]).
//!
//! The one rule: it imports the codec layer only (and the bottom modules), never merge or
//! the bindings. Every file fastseq writes is written here.
pub mod digest;
pub mod export_lock;
pub mod external;
pub mod read;
pub mod source;
pub mod spill;
pub mod temp;
pub mod writer;
