//! fastseq's request path: the KServe v2 inference protocol (Triton's) over HTTP/1.1 and
//! gRPC, from the socket to a joined batch and back, with Python entered once a batch (the
//! [`batching::Engine`] the bindings hand in), never once a request.
//!
//! Layers, each naming only those below it:
//!
//! - base: [`error`] (a request's failure as a status and a message, client text made
//!   safe to echo) and [`tensor`] (datatypes, the model's tensors, a request's tensors);
//! - [`protocol`]: requests and answers to and from bytes (JSON, Triton's binary tensors,
//!   gRPC messages), the documents (metadata, config, statistics); pure functions;
//! - [`batching`]: requests joined into one contiguous buffer per input, run once by the
//!   engine, answers split per request; the rules (rows never mix, a failing request alone,
//!   timeouts, the queue bound) and the memory [`batching::budget`];
//! - [`service`]: what every request meets whatever carries it: the models, admission,
//!   the lifecycle, the [`metrics`];
//! - [`transport`]: HTTP/1.1 and gRPC (HTTP/2) on tokio and hyper, limits before work.
pub mod error;
pub mod metrics;
pub mod tensor;

pub mod batching;
pub mod protocol;
pub mod service;
pub mod transport;

// prost-derive as the workspace patches it calls this module by this path for `string`
// fields (protocol::grpc's messages): the core's, which keeps bytes that are not UTF-8.
#[doc(hidden)]
pub use fastseq::__prost_fidelity;
