//! The pipeline layer: the whole job as a Rust API, on top of storage and merge, and the
//! one place where they meet. Sources are loaded by storage ([`load`]), composed by merge
//! with storage's weight reader handed in ([`load::compose`]), and held as a [`Composed`](composed::Composed)
//! ([`composed`]), which storage writes (an export, bytes, the session's private copy) and
//! digests ([`write`](mod@write)). The Python bindings call this layer and only convert types; a Rust
//! program calls it the same way:
//!
//! ```no_run
//! use fastseq::{compose, Mode, Options, Source, LAYOUT};
//!
//! let sources = vec![Source::path("a.onnx"), Source::path("b.onnx")];
//! let labels = vec!["a".to_string(), "b".to_string()];
//! let merged = compose(sources, &labels, Options::default(), Mode::Range)?;
//! let saved = merged.save("ab.onnx".as_ref(), Some(true), LAYOUT.threshold)?;
//! println!("{} bytes, data files {:?}", saved.model_bytes, saved.data_files);
//! # Ok::<(), fastseq::Error>(())
//! ```
pub mod composed;
pub mod load;
pub mod write;
