"""The runtime half, side by side: how long until a pipeline is ready to call (and at what
peak memory), and what one call costs.

    python benches/bench_runtime.py              # both tables (a few minutes)
    python benches/bench_runtime.py --readme     # and write them into docs/benchmarks.md
    python benches/bench_runtime.py --cases cache [--readme]   # when the session cache helps

"Ready to call" (each measurement in its own process, repeats taken in turns across the
tools, medians): fastseq cold (compose + session), fastseq from its session cache, kornia's
whole constructor (when installed), ONNX Runtime alone on fastseq's merged file (weights
inline, as fastseq exports below 2 GB) and on the same model saved with external data (ONNX
Runtime's fastest start: it maps the data file), all with kornia's session options (extended
graph optimisations) on the CPU provider. Peak RSS is the process's VmHWM; system time is
the process's (all threads) over the same span, what a slow disk or memory copies show first.

"When the session cache helps" (``--cases cache``): fastseq cold against fastseq from its
session cache, each start in its own process, in turns, on a resnet18-shaped CNN, the
node-heavy chain, a graph that ONNX Runtime optimises heavily (constant folding) and the
weight-heavy chain.

"Per call" on a one-node model, in one process, the methods in turns: ``session.run``,
``run_with_iobinding`` (bound once), ``pipe(x)`` and the bound path ``binding.run()``.

"A cached start that skips conversion" (``--converted``): the README's operator pipeline
(``to_float``, ``layout``, ``resize(256, keep_aspect=True, antialias=True)``, which needs
opset 18, ``center_crop(224)``, ``normalize``, the resnet18-shaped CNN at opset 17,
``softmax``, ``topk(5)``, ``auto_ir_version_conversion=True``) started cold (no session
cache: onnx imported, every stage converted) against a start from a warm session cache
(converted stages and the session from it), each in a fresh process with fastseq,
onnxruntime and numpy imported first, in turns, medians; whether onnx was imported.

"Operators" (``--operators`` runs only these, in a minute): the first ``fastseq.ops`` build
in a fresh process (after ``import fastseq``), and the wall time of ``fastseq merge`` with
and without ``builtin:`` operators around a model, each in its own process, repeats in
turns, medians; ``import onnx`` alone for scale (what a first operator cost before).
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


def gen_cnn(folder: Path) -> None:
    """A resnet18-shaped CNN built with onnx (random weights, 11.7M parameters, 47 MB): a 7x7
    stem, four stages of two basic blocks, a BatchNormalization after every Conv (ONNX Runtime
    folds it into the Conv, and fuses the Relu), global pooling and a 1000-way head."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv(x: str, cin: int, cout: int, k: int, stride: int, name: str, relu: bool = True) -> str:
        w = const(f"{name}.w", rng.standard_normal((cout, cin, k, k)) * (2 / (cin * k * k)) ** 0.5)
        nodes.append(
            helper.make_node(
                "Conv", [x, w], [f"{name}.c"], kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4
            )
        )
        bn = [
            const(f"{name}.{p}", v)
            for p, v in (("g", np.ones(cout)), ("b", np.zeros(cout)), ("m", np.zeros(cout)), ("v", np.ones(cout)))
        ]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.c", *bn], [f"{name}.bn"]))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.r"]))
        return f"{name}.r"

    x = conv("x", 3, 64, 7, 2, "stem")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, cin = "pool", 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride, name = (2 if stage and not block else 1), f"s{stage}b{block}"
            h = conv(conv(x, cin, cout, 3, stride, f"{name}.1"), cout, cout, 3, 1, f"{name}.2", relu=False)
            skip = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, f"{name}.down", relu=False)
            nodes += [
                helper.make_node("Add", [h, skip], [f"{name}.sum"]),
                helper.make_node("Relu", [f"{name}.sum"], [f"{name}.out"]),
            ]
            x, cin = f"{name}.out", cout
    fc_w, fc_b = const("fc.w", rng.standard_normal((1000, 512)) * 512**-0.5), const("fc.b", np.zeros(1000))
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", fc_w, fc_b], ["y"], transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "resnet18",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1000])],
        inits,
    )
    bench._save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), folder / "m00.onnx")


def gen_folded(folder: Path, blocks: int = 100, dim: int = 384) -> None:
    """A graph that ONNX Runtime optimises heavily: its weight is computed from constants
    (100 MatMul + Add + Relu on 384 x 384 initializers, 59 MB), which constant folding
    evaluates when the session is made; the optimised model holds the one result."""
    import numpy as np
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    inits: list = []
    nodes, t = [], const("c0", rng.standard_normal((dim, dim)) / dim**0.5)
    for k in range(blocks):
        w, b = const(f"w{k}", rng.standard_normal((dim, dim)) / dim**0.5), const(f"b{k}", np.full(dim, 0.01))
        nodes += [
            helper.make_node("MatMul", [t, w], [f"m{k}"]),
            helper.make_node("Add", [f"m{k}", b], [f"a{k}"]),
            helper.make_node("Relu", [f"a{k}"], [f"t{k}"]),
        ]
        t = f"t{k}"
    nodes.append(helper.make_node("MatMul", ["x", t], ["y"]))
    bench._save(bench.xy_model(nodes, "folded", inits, ["N", dim]), folder / "m00.onnx")


CASES = {
    "node_heavy": (bench.gen_node_heavy, "50 models x 600 nodes (30,000 nodes)"),
    "weight_heavy8": (
        lambda folder: bench._weight_chain(folder, 8, 64 * MB, 1, external=False),
        "8 models x 64 MB (512 MB of weights)",
    ),
    "matmul4_8": (
        lambda folder: bench._weight_chain(folder, 8, 64 * MB, 4, external=False),
        "8 models x 4 MatMul blocks of 2048 x 2048 (512 MB)",
    ),
    "cnn": (gen_cnn, "resnet18-shaped CNN (47 MB, Conv + BatchNorm + Relu)"),
    "folded": (gen_folded, "weights computed from constants (100 MatMul + Add + Relu, 59 MB)"),
}
READY_CASES = "node_heavy,weight_heavy8,matmul4_8"
CACHE_CASES = ["cnn", "node_heavy", "folded", "weight_heavy8"]
TOOLS = ["fastseq cold", "fastseq cached", "kornia", "onnxruntime on the merged file", "onnxruntime on external data"]
CACHE_TOOLS = TOOLS[:2]
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
        import fastseq
    elif tool == "kornia":
        import warnings

        warnings.filterwarnings("ignore")
        import kornia.onnx
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
    print(
        "RESULT "
        + json.dumps(
            {
                "s": elapsed,
                "sys": cpu.ru_stime - cpu0.ru_stime,
                "user": cpu.ru_utime - cpu0.ru_utime,
                "peak_rss": bench.peak_rss(),
                "base_rss": base,
                "inputs": len(session.get_inputs()),
            }
        )
    )


def merged_file(case: str, external: bool = False) -> Path:
    """fastseq's merged file: weights inline, or (``external``) in a data file beside it."""
    return bench.CASES_DIR / case / "merged" / ("fastseq-external.onnx" if external else "fastseq.onnx")


def prepare(case: str, merged: bool = True) -> str:
    """fastseq's merged file for ONNX Runtime alone, and a warm session cache."""
    import fastseq

    files = [str(f) for f in files_of(case)]
    io_maps = [[("y", "x")]] * (len(files) - 1)
    if merged:
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
    return json.loads(line[len("RESULT ") :])


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
        cache = prepare(case, merged=any(t.startswith("onnxruntime") for t in tools))
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
            rows[tool] = {
                "s": statistics.median(r["s"] for r in ok),
                "runs": sorted(r["s"] for r in ok),
                "sys": statistics.median(r["sys"] for r in ok),
                "peak_rss": max(r["peak_rss"] for r in ok),
                "base_rss": min(r["base_rss"] for r in ok),
            }
        report[case] = {"description": CASES[case][1], "rows": rows}
    return report


# --- per call -------------------------------------------------------------------------------------
def per_call(repeats: int = 7, number: int = 20000) -> dict:
    import numpy as np
    import onnxruntime  # noqa: F401 - loaded before anything is timed
    from onnx import TensorProto, helper

    import fastseq

    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
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


# --- operators: the first build and a CLI merge ---------------------------------------------------
FIRST_BUILD = """
import sys, time
import fastseq
t0 = time.perf_counter()
fastseq.ops.resize(224)
t1 = time.perf_counter()
fastseq.ops.normalize()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, "onnx" in sys.modules, "numpy" in sys.modules)
"""


def classifier(path: Path) -> None:
    """A resnet18-like stand-in: float32 [N, 3, 224, 224] -> [N, 1000] (12 KB of weights)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("Gemm", ["flat", "w"], ["logits"], transB=1),
        ],
        "classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        [numpy_helper.from_array(np.ones((1000, 3), np.float32), "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


# Bytecode written and read, as an installed package has it (PYTHONDONTWRITEBYTECODE would
# compile every module of every fresh process again).
COMPILED = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, timeout=300, env=COMPILED)
    return time.perf_counter() - t0


def operators(repeats: int = 7) -> dict:
    folder = OUT / "operators"
    folder.mkdir(parents=True, exist_ok=True)
    classifier(folder / "model.onnx")
    merge = [sys.executable, "-m", "fastseq", "merge"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import onnx'": [sys.executable, "-c", "import onnx"],
        "fastseq merge model.onnx": [*merge, "model.onnx", "-o", "plain.onnx"],
        "fastseq merge 'builtin:to_float?scale=1/255' model.onnx 'builtin:softmax'": [
            *merge,
            "builtin:to_float?scale=1/255",
            "model.onnx",
            "builtin:softmax",
            "-o",
            "ops.onnx",
        ],
    }
    walls: dict[str, list[float]] = {k: [] for k in commands}
    builds: list[list[float]] = []
    loaded = None
    for cmd in commands.values():  # a first run writes the bytecode
        wall(cmd, folder)
    for _ in range(repeats):  # in turns, so that the machine's drift hits every command alike
        for name, cmd in commands.items():
            walls[name].append(wall(cmd, folder))
        out = subprocess.run(
            [sys.executable, "-c", FIRST_BUILD], capture_output=True, text=True, check=True, env=COMPILED
        )
        first, second, onnx_loaded, numpy_loaded = out.stdout.split()
        builds.append([float(first), float(second)])
        loaded = {"onnx": onnx_loaded == "True", "numpy": numpy_loaded == "True"}
    return {
        "walls": {k: statistics.median(v) for k, v in walls.items()},
        "first_build": statistics.median(b[0] for b in builds),
        "second_build": statistics.median(b[1] for b in builds),
        "loaded": loaded,
    }


def operator_tables(report: dict) -> str:
    ops = report["operators"]
    w = ops["walls"]
    lines = [f"Measured on {report['machine']}, {report['date']}; medians of 7, each in its own process, in turns.", ""]
    lines.append("| a fresh process | ms |")
    lines.append("|---|---|")
    lines.append(f"| first `fastseq.ops.resize(224)` (after `import fastseq`) | {ops['first_build'] * 1e3:.1f} |")
    lines.append(f"| a second operator (`normalize()`) | {ops['second_build'] * 1e3:.2f} |")
    for name, s in w.items():
        lines.append(f"| `{name}` | {s * 1e3:.0f} |")
    lines.append("")
    plain = w["fastseq merge model.onnx"]
    with_ops = w["fastseq merge 'builtin:to_float?scale=1/255' model.onnx 'builtin:softmax'"]
    onnx_import = w["python -c 'import onnx'"] - w["python -c pass"]
    loaded = [k for k, v in ops["loaded"].items() if v]
    lines.append(
        f"The two operators add {(with_ops - plain) * 1e3:+.0f} ms to the merge; importing onnx, which building "
        f"them cost before, takes {onnx_import * 1e3:.0f} ms here. After a build, "
        + (
            f"{' and '.join(loaded)} {'is' if len(loaded) == 1 else 'are'} loaded."
            if loaded
            else "neither onnx nor numpy is loaded."
        )
    )
    return "\n".join(lines)


# --- output ---------------------------------------------------------------------------------------
def tables(report: dict) -> str:
    lines = [f"Measured on {report['machine']}, {report['date']}.", ""]
    lines.append("| ready to call | tool | ready (median) | runs | system time | peak RSS |")
    lines.append("|---|---|---|---|---|---|")
    for c in report["ready"].values():
        for tool in TOOLS:
            r = c["rows"].get(tool)
            if r is None:
                continue
            if "error" in r:
                cells = ["fails: " + r["error"][:60], "", "", ""]
            else:
                cells = [
                    f"{r['s']:.2f} s",
                    ", ".join(f"{x:.2f}" for x in r["runs"]),
                    f"{r['sys']:.2f} s",
                    f"{r['peak_rss'] / MB:,.0f} MB",
                ]
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
            out.append(
                f"- {case}: cold ready {cold['s'] / ortf['s']:.2f}x ONNX Runtime on the merged file "
                f"(target <= 1.1x), peak RSS {cold['peak_rss'] / ortf['peak_rss']:.2f}x (target <= 1.2x)"
            )
        if "s" in cold and "s" in orte:
            out.append(
                f"- {case}: cold ready {cold['s'] / orte['s']:.2f}x ONNX Runtime on external data "
                f"(target <= 1.3x), peak RSS {cold['peak_rss'] / orte['peak_rss']:.2f}x"
            )
        if "s" in cold and "s" in cached:
            out.append(f"- {case}: from the cache {cold['s'] / cached['s']:.1f}x faster than cold")
        if "s" in kor and "s" in cold:
            out.append(f"- {case}: {kor['s'] / cold['s']:.1f}x faster than kornia's constructor (target >= 5x)")
    calls = report["per_call"]
    if not calls:
        return out
    out.append(
        f"- pipe(x) costs {calls['pipe(x)'] - calls['session.run']:+.2f} us against session.run; the bound "
        f"path {calls['pipe.bind(x).run()'] - calls['run_with_iobinding']:+.2f} us against "
        "run_with_iobinding (target: within 1 us)"
    )
    return out


CONVERTED = """
import json, sys, time
import numpy, onnxruntime
import fastseq
from fastseq import ops
model, cache = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
pipe = fastseq.ONNXSequential(
    ops.to_float(), ops.layout("NHWC", "NCHW"), ops.resize(256, keep_aspect=True, antialias=True),
    ops.center_crop(224), ops.normalize(), model, ops.softmax(), ops.topk(5),
    auto_ir_version_conversion=True, session_cache=cache if cache != "-" else False)
s = time.perf_counter() - t0
print(json.dumps({"s": s, "cache": pipe.session_info.get("cache"), "onnx": "onnx" in sys.modules}))
"""


def converted_start(repeats: int = 7) -> dict:
    """Cold against a session-cache hit for the README's operator pipeline (see the module's
    doc), each start in a fresh process, in turns."""
    model = str(files_of("cnn")[0])
    cache = OUT / "session-cache" / "converted"
    load = [os.getloadavg()[0]]

    def start(cache_arg: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", CONVERTED, model, cache_arg],
            capture_output=True,
            text=True,
            timeout=600,
            env=COMPILED,
        )
        if out.returncode:
            raise RuntimeError(out.stderr.strip().splitlines()[-1])
        return json.loads(out.stdout.strip().splitlines()[-1])

    start(str(cache))  # stores the entries (and writes the bytecode)
    runs: dict[str, list[dict]] = {"cold": [], "cached": []}
    for _ in range(repeats):
        runs["cold"].append(start("-"))
        runs["cached"].append(start(str(cache)))
    load.append(os.getloadavg()[0])
    assert all(r["cache"] == "hit" for r in runs["cached"]), runs["cached"]
    return {
        name: {
            "s": statistics.median(r["s"] for r in rs),
            "runs": sorted(r["s"] for r in rs),
            "onnx": any(r["onnx"] for r in rs),
        }
        for name, rs in runs.items()
    } | {"load": load}


def converted_table(report: dict) -> str:
    c = report["converted"]
    cold, cached = c["cold"], c["cached"]

    def cell(r: dict) -> str:
        runs = " ".join(f"{x:.3f}" for x in r["runs"])
        return f"{r['s']:.3f} s ({runs}); onnx {'imported' if r['onnx'] else 'not imported'}"

    ratio = cold["s"] / cached["s"]
    return "\n".join(
        [
            f"Measured on {report['machine']}, {report['date']} (load average {c['load'][0]:.1f} at the start, "
            f"{c['load'][1]:.1f} at the end); medians of {len(cold['runs'])} starts, each in a fresh process, "
            "in turns.",
            "",
            "| the README's operator pipeline (antialias=True: converted to opset 18) | cold "
            "| from the session cache | "
            "cached / cold |",
            "|---|---|---|---|",
            f"| ready to call | {cell(cold)} | {cell(cached)} | {ratio:.1f}x faster |",
            "",
            f"- target: a cached start at least 3x faster than cold, onnx not imported: "
            f"{'met' if ratio >= 3 and not cached['onnx'] else 'missed'}",
        ]
    )


def cache_table(report: dict) -> str:
    lines = [
        f"Measured on {report['machine']}, {report['date']}; medians of {RUNS} starts, each in its own process.",
        "",
        "| ready to call | fastseq cold | fastseq from its session cache | cached / cold |",
        "|---|---|---|---|",
    ]
    for c in report["ready"].values():
        cold, cached = (c["rows"].get(t, {}) for t in CACHE_TOOLS)
        if "s" not in cold or "s" not in cached:
            lines.append(f"| {c['description']} | {cold.get('error', '?')} | {cached.get('error', '?')} | |")
            continue
        runs = " ".join(f"{r:.2f}" for r in cached["runs"])
        lines.append(
            f"| {c['description']} | {cold['s']:.2f} s ({' '.join(f'{r:.2f}' for r in cold['runs'])}) | "
            f"{cached['s']:.2f} s ({runs}) | {cold['s'] / cached['s']:.1f}x faster |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--cases", default=READY_CASES, help=f"cases among {', '.join(CASES)}, or 'cache'")
    p.add_argument("--readme", action="store_true")
    p.add_argument("--operators", action="store_true", help="only the operators' table")
    p.add_argument("--runs", type=int, default=RUNS, help="measurements of each tool (medians)")
    p.add_argument("--no-per-call", action="store_true", help="skip the per-call table")
    p.add_argument(
        "--converted",
        action="store_true",
        help="only the cached start of a pipeline that needs conversion, against cold",
    )
    a = p.parse_args()
    if a.worker:
        worker(*a.worker)
        return
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if a.converted:
        report = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "converted": converted_start(a.runs)}
        OUT.mkdir(exist_ok=True)
        (OUT / "converted.json").write_text(json.dumps(report, indent=2))
        print(converted_table(report))
        return
    if a.operators:
        report = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "operators": operators()}
        text = operator_tables(report)
        print(text)
        if a.readme:
            bench.write_readme_section("operators", text)
        return
    if a.cases == "cache":
        report = {
            "machine": machine,
            "date": time.strftime("%Y-%m-%d"),
            "ready": ready_table(CACHE_CASES, CACHE_TOOLS, a.runs),
        }
        OUT.mkdir(exist_ok=True)
        (OUT / "cache.json").write_text(json.dumps(report, indent=2))
        text = cache_table(report)
        print(text)
        if a.readme:
            bench.write_readme_section("cache", text)
        return
    try:
        import kornia  # noqa: F401

        tools = TOOLS
    except Exception:  # noqa: BLE001 - kornia's import fails in many ways (torch's too)
        print("kornia is not installed (pip install -r benches/requirements.txt): skipping it", file=sys.stderr)
        tools = [t for t in TOOLS if t != "kornia"]
    report = {
        "machine": machine,
        "date": time.strftime("%Y-%m-%d"),
        "ready": ready_table(a.cases.split(","), tools, a.runs),
        "per_call": None if a.no_per_call else per_call(),
        "operators": operators(),
    }
    OUT.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    text = tables(report)
    print(text)
    print(operator_tables(report))
    if a.readme:
        bench.write_readme_section("runtime", text)
        bench.write_readme_section("operators", operator_tables(report))


if __name__ == "__main__":
    main()
