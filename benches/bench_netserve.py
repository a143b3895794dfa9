"""Serving over the network with C load generators: ``fastseq serve`` over HTTP (binary
tensors and JSON) and gRPC, batching off, KServe 0.21 and MLServer 1.7.1, against the
in-process batcher on the same core (issue 43's benchmark).

    python benches/bench_netserve.py --setup    # once: wrk, h2load, libb64 (apt), the peers' venvs
    python benches/bench_netserve.py            # the table: 3 rounds, both pipelines (about 10 minutes)
    python benches/bench_netserve.py --quick    # one round of 1 s a mode (a smoke run, under 2 minutes)
    python benches/bench_netserve.py --long     # RSS and open files over 1,000,000 requests (wrk)
    python benches/bench_netserve.py --readme   # and write the table into docs/benchmarks.md
    python benches/bench_netserve.py --wait-idle 600   # first wait (up to 10 min) for a quiet machine
    python benches/bench_netserve.py --fastseq "/path/venv/bin/fastseq"   # another build's CLI
    python benches/bench_netserve.py --quick --pipelines cnn --modes serve-bin,in-process  # a subset

A smoke run or a subset writes benches/out/netserve_partial.json; only a whole run replaces
benches/out/netserve.json, the table that --readme and --long build on.

Every server runs pinned to core 0 (``taskset -c 0``), every client to core 1, 32 connections,
one row a request: wrk (HTTP/1.1, a Lua script posting one fixed body, counting answers that
are not 200), h2load (gRPC: HTTP/2 POSTs of one framed ``ModelInferRequest``) and Triton's
perf_analyzer (HTTP and gRPC; from the tritonclient==2.40.0 wheel). A server's CPU per request
is its /proc utime+stime (children included) over the requests it answered (fastseq: its own
``nv_inference_request_success``, which also gives the mean batch); "beyond compute" takes
off ONNX Runtime's own CPU per row at that batch size, measured alone on core 0. Before
measuring, one request of each mode is checked against ``pipe(x)``; any request that fails
fails the run. Server kinds in turns, each round, medians of 3 rounds. The in-process mode
imports this Python's fastseq: run the benchmark with the Python of the build under test.
On a machine that others share, a single-threaded server gets a smaller share of core 0
than the batcher's 32 threads: numbers are only worth comparing when the load average is
near 0 (the run says when it is not)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import netserve_clients as nc
import netserve_servers as ns
import numpy as np
from netserve_servers import Server

HERE = Path(__file__).parent
FIXTURES = HERE.parent / "tests" / "fixtures"
OUT = HERE / "out"
WORK = OUT / "netserve"
RESULTS = OUT / "netserve.json"
PARTIAL = OUT / "netserve_partial.json"  # --quick, --pipelines or --modes
CONNECTIONS = 32
WARM_S, MEASURE_S, REPEATS = 1, 5, 3
LONG_REQUESTS = 1_000_000
# mode -> (server kind, client, what the table calls it)
MODES = {
    "serve-bin": ("serve", "wrk-bin", "fastseq serve, HTTP binary (wrk)"),
    "serve-json": ("serve", "wrk-json", "fastseq serve, HTTP JSON (wrk)"),
    "serve-grpc": ("serve", "h2load", "fastseq serve, gRPC (h2load)"),
    "serve-pa-http": ("serve", "pa-http", "fastseq serve, HTTP binary (perf_analyzer)"),
    "serve-pa-grpc": ("serve", "pa-grpc", "fastseq serve, gRPC (perf_analyzer)"),
    "b1-bin": ("serve-b1", "wrk-bin", "fastseq serve --max-batch-size 1, HTTP binary (wrk)"),
    "in-process": ("in-process", None, "in-process batcher, 32 threads, core 0"),
    "kserve-bin": ("kserve", "wrk-bin", "KServe 0.21, HTTP binary (wrk)"),
    "kserve-grpc": ("kserve", "h2load", "KServe 0.21, gRPC (h2load)"),
    "mlserver-json": ("mlserver", "wrk-json", "MLServer 1.7.1, JSON, adaptive batching (wrk)"),
}


# --- the pipelines --------------------------------------------------------------------------------
def cnn_model(path: Path) -> None:
    """3x20x20 -> Conv 3->16 -> Relu -> Conv 16->16 -> Relu -> GlobalAveragePool -> Gemm 16->10."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["features"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["features", "w3", "b3"], ["logits"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 20, 20])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [w("w1", 16, 3, 3, 3), w("b1", 16), w("w2", 16, 16, 3, 3), w("b2", 16), w("w3", 10, 16), w("b3", 10)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def cases() -> dict[str, tuple[str, list[str], str, list[int]]]:
    """name -> (description, sources, input name, one row's shape)."""
    OUT.mkdir(exist_ok=True)
    cnn = OUT / "netserve_cnn.onnx"
    if not cnn.exists():
        cnn_model(cnn)
    return {
        "cnn": ("small CNN: 3x20x20 -> two 3x3 convs -> 10", [str(cnn)], "image", [1, 3, 20, 20]),
        "tabular": (
            "tabular: skl2onnx scaler + MLP 64-256-10",
            [str(FIXTURES / "digits_scaler.onnx"), str(FIXTURES / "digits_mlp.onnx")],
            "X",
            [1, 64],
        ),
    }


def build(sources: list[str]):
    """The pipeline as ``fastseq serve`` starts it (its session options)."""
    import fastseq
    from fastseq.cli.serve import SERVING_OPTIONS
    from fastseq.graph.session_settings import session_options

    return fastseq.ONNXSequential(*sources, session_options=session_options(SERVING_OPTIONS))


def prepare(name: str, sources: list[str], input_name: str, shape: list[int]) -> dict:
    """What every mode of one pipeline shares: the row, ``pipe(row)``, the joined ONNX file the
    peers and ONNX Runtime alone run, the request bodies and wrk's scripts."""
    d = WORK / name
    d.mkdir(parents=True, exist_ok=True)
    pipe = build(sources)
    row = np.random.default_rng(0).random(shape, dtype=np.float32)
    outputs = [o.name for o in pipe.outputs]
    expected = dict(zip(outputs, pipe(row)))
    joined = d / "joined.onnx"
    pipe.export(str(joined))
    binary, header = nc.binary_body(input_name, row, outputs)
    message = nc.grpc_message("m", input_name, row, outputs)
    (d / "body.bin").write_bytes(binary)
    (d / "body.json").write_bytes(nc.json_body(input_name, row))
    (d / "body.grpc").write_bytes(nc.grpc_frame(message))
    headers = {
        "wrk-bin": {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header)},
        "wrk-json": {"Content-Type": "application/json"},
    }
    for client, h in headers.items():
        nc.wrk_script(d / f"{client}.lua", (d / f"body.{client[4:]}").resolve(), h)
    return {
        "name": name,
        "dir": d,
        "sources": sources,
        "joined": joined,
        "expected": expected,
        "headers": headers,
        "message": message,
        "input": input_name,
        "shape": shape,
    }


# --- the clients ----------------------------------------------------------------------------------
def check(server: Server, client: str, case: dict) -> None:
    """One request as the mode's client sends it, its answer against ``pipe(x)``."""
    d = case["dir"]
    if client in ("wrk-bin", "wrk-json", "pa-http"):
        kind = "wrk-json" if client == "wrk-json" else "wrk-bin"
        body = (d / f"body.{kind[4:]}").read_bytes()
        status, headers, answer = nc.post(server.http, "/v2/models/m/infer", body, case["headers"][kind])
        if status != 200:
            raise RuntimeError(f"{server.kind}, {client}: {status} {answer[:300]!r}")
        got = nc.http_outputs(headers, answer)
    else:
        got, case["answer_bytes"] = nc.grpc_outputs(server.grpc, case["message"])
    wrong = nc.compare(got, case["expected"])
    if wrong:
        raise RuntimeError(f"{server.kind}, {client}: a wrong answer: {wrong}")


def drive(server: Server, client: str, case: dict, seconds: float) -> dict:
    d, url = case["dir"], f"http://127.0.0.1:{server.http}/v2/models/m/infer"
    if client.startswith("wrk"):
        return nc.run_wrk(url, d / f"{client}.lua", seconds, CONNECTIONS)
    if client == "h2load":
        return nc.run_h2load(
            f"http://127.0.0.1:{server.grpc}{nc.GRPC_INFER}",
            d / "body.grpc",
            seconds,
            CONNECTIONS,
            WORK / "h2load.log",
            case["answer_bytes"],
        )
    exe, env = nc.perf_analyzer(ns.VENVS / "perf")
    port, protocol = (server.http, "http") if client == "pa-http" else (server.grpc, "grpc")
    return nc.run_perf_analyzer(
        exe, env, f"127.0.0.1:{port}", protocol, "m", seconds, CONNECTIONS, WORK / "perf_analyzer.csv"
    )


def measure_mode(server: Server, mode: str, case: dict, seconds: float, warm: float) -> dict:
    """One client run against a running server, with the server's CPU and counters around it."""
    client = MODES[mode][1]
    if warm and not client.startswith("pa"):
        drive(server, client, case, warm)
    m0, c0 = server.metrics(), nc.cpu_seconds(server.proc.pid)
    r = drive(server, client, case, seconds)
    c1, m1 = nc.cpu_seconds(server.proc.pid), server.metrics()
    delta = {k: m1[k] - m0.get(k, 0.0) for k in m1}
    served = delta.get("nv_inference_request_success") or r["requests"]
    r["server_us"] = (c1 - c0) / max(1, served) * 1e6
    r["mean_batch"] = (
        delta["nv_inference_count"] / delta["nv_inference_exec_count"]
        if delta.get("nv_inference_exec_count")
        else 1.0
        if server.kind in ("serve-b1", "kserve")
        else None
    )
    r["errors"] += int(delta.get("nv_inference_request_failure", 0))
    if r["errors"]:  # a rate of errors measures nothing
        raise RuntimeError(f"{mode}: {r['errors']} requests failed ({r['non200']} answers not 200); see {server.log}")
    return r


def in_process(sources: list[str], joined: str, shape: list[int], seconds: float, quick: bool) -> dict:
    """Run on the server core, in a process of its own: ONNX Runtime alone (CPU per row by batch
    size), then 32 threads calling the pipeline's batcher, one row each call."""
    import onnxruntime as ort

    options = ort.SessionOptions()  # fastseq serve's session options
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(joined, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    compute = {}
    for b in (1, 2, 4, 8, 16, 32):
        x = np.random.default_rng(1).random([b, *shape[1:]], dtype=np.float32)
        session.run(None, {name: x})
        n, c0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < (0.05 if quick else 0.3):
            session.run(None, {name: x})
            n += 1
        compute[b] = (time.process_time() - c0) / (n * b) * 1e6
    pipe = build(sources)
    row = np.random.default_rng(0).random(shape, dtype=np.float32)
    done: list[tuple[float, float]] = []
    with pipe.batcher(max_batch_size=32) as batcher:
        wrong = nc.compare(
            dict(zip([o.name for o in pipe.outputs], batcher(row))),
            dict(zip([o.name for o in pipe.outputs], pipe(row))),
        )
        stop_at, barrier = [0.0], threading.Barrier(CONNECTIONS + 1)

        def caller() -> None:
            mine = []
            barrier.wait()
            while (begin := time.perf_counter()) < stop_at[0]:
                batcher(row)
                mine.append((begin, time.perf_counter()))
            done.extend(mine)

        threads = [threading.Thread(target=caller) for _ in range(CONNECTIONS)]
        for t in threads:
            t.start()
        start = time.perf_counter()
        stop_at[0] = start + WARM_S + seconds
        barrier.wait()
        time.sleep(WARM_S)
        c0 = time.process_time()
        for t in threads:
            t.join()
        cpu = time.process_time() - c0
    window = sorted(e - b for b, e in done if start + WARM_S <= b)
    pct = lambda q: window[min(len(window) - 1, int(len(window) * q))] * 1e3  # noqa: E731
    return {
        "rows_s": len(window) / seconds,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "requests": len(window),
        "server_us": cpu / max(1, len(window)) * 1e6,
        "mean_batch": None,
        "compute_us": compute,
        "wrong": wrong,
    }


def compute_at(compute: dict, batch: float | None) -> float | None:
    """ONNX Runtime's CPU per row at a mean batch size (log-linear between the sizes measured)."""
    if batch is None or not compute:
        return None
    sizes = sorted(compute)
    batch = min(max(batch, sizes[0]), sizes[-1])
    lo = max(s for s in sizes if s <= batch)
    hi = min(s for s in sizes if s >= batch)
    if lo == hi:
        return compute[lo]
    f = (np.log2(batch) - np.log2(lo)) / (np.log2(hi) - np.log2(lo))
    return compute[lo] + f * (compute[hi] - compute[lo])


# --- the run --------------------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict:
    seconds, warm, repeats = (1, 0, 1) if args.quick else (MEASURE_S, WARM_S, REPEATS)
    modes, skipped = ns.available({m: v for m, v in MODES.items() if not args.modes or m in args.modes.split(",")})
    for mode, why in skipped.items():
        print(f"skipped {mode}: {why}", file=sys.stderr)
    load = os.getloadavg()[0]
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "connections": CONNECTIONS,
        "measure_s": seconds,
        "repeats": repeats,
        "load_at_start": load,
        "fastseq": args.fastseq,
        "skipped": skipped,
        "pipelines": {},
    }
    kinds = list(dict.fromkeys(MODES[m][0] for m in modes))
    for name, (description, sources, input_name, shape) in cases().items():
        if args.pipelines and name not in args.pipelines.split(","):
            continue
        case = prepare(name, sources, input_name, shape)
        rounds: dict[str, list[dict]] = {m: [] for m in modes}
        failed: dict[str, str] = {}
        for k in range(repeats):
            for kind in kinds[k % len(kinds) :] + kinds[: k % len(kinds)]:  # in turns, a different start each round
                mine = [m for m in modes if MODES[m][0] == kind and m not in failed]
                print(
                    f"{name}: round {k + 1} of {repeats}: {kind} ({', '.join(mine)}) ...", file=sys.stderr, flush=True
                )
                if kind == "in-process":
                    r = json.loads(
                        subprocess.run(
                            nc.pinned(
                                nc.SERVER_CORE,
                                [
                                    sys.executable,
                                    __file__,
                                    "--in-process",
                                    json.dumps([sources, str(case["joined"]), shape, seconds, args.quick]),
                                ],
                            ),
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                        .stdout.strip()
                        .splitlines()[-1]
                    )
                    if r.pop("wrong"):
                        raise RuntimeError(f"in-process: a wrong answer: {r}")
                    rounds["in-process"].append(r)
                    continue
                try:
                    server = Server(kind, case, args.fastseq)
                except RuntimeError as e:  # a peer that cannot start: said, and its rows skipped
                    if kind.startswith("serve"):
                        raise
                    failed.update({m: str(e) for m in mine})
                    print(f"  {kind} skipped: {e}", file=sys.stderr)
                    continue
                try:
                    for mode in mine:
                        client = MODES[mode][1]
                        check(server, client, case)
                        try:
                            rounds[mode].append(measure_mode(server, mode, case, seconds, warm))
                        except RuntimeError as e:
                            if not client.startswith("pa"):
                                raise
                            failed[mode] = str(e)  # perf_analyzer refusing the server: said in the report
                            print(f"  {mode}: {e}", file=sys.stderr)
                finally:
                    server.stop()
        compute = (
            {
                int(b): statistics.median(r["compute_us"][b] for r in rounds["in-process"])
                for b in rounds["in-process"][0]["compute_us"]
            }
            if rounds.get("in-process")
            else {}
        )
        medians = {}
        for mode, rs in rounds.items():
            if not rs:
                continue
            med = {key: statistics.median(r[key] for r in rs) for key in ("rows_s", "p50_ms", "p99_ms", "server_us")}
            batches = [r["mean_batch"] for r in rs if r.get("mean_batch") is not None]
            med["mean_batch"] = statistics.median(batches) if batches else None
            c = compute_at(compute, med["mean_batch"])
            med["beyond_us"] = med["server_us"] - c if c is not None and mode != "in-process" else None
            medians[mode] = med | {"runs": [round(r["rows_s"]) for r in rs]}
        report["pipelines"][name] = {
            "description": description,
            "modes": medians,
            "failed": failed,
            "compute_us": compute,
        }
    return report


def long_run(args: argparse.Namespace) -> dict:
    """fastseq serve (CNN, binary over wrk): memory, open files and threads before and after."""
    description, sources, input_name, shape = cases()["cnn"]
    case = prepare("cnn", sources, input_name, shape)
    server = Server("serve", case, args.fastseq)
    try:
        check(server, "wrk-bin", case)
        measure_mode(server, "serve-bin", case, 5, 0)  # warm: pools, buffers, caches
        before, t0, total = nc.footprint(server.proc.pid), time.perf_counter(), 0
        rate = 5000.0
        while total < LONG_REQUESTS:
            left = LONG_REQUESTS - total
            r = measure_mode(server, "serve-bin", case, max(1, min(60, round(left / rate) + 1)), 0)
            total, rate = total + r["requests"], max(r["rows_s"], 1.0)
            print(f"  {total:,} requests", file=sys.stderr, flush=True)
        after = nc.footprint(server.proc.pid)
    finally:
        server.stop()
    return {
        "requests": total,
        "seconds": time.perf_counter() - t0,
        "before": before,
        "after": after,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


# --- the report -----------------------------------------------------------------------------------
def table(report: dict) -> str:
    lines = [
        f"{report['connections']} connections, one row a request, server on core 0 and client on core 1 "
        f"({report['machine']}), {report['date']}; medians of {report['repeats']} rounds of "
        f"{report['measure_s']:g} s; load average at start {report['load_at_start']:.1f}",
        "",
        "| pipeline | server, client | rows/s | p50 ms | p99 ms | server CPU µs/request | beyond compute µs | "
        "mean batch | rounds (rows/s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    f = lambda v, fmt: "" if v is None else format(v, fmt)  # noqa: E731
    for name, p in report["pipelines"].items():
        for mode, m in p["modes"].items():
            lines.append(
                f"| {name} | {MODES[mode][2]} | {m['rows_s']:,.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
                f"{m['server_us']:.0f} | {f(m['beyond_us'], '.0f')} | {f(m['mean_batch'], '.1f')} | "
                f"{', '.join(f'{r:,}' for r in m['runs'])} |"
            )
        for mode, why in p["failed"].items():
            lines.append(f"| {name} | {MODES[mode][2]} | failed: {why[:160]} | | | | | | |")
    lines.append("")
    for name, p in report["pipelines"].items():
        if p["compute_us"]:
            lines.append(
                f"- {name}: ONNX Runtime alone on core 0, CPU µs a row by batch size: "
                + ", ".join(f"{b}: {us:.1f}" for b, us in sorted(p["compute_us"].items(), key=lambda kv: int(kv[0])))
            )
    for mode, why in report.get("skipped", {}).items():
        lines.append(f"- {MODES[mode][2]}: skipped, {why}")
    lines += ["", "| target | " + " | ".join(report["pipelines"]) + " |", "|---|" + "---|" * len(report["pipelines"])]

    def row(label: str, value, ok) -> None:
        cells = []
        for p in report["pipelines"].values():
            try:
                v = value(p["modes"])
                cells.append(f"{v} ({'yes' if ok(p['modes']) else 'no'})")
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    rate = lambda m, k: m[k]["rows_s"]  # noqa: E731
    for mode, what in (("serve-bin", "HTTP binary"), ("serve-json", "HTTP JSON"), ("serve-grpc", "gRPC")):
        row(
            f"fastseq serve ≥ 50% of the in-process batcher's rows/s (goal 70%), {what}",
            lambda m, mode=mode: f"{rate(m, mode) / rate(m, 'in-process'):.0%}",
            lambda m, mode=mode: rate(m, mode) >= 0.5 * rate(m, "in-process"),
        )
    row(
        "batching on ≥ 2x off (HTTP binary)",
        lambda m: f"{rate(m, 'serve-bin') / rate(m, 'b1-bin'):.2f}x",
        lambda m: rate(m, "serve-bin") >= 2 * rate(m, "b1-bin"),
    )
    for mine, peer, what in (
        ("serve-bin", "kserve-bin", "KServe, HTTP binary"),
        ("serve-grpc", "kserve-grpc", "KServe, gRPC"),
        ("serve-json", "mlserver-json", "MLServer, JSON"),
    ):
        row(
            f"≥ 10x {what}",
            lambda m, a=mine, b=peer: f"{rate(m, a) / rate(m, b):.1f}x",
            lambda m, a=mine, b=peer: rate(m, a) >= 10 * rate(m, b),
        )
    for mode, what in (("serve-bin", "HTTP binary"), ("serve-json", "HTTP JSON"), ("serve-grpc", "gRPC")):
        row(
            f"server CPU ≤ 25 µs a request beyond compute, {what}",
            lambda m, k=mode: f"{m[k]['beyond_us']:.0f} µs",
            lambda m, k=mode: m[k]["beyond_us"] <= 25,
        )
    if "long" in report:
        r = report["long"]
        b, a = r["before"], r["after"]
        lines += [
            "",
            f"- RSS and open files over {r['requests']:,} requests to fastseq serve (CNN, HTTP binary, wrk; "
            f"{r['seconds']:.0f} s, {r['date']}): RSS {b['rss_mb']:.1f} -> {a['rss_mb']:.1f} MB, open files "
            f"{b['open_files']} -> {a['open_files']}, threads {b['threads']} -> {a['threads']}",
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setup", action="store_true", help="install wrk, h2load, libb64 and build the peers' venvs")
    p.add_argument("--quick", action="store_true", help="one round of 1 s a mode, no warm-up (a smoke run)")
    p.add_argument("--long", action="store_true", help=f"only the {LONG_REQUESTS:,}-request run (RSS, open files)")
    p.add_argument("--readme", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument(
        "--fastseq",
        default=f"{shlex.quote(sys.executable)} -m fastseq",
        help="the command that runs fastseq's CLI (default: this Python's fastseq)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="S",
        help="wait up to S seconds for the load average to fall under 0.5 before measuring",
    )
    p.add_argument("--pipelines", help="e.g. cnn (default: cnn,tabular)")
    p.add_argument("--modes", help="a comma-separated subset of: " + ", ".join(MODES))
    p.add_argument("--in-process", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.in_process:
        sources, joined, shape, seconds, quick = json.loads(args.in_process)
        print(json.dumps(in_process(sources, joined, shape, seconds, quick)))
        return
    if args.setup:
        ns.setup()
        return
    partial = bool(args.quick or args.pipelines or args.modes)
    if args.readme and partial and not args.long:
        sys.exit("--readme writes the whole table: run it without --quick, --pipelines or --modes")
    if nc.missing_tools():
        sys.exit("missing: " + "; ".join(nc.missing_tools()) + " (or run with --setup)")
    args.fastseq = shlex.split(args.fastseq)
    deadline = time.monotonic() + args.wait_idle
    while os.getloadavg()[0] > 0.5 and time.monotonic() < deadline:
        time.sleep(5)
    if os.getloadavg()[0] > 0.5:
        print(
            f"warning: load average {os.getloadavg()[0]:.1f}: something else runs here, numbers will be noisy",
            file=sys.stderr,
        )
    WORK.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    # a smoke run or a subset goes to its own file: the whole table's numbers (what --readme
    # and --long build on) stay
    results = RESULTS if args.long or not partial else PARTIAL
    if args.long:  # added to the last table's report
        report = earlier or {
            "connections": CONNECTIONS,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "date": "",
            "repeats": 0,
            "measure_s": 0,
            "load_at_start": os.getloadavg()[0],
            "pipelines": {},
        }
        report["long"] = long_run(args)
    else:
        report = measure(args)
        if "long" in earlier:  # the last long run stays in the table, with its date
            report["long"] = earlier["long"]
    results.write_text(json.dumps(report, indent=2))
    text = table(report)
    print(text)
    if args.readme:
        sys.path.insert(0, str(HERE))
        import bench

        bench.write_readme_section("netserve", text)


if __name__ == "__main__":
    main()
