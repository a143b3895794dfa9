//! What runs a batch: the pipeline's session, behind a trait so that this crate needs no
//! Python (the bindings implement it over the pipeline's Python session, entering Python once
//! a batch; the tests implement it in Rust).
use crate::tensor::Tensor;

/// Runs one batch of a model.
pub trait Engine: Send + Sync + 'static {
    /// Every output of the model, in its order, for `inputs` (one tensor per input of the
    /// model, in its order, each contiguous). Called on the model's worker thread.
    fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, EngineError>;

    /// Runs `work`, the whole life of the model's worker thread, on that thread. An engine
    /// that enters another runtime keeps that runtime's state for this thread here, once for
    /// the thread's life rather than once a run (the bindings: Python's thread state, whose
    /// thread-locals a library such as gevent expects to live as long as the thread).
    fn on_worker_thread(&self, work: &mut (dyn FnMut() + Send)) {
        work()
    }
}

/// A run that failed: its message, and whether the values given were refused (the caller's
/// mistake, a 400) rather than the model failing (a 500).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    pub message: String,
    pub refused_input: bool,
}

impl EngineError {
    pub fn failed(message: impl Into<String>) -> Self {
        EngineError { message: message.into(), refused_input: false }
    }

    pub fn refused(message: impl Into<String>) -> Self {
        EngineError { message: message.into(), refused_input: true }
    }
}
