//! What the server counts: per model, Triton's counters (so that dashboards and
//! `perf_analyzer` made for Triton read a fastseq server), histograms of latency and batch
//! sizes, the statistics extension's durations; per server, responses by status and the
//! process's memory, open files and threads. Atomics, changed without a lock by whichever
//! thread sees the event; read when scraped ([`Metrics::text`]) or asked for
//! ([`ModelMetrics::statistics`]).
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Status;

/// Seconds, for request and queue latencies.
pub const LATENCY_BUCKETS: [f64; 15] =
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];
/// Rows per batch.
pub const BATCH_BUCKETS: [f64; 11] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
/// Why a request failed, as Triton says it: refused (full, timed out, shutting down),
/// cancelled (its client left), the run failed, or the request itself was wrong.
pub const REASONS: [&str; 4] = ["REJECTED", "CANCELED", "BACKEND", "OTHER"];

/// A count of events and their summed duration (Triton's `StatisticDuration`).
#[derive(Debug, Default)]
pub struct Timed {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Timed {
    pub fn add(&self, count: u64, took: Duration) {
        self.count.fetch_add(count, Relaxed);
        self.ns.fetch_add(took.as_nanos() as u64, Relaxed);
    }

    /// (count, ns) now.
    pub fn read(&self) -> (u64, u64) {
        (self.count.load(Relaxed), self.ns.load(Relaxed))
    }
}

/// Counts per bucket, a sum and a count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_micros: AtomicU64::new(0) }
    }

    pub fn observe(&self, value: f64) {
        let k = self.bounds.partition_point(|&b| b < value);
        self.counts[k].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add((value * 1e6) as u64, Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut total = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            total += count.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound:?}\"}} {total}");
        }
        total += self.counts[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum_micros.load(Relaxed) as f64 / 1e6);
    }
}

/// Per batch size: how many runs of that size and their time (Triton's `InferBatchStatistics`).
#[derive(Debug, Default)]
struct BatchSizes(Mutex<BTreeMap<u64, (u64, u64)>>);

/// One model's counts.
#[derive(Debug)]
pub struct ModelMetrics {
    pub name: String,
    pub version: String,
    labels: String,
    /// Requests answered, failed by reason (in [`REASONS`]' order).
    success: Timed,
    failure: [Timed; 4],
    /// Rows run (warm-up runs not counted) and runs.
    rows: AtomicU64,
    executions: AtomicU64,
    /// Time in the queue, and in the run (each request counted with its batch's run time).
    queue: Timed,
    compute: Timed,
    pending: AtomicI64,
    last_inference_ms: AtomicU64,
    latency: Histogram,
    queued: Histogram,
    batch_sizes: Histogram,
    by_size: BatchSizes,
}

impl ModelMetrics {
    pub fn new(name: &str, version: &str) -> Self {
        ModelMetrics {
            name: name.to_string(),
            version: version.to_string(),
            labels: format!("model=\"{}\",version=\"{}\"", escape(name), escape(version)),
            success: Timed::default(),
            failure: Default::default(),
            rows: AtomicU64::new(0),
            executions: AtomicU64::new(0),
            queue: Timed::default(),
            compute: Timed::default(),
            pending: AtomicI64::new(0),
            last_inference_ms: AtomicU64::new(0),
            latency: Histogram::new(&LATENCY_BUCKETS),
            queued: Histogram::new(&LATENCY_BUCKETS),
            batch_sizes: Histogram::new(&BATCH_BUCKETS),
            by_size: BatchSizes::default(),
        }
    }

    /// A request answered, `took` from its first byte to its answer.
    pub fn done(&self, took: Duration) {
        self.success.add(1, took);
        self.latency.observe(took.as_secs_f64());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
        self.last_inference_ms.store(now, Relaxed);
    }

    /// A request that failed with `status` (or was cancelled: `None`).
    pub fn failed(&self, status: Option<Status>, took: Duration) {
        let reason = status.map_or("CANCELED", Status::reason);
        let k = REASONS.iter().position(|&r| r == reason).unwrap_or(3);
        self.failure[k].add(1, took);
        self.latency.observe(took.as_secs_f64());
    }

    /// A batch run: its rows, how long each of its requests waited, and the run's time.
    pub fn batch(&self, rows: usize, waits: &[Duration], run: Duration) {
        self.rows.fetch_add(rows as u64, Relaxed);
        self.executions.fetch_add(1, Relaxed);
        self.batch_sizes.observe(rows as f64);
        self.compute.add(waits.len() as u64, run * waits.len() as u32);
        for w in waits {
            self.queue.add(1, *w);
            self.queued.observe(w.as_secs_f64());
        }
        let mut sizes = self.by_size.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = sizes.entry(rows as u64).or_default();
        entry.0 += 1;
        entry.1 += run.as_nanos() as u64;
    }

    pub fn pending(&self, change: i64) {
        self.pending.fetch_add(change, Relaxed);
    }

    /// What the statistics extension reports, now.
    pub fn statistics(&self) -> Statistics {
        let failed = self.failure.iter().fold((0, 0), |(c, n), t| {
            let (c2, n2) = t.read();
            (c + c2, n + n2)
        });
        let sizes = self.by_size.0.lock().unwrap_or_else(|e| e.into_inner());
        Statistics {
            name: self.name.clone(),
            version: self.version.clone(),
            last_inference_ms: self.last_inference_ms.load(Relaxed),
            inference_count: self.rows.load(Relaxed),
            execution_count: self.executions.load(Relaxed),
            success: self.success.read(),
            fail: failed,
            queue: self.queue.read(),
            compute_infer: self.compute.read(),
            batches: sizes.iter().map(|(&size, &(count, ns))| (size, count, ns)).collect(),
        }
    }

    fn write(&self, families: &mut BTreeMap<&'static str, String>) {
        let l = &self.labels;
        let s = self.statistics();
        let mut put = |name: &'static str, line: String| families.entry(name).or_default().push_str(&line);
        put("nv_inference_request_success", format!("nv_inference_request_success{{{l}}} {}\n", s.success.0));
        for (reason, t) in REASONS.iter().zip(&self.failure) {
            put("nv_inference_request_failure", format!("nv_inference_request_failure{{{l},reason=\"{reason}\"}} {}\n", t.read().0));
        }
        put("nv_inference_count", format!("nv_inference_count{{{l}}} {}\n", s.inference_count));
        put("nv_inference_exec_count", format!("nv_inference_exec_count{{{l}}} {}\n", s.execution_count));
        let us = |ns: u64| ns / 1000;
        put("nv_inference_request_duration_us", format!("nv_inference_request_duration_us{{{l}}} {}\n", us(s.success.1 + s.fail.1)));
        put("nv_inference_queue_duration_us", format!("nv_inference_queue_duration_us{{{l}}} {}\n", us(s.queue.1)));
        put("nv_inference_compute_infer_duration_us", format!("nv_inference_compute_infer_duration_us{{{l}}} {}\n", us(s.compute_infer.1)));
        put("nv_inference_pending_request_count", format!("nv_inference_pending_request_count{{{l}}} {}\n", self.pending.load(Relaxed).max(0)));
        let mut h = String::new();
        self.latency.write(&mut h, "fastseq_request_duration_seconds", l);
        put("fastseq_request_duration_seconds", std::mem::take(&mut h));
        self.queued.write(&mut h, "fastseq_queue_duration_seconds", l);
        put("fastseq_queue_duration_seconds", std::mem::take(&mut h));
        self.batch_sizes.write(&mut h, "fastseq_batch_size", l);
        put("fastseq_batch_size", h);
    }
}

/// A model's statistics at one moment (Triton's `ModelStatistics`): durations as (count, ns);
/// `batches` as (batch size, runs, ns of compute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statistics {
    pub name: String,
    pub version: String,
    pub last_inference_ms: u64,
    pub inference_count: u64,
    pub execution_count: u64,
    pub success: (u64, u64),
    pub fail: (u64, u64),
    pub queue: (u64, u64),
    pub compute_infer: (u64, u64),
    pub batches: Vec<(u64, u64, u64)>,
}

/// The server's counts: every model's, and responses by status.
#[derive(Debug, Default)]
pub struct Metrics {
    pub models: Vec<Arc<ModelMetrics>>,
    responses: Mutex<BTreeMap<u16, u64>>,
    /// Upgrade requests refused (WebSocket and the like).
    pub upgrades: AtomicU64,
}

const HELP: &[(&str, &str, &str)] = &[
    ("nv_inference_request_success", "Successful inference requests", "counter"),
    ("nv_inference_request_failure", "Failed inference requests, by reason", "counter"),
    ("nv_inference_count", "Rows inferred (warm-up runs not counted)", "counter"),
    ("nv_inference_exec_count", "Model executions (batches run)", "counter"),
    ("nv_inference_request_duration_us", "Cumulative request duration, microseconds", "counter"),
    ("nv_inference_queue_duration_us", "Cumulative time requests waited in the queue, microseconds", "counter"),
    ("nv_inference_compute_infer_duration_us", "Cumulative run time of requests' batches, microseconds", "counter"),
    ("nv_inference_pending_request_count", "Requests received and not yet answered", "gauge"),
    ("fastseq_request_duration_seconds", "Request latency, from its first byte read to its answer", "histogram"),
    ("fastseq_queue_duration_seconds", "Time a request waited for its batch", "histogram"),
    ("fastseq_batch_size", "Rows per batch run", "histogram"),
];

impl Metrics {
    pub fn new(models: Vec<Arc<ModelMetrics>>) -> Self {
        Metrics { models, ..Default::default() }
    }

    pub fn response(&self, status: u16) {
        *self.responses.lock().unwrap_or_else(|e| e.into_inner()).entry(status).or_default() += 1;
    }

    /// Every metric in Prometheus' text format (0.0.4), Triton's names as Triton writes them
    /// (a counter without `_total`), then `extra` lines (the memory budget's, say).
    pub fn text(&self, extra: &str) -> String {
        let mut families = BTreeMap::new();
        for m in &self.models {
            m.write(&mut families);
        }
        let mut out = String::with_capacity(8192);
        for (name, help, kind) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            out.push_str(families.get(name).map_or("", String::as_str));
        }
        out.push_str("# HELP fastseq_http_responses HTTP responses, by status\n# TYPE fastseq_http_responses counter\n");
        for (status, n) in self.responses.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "fastseq_http_responses{{status=\"{status}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP fastseq_upgrades_refused Requests to upgrade the connection (WebSocket), refused\n\
             # TYPE fastseq_upgrades_refused counter\nfastseq_upgrades_refused {}",
            self.upgrades.load(Relaxed)
        );
        out.push_str(extra);
        process(&mut out);
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"")
}

/// The process's own, as prometheus_client's process collector names them (Linux: /proc).
fn process(out: &mut String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| -> Option<u64> {
        status.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
    };
    if let Some(kb) = field("VmRSS:") {
        let _ = writeln!(out, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}", kb * 1024);
    }
    if let Some(kb) = field("VmSize:") {
        let _ = writeln!(out, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes {}", kb * 1024);
    }
    if let Some(n) = field("Threads:") {
        let _ = writeln!(out, "# HELP fastseq_threads Threads of the process\n# TYPE fastseq_threads gauge\nfastseq_threads {n}");
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        let _ = writeln!(out, "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}", dir.count());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_triton_names_and_histograms() {
        let m = Arc::new(ModelMetrics::new("cnn", "1"));
        m.done(Duration::from_millis(3));
        m.failed(Some(Status::BadRequest), Duration::from_millis(1));
        m.batch(4, &[Duration::from_micros(10), Duration::from_micros(20)], Duration::from_millis(2));
        let metrics = Metrics::new(vec![m.clone()]);
        metrics.response(200);
        let text = metrics.text("");
        assert!(text.contains("nv_inference_request_success{model=\"cnn\",version=\"1\"} 1\n"), "{text}");
        assert!(text.contains("nv_inference_request_failure{model=\"cnn\",version=\"1\",reason=\"OTHER\"} 1\n"));
        assert!(text.contains("nv_inference_count{model=\"cnn\",version=\"1\"} 4\n"));
        assert!(text.contains("fastseq_batch_size_bucket{model=\"cnn\",version=\"1\",le=\"4.0\"} 1\n"));
        assert!(text.contains("fastseq_http_responses{status=\"200\"} 1\n"));
        let s = m.statistics();
        assert_eq!((s.inference_count, s.execution_count, s.batches.clone()), (4, 1, vec![(4, 1, 2_000_000)]));
        assert_eq!(s.compute_infer, (2, 4_000_000));
    }
}
