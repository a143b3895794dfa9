"""The runtime half, side by side: how long until a pipeline is ready to call (and at what
peak memory), and what one call costs.

    python benches/bench_runtime.py              # both tables (a few minutes)
    python benches/bench_runtime.py --readme     # and write them into README.md

"Ready to call" (each measurement in its own process, repeats taken in turns across the
tools, medians): fastseq cold (compose + session), fastseq from its session cache, kornia's
whole constructor (when installed), ONNX Runtime alone on fastseq's merged file (weights
inline, as fastseq exports below 2 GB) and on the same model saved with external data (ONNX
Runtime's fastest start: it maps the data file), all with kornia's session options (extended
graph optimisations) on the CPU provider. Peak RSS is the process's VmHWM; system time is
the process's (all threads) over the same span, what a slow disk or memory copies show first.

"Per call" on a one-node model, in one process, the methods in turns: ``session.run``,
``run_with_iobinding`` (bound once), ``pipe(x)`` and the bound path ``binding.run()``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (the case generators and helpers)

OUT = HERE / "out"
RESULTS = OUT / "runtime.json"
MB = 1 << 20
CASES = {
    "node_heavy": (bench.gen_node_heavy, "50 models x 600 nodes (30,000 nodes)"),
    "weight_heavy8": (lambda folder: bench._weight_chain(folder, 8, 64 * MB, 1, external=False),
                      "8 models x 64 MB (512 MB of weights)"),
    "matmul4_8": (lambda folder: bench._weight_chain(folder, 8, 64 * MB, 4, external=False),
                  "8 models x 4 MatMul blocks of 2048 x 2048 (512 MB)"),
}
TOOLS = ["fastseq cold", "fastseq cached", "kornia", "onnxruntime on the merged file",
         "onnxruntime on external data"]
RUNS = 3


def files_of(case: str) -> list[Path]:
    folder = bench.CASES_DIR / case
    if not (folder / ".done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        print(f"generating {case} ...", file=sys.stderr, flush=True)
        CASES[case][0](folder)
        (folder / ".done").write_text("ok")
    return sorted(folder.glob("m*.onnx"))


# --- one measurement, in a worker process ------------------------------------------------------
def worker(tool: str, case: str, cache: str) -> None:
    files = [str(f) for f in files_of(case)]
    io_maps = [[("y", "x")]] * (len(files) - 1)
    os.environ.pop("FASTSEQ_SESSION_CACHE", None)
    if tool.startswith("fastseq"):
        import fastseq  # noqa: F401
    elif tool == "kornia":
        import warnings

        warnings.filterwarnings("ignore")
        import kornia.onnx  # noqa: F401
    import onnxruntime as ort

    base = bench.peak_rss()
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    if tool == "fastseq cold":
        import fastseq

        pipe = fastseq.ONNXSequential(*files, io_maps=io_maps, session_cache=False)
        session = pipe.get_session()
    elif tool == "fastseq cached":
        import fastseq

        pipe = fastseq.ONNXSequential(*files, io_maps=io_maps, session_cache=cache)
        assert pipe.session_info["cache"] == "hit", pipe.session_info
        session = pipe.get_session()
    elif tool == "kornia":
        import kornia.onnx

        pipe = kornia.onnx.ONNXSequential(*files, io_maps=io_maps)
        session = pipe.get_session()
    else:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        path = merged_file(case, external=tool == "onnxruntime on external data")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    elapsed, cpu = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    print("RESULT " + json.dumps({"s": elapsed, "sys": cpu.ru_stime - cpu0.ru_stime,
                                  "user": cpu.ru_utime - cpu0.ru_utime, "peak_rss": bench.peak_rss(),
                                  "base_rss": base, "inputs": len(session.get_inputs())}))


def merged_file(case: str, external: bool = False) -> Path:
    """fastseq's merged file: weights inline, or (``external``) in a data file beside it."""
    return bench.CASES_DIR / case / "merged" / ("fastseq-external.onnx" if external else "fastseq.onnx")


def prepare(case: str) -> str:
    """fastseq's merged file for ONNX Runtime alone, and a warm session cache."""
    import fastseq

    files = [str(f) for f in files_of(case)]
    io_maps = [[("y", "x")]] * (len(files) - 1)
    merged_file(case).parent.mkdir(exist_ok=True)
    fastseq.compose_to_file(files, merged_file(case), io_maps=io_maps)
    fastseq.compose_to_file(files, merged_file(case, external=True), io_maps=io_maps, external_data=True)
    cache = OUT / "session-cache" / case
    fastseq.ONNXSequential(*files, io_maps=io_maps, session_cache=cache)
    return str(cache)


def measure(tool: str, case: str, cache: str) -> dict:
    bench.warm_cache(case) if (bench.CASES_DIR / case).exists() else None
    warm(merged_file(case).parent)
    cmd = [sys.executable, __file__, "--worker", tool, case, cache]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:160]}
    return json.loads(line[len("RESULT "):])


def warm(folder: Path) -> None:
    """Reads the merged files once, as warm_cache does the sources: every tool starts from
    the page cache."""
    buf = bytearray(16 * MB)
    for f in sorted(folder.glob("*")):
        with open(f, "rb", buffering=0) as src:
            while src.readinto(buf):
                pass


def ready_table(cases: list[str], tools: list[str], repeats: int = RUNS) -> dict:
    report = {}
    for case in cases:
        cache = prepare(case)
        runs: dict[str, list[dict]] = {t: [] for t in tools}
        for _ in range(repeats):
            for tool in tools:
                print(f"{case}: {tool} ...", file=sys.stderr, flush=True)
                runs[tool].append(measure(tool, case, cache))
        rows = {}
        for tool, rs in runs.items():
            ok = [r for r in rs if "s" in r]
            if not ok:
                rows[tool] = {"error": rs[0].get("error", "failed")}
                continue
            rows[tool] = {"s": statistics.median(r["s"] for r in ok), "runs": sorted(r["s"] for r in ok),
                          "sys": statistics.median(r["sys"] for r in ok),
                          "peak_rss": max(r["peak_rss"] for r in ok), "base_rss": min(r["base_rss"] for r in ok)}
        report[case] = {"description": CASES[case][1], "rows": rows}
    return report


# --- per call -------------------------------------------------------------------------------------
def per_call(repeats: int = 7, number: int = 20000) -> dict:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import fastseq

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "one",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    pipe = fastseq.ONNXSequential(model, session_cache=False)
    session = pipe.get_session()
    x = np.ones((1, 4), np.float32)
    iob = session.io_binding()
    iob.bind_cpu_input("x", x)
    iob.bind_output("y", "cpu")
    bound = pipe.bind(x)
    methods = {
        "session.run": lambda: session.run(None, {"x": x}),
        "run_with_iobinding": lambda: session.run_with_iobinding(iob),
        "pipe(x)": lambda: pipe(x),
        "pipe.bind(x).run()": bound.run,
    }
    import timeit

    best = {k: [] for k in methods}
    for _ in range(repeats):
        for name, fn in methods.items():  # in turns, so that drift hits every method alike
            best[name].append(min(timeit.repeat(fn, number=number // 10, repeat=10)) / (number // 10) * 1e6)
    return {k: statistics.median(v) for k, v in best.items()}


# --- output ---------------------------------------------------------------------------------------
def tables(report: dict) -> str:
    lines = [f"Measured on {report['machine']}, {report['date']}.", ""]
    lines.append("| ready to call | tool | ready (median) | runs | system time | peak RSS |")
    lines.append("|---|---|---|---|---|---|")
    for case, c in report["ready"].items():
        for tool in TOOLS:
            r = c["rows"].get(tool)
            if r is None:
                continue
            if "error" in r:
                cells = ["fails: " + r["error"][:60], "", "", ""]
            else:
                cells = [f"{r['s']:.2f} s", ", ".join(f"{x:.2f}" for x in r["runs"]), f"{r['sys']:.2f} s",
                         f"{r['peak_rss'] / MB:,.0f} MB"]
            lines.append("| " + " | ".join([c["description"], tool, *cells]) + " |")
    lines.append("")
    calls = report["per_call"] or {}
    if calls:
        lines.append("| per call, one-node model | " + " | ".join(calls) + " |")
        lines.append("|" + "---|" * (len(calls) + 1))
        lines.append("| microseconds (median of best-of-10) | " + " | ".join(f"{v:.2f}" for v in calls.values()) + " |")
        lines.append("")
    lines.extend(targets(report))
    return "\n".join(lines)


def targets(report: dict) -> list[str]:
    out = ["Against the targets, in this run:"]
    for case, c in report["ready"].items():
        rows = c["rows"]
        cold, cached, kor, ortf, orte = (rows.get(t, {}) for t in TOOLS)
        if "s" in cold and "s" in ortf:
            out.append(f"- {case}: cold ready {cold['s'] / ortf['s']:.2f}x ONNX Runtime on the merged file "
                       f"(target <= 1.1x), peak RSS {cold['peak_rss'] / ortf['peak_rss']:.2f}x (target <= 1.2x)")
        if "s" in cold and "s" in orte:
            out.append(f"- {case}: cold ready {cold['s'] / orte['s']:.2f}x ONNX Runtime on external data "
                       f"(target <= 1.3x), peak RSS {cold['peak_rss'] / orte['peak_rss']:.2f}x")
        if "s" in cold and "s" in cached:
            out.append(f"- {case}: from the cache {cold['s'] / cached['s']:.1f}x faster than cold")
        if "s" in kor and "s" in cold:
            out.append(f"- {case}: {kor['s'] / cold['s']:.1f}x faster than kornia's constructor (target >= 5x)")
    calls = report["per_call"]
    if not calls:
        return out
    out.append(f"- pipe(x) costs {calls['pipe(x)'] - calls['session.run']:+.2f} us against session.run; the bound "
               f"path {calls['pipe.bind(x).run()'] - calls['run_with_iobinding']:+.2f} us against "
               "run_with_iobinding (target: within 1 us)")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--readme", action="store_true")
    p.add_argument("--runs", type=int, default=RUNS, help="measurements of each tool (medians)")
    p.add_argument("--no-per-call", action="store_true", help="skip the per-call table")
    a = p.parse_args()
    if a.worker:
        worker(*a.worker)
        return
    try:
        import kornia  # noqa: F401
        tools = TOOLS
    except Exception:
        print("kornia is not installed (pip install -r benches/requirements.txt): skipping it", file=sys.stderr)
        tools = [t for t in TOOLS if t != "kornia"]
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "date": time.strftime("%Y-%m-%d"), "ready": ready_table(a.cases.split(","), tools, a.runs),
              "per_call": None if a.no_per_call else per_call()}
    OUT.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    text = tables(report)
    print(text)
    if a.readme:
        bench.write_readme_section("runtime", text)


if __name__ == "__main__":
    main()
