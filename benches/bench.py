"""Side-by-side benchmark: fastseq vs onnx.compose (pairwise chain) vs kornia's
ONNXSequential vs a plain copy of the same bytes, on cases this script generates.

    python benches/bench.py                 # every case (needs ~40 GB of disk for "big10")
    python benches/bench.py --quick         # small cases only, a minute or two
    python benches/bench.py --cases weight_heavy,node_heavy --readme

Each measurement runs in its own subprocess, so peak RSS (ru_maxrss) is that tool's alone.
Composition (merge + export to a file) and ONNX Runtime session creation are timed apart.
Results: a table on stdout and benches/out/results.json; --readme rewrites the table between
the bench markers, in docs/benchmarks.md (where the tables live now; the flag kept its name).
Timings are noisy on shared machines: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE / "out"
CASES_DIR = OUT / "cases"
RESULTS = OUT / "results.json"
#: where the tables live between their markers (the README held them before the docs site)
DOCS = [HERE.parent / "README.md", *sorted((HERE.parent / "docs").glob("*.md"))]
GB = 1 << 30
MB = 1 << 20
REPEATS = 5  # runs of a measurement that takes little time; the median is reported
REPEAT_BUDGET_S = 10.0
MIN_RUNS, MIN_RUNS_UNDER_S = 3, 30.0  # a median of two is a mean: runs under 30 s get three


# --- case generation ---------------------------------------------------------------------
def _np():
    import numpy as np

    return np


def _save(model, path: Path, external: bool = False) -> None:
    import onnx

    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".bin", size_threshold=1024)
    else:
        onnx.save(model, str(path))


def xy_model(nodes, name: str, inits, shape: list):
    """A model of ``nodes`` from one float input ``x`` to one float output ``y``, both of
    ``shape`` (a name for a dynamic axis), at opset 17 and IR version 8: every case here,
    and device_check.py's model."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _matmul_model(weights, dim: int, name: str):
    from onnx import helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for k, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        out = "y" if k == len(weights) - 1 else f"h{k}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [out], name=f"matmul{k}"))
        prev = out
    return xy_model(nodes, name, inits, [1, dim])


def gen_node_heavy(folder: Path, models: int = 50, nodes: int = 600, batch: int | str = 1) -> None:
    """50 models x 600 nodes, small weights, identical internal names (all clash); inputs and
    outputs [batch, 64] (``batch`` a name for a dynamic batch axis)."""
    from onnx import helper, numpy_helper

    np = _np()
    for i in range(models):
        c = numpy_helper.from_array(np.full(64, 0.001 * (i + 1), np.float32), "c")
        ns, prev = [], "x"
        for k in range(nodes):
            out = "y" if k == nodes - 1 else f"n{k}"
            ns.append(
                helper.make_node("Add", [prev, "c"], [out], name=f"add{k}")
                if k % 2 == 0
                else helper.make_node("Relu", [prev], [out], name=f"relu{k}")
            )
            prev = out
        _save(xy_model(ns, f"block{i}", [c], [batch, 64]), folder / f"m{i:02d}.onnx")


def _weight_chain(folder: Path, models: int, per_model: int, mats: int, external: bool) -> None:
    np = _np()
    dim = int((per_model / mats / 4) ** 0.5)
    w = (np.random.default_rng(0).standard_normal((dim, dim), dtype=np.float32) / dim).astype(np.float32)
    for i in range(models):
        _save(_matmul_model([w] * mats, dim, f"mm{i}"), folder / f"m{i:02d}.onnx", external=external)


def gen_weight_heavy(folder: Path) -> None:
    """16 models x 64 MB of inline weights (1 GB)."""
    _weight_chain(folder, 16, 64 * MB, 1, external=False)


def gen_big3(folder: Path) -> None:
    """6 models x 512 MB inline (3 GB): the merged model is over protobuf's 2 GB."""
    _weight_chain(folder, 6, 512 * MB, 2, external=False)


def gen_big10(folder: Path) -> None:
    """10 models x 1 GB in external data files (10 GB)."""
    _weight_chain(folder, 10, 1 * GB, 1, external=True)


def gen_subgraphs(folder: Path, models: int = 20) -> None:
    """20 models whose If branches and Loop body read outer-scope initializers."""
    from onnx import TensorProto, helper, numpy_helper

    np = _np()
    for i in range(models):
        c = numpy_helper.from_array(np.full(64, 0.5, np.float32), "c")
        then_g = helper.make_graph(
            [helper.make_node("Mul", ["x", "c"], ["a"])],
            "then",
            [],
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 64])],
        )
        else_g = helper.make_graph(
            [helper.make_node("Sub", ["x", "c"], ["b"])],
            "else",
            [],
            [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 64])],
        )
        body = helper.make_graph(
            [
                helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                helper.make_node("Add", ["acc", "c"], ["acc_out"]),
            ],
            "body",
            [
                helper.make_tensor_value_info("i", TensorProto.INT64, []),
                helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 64]),
            ],
            [
                helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 64]),
            ],
        )
        nodes = [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["t"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Loop", ["n", "", "t"], ["y"], body=body),
        ]
        inits = [
            c,
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(2, np.int64), "n"),
        ]
        _save(xy_model(nodes, f"sub{i}", inits, [1, 64]), folder / f"m{i:02d}.onnx")


def gen_dag(folder: Path, stages: int = 20, nodes: int = 1500) -> None:
    """20 stages x 1500 nodes (node_heavy's 30,000 nodes) as a graph: stage i reads stage
    i - 1 and, through a skip edge, stage i - 2. Wired by a pipeline.toml beside them."""
    from onnx import TensorProto, helper, numpy_helper

    np = _np()
    edges = []
    for i in range(stages):
        skip = i >= 2
        c = numpy_helper.from_array(np.full(64, 0.001 * (i + 1), np.float32), "c")
        ns, prev = [], "x"
        if skip:
            ns.append(helper.make_node("Add", ["x", "skip"], ["joined"], name="join"))
            prev = "joined"
        body = nodes - len(ns)
        for k in range(body):
            out = "y" if k == body - 1 else f"n{k}"
            ns.append(
                helper.make_node("Add", [prev, "c"], [out], name=f"add{k}")
                if k % 2 == 0
                else helper.make_node("Relu", [prev], [out], name=f"relu{k}")
            )
            prev = out
        inputs = [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64]) for n in (["x", "skip"] if skip else ["x"])
        ]
        g = helper.make_graph(
            ns, f"stage{i}", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [c]
        )
        _save(
            helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), folder / f"m{i:02d}.onnx"
        )
        if i >= 1:
            edges.append(f'  "m{i - 1:02d}.y -> m{i:02d}.x",')
        if skip:
            edges.append(f'  "m{i - 2:02d}.y -> m{i:02d}.skip",')
    stage_lines = [f'm{i:02d} = "m{i:02d}.onnx"' for i in range(stages)]
    (folder / "pipeline.toml").write_text(
        "edges = [\n" + "\n".join(edges) + "\n]\n\n[stages]\n" + "\n".join(stage_lines) + "\n"
    )


CASES = {
    "node_heavy": (gen_node_heavy, "50 models x 600 nodes"),
    "weight_heavy": (gen_weight_heavy, "16 models x 64 MB inline"),
    "subgraphs": (gen_subgraphs, "20 models with If/Loop reading outer initializers"),
    "big3": (gen_big3, "6 models x 512 MB inline, 3 GB"),
    "big10": (gen_big10, "10 models x 1 GB external data, 10 GB"),
    "dag": (gen_dag, "20 stages x 1500 nodes with skip edges (a pipeline.toml)"),
}
QUICK = ["node_heavy", "weight_heavy", "subgraphs"]


def case_files(case: str) -> list[Path]:
    folder = CASES_DIR / case
    done = folder / ".done"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        print(f"generating {case} ({CASES[case][1]}) ...", file=sys.stderr, flush=True)
        CASES[case][0](folder)
        done.write_text("ok")
    return sorted(folder.glob("m*.onnx"))


def input_bytes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files) + sum(f.stat().st_size for f in files[0].parent.glob("*.bin"))


def count_nodes(files: list[Path]) -> int:
    from fastseq import _core

    return sum(_core.load_model(str(f)).summary()["nodes"] for f in files)


# --- the tools (run inside a worker subprocess) --------------------------------------------
def tool_fastseq(files, out: Path, mode: str) -> None:
    import fastseq

    external = {"inline": None, "external": True, "reuse": "reuse"}[mode]
    pipeline = files[0].parent / "pipeline.toml"
    if pipeline.exists():  # a graph: the pipeline file wires the stages
        from fastseq.facades.compose import save
        from fastseq.graph import build, pipefile

        description = pipefile.read(pipeline)
        save(build.build(description).composed, out, external)
        return
    fastseq.compose_to_file([str(f) for f in files], out, external_data=external)


def _onnx_compose_script(compose, files, out: Path) -> None:
    """A build script written for onnx.compose: add_prefix, then merge_models pairwise."""
    import onnx

    merged = compose.add_prefix(onnx.load(str(files[0])), "s0/")
    for j, f in enumerate(files[1:], start=1):
        m = compose.add_prefix(onnx.load(str(f)), f"s{j}/")
        merged = compose.merge_models(merged, m, io_map=[(f"s{j - 1}/y", f"s{j}/x")])
    onnx.save(merged, str(out))


def tool_onnx(files, out: Path, mode: str) -> None:
    import onnx.compose

    _onnx_compose_script(onnx.compose, files, out)


def tool_onnx_compose(files, out: Path, mode: str) -> None:
    """The same script with its import changed to fastseq.onnx_compose."""
    import fastseq.onnx_compose

    _onnx_compose_script(fastseq.onnx_compose, files, out)


def tool_kornia(files, out: Path, mode: str) -> None:
    import warnings

    import onnx

    warnings.filterwarnings("ignore")
    from kornia.onnx import ONNXSequential

    seq = ONNXSequential.__new__(ONNXSequential)  # kornia's own load + combine, no session
    seq.operators = seq._load_ops(*[str(f) for f in files])
    combined = seq.combine([[("y", "x")]] * (len(files) - 1))
    onnx.save(combined, str(out))


def tool_copy(files, out: Path, mode: str) -> None:
    """The physical limit: the same bytes read and written once."""
    sources = list(files) + sorted(files[0].parent.glob("*.bin"))
    with open(out, "wb") as dst:
        for f in sources:
            with open(f, "rb") as src:
                shutil.copyfileobj(src, dst, 16 * MB)
        dst.flush()
        os.fsync(dst.fileno())


TOOLS = {
    "fastseq": tool_fastseq,
    "onnx.compose": tool_onnx,
    "fastseq.onnx_compose": tool_onnx_compose,
    "kornia": tool_kornia,
    "copy": tool_copy,
}


def peak_rss() -> int:
    """VmHWM: this process's peak RSS. (ru_maxrss survives exec on Linux, so a child
    would report its parent's peak.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# What each tool imports is loaded before the clock starts: torch alone takes seconds.
# `import fastseq` is lazy, so fastseq's line names the modules a first compose loads (when
# this table began, `import fastseq` loaded them; the first call now does, ~15 ms).
PREPARE = {
    "fastseq": "import fastseq, fastseq.facades.compose, fastseq.graph.build, fastseq.sources.resolve",
    "onnx.compose": "import onnx, onnx.compose",
    "fastseq.onnx_compose": "import onnx, fastseq.onnx_compose",
    "kornia": "import onnx, warnings; warnings.filterwarnings('ignore'); import kornia.onnx",
    "copy": "",
}


def worker(tool: str, case: str, mode: str, out: str, session: bool) -> None:
    files = sorted((CASES_DIR / case).glob("m*.onnx"))
    exec(PREPARE[tool], {})
    base_rss = peak_rss()
    result: dict = {"ok": False}
    t0 = time.perf_counter()
    try:
        TOOLS[tool](files, Path(out), mode)
        result["compose_s"] = time.perf_counter() - t0
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001 - report every failure, including MemoryError
        result["compose_s"] = time.perf_counter() - t0
        result["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    result["peak_rss"] = peak_rss()
    result["import_rss"] = base_rss
    if result["ok"] and session:
        import onnxruntime as ort

        t1 = time.perf_counter()
        try:
            ort.InferenceSession(out, providers=["CPUExecutionProvider"])
            result["session_s"] = time.perf_counter() - t1
        except Exception as e:  # noqa: BLE001 - reported as the session's failure
            result["session_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    print("RESULT " + json.dumps(result))


def warm_cache(case: str) -> None:
    """Reads every input once so that each tool starts with the same (warm) page cache, and
    flushes what earlier runs wrote so that no tool pays for another's writeback."""
    os.sync()
    folder = CASES_DIR / case
    buf = bytearray(16 * MB)
    for f in sorted(folder.glob("m*.onnx")) + sorted(folder.glob("*.bin")):
        with open(f, "rb", buffering=0) as src:
            while src.readinto(buf):
                pass


def measure(tool: str, case: str, mode: str, timeout: float, session: bool) -> dict:
    warm_cache(case)
    out_dir = OUT / "merged" / case
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{tool}-{mode}.onnx"
    for old in out_dir.glob(f"{tool}-{mode}.onnx*"):
        old.unlink()
    cmd = [sys.executable, __file__, "--worker", tool, case, mode, str(out)] + (["--session"] if session else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout:.0f}s", "compose_s": timeout}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"crashed (exit {p.returncode}): {tail[:160]}"}
    r = json.loads(line[len("RESULT ") :])
    if r["ok"]:
        r["output_bytes"] = sum(f.stat().st_size for f in out_dir.glob(f"{tool}-{mode}.onnx*"))
    for f in out_dir.glob(f"{tool}-{mode}.onnx*"):
        f.unlink()  # keep the disk free for the next case
    return r


# --- the run --------------------------------------------------------------------------------
PLAN = {
    # case: [(tool, mode, session)], fastseq first
    "node_heavy": [
        ("fastseq", "inline", True),
        ("onnx.compose", "inline", False),
        ("fastseq.onnx_compose", "inline", True),
        ("kornia", "inline", False),
        ("copy", "-", False),
    ],
    "weight_heavy": [
        ("fastseq", "inline", True),
        ("onnx.compose", "inline", False),
        ("kornia", "inline", False),
        ("copy", "-", False),
    ],
    "subgraphs": [
        ("fastseq", "inline", True),
        ("onnx.compose", "inline", True),
        ("fastseq.onnx_compose", "inline", True),
        ("kornia", "inline", True),
        ("copy", "-", False),
    ],
    "big3": [
        ("fastseq", "inline", True),
        ("onnx.compose", "inline", False),
        ("kornia", "inline", False),
        ("copy", "-", False),
    ],
    "big10": [
        ("fastseq", "reuse", False),
        ("fastseq", "external", False),
        ("onnx.compose", "inline", False),
        ("kornia", "inline", False),
        ("copy", "-", False),
    ],
    # The peers chain models pairwise: neither takes skip edges, so only the copy compares.
    "dag": [("fastseq", "inline", True), ("copy", "-", False)],
}


def run(cases: list[str], timeout: float) -> dict:
    try:
        import kornia  # noqa: F401

        have_kornia = True
    except Exception:  # noqa: BLE001 - kornia's import fails in many ways (torch's too)
        have_kornia = False
        print("kornia is not installed (pip install -r benches/requirements.txt): skipping it", file=sys.stderr)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "cases": {},
    }
    for case in cases:
        files = case_files(case)
        size, nodes = input_bytes(files), count_nodes(files)
        rows, times = [], []
        plan = [(t, m, sess) for t, m, sess in PLAN[case] if t != "kornia" or have_kornia]
        for tool, mode, session in plan:
            print(f"{case}: {tool} ({mode}) ...", file=sys.stderr, flush=True)
            r = measure(tool, case, mode, timeout, session)
            r.update(tool=tool, mode=mode)
            rows.append(r)
            times.append([r["compose_s"]] if r.get("ok") else [])
        # Short runs are noisy on a shared machine: repeat them and keep the median. The
        # repeats go round the tools in turn, so that no tool always runs first (after a
        # flush, on a quieter disk) and the ratios compare like with like.
        for _ in range(REPEATS - 1):
            for (tool, mode, _session), r, ts in zip(plan, rows, times):
                wanted = sum(ts) < REPEAT_BUDGET_S or (len(ts) < MIN_RUNS and ts[0] < MIN_RUNS_UNDER_S) if ts else False
                if not wanted:
                    continue
                again = measure(tool, case, mode, timeout, False)
                if again.get("ok"):
                    ts.append(again["compose_s"])
                    r["peak_rss"] = max(r["peak_rss"], again["peak_rss"])
        for r, ts in zip(rows, times):
            if ts:
                r["runs"] = sorted(ts)
                r["compose_s"] = statistics.median(ts)
            if r.get("ok"):
                r["mb_s"] = size / MB / r["compose_s"]
                r["nodes_s"] = nodes / r["compose_s"]
                r["rss_per_input"] = r["peak_rss"] / size
        # A peer "succeeds" only if its model runs: onnx.compose's output for If/Loop reading
        # outer initializers does not even load.
        fast = next(r for r in rows if r["tool"] == "fastseq")
        for r in rows:
            if r.get("ok") and "compose_s" in fast and r is not fast:
                r["vs_fastseq"] = r["compose_s"] / fast["compose_s"]
        copy = next((r for r in rows if r["tool"] == "copy" and r.get("ok")), None)
        for r in rows:
            if copy and r.get("ok") and r["tool"] != "copy":
                r["vs_copy"] = r["compose_s"] / copy["compose_s"]
        report["cases"][case] = {"description": CASES[case][1], "input_bytes": size, "nodes": nodes, "rows": rows}
    return report


def _fmt_row(r: dict) -> list[str]:
    if not r.get("ok"):
        return [
            r["tool"] + ("" if r["mode"] in ("inline", "-") else f" ({r['mode']})"),
            "fails: " + r["error"],
            "",
            "",
            "",
            "",
            "",
            "",
        ]
    status = "ok" if "session_error" not in r else "invalid model: " + r["session_error"][:70]
    return [
        r["tool"] + ("" if r["mode"] in ("inline", "-") else f" ({r['mode']})"),
        status,
        f"{r['compose_s']:.3f}" if r["compose_s"] < 0.1 else f"{r['compose_s']:.2f}",
        f"{r['vs_fastseq']:.1f}x" if "vs_fastseq" in r else ("1x" if r["tool"] == "fastseq" else ""),
        f"{r['vs_copy']:.2f}x" if "vs_copy" in r else "",
        f"{r['mb_s']:.0f} MB/s, {r['nodes_s']:.0f} nodes/s",
        f"{r['peak_rss'] / MB:.0f} MB ({r['rss_per_input']:.2f}x input; imports {r['import_rss'] / MB:.0f} MB)",
        f"{r['session_s']:.2f}" if "session_s" in r else "",
    ]


def table(report: dict) -> str:
    lines = [f"Measured on {report['machine']}, {report.get('date', '')}.", ""]
    head = [
        "tool",
        "result",
        "merge+export s (median)",
        "time / fastseq",
        "time / copy",
        "throughput",
        "peak RSS",
        "session s",
    ]
    for case, c in report["cases"].items():
        lines.append(f"**{case}**: {c['description']} ({c['input_bytes'] / MB:.0f} MB, {c['nodes']} nodes)")
        lines.append("")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in c["rows"]:
            lines.append("| " + " | ".join(_fmt_row(r)) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", nargs=4, metavar=("TOOL", "CASE", "MODE", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--session", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cases", help=f"comma-separated, from {', '.join(CASES)}")
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    p.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    p.add_argument("--readme", action="store_true", help="write the table into docs/benchmarks.md")
    a = p.parse_args()
    if a.worker:
        worker(*a.worker, session=a.session)
        return
    cases = a.cases.split(",") if a.cases else (QUICK if a.quick else list(CASES))
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    report = run(cases, a.timeout)
    report["date"] = time.strftime("%Y-%m-%d")
    OUT.mkdir(exist_ok=True)
    if RESULTS.exists():  # a partial run updates its cases and keeps the others
        previous = json.loads(RESULTS.read_text())
        merged = {c: previous["cases"][c] for c in CASES if c in previous.get("cases", {})}
        merged.update(report["cases"])
        report["cases"] = {c: merged[c] for c in CASES if c in merged}
    RESULTS.write_text(json.dumps(report, indent=2))
    text = table(report)
    print(text)
    print(f"\nJSON: {RESULTS}")
    if a.readme:
        write_readme_section("bench", text)


def write_readme_section(marker: str, text: str) -> None:
    """Replaces what a page holds between ``<!-- {marker}:start -->`` and ``:end`` (the one
    page of README.md and docs/*.md that has the markers)."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    for page in DOCS:
        content = page.read_text()
        if start in content and end in content:
            before, rest = content.split(start, 1)
            _, after = rest.split(end, 1)
            page.write_text(before + start + "\n" + text + "\n" + end + after)
            print(f"updated {page}")
            return
    print(f"no page holds the {marker} markers; the table is above")


if __name__ == "__main__":
    main()
