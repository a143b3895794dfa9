//! A model's queue and its worker thread. Whenever the worker is free it takes everything
//! queued that can join the first request (the same axes past the first, up to the model's
//! `max_batch_size` rows; a request with more rows runs alone), joins it, runs it once and
//! answers each request with its own rows. With `max_delay_us` > 0 a free worker that finds
//! fewer rows waits for more, at most until the oldest request has waited that long. A
//! request whose client left is not run; one whose deadline passed is answered 503 unrun.
//!
//! One worker per model: the run is ONNX Runtime's, which has threads of its own; the worker
//! only joins, calls the engine and splits (measured in benches/bench_netserve.py).
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::batching::engine::{Engine, EngineError};
use crate::batching::join;
use crate::error::{RequestError, Status};
use crate::metrics::ModelMetrics;
use crate::tensor::{ModelSpec, Tensor};

/// A request's answer: every output of the model (its own rows), or its failure.
pub type Answer = Result<Vec<Tensor>, RequestError>;

/// A request in the queue.
pub struct Job {
    inputs: Vec<Tensor>,
    rows: usize,
    key: Option<Vec<Vec<usize>>>,
    since: Instant,
    deadline: Instant,
    warm_up: bool,
    reply: oneshot::Sender<Answer>,
}

struct State {
    queue: VecDeque<Job>,
    rows: usize,
    closed: bool,
    /// The worker waits on the condition variable: a submit wakes it (a futex call each),
    /// and only then.
    sleeping: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    spec: Arc<ModelSpec>,
    engine: Arc<dyn Engine>,
    metrics: Arc<ModelMetrics>,
}

/// A model's queue and worker.
pub struct Batcher {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Batcher {
    /// Starts the worker of `spec`'s model over `engine`.
    pub fn start(spec: Arc<ModelSpec>, engine: Arc<dyn Engine>, metrics: Arc<ModelMetrics>) -> Batcher {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { queue: VecDeque::new(), rows: 0, closed: false, sleeping: false }),
            wake: Condvar::new(),
            spec,
            engine,
            metrics,
        });
        let worker = shared.clone();
        let name = format!("fastseq-batch-{}", shared.spec.name.chars().take(12).collect::<String>());
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let engine = worker.engine.clone();
                engine.on_worker_thread(&mut || worker.work())
            })
            .expect("a thread for the model's batches");
        Batcher { shared, worker: Mutex::new(Some(handle)) }
    }

    /// Queues a request (its tensors as the protocol decoded them, in the model's input
    /// order); its answer comes on the receiver. A warm-up run's rows are not counted.
    pub fn submit(
        &self,
        inputs: Vec<Tensor>,
        deadline: Instant,
        warm_up: bool,
    ) -> Result<oneshot::Receiver<Answer>, RequestError> {
        let (reply, answer) = oneshot::channel();
        let (rows, key) = match join::key(&inputs) {
            Some((rows, key)) => (rows, Some(key)),
            None if self.shared.spec.batched() => return Err(self.shared.not_joinable(&inputs)),
            None => (1, None),
        };
        let job = Job { inputs, rows, key, since: Instant::now(), deadline, warm_up, reply };
        let mut state = self.shared.lock();
        if state.closed {
            return Err(RequestError::new(Status::Unavailable, "the server is shutting down"));
        }
        state.rows += job.rows;
        state.queue.push_back(job);
        let sleeping = state.sleeping;
        drop(state);
        if sleeping {
            self.shared.wake.notify_one();
        }
        Ok(answer)
    }

    /// Runs what is queued, then ends the worker (and waits for it).
    pub fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        let handle = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// Requests queued now.
    pub fn queued(&self) -> usize {
        self.shared.lock().queue.len()
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.close();
    }
}

/// Asks the kernel not to let this thread preempt the one that woke it (Linux's SCHED_BATCH):
/// a request's arrival wakes the worker, and on a core the transport shares, a worker that
/// runs at once takes that one request alone while the others the transport has read wait
/// behind it; disfavoured, it runs once the transport has queued what it read, as a batch.
fn disfavoured() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain system call on this thread (0), with a valid parameter.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn work(&self) {
        disfavoured();
        while let Some(batch) = self.next() {
            self.run(batch);
        }
    }

    /// The next batch, waiting for one; None once closed and empty.
    fn next(&self) -> Option<Vec<Job>> {
        let max_rows = self.spec.max_batch_size.max(1);
        let delay = Duration::from_micros(self.spec.max_delay_us);
        let mut state = self.lock();
        loop {
            if let Some(oldest) = state.queue.front() {
                let until = oldest.since + delay;
                let now = Instant::now();
                if delay.is_zero() || state.closed || state.rows >= max_rows || now >= until {
                    return Some(self.take(&mut state, max_rows));
                }
                state.sleeping = true;
                state = self.wake.wait_timeout(state, until - now).unwrap_or_else(|e| e.into_inner()).0;
                state.sleeping = false;
            } else if state.closed {
                return None;
            } else {
                state.sleeping = true;
                state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                state.sleeping = false;
            }
        }
    }

    /// The first request and those after it that can join it, in order, up to `max_rows`
    /// rows; requests whose client left are dropped on the way, those past their deadline
    /// answered.
    fn take(&self, state: &mut State, max_rows: usize) -> Vec<Job> {
        let mut batch: Vec<Job> = Vec::new();
        let mut rows = 0;
        let now = Instant::now();
        let mut k = 0;
        while k < state.queue.len() {
            let job = &state.queue[k];
            if job.reply.is_closed() || job.deadline <= now {
                let job = state.queue.remove(k).expect("in the queue");
                state.rows -= job.rows;
                if !job.reply.is_closed() {
                    let _ = job.reply.send(Err(self.late()));
                }
                continue;
            }
            let fits = match batch.first() {
                None => true,
                Some(first) => {
                    self.spec.batched() && first.key.is_some() && job.key == first.key && rows + job.rows <= max_rows
                }
            };
            if fits {
                let job = state.queue.remove(k).expect("in the queue");
                state.rows -= job.rows;
                rows += job.rows;
                let alone = !self.spec.batched() || job.key.is_none();
                batch.push(job);
                if alone || rows >= max_rows {
                    break;
                }
            } else {
                k += 1;
            }
        }
        batch
    }

    /// Why a request to a batched model cannot join a batch: an input without a first axis,
    /// or inputs whose first axes differ (the batcher's one input rule, in its words).
    fn not_joinable(&self, inputs: &[Tensor]) -> RequestError {
        let names = self.spec.inputs.iter().map(|t| t.name.as_str());
        if let Some((name, _)) = names.clone().zip(inputs).find(|(_, t)| t.shape.is_empty()) {
            return RequestError::bad(format!(
                "input '{name}' of a batched request needs a batch axis (axis 0); got a scalar"
            ));
        }
        let sizes: Vec<String> = names.zip(inputs).map(|(n, t)| format!("'{n}' {}", t.shape[0])).collect();
        RequestError::bad(format!(
            "the inputs of one request must have the same number of rows (axis 0): {}",
            sizes.join(", ")
        ))
    }

    fn late(&self) -> RequestError {
        RequestError::new(
            Status::Unavailable,
            format!("model '{}': the request was not answered within its timeout", self.spec.name),
        )
    }

    fn run(&self, batch: Vec<Job>) {
        if batch.is_empty() {
            return;
        }
        let start = Instant::now();
        let counted: usize = batch.iter().filter(|j| !j.warm_up).map(|j| j.rows).sum();
        let waits: Vec<Duration> = batch.iter().filter(|j| !j.warm_up).map(|j| start - j.since).collect();
        if batch.len() == 1 {
            let job = batch.into_iter().next().expect("one");
            let answer = self.call(job.inputs);
            self.counted(counted, &waits, start);
            let _ = job.reply.send(answer);
            return;
        }
        let joined = {
            let inputs: Vec<&[Tensor]> = batch.iter().map(|j| j.inputs.as_slice()).collect();
            join::join(&inputs)
        };
        let outputs = self.call(joined);
        let rows: Vec<usize> = batch.iter().map(|j| j.rows).collect();
        match outputs {
            Ok(outputs) => {
                self.counted(counted, &waits, start);
                match join::split(&outputs, &rows) {
                    Ok(answers) => {
                        for (job, answer) in batch.into_iter().zip(answers) {
                            let _ = job.reply.send(Ok(answer));
                        }
                    }
                    Err(bad) => {
                        let error = self.not_split(bad, rows.iter().sum());
                        for job in batch {
                            let _ = job.reply.send(Err(error.clone()));
                        }
                    }
                }
            }
            // Which request failed is found by running each alone: only its caller gets the error.
            Err(_) => {
                for job in batch {
                    let alone = Instant::now();
                    let answer = self.call(job.inputs);
                    if !job.warm_up {
                        self.counted(job.rows, &[alone - job.since], alone);
                    }
                    let _ = job.reply.send(answer);
                }
            }
        }
    }

    fn counted(&self, rows: usize, waits: &[Duration], start: Instant) {
        if !waits.is_empty() {
            self.metrics.batch(rows, waits, start.elapsed());
        }
    }

    /// The engine's run, its failure (or panic) as the request's.
    fn call(&self, inputs: Vec<Tensor>) -> Answer {
        let name = &self.spec.name;
        match catch_unwind(AssertUnwindSafe(|| self.engine.run(inputs))) {
            Ok(Ok(outputs)) if outputs.len() == self.spec.outputs.len() => Ok(outputs),
            Ok(Ok(outputs)) => Err(RequestError::new(
                Status::Internal,
                format!("model '{name}' gave {} outputs, not {}", outputs.len(), self.spec.outputs.len()),
            )),
            Ok(Err(EngineError { message, refused_input })) => Err(RequestError::new(
                if refused_input { Status::BadRequest } else { Status::Internal },
                format!("model '{name}': {message}"),
            )),
            Err(_) => Err(RequestError::new(Status::Internal, format!("model '{name}': the run panicked"))),
        }
    }

    fn not_split(&self, bad: join::NotSplit, rows: usize) -> RequestError {
        let output = self.spec.outputs.get(bad.output).map_or("?", |t| t.name.as_str());
        RequestError::new(
            Status::Internal,
            format!(
                "model '{}': output '{output}' has shape {:?} for {rows} rows of input: it does not keep the batch \
                 axis, so its rows cannot be split between requests; serve it with batching off (--max-batch-size 1)",
                self.spec.name, bad.shape
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Datatype, TensorSpec};
    use bytes::Bytes;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// y = 2x + 1 per element, x [N, 3] FP32; a value of 13 is refused; counts its runs.
    struct Double(AtomicUsize);

    impl Engine for Double {
        fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, EngineError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            let x = &inputs[0];
            let mut out = Vec::with_capacity(x.data.len());
            for c in x.data.chunks_exact(4) {
                let v = f32::from_le_bytes(c.try_into().unwrap());
                if v == 13.0 {
                    return Err(EngineError::refused("13 is refused"));
                }
                out.extend_from_slice(&(2.0 * v + 1.0).to_le_bytes());
            }
            Ok(vec![Tensor { datatype: Datatype::Fp32, shape: x.shape.clone(), data: Bytes::from(out) }])
        }
    }

    fn spec(max_batch_size: usize) -> Arc<ModelSpec> {
        let t = |n: &str| TensorSpec { name: n.into(), datatype: Datatype::Fp32, shape: Some(vec![-1, 3]) };
        Arc::new(ModelSpec {
            name: "double".into(),
            version: "1".into(),
            inputs: vec![t("x")],
            outputs: vec![t("y")],
            max_batch_size,
            max_delay_us: 0,
        })
    }

    fn rows(n: usize, first: f32) -> Tensor {
        let data: Vec<u8> = (0..n * 3).flat_map(|k| (first + k as f32).to_le_bytes()).collect();
        Tensor { datatype: Datatype::Fp32, shape: vec![n, 3], data: Bytes::from(data) }
    }

    fn expected(x: &Tensor) -> Tensor {
        Double(AtomicUsize::new(0)).run(vec![x.clone()]).unwrap().remove(0)
    }

    fn batcher(max: usize) -> (Batcher, Arc<Double>, Arc<ModelMetrics>) {
        let engine = Arc::new(Double(AtomicUsize::new(0)));
        let metrics = Arc::new(ModelMetrics::new("double", "1"));
        (Batcher::start(spec(max), engine.clone(), metrics.clone()), engine, metrics)
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn many_threads_of_random_row_counts_each_get_their_own_rows() {
        let (b, engine, metrics) = batcher(8);
        let b = Arc::new(b);
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let plans: Vec<Vec<usize>> = (0..16).map(|_| (0..40).map(|_| (next() % 5) as usize).collect()).collect();
        let threads: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(t, plan)| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for (j, n) in plan.into_iter().enumerate() {
                        let x = rows(n, (t * 1000 + j * 10) as f32 + 0.5);
                        let got = b.submit(vec![x.clone()], far(), false).unwrap().blocking_recv().unwrap().unwrap();
                        assert_eq!(got, vec![expected(&x)], "thread {t} request {j} of {n} rows");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let runs = engine.0.load(Ordering::Relaxed);
        assert!(runs < 16 * 40, "joined: {runs} runs");
        assert_eq!(metrics.statistics().execution_count as usize, runs);
    }

    #[test]
    fn a_refused_request_fails_alone_and_the_others_get_their_answers() {
        let (b, _, _) = batcher(8);
        // Hold the worker on a first request so the next ones queue up and join.
        let mut bad = rows(1, 0.0);
        bad.data = Bytes::from([0f32, 13.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        let good: Vec<Tensor> = (0..4).map(|k| rows(2, k as f32 * 100.0 + 0.5)).collect();
        let mut waiting: Vec<_> = good.iter().map(|x| b.submit(vec![x.clone()], far(), false).unwrap()).collect();
        waiting.insert(2, b.submit(vec![bad], far(), false).unwrap());
        let answers: Vec<Answer> = waiting.into_iter().map(|r| r.blocking_recv().unwrap()).collect();
        assert_eq!(answers[2].as_ref().unwrap_err().status, Status::BadRequest);
        for (k, x) in good.iter().enumerate() {
            let a = &answers[if k < 2 { k } else { k + 1 }];
            assert_eq!(a.as_ref().unwrap(), &vec![expected(x)]);
        }
    }

    /// Double, run inside the worker thread's one `on_worker_thread` call.
    struct InThread(Double, AtomicUsize);

    thread_local! {
        static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    impl Engine for InThread {
        fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, EngineError> {
            assert!(INSIDE.with(|c| c.get()), "a run outside on_worker_thread");
            self.0.run(inputs)
        }

        fn on_worker_thread(&self, work: &mut (dyn FnMut() + Send)) {
            self.1.fetch_add(1, Ordering::Relaxed);
            INSIDE.with(|c| c.set(true));
            work();
            INSIDE.with(|c| c.set(false));
        }
    }

    #[test]
    fn every_run_is_inside_the_worker_threads_one_call_of_on_worker_thread() {
        let engine = Arc::new(InThread(Double(AtomicUsize::new(0)), AtomicUsize::new(0)));
        let metrics = Arc::new(ModelMetrics::new("double", "1"));
        let b = Batcher::start(spec(4), engine.clone(), metrics);
        for k in 0..20 {
            let x = rows(1 + k % 3, k as f32 * 10.0 + 0.5);
            let got = b.submit(vec![x.clone()], far(), false).unwrap().blocking_recv().unwrap().unwrap();
            assert_eq!(got, vec![expected(&x)]);
        }
        b.close();
        assert_eq!(engine.0 .0.load(Ordering::Relaxed), 20);
        assert_eq!(engine.1.load(Ordering::Relaxed), 1, "one call for the thread's life");
    }

    #[test]
    fn late_requests_are_answered_unrun_and_warm_ups_not_counted() {
        let (b, engine, metrics) = batcher(0);
        let late = b.submit(vec![rows(1, 0.0)], Instant::now() - Duration::from_millis(1), false).unwrap();
        assert_eq!(late.blocking_recv().unwrap().unwrap_err().status, Status::Unavailable);
        let warm = b.submit(vec![rows(1, 0.0)], far(), true).unwrap();
        assert!(warm.blocking_recv().unwrap().is_ok());
        b.close();
        assert_eq!(engine.0.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.statistics().inference_count, 0);
        assert_eq!(b.submit(vec![rows(1, 0.0)], far(), false).unwrap_err().status, Status::Unavailable);
    }
}
