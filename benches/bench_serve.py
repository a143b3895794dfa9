"""Serving many callers, side by side: 64 concurrent callers, each sending batch-1 requests,
on a small tabular pipeline, a small convolutional one and a node-heavy chain.

    python benches/bench_serve.py             # the table (about a minute)
    python benches/bench_serve.py --readme    # and write it into docs/benchmarks.md

Per pipeline, in one process: (a) 64 threads each calling ``pipe(x)`` (a thread-per-request
server today), (b) 64 coroutines on one asyncio loop through ``pipe.batcher()``, (c) 64
coroutines through ``pipe.run_async``, (d) 64 threads through the batcher; rows per second
and p50/p99 latency over a measured window after a warm-up, and the process's CPU time per
row, beside the pipeline's ceiling (its own rows per second at ``max_batch_size`` rows per
call from one thread). The five are measured in turns, ``REPEATS`` times, and the medians
reported, so that a busy spell of a shared machine does not land on one of them only. Then
what starting a batcher costs (the core's row check, and the batcher's own session), the
profile's overhead (creating the profiling session, and a profiled run against a plain
one), and a pipeline whose rows mix (Softmax over the batch axis): refused by the batcher,
and what joining its requests anyway would do to the callers' values.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (the case generators and the docs-table helper)

FIXTURES = HERE.parent / "tests" / "fixtures"
RESULTS = bench.OUT / "serve.json"
CALLERS = 64
MAX_BATCH = 32
MAX_DELAY_MS = 0.0  # the batcher's default: its worker runs what is queued whenever it is free
WARM_S, MEASURE_S = 0.3, 1.0
REPEATS = 3
MODES = {
    "a": "(a) 64 threads, pipe(x)",
    "b": "(b) 64 coroutines, batcher",
    "c": "(c) 64 coroutines, run_async",
    "d": "(d) 64 threads, batcher",
}
NODE_HEAVY = (10, 200)  # models x nodes of the chain


def pipelines() -> dict[str, tuple[str, object, object]]:
    """name -> (description, pipeline, one row)."""
    import numpy as np

    import fastseq

    rng = np.random.default_rng(0)
    folder = bench.CASES_DIR / "node_heavy_serve"
    if not (folder / ".done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        bench.gen_node_heavy(folder, *NODE_HEAVY, batch="N")
        (folder / ".done").write_text("ok")
    chain = sorted(folder.glob("m*.onnx"))
    models, nodes = NODE_HEAVY
    return {
        "tabular": (
            "tabular: skl2onnx scaler + MLP 64-256-10",
            fastseq.ONNXSequential(FIXTURES / "digits_scaler.onnx", FIXTURES / "digits_mlp.onnx"),
            rng.random((1, 64), dtype=np.float32),
        ),
        "conv": (
            "convolutional: torch CNN backbone + head, 3x32x32",
            fastseq.Pipeline(
                {"backbone": FIXTURES / "torch_cnn_backbone.onnx", "head": FIXTURES / "torch_head.onnx"},
                edges=["backbone.features -> head.features"],
            ),
            rng.random((1, 3, 32, 32), dtype=np.float32),
        ),
        "node_heavy": (
            f"node-heavy: {models} models x {nodes} nodes ({models * nodes:,} nodes)",
            fastseq.ONNXSequential(*chain, io_maps=[[("y", "x")]] * (len(chain) - 1)),
            rng.random((1, 64), dtype=np.float32),
        ),
    }


# --- one way of calling ------------------------------------------------------------------------
def _summary(done: list[tuple[float, float]], start: float, cpu_s: float) -> dict:
    """Rows per second and latencies over the requests that finished in the window; the
    process's CPU time per row over the whole measurement."""
    lo, hi = start + WARM_S, start + WARM_S + MEASURE_S
    window = sorted(end - begin for begin, end in done if lo <= end < hi)
    if not window:
        return {"rows_s": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan"), "cpu_us": float("nan")}
    return {
        "rows_s": len(window) / MEASURE_S,
        "p50_ms": window[len(window) // 2] * 1000,
        "p99_ms": window[min(len(window) - 1, int(len(window) * 0.99))] * 1000,
        "cpu_us": cpu_s / len(done) * 1e6,
    }


def with_threads(call: Callable, row) -> dict:
    done: list[tuple[float, float]] = []
    barrier = threading.Barrier(CALLERS + 1)
    stop = [0.0]

    def caller() -> None:
        mine = []
        barrier.wait()
        while True:
            begin = time.perf_counter()
            if begin >= stop[0]:
                break
            call(row)
            mine.append((begin, time.perf_counter()))
        done.extend(mine)  # list.extend is atomic under the GIL

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    cpu = time.process_time()
    start = time.perf_counter()
    stop[0] = start + WARM_S + MEASURE_S
    barrier.wait()
    for t in threads:
        t.join()
    return _summary(done, start, time.process_time() - cpu)


def with_coroutines(acall: Callable, row) -> dict:
    done: list[tuple[float, float]] = []

    async def caller(stop: float) -> None:
        while (begin := time.perf_counter()) < stop:
            await acall(row)
            done.append((begin, time.perf_counter()))

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(caller(start + WARM_S + MEASURE_S) for _ in range(CALLERS)))
        return start

    cpu = time.process_time()
    start = asyncio.run(main())
    return _summary(done, start, time.process_time() - cpu)


def ceiling(pipe, row) -> dict:
    """One thread, ``MAX_BATCH`` rows per call: rows per second and the time of one call."""
    import numpy as np

    x = np.repeat(row, MAX_BATCH, axis=0)
    for _ in range(5):
        pipe(x)
    times = []
    cpu = time.process_time()
    end = time.perf_counter() + MEASURE_S
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        pipe(x)
        times.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu
    return {
        "rows_s": MAX_BATCH * len(times) / sum(times),
        "batch_ms": statistics.median(times) * 1000,
        "cpu_us": cpu / (MAX_BATCH * len(times)) * 1e6,
    }


def profile_overhead(pipe, row, runs: int = 20, warmup: int = 3) -> dict:
    """The profiling session's creation, and a profiled run (wall, with the profiler's own
    work) against a plain ``pipe(x)`` on the same ``MAX_BATCH`` rows."""
    import numpy as np

    x = np.repeat(row, MAX_BATCH, axis=0)
    plain = []
    for _ in range(runs + warmup):
        t0 = time.perf_counter()
        pipe(x)
        plain.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    p = pipe.profile(x, runs=runs, warmup=warmup)
    total = time.perf_counter() - t0
    return {
        "session_s": p.session_s,
        "profiled_run_ms": (total - p.session_s) / (runs + warmup) * 1000,
        "plain_run_ms": statistics.median(plain[warmup:]) * 1000,
        "hottest": p.hottest.name if p.hottest else None,
        "profile": p.to_dict(),
    }


def one(mode: str, pipe, row) -> dict:
    if mode == "ceiling":
        return ceiling(pipe, row)
    if mode == "a":
        return with_threads(pipe, row)
    if mode == "c":
        return with_coroutines(pipe.run_async, row)
    with pipe.batcher(max_batch_size=MAX_BATCH, max_delay_ms=MAX_DELAY_MS) as b:
        return with_coroutines(b.run_async, row) if mode == "b" else with_threads(b, row)


def measure(name: str, pipe, row) -> dict:
    runs: dict[str, list[dict]] = {m: [] for m in ["ceiling", *MODES]}
    for k in range(REPEATS):  # in turns: a busy spell lands on all of them alike
        print(f"{name}: round {k + 1} of {REPEATS} ...", file=sys.stderr, flush=True)
        for mode in runs:
            runs[mode].append(one(mode, pipe, row))

    def median(results: list[dict]) -> dict:
        return {key: statistics.median(r[key] for r in results) for key in results[0]}

    print(f"{name}: profile ...", file=sys.stderr, flush=True)
    return {
        "ceiling": median(runs.pop("ceiling")),
        "modes": {m: median(r) for m, r in runs.items()},
        "start": batcher_start(pipe),
        "profile": profile_overhead(pipe, row),
    }


def batcher_start(pipe, runs: int = 5) -> dict:
    """What ``pipe.batcher()`` costs before the first request: the core's row check alone,
    and the whole start (the check; the batchers' own session is made with the first batch
    that has a thread)."""

    def best(call) -> float:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return min(times) * 1000

    return {"row_check_ms": best(pipe.check_rows), "start_ms": best(lambda: pipe.batcher().close())}


def mixing() -> dict:
    """Softmax over the batch axis: the batcher refuses it; forced (row_independent=True),
    joining 8 one-row requests gives each caller values computed from the others' rows."""
    import numpy as np
    from onnx import TensorProto, helper

    import fastseq

    g = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=0, name="over_rows")],
        "mix",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    pipe = fastseq.ONNXSequential(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    try:
        pipe.batcher()
        refused = ""
    except fastseq.CompositionError as e:
        refused = str(e).splitlines()[1]
    xs = [np.full((1, 4), k, np.float32) for k in range(8)]
    got: list = [None] * 8
    with pipe.batcher(max_batch_size=8, max_delay_ms=10_000, row_independent=True) as b:
        threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, b(xs[k])[0])) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    alone = [pipe(x)[0] for x in xs]
    return {
        "refused": refused,
        "alone": float(alone[0][0, 0]),
        "joined": float(got[0][0, 0]),
        "worst_error": float(max(abs(g - a).max() for g, a in zip(got, alone))),
    }


# --- output ---------------------------------------------------------------------------------------
def tables(report: dict) -> str:
    lines = [
        f"Measured on {report['machine']}, {report['date']} (load average {report['load'][0]:.1f} at the start, "
        f"{report['load'][1]:.1f} at the end: the machine is shared); {CALLERS} callers, batch-1 requests, "
        f"max_batch_size={MAX_BATCH}, max_delay_ms={MAX_DELAY_MS:g}.",
        "",
        "| rows/s (p50 / p99 latency; CPU per row) | ceiling: 1 thread, 32 rows per call | "
        + " | ".join(MODES.values())
        + " |",
        "|" + "---|" * (len(MODES) + 2),
    ]
    for r in report["pipelines"].values():
        c = r["ceiling"]
        cells = [r["description"], f"{c['rows_s']:,.0f} ({c['batch_ms']:.2f} ms per call; {c['cpu_us']:.0f} µs)"]
        for mode in MODES:
            m = r["modes"][mode]
            cells.append(f"{m['rows_s']:,.0f} ({m['p50_ms']:.1f} / {m['p99_ms']:.1f} ms; {m['cpu_us']:.0f} µs)")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| starting a batcher | the core's row check "
        "| pipe.batcher() (the check; its own session comes with the first batch of threads) |",
        "|---|---|---|",
    ]
    for r in report["pipelines"].values():
        lines.append(f"| {r['description']} | {r['start']['row_check_ms']:.2f} ms | {r['start']['start_ms']:.1f} ms |")
    m = report.get("mixing")
    if m:
        lines += [
            "",
            f"Rows that mix (Softmax over the batch axis): pipe.batcher() refuses it "
            f"({m['refused'].lstrip('- ')}); forced with row_independent=True, 8 joined one-row requests "
            f"get {m['joined']:.4g} where pipe(x) alone gives {m['alone']:.4g} (worst error {m['worst_error']:.3g}).",
        ]
    lines += [
        "",
        "| profile overhead | profiling session created | profiled run | plain run (pipe(x), 32 rows) |",
        "|---|---|---|---|",
    ]
    for r in report["pipelines"].values():
        p = r["profile"]
        lines.append(
            f"| {r['description']} | {p['session_s'] * 1000:.0f} ms | {p['profiled_run_ms']:.2f} ms "
            f"({p['profiled_run_ms'] / p['plain_run_ms']:.1f}x) | {p['plain_run_ms']:.2f} ms |"
        )
    lines += ["", *targets(report)]
    return "\n".join(lines)


def targets(report: dict) -> list[str]:
    out = ["Against the targets, in this run:"]
    runs = report["pipelines"]

    def rate(name: str, mode: str) -> float:
        return runs[name]["modes"][mode]["rows_s"]

    if "conv" in runs:
        share = rate("conv", "b") / runs["conv"]["ceiling"]["rows_s"]
        out.append(
            f"- conv: (b) reaches {share:.0%} of the ceiling (target >= 70%): {'met' if share >= 0.7 else 'missed'}"
        )
    if "tabular" in runs:
        x = rate("tabular", "b") / rate("tabular", "a")
        out.append(f"- tabular: (b) {x:.1f}x the rows/s of (a) (target >= 3x): {'met' if x >= 3 else 'missed'}")
    for name, r in runs.items():
        x = rate(name, "d") / rate(name, "a")
        p99_a, p99_d = r["modes"]["a"]["p99_ms"], r["modes"]["d"]["p99_ms"]
        verdict = "met (goal > 1x: met)" if x > 1 else "met (goal > 1x: missed)" if x >= 0.9 else "missed"
        out.append(
            f"- {name}: (d) {x:.2f}x the rows/s of (a) (target >= 0.9x): {verdict}; (d) p99 {p99_d:.1f} ms "
            f"against (a)'s {p99_a:.1f} ms (target lower): {'met' if p99_d < p99_a else 'missed'}"
        )
        bound = MAX_DELAY_MS + 2 * r["ceiling"]["batch_ms"]
        p99 = r["modes"]["b"]["p99_ms"]
        out.append(
            f"- {name}: (b) p99 {p99:.1f} ms against max_delay_ms + two batch runs = {bound:.1f} ms: "
            f"{'met' if p99 <= bound else 'missed'}"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipelines", default="tabular,conv,node_heavy")
    p.add_argument("--readme", action="store_true", help="write the table into docs/benchmarks.md (serve markers)")
    a = p.parse_args()
    chosen = a.pipelines.split(",")
    import onnx  # noqa: F401  (a process's first profile imports it: not the profile's own cost)

    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "pipelines": {},
    }
    start_load = os.getloadavg()[0]
    for name, (description, pipe, row) in pipelines().items():
        if name in chosen:
            report["pipelines"][name] = {"description": description, **measure(name, pipe, row)}
    report["mixing"] = mixing()
    report["load"] = (start_load, os.getloadavg()[0])
    bench.OUT.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    text = tables(report)
    print(text)
    if a.readme:
        bench.write_readme_section("serve", text)


if __name__ == "__main__":
    main()
