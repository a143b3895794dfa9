//! The storage layer: models in and out of files and memory.
//!
//! Reading sources into memory fastseq owns ([`read`], [`source`]), their large weights
//! left in their files as ranges ([`ranges`]) that are copied in the kernel ([`copy`]) when a
//! model is written; external data ([`external`]); the one writer ([`writer`]) with its
//! commit ([`commit`]), data files ([`data_file`]) laid out as one [`layout`] says, export
//! lock ([`export_lock`]), temporary files and staging folders ([`temp`]), the tokens in
//! their names ([`token`]) and the marks that tell its data files from a user's
//! ([`ownership`]); the session's private copy and the spill onto it ([`spill`],
//! [`mapped`]); and digests ([`digest`]).
//!
//! The one rule: it names the codec layer only (and the bottom modules), never merge or the
//! pipeline above it. Every file fastseq writes is written here.
pub mod commit;
pub mod copy;
pub mod data_file;
pub mod digest;
pub mod export_lock;
pub mod external;
pub mod layout;
pub mod mapped;
pub mod ownership;
pub mod ranges;
pub mod read;
pub mod source;
pub mod spill;
pub mod temp;
pub mod token;
pub mod writer;
