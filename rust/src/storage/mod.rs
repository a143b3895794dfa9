//! The storage layer: models in and out of files and memory.
//!
//! Reading sources into memory fastseq owns ([`read`], [`source`]), external data
//! ([`external`]), the one writer ([`writer`]) with its commit ([`commit`]), export lock
//! ([`export_lock`]), temporary files and staging folders ([`temp`]) and the marks that tell
//! its data files from a user's ([`ownership`]), the spill onto the session's private copy ([`spill`]),
//! and digests ([`digest`]).
//!
//! The one rule: it imports the codec layer only (and the bottom modules), never merge or
//! the bindings. Every file fastseq writes is written here.
pub mod commit;
pub mod digest;
pub mod export_lock;
pub mod external;
pub mod ownership;
pub mod read;
pub mod source;
pub mod spill;
pub mod temp;
pub mod writer;
