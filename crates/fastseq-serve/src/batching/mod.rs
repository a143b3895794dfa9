//! Batching where the bytes are: each model's requests queued, those whose axes past the
//! first agree joined into one contiguous buffer per input, run once by the [`Engine`] (the
//! one entry into Python: once a batch), and each request given exactly its own rows of the
//! outputs. The rules, decided here once: rows never mix (a request gets the rows it sent,
//! 0 included, and nothing else), a joint run that fails is run again request by request (only
//! the failing request's caller gets an error), a request whose client left or whose time ran
//! out is not run, the queue is bounded, and every byte a request holds is counted in one
//! [`budget::Budget`].
pub mod budget;
pub mod engine;
pub mod join;
pub mod queue;

pub use budget::{Budget, Held};
pub use engine::{Engine, EngineError};
pub use queue::{Answer, Batcher, Job};
