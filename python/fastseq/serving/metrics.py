"""What the server counts, exposed at ``/metrics`` in Prometheus' text format.

Triton's names where Triton has the metric (``nv_inference_request_success``,
``nv_inference_request_failure``, ``nv_inference_count``, ``nv_inference_exec_count``,
``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
``nv_inference_compute_infer_duration_us``, ``nv_inference_pending_request_count``), so
that dashboards made for Triton read a fastseq server; histograms of request and queue
latency and of batch sizes under ``fastseq_``; and the process's memory, open files and
threads. The counts are plain numbers kept by the one thread that changes each (the loop
for requests, a batcher's worker for its batches) and read when scraped: a request costs a
few additions, not a lock per metric."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from typing import Any

#: seconds, for request and queue latencies
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: rows per batch
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: why a request failed, as Triton says it: refused (queue full, timed out, shutting down),
#: cancelled (its client left), the run failed, or the request itself was wrong
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class Histogram:
    """Counts per bucket, a sum and a count; changed by one thread, read by any."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def samples(self, name: str, labels: dict[str, str]) -> Iterator[tuple[str, dict[str, str], float]]:
        total = 0
        for bound, count in zip(self.bounds, self.counts):
            total += count
            yield f"{name}_bucket", {**labels, "le": repr(float(bound))}, total
        total += self.counts[-1]
        yield f"{name}_bucket", {**labels, "le": "+Inf"}, total
        yield f"{name}_count", labels, total
        yield f"{name}_sum", labels, self.sum


class ModelStats:
    """One model's counts. Requests are counted on the loop; batches on the batcher's worker
    (``batch``); the queue depth is the server's count of the model's open requests."""

    def __init__(self, model: str, version: str) -> None:
        self.labels = {"model": model, "version": version}
        self.success = 0
        self.failure = dict.fromkeys(REASONS, 0)
        self.request_us = 0.0
        self.pending = 0
        self.latency = Histogram(LATENCY_BUCKETS)
        # the worker's
        self.rows = 0
        self.executions = 0
        self.queue_us = 0.0
        self.compute_us = 0.0
        self.queued = Histogram(LATENCY_BUCKETS)
        self.batch_sizes = Histogram(BATCH_BUCKETS)

    def done(self, seconds: float) -> None:
        self.success += 1
        self.request_us += seconds * 1e6
        self.latency.observe(seconds)

    def failed(self, reason: str, seconds: float) -> None:
        self.failure[reason] += 1
        self.request_us += seconds * 1e6
        self.latency.observe(seconds)

    def batch(self, rows: int, waits: list[float], run_s: float) -> None:
        """The batcher's observer: one batch of ``rows`` rows, its requests' queue times."""
        self.rows += rows
        self.executions += 1
        self.compute_us += run_s * 1e6 * len(waits)
        self.batch_sizes.observe(rows)
        for w in waits:
            self.queue_us += w * 1e6
            self.queued.observe(w)

    def unbatched(self, seconds: float, rows: int) -> None:
        """A request run without the batcher: one execution of its rows (as far as this
        server sees: another batching, Ray Serve's, may have joined it with others)."""
        self.rows += rows
        self.executions += 1
        self.compute_us += seconds * 1e6
        self.batch_sizes.observe(rows)


class Metrics:
    """The server's counts: every model's, responses by status, and the process's own
    (prometheus_client's process collector)."""

    def __init__(self) -> None:
        self.models: dict[str, ModelStats] = {}
        self.responses: dict[int, int] = {}
        self._process: Any = None  # prometheus_client's, made when first scraped (the serve extra)

    def model(self, name: str, version: str) -> ModelStats:
        stats = self.models[name] = ModelStats(name, version)
        return stats

    def response(self, status: int) -> None:
        self.responses[status] = self.responses.get(status, 0) + 1

    def families(self) -> Iterator[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """(name, help, type, samples) of each metric, read now."""
        stats = list(self.models.values())

        def each(values: Any) -> list[tuple[str, dict[str, str], float]]:
            return [sample for s in stats for sample in values(s)]

        for name, doc, field in (
            ("nv_inference_request_success", "Successful inference requests", "success"),
            ("nv_inference_count", "Rows inferred", "rows"),
            ("nv_inference_exec_count", "Model executions (batches run)", "executions"),
            ("nv_inference_request_duration_us", "Cumulative request duration, microseconds", "request_us"),
            (
                "nv_inference_queue_duration_us",
                "Cumulative time requests waited in the queue, microseconds",
                "queue_us",
            ),
            (
                "nv_inference_compute_infer_duration_us",
                "Cumulative run time of requests' batches, microseconds",
                "compute_us",
            ),
        ):
            yield name, doc, "counter", each(lambda s, name=name, field=field: [(name, s.labels, getattr(s, field))])
        yield (
            "nv_inference_request_failure",
            "Failed inference requests, by reason",
            "counter",
            each(
                lambda s: [("nv_inference_request_failure", {**s.labels, "reason": r}, n) for r, n in s.failure.items()]
            ),
        )
        yield (
            "nv_inference_pending_request_count",
            "Requests received and not yet answered",
            "gauge",
            each(lambda s: [("nv_inference_pending_request_count", s.labels, s.pending)]),
        )
        for name, doc, field in (
            ("fastseq_request_duration_seconds", "Request latency, from its first byte read to its answer", "latency"),
            ("fastseq_queue_duration_seconds", "Time a request waited for its batch", "queued"),
            ("fastseq_batch_size", "Rows per batch run", "batch_sizes"),
        ):
            yield (
                name,
                doc,
                "histogram",
                each(lambda s, name=name, field=field: getattr(s, field).samples(name, s.labels)),
            )
        yield (
            "fastseq_http_responses",
            "HTTP responses, by status",
            "counter",
            [("fastseq_http_responses", {"status": str(k)}, n) for k, n in sorted(self.responses.items())],
        )
        yield (
            "fastseq_threads",
            "Threads of the process that Python knows",
            "gauge",
            [("fastseq_threads", {}, threading.active_count())],
        )

    def text(self) -> bytes:
        """Every metric in Prometheus' text format (0.0.4), Triton's names as Triton writes
        them (a counter without ``_total``)."""
        from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

        if self._process is None:
            self._process = CollectorRegistry(auto_describe=False)
            ProcessCollector(registry=self._process)

        lines: list[str] = []
        for name, doc, kind, samples in self.families():
            lines += (f"# HELP {name} {doc}", f"# TYPE {name} {kind}")
            for sample, labels, value in samples:
                shown = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                lines.append(f"{sample}{{{shown}}} {_number(value)}" if shown else f"{sample} {_number(value)}")
        return ("\n".join(lines) + "\n").encode() + generate_latest(self._process)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
