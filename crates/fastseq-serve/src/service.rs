//! What every request meets, whichever transport carries it (HTTP, gRPC): the models by name
//! and version, admission (uploads in progress and complete requests bounded apart; none
//! while not ready or shutting down), the memory budget, its timeout, its failure as a status
//! and one log line, the metrics; and the lifecycle (ready after a warm-up, draining).
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::batching::{Batcher, Budget, Engine, Held};
use crate::error::{client_text, did_you_mean, log_line, RequestError, Status};
use crate::metrics::{Metrics, ModelMetrics};
use crate::tensor::{Datatype, InferRequest, ModelSpec, Tensor};

/// What a BYTES element of a request costs beyond its own bytes while its batch runs: the
/// Python str it becomes (49 bytes and its text), its slot in numpy's object array (8), ONNX
/// Runtime's std::string (32), and an output element of as many on the way back (a Python
/// bytes of 33, its packed length of 37, a list slot of 8). Measured: 200,000 one-character
/// elements through an Identity model held 30-35 MB (about 160 bytes each) at their peak.
pub const STRING_COST: u64 = 192;

/// The limits a server keeps.
#[derive(Debug, Clone)]
pub struct Options {
    /// Complete requests open at once (queued or running) before a 503.
    pub max_queue: usize,
    /// Requests whose bodies are arriving at once before a 503 (answered before the body is read).
    pub max_uploads: usize,
    /// A request body's limit (413).
    pub max_request_bytes: usize,
    /// Bytes every request in the server holds together (bodies, tensors, batches, answers).
    pub memory_budget: u64,
    /// A request's limit from its arrival to its answer (503).
    pub timeout: Duration,
    /// How long a body may take to arrive (408), and an answer to be read.
    pub body_timeout: Duration,
    /// How long request headers may take to arrive (408), and their size and count (431).
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// The server's version, as its metadata says.
    pub version: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_queue: 128,
            max_uploads: 64,
            max_request_bytes: 32 << 20,
            memory_budget: 1 << 30,
            timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16 << 10,
            max_headers: 64,
            version: String::new(),
        }
    }
}

/// Where the server's log lines go (`true`: an error), one line each.
pub type Log = Arc<dyn Fn(bool, &str) + Send + Sync>;

/// One served model.
pub struct Model {
    pub spec: Arc<ModelSpec>,
    pub batcher: Batcher,
    pub metrics: Arc<ModelMetrics>,
    /// Output bytes a row takes by the model's declared shapes (a request, where the model is
    /// not batched; 0 where the shapes do not say: a dynamic axis, BYTES).
    declared_per_row: u64,
    /// Output bytes a row gave in the recent runs (the warm-up's included): the most of the
    /// last run's and an eighth less than before, so that one large request does not make
    /// every later one look large for long.
    seen_per_row: AtomicU64,
}

impl Model {
    pub fn new(spec: ModelSpec, engine: Arc<dyn Engine>) -> Model {
        let spec = Arc::new(spec);
        let metrics = Arc::new(ModelMetrics::new(&spec.name, &spec.version));
        let batcher = Batcher::start(spec.clone(), engine, metrics.clone());
        let declared_per_row = declared_row_bytes(&spec);
        Model { spec, batcher, metrics, declared_per_row, seen_per_row: AtomicU64::new(0) }
    }

    /// The rows a request counts as: its first axis where the model is batched, else 1.
    pub fn rows(&self, request: &InferRequest) -> u64 {
        if !self.spec.batched() {
            return 1;
        }
        request.inputs.first().and_then(Tensor::rows).map_or(1, |r| r as u64)
    }

    /// Output bytes expected for `rows` rows.
    pub fn expected_outputs(&self, rows: u64) -> u64 {
        self.declared_per_row.max(self.seen_per_row.load(Ordering::Relaxed)).saturating_mul(rows)
    }

    /// Learns from a run's outputs for `rows` rows.
    pub fn learn(&self, outputs: &[Tensor], rows: u64) {
        if rows == 0 {
            return;
        }
        let seen = outputs.iter().map(|t| t.data.len() as u64).sum::<u64>().div_ceil(rows);
        let _ =
            self.seen_per_row.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| Some(seen.max(old - old / 8)));
    }

    /// What running `request` adds to what its tensors hold already, as (bytes it will hold
    /// for certain, bytes its outputs are expected to take): the joined batch's copy of its
    /// inputs (batched models) and its BYTES elements as Python and ONNX Runtime hold them;
    /// twice its expected outputs (ONNX Runtime's arrays and the server's copy, then the
    /// server's copy and each request's own rows split out of it).
    pub fn run_cost(&self, request: &InferRequest) -> (u64, u64) {
        let joined = if self.spec.batched() { request.bytes() as u64 } else { 0 };
        let strings: u64 = request
            .inputs
            .iter()
            .filter(|t| t.datatype == Datatype::Bytes)
            .map(|t| (t.elements() as u64).saturating_mul(STRING_COST).saturating_add(2 * t.data.len() as u64))
            .fold(0, u64::saturating_add);
        (joined.saturating_add(strings), self.expected_outputs(self.rows(request)).saturating_mul(2))
    }
}

/// The output bytes a row takes by the model's declared shapes (past the batch axis where it
/// is batched); 0 for what they do not say (a dynamic axis, BYTES).
fn declared_row_bytes(spec: &ModelSpec) -> u64 {
    let skip = usize::from(spec.batched());
    spec.outputs
        .iter()
        .map(|t| match (t.datatype.size(), &t.shape) {
            (Some(size), Some(dims)) if dims.iter().skip(skip).all(|&d| d >= 0) => {
                dims.iter().skip(skip).try_fold(size as u64, |n, &d| n.checked_mul(d as u64)).unwrap_or(u64::MAX)
            }
            _ => 0,
        })
        .fold(0, u64::saturating_add)
}

/// The bytes of `request`'s tensors that are not slices of `body` (decoded into buffers of
/// their own: JSON values, typed gRPC contents), and whether any is such a slice.
pub fn fresh_bytes(body: &[u8], request: &InferRequest) -> (u64, bool) {
    let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let mut fresh = 0;
    let mut sliced = false;
    for t in &request.inputs {
        let at = t.data.as_ptr() as usize;
        if !t.data.is_empty() && range.contains(&at) {
            sliced = true;
        } else {
            fresh += t.data.len() as u64;
        }
    }
    (fresh, sliced)
}

/// The models and everything requests share.
pub struct Service {
    pub models: Vec<Model>,
    pub options: Options,
    pub budget: Arc<Budget>,
    pub metrics: Metrics,
    open: AtomicUsize,
    uploads: AtomicUsize,
    ready: AtomicBool,
    draining: AtomicBool,
    failed: Mutex<Option<String>>,
    log: Log,
}

/// A place taken (an upload in progress, or a complete request), given back when dropped.
pub struct Slot<'a> {
    count: &'a AtomicUsize,
    metrics: Option<&'a ModelMetrics>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        if let Some(m) = self.metrics {
            m.pending(-1);
        }
    }
}

impl Service {
    pub fn new(models: Vec<(ModelSpec, Arc<dyn Engine>)>, options: Options, log: Log) -> Arc<Service> {
        let models: Vec<Model> = models.into_iter().map(|(spec, engine)| Model::new(spec, engine)).collect();
        let metrics = Metrics::new(models.iter().map(|m| m.metrics.clone()).collect());
        Arc::new(Service {
            budget: Budget::new(options.memory_budget),
            models,
            options,
            metrics,
            open: AtomicUsize::new(0),
            uploads: AtomicUsize::new(0),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            failed: Mutex::new(None),
            log,
        })
    }

    // --- lifecycle --------------------------------------------------------------------------
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Runs a row of zeros through each model's own path (a warm-up: not counted), then
    /// marks the server ready. The first failure is kept, said to every request after it, and
    /// returned.
    pub fn warm_up(&self) -> Result<(), String> {
        for m in &self.models {
            let zeros = m.spec.inputs.iter().map(|t| crate::batching::join::zeros(t.datatype, &t.shape)).collect();
            let deadline = Instant::now() + self.options.timeout;
            let answer = m
                .batcher
                .submit(zeros, deadline, true)
                .map_err(|e| e.message)
                .and_then(|rx| rx.blocking_recv().map_err(|_| "the model's worker ended".to_string()))
                .and_then(|a| a.map_err(|e| e.message))
                .map(|outputs| m.learn(&outputs, 1));
            if let Err(why) = answer {
                let message = format!(
                    "model '{}' failed its warm-up run (a row of zeros, each dynamic axis 1), so it is not ready: {why}; \
                     serve it without a warm-up run (--no-warm-up, warm_up=False) if such a row is not an input it takes",
                    m.spec.name
                );
                self.say(true, &message);
                *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                return Err(message);
            }
        }
        self.mark_ready();
        Ok(())
    }

    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Stops taking requests (ready turns false); those open go on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Requests open now: uploading, queued or running.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire) + self.uploads.load(Ordering::Acquire)
    }

    /// Runs what the batchers took and ends their workers.
    pub fn close(&self) {
        self.drain();
        for m in &self.models {
            m.batcher.close();
        }
    }

    // --- a request ----------------------------------------------------------------------------
    /// The model `name` (at `version`, if given): a 404 naming the near miss if none.
    pub fn model(&self, name: &str, version: Option<&str>) -> Result<&Model, RequestError> {
        let Some(model) = self.models.iter().find(|m| m.spec.name == name) else {
            let names: Vec<&str> = self.models.iter().map(|m| m.spec.name.as_str()).collect();
            return Err(RequestError::new(
                Status::NotFound,
                format!(
                    "no model {}{}; models: {}",
                    client_text(name),
                    did_you_mean(name, names.iter().copied()),
                    names.join(", ")
                ),
            ));
        };
        if let Some(v) = version {
            if v != model.spec.version {
                return Err(RequestError::new(
                    Status::NotFound,
                    format!("model '{name}' has no version {}; versions: {}", client_text(v), model.spec.version),
                ));
            }
        }
        Ok(model)
    }

    /// Whether `model` takes requests now; a 503 saying why not.
    pub fn accepting(&self, model: &Model) -> Result<(), RequestError> {
        if self.draining() {
            return Err(RequestError::new(Status::Unavailable, "the server is shutting down"));
        }
        if !self.ready.load(Ordering::Acquire) {
            if let Some(why) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                return Err(RequestError::new(
                    Status::Unavailable,
                    format!("model '{}' is not ready: its warm-up run failed: {why}", model.spec.name),
                ));
            }
            return Err(RequestError::new(
                Status::Unavailable,
                format!("model '{}' is not ready yet", model.spec.name),
            ));
        }
        Ok(())
    }

    /// A place for a body to arrive in (a 503 when `max_uploads` are arriving).
    pub fn upload(&self, model: &Model) -> Result<Slot<'_>, RequestError> {
        self.accepting(model)?;
        self.upload_place()
    }

    /// A place for a body still arriving, whatever the model (a 503 when `max_uploads` are
    /// arriving); a body that came whole with its headers needs none.
    pub fn upload_place(&self) -> Result<Slot<'_>, RequestError> {
        let before = self.uploads.fetch_add(1, Ordering::AcqRel);
        let slot = Slot { count: &self.uploads, metrics: None };
        if before >= self.options.max_uploads {
            return Err(RequestError::new(
                Status::Unavailable,
                format!("{before} request bodies are arriving, the most this server reads at once (max_uploads); try again later"),
            ));
        }
        Ok(slot)
    }

    /// A place in the queue for a complete request (a 503 when `max_queue` are open).
    pub fn admit<'a>(&'a self, model: &'a Model) -> Result<Slot<'a>, RequestError> {
        self.accepting(model)?;
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        model.metrics.pending(1);
        let slot = Slot { count: &self.open, metrics: Some(&model.metrics) };
        if before >= self.options.max_queue {
            return Err(RequestError::new(
                Status::Unavailable,
                format!("{before} requests are open, the most this server takes (max_queue); try again later"),
            ));
        }
        Ok(slot)
    }

    /// When a request that arrived at `began` must be answered by.
    pub fn deadline(&self, began: Instant, request: Option<&InferRequest>) -> Instant {
        let own = request.and_then(|r| r.timeout).unwrap_or(self.options.timeout);
        began + own.min(self.options.timeout)
    }

    /// The bytes running `request` adds to `held` (what its account holds now): what it will
    /// hold for certain, and its expected outputs as far as the budget has room for them (an
    /// estimate never makes a request a 413: what it says past the budget is taken once the
    /// outputs exist). Taken by the transport in one step with whatever else it still needs,
    /// so that a request waits for bytes at one point only once its body is in.
    pub fn run_bytes(&self, model: &Model, request: &InferRequest, held: u64) -> u64 {
        let (certain, expected) = model.run_cost(request);
        let room = self.budget.limit().saturating_sub(held.saturating_add(certain));
        certain.saturating_add(expected.min(room))
    }

    /// Runs `request` by its model's batcher within its deadline: every output of the model,
    /// its own rows. `held` is the request's account, holding its tensors and the run's cost
    /// ([`Service::run_bytes`], taken by the caller); it holds exactly the outputs once they
    /// exist (the caller lets go of its tensors: the run took them).
    pub async fn infer(
        &self,
        model: &Model,
        request: InferRequest,
        began: Instant,
        held: &mut Held,
    ) -> Result<Vec<Tensor>, RequestError> {
        let deadline = self.deadline(began, Some(&request));
        let name = &model.spec.name;
        let rows = model.rows(&request);
        let answer = model.batcher.submit(request.inputs, deadline, false)?;
        let late = || {
            RequestError::new(
                Status::Unavailable,
                format!(
                    "model '{name}': the request was not answered within its timeout of {} s",
                    crate::error::seconds(deadline - began)
                ),
            )
        };
        let outputs = match tokio::time::timeout_at(deadline.into(), answer).await {
            Ok(Ok(answer)) => answer?,
            Ok(Err(_)) => return Err(RequestError::new(Status::Unavailable, "the server is shutting down")),
            Err(_) => return Err(late()),
        };
        // The inputs are gone with the run; the outputs are held until the answer is read.
        model.learn(&outputs, rows);
        held.resize(outputs.iter().map(|t| t.data.len() as u64).sum());
        Ok(outputs)
    }

    /// Counts a request's failure and says it in one log line (`what`: the request as the
    /// transport names it). Client errors are warnings, the server's are errors.
    pub fn failed(&self, model: Option<&Model>, error: &RequestError, began: Instant, what: &str) {
        if let Some(m) = model {
            m.metrics.failed(Some(error.status), began.elapsed());
        }
        let line = format!("{what}: {} {}", error.status.http(), error.message);
        self.say(error.status == Status::Internal, &line);
    }

    /// A request whose client left before its answer.
    pub fn cancelled(&self, model: &Model, began: Instant) {
        model.metrics.failed(None, began.elapsed());
    }

    /// One log line, whatever `line` holds.
    pub fn say(&self, error: bool, line: &str) {
        (self.log)(error, &log_line(line));
    }
}
