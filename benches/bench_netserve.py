"""Serving over the network, side by side: ``fastseq serve`` against batching off and a
hand-written per-request server, with the in-process batcher as the reference.

    python benches/bench_netserve.py            # the table (a few minutes)
    python benches/bench_netserve.py --readme   # and write it into docs/benchmarks.md
    python benches/bench_netserve.py --quick    # one short round, no RSS run

Two pipelines: a small CNN (3x20x20 -> two 3x3 convs -> global pool -> 10) and the tabular
pipeline of bench_serve.py (skl2onnx scaler + MLP 64-256-10). Per pipeline, each in a
process of its own, the client another (``CLIENTS`` threads with ``tritonclient.http``, one
row a request, one connection each):

- serve: ``fastseq serve`` (batching on, ``--max-batch-size 32``);
- serve-b1: ``fastseq serve --max-batch-size 1`` (batching off);
- hand: what users write today, a per-request server in the same framework: a Starlette
  route on uvicorn (uvloop, httptools) that decodes the same protocol with fastseq's own
  functions and calls ``pipe(x)`` in Starlette's thread pool for each request;
- null: a server that answers every request with one answer made at start, decoding and
  running nothing: what the client itself allows on this machine;
- in-process: ``CLIENTS`` threads calling ``pipe.batcher()`` in one process (no network).

Rows per second and p50/p99 latency over a measured window after a warm-up, and the
server process's CPU time per request; each client thread's first answer is checked against
``pipe(x)`` and a run with any failed request stops the benchmark. The modes in turns,
``REPEATS`` rounds, medians reported. Then ``fastseq serve``'s resident memory
before and after ``LONG_REQUESTS`` requests (read from its own ``/metrics``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
FIXTURES = HERE.parent / "tests" / "fixtures"
OUT = HERE / "out"
RESULTS = OUT / "netserve.json"
CLIENTS = 32
WARM_S, MEASURE_S = 1.0, 3.0
REPEATS = 3
LONG_REQUESTS = 100_000
MODES = {
    "serve": "fastseq serve",
    "serve-b1": "fastseq serve --max-batch-size 1",
    "hand": "hand-written per-request server",
    "null": "a server that runs nothing (the client's ceiling)",
    "in-process": "in-process batcher, threads",
}


# --- the pipelines ------------------------------------------------------------------------------
def cnn_model(path: Path) -> None:
    """3x20x20 -> Conv 3->16 -> Relu -> Conv 16->16 -> Relu -> GlobalAveragePool -> Gemm 16->10."""
    import numpy as np
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
    """The pipeline as ``fastseq serve`` starts it (its session options), so that every server
    here runs the same sessions: what differs is the serving."""
    import fastseq
    from fastseq.cli.serve import SERVING_OPTIONS
    from fastseq.graph.session_settings import session_options

    return fastseq.ONNXSequential(*sources, session_options=session_options(SERVING_OPTIONS))


# --- the servers --------------------------------------------------------------------------------
def start(mode: str, sources: list[str]) -> tuple[subprocess.Popen, int]:
    """A server process for ``mode``; returns it and its port once it is ready."""
    if mode.startswith("serve"):
        cmd = [
            sys.executable,
            "-m",
            "fastseq",
            "serve",
            *sources,
            "--name",
            "m",
            "--port",
            "0",
            "--max-batch-size",
            "1" if mode == "serve-b1" else "32",
            "--max-queue",
            "1024",
        ]
    elif mode == "null":
        cmd = [sys.executable, __file__, "--null-server", *sources]
    else:
        cmd = [sys.executable, __file__, "--hand-server", *sources]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "listening on" in line:
            port = int(line.split("listening on http://127.0.0.1:")[1].split()[0].rstrip(")"))
        if "ready" in line and port is not None:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc, port
    proc.kill()
    raise RuntimeError(f"{mode}: the server did not start ({line.strip() if line else 'no output'})")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def hand_server(sources: list[str]) -> None:
    """What users write today: a Starlette route around ``pipe(x)``, one request at a time
    in Starlette's thread pool, the same protocol decoded by fastseq's own functions."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from fastseq.serving.model import ServedModel
    from fastseq.serving.protocol import decode_infer, encode_infer
    from fastseq.serving.server import bind

    pipe = build(sources)
    model = ServedModel("m", pipe, max_batch_size=1)  # its description only
    names = [i.name for i in pipe.inputs]

    async def infer(request):
        body = await request.body()
        header = request.headers.get("inference-header-content-length")
        try:
            req = decode_infer("m", body, int(header) if header else None, model.inputs, model.outputs)
            outputs = await run_in_threadpool(pipe, *[req.inputs[n] for n in names])
        except Exception as e:  # noqa: BLE001
            return JSONResponse({"error": str(e)}, 400)
        chosen = [(model.outputs[n], a, req.binary_output) for n, a in zip(model.output_order, outputs)]
        data, length = encode_infer("m", "1", req.id, chosen)
        headers = {"inference-header-content-length": str(length)} if length is not None else {}
        return Response(data, headers=headers, media_type="application/octet-stream")

    async def ready(request):
        return Response(b"")

    app = Starlette(routes=[Route("/v2/models/m/infer", infer, methods=["POST"]), Route("/v2/health/ready", ready)])
    sock = bind("127.0.0.1", 0)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    print("ready", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", access_log=False, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


def null_server(sources: list[str], shape: list[int]) -> None:
    """The client's ceiling: uvicorn answering every request with one answer made at start
    (the pipeline's, for the benchmark's row), without decoding or running anything."""
    import numpy as np
    import uvicorn

    from fastseq.serving.model import ServedModel
    from fastseq.serving.protocol import encode_infer
    from fastseq.serving.server import bind

    pipe = build(sources)
    model = ServedModel("m", pipe, max_batch_size=1)
    outputs = pipe(np.random.default_rng(0).random(shape, dtype=np.float32))
    body, length = encode_infer(
        "m", "1", None, [(model.outputs[n], a, True) for n, a in zip(model.output_order, outputs)]
    )
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"content-length", str(len(body)).encode()),
        (b"inference-header-content-length", str(length).encode()),
    ]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    sock = bind("127.0.0.1", 0)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    print("ready", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", access_log=False, log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


# --- the clients --------------------------------------------------------------------------------
def client(
    port: int, input_name: str, shape: list[int], seconds: float, requests: int | None = None, expected: object = None
) -> dict:
    """``CLIENTS`` threads, one tritonclient.http connection each, one row a request; each
    thread's first answer is compared with ``expected`` (pipe(row)'s first output)."""
    import numpy as np
    import tritonclient.http as http

    row = np.random.default_rng(0).random(shape, dtype=np.float32)
    done: list[tuple[float, float]] = []
    errors = [0]
    first: list[str] = []
    barrier = threading.Barrier(CLIENTS + 1)
    stop_at = [0.0]
    left = [requests]
    lock = threading.Lock()

    def caller() -> None:
        c = http.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=60, network_timeout=60)
        x = http.InferInput(input_name, shape, "FP32")
        x.set_data_from_numpy(row)
        mine = []
        if expected is not None:  # the server answers right before it is timed
            answer = c.infer("m", [x])
            got = answer.as_numpy(answer.get_response()["outputs"][0]["name"])
            if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
                first.append(f"a wrong answer: {got.ravel()[:4]} against {np.ravel(expected)[:4]}")
                errors[0] += 1
        barrier.wait()
        while True:
            if requests is not None:
                with lock:
                    if left[0] <= 0:
                        break
                    left[0] -= 1
            begin = time.perf_counter()
            if requests is None and begin >= stop_at[0]:
                break
            try:
                c.infer("m", [x])
            except Exception as e:  # noqa: BLE001 - counted, and the first one said
                errors[0] += 1
                first.append(str(e))
            mine.append((begin, time.perf_counter()))
        done.extend(mine)
        c.close()

    start = together(caller, barrier, stop_at, seconds)
    return summary(done, start, seconds, errors[0]) | {"first_error": first[0] if first else None}


def together(caller, barrier: threading.Barrier, stop_at: list[float], seconds: float) -> float:
    """``CLIENTS`` threads of ``caller``, let go at once (``barrier``) until ``stop_at[0]``, a
    warm-up and ``seconds`` from now, and waited for; when they were let go."""
    threads = [threading.Thread(target=caller) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    stop_at[0] = start + WARM_S + seconds
    barrier.wait()
    for t in threads:
        t.join()
    return start


def summary(done: list[tuple[float, float]], start: float, seconds: float, errors: int = 0) -> dict:
    lo, hi = start + WARM_S, start + WARM_S + seconds
    window = sorted(end - begin for begin, end in done if lo <= end < hi)
    if not window:
        return {"rows_s": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan"), "errors": errors, "total": len(done)}
    return {
        "rows_s": len(window) / seconds,
        "p50_ms": window[len(window) // 2] * 1000,
        "p99_ms": window[min(len(window) - 1, int(len(window) * 0.99))] * 1000,
        "errors": errors,
        "total": len(done),
    }


def in_process(sources: list[str], shape: list[int], seconds: float) -> dict:
    """``CLIENTS`` threads calling the pipeline's batcher (no network)."""
    import numpy as np

    pipe = build(sources)
    row = np.random.default_rng(0).random(shape, dtype=np.float32)
    done: list[tuple[float, float]] = []
    with pipe.batcher(max_batch_size=32) as batcher:
        batcher(row)
        barrier = threading.Barrier(CLIENTS + 1)
        stop_at = [0.0]

        def caller() -> None:
            mine = []
            barrier.wait()
            while (begin := time.perf_counter()) < stop_at[0]:
                batcher(row)
                mine.append((begin, time.perf_counter()))
            done.extend(mine)

        start = together(caller, barrier, stop_at, seconds)
    return summary(done, start, seconds)


def run_json(args: list[str]) -> dict:
    """One measurement in a process of its own; its JSON line."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(mode: str, sources: list[str], input_name: str, shape: list[int], seconds: float) -> dict:
    if mode == "in-process":
        return run_json(["--in-process", json.dumps([sources, shape, seconds])])
    proc, port = start(mode, sources)
    try:
        cpu = cpu_seconds(proc.pid)
        result = run_json(["--client", json.dumps([port, input_name, shape, seconds, sources])])
        result["server_us"] = (cpu_seconds(proc.pid) - cpu) / max(1, result["total"]) * 1e6
    finally:
        stop(proc)
    if result["errors"]:  # a rate of errors measures nothing
        raise RuntimeError(f"{mode}: {result['errors']} requests failed; the first: {result['first_error']}")
    return result


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_run(sources: list[str], input_name: str, shape: list[int], requests: int) -> dict:
    """fastseq serve's resident memory, threads and open files before and after ``requests``."""
    import urllib.request

    proc, port = start("serve", sources)

    def read() -> dict:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        found = {}
        for line in text.splitlines():
            for key in ("process_resident_memory_bytes", "process_open_fds", "fastseq_threads"):
                if line.startswith(key + " "):
                    found[key] = float(line.split()[1])
        return found

    try:
        run_json(["--client-count", json.dumps([port, input_name, shape, 2000])])  # warm: pools, buffers
        before = read()
        start_t = time.perf_counter()
        result = run_json(["--client-count", json.dumps([port, input_name, shape, requests])])
        elapsed = time.perf_counter() - start_t
        after = read()
    finally:
        stop(proc)
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} of {requests} requests failed; the first: {result['first_error']}")
    return {
        "requests": requests,
        "seconds": elapsed,
        "errors": result.get("errors", 0),
        "rss_before_mb": before["process_resident_memory_bytes"] / 2**20,
        "rss_after_mb": after["process_resident_memory_bytes"] / 2**20,
        "fds_before": before["process_open_fds"],
        "fds_after": after["process_open_fds"],
        "threads_before": before["fastseq_threads"],
        "threads_after": after["fastseq_threads"],
    }


# --- the report ---------------------------------------------------------------------------------
def measure(quick: bool) -> dict:
    seconds = 1.5 if quick else MEASURE_S
    repeats = 1 if quick else REPEATS
    report: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "clients": CLIENTS,
        "measure_s": seconds,
        "repeats": repeats,
        "date": time.strftime("%Y-%m-%d"),
        "pipelines": {},
    }
    for name, (description, sources, input_name, shape) in cases().items():
        rounds: dict[str, list[dict]] = {m: [] for m in MODES}
        for k in range(repeats):
            for mode in MODES:  # in turns: a busy spell lands on all of them alike
                print(f"{name}: round {k + 1} of {repeats}: {mode} ...", file=sys.stderr, flush=True)
                rounds[mode].append(one(mode, sources, input_name, shape, seconds))
        medians = {
            m: {
                key: statistics.median(r.get(key, float("nan")) for r in rs)
                for key in ("rows_s", "p50_ms", "p99_ms", "server_us")
            }
            | {"errors": sum(r["errors"] for r in rs), "runs": [round(r["rows_s"]) for r in rs]}
            for m, rs in rounds.items()
        }
        report["pipelines"][name] = {"description": description, "modes": medians}
    if not quick:
        _, sources, input_name, shape = cases()["cnn"]
        print(f"cnn: RSS over {LONG_REQUESTS:,} requests ...", file=sys.stderr, flush=True)
        report["rss"] = rss_run(sources, input_name, shape, LONG_REQUESTS)
    return report


def table(report: dict) -> str:
    lines = [
        f"{report['clients']} client threads (tritonclient.http, one row a request) on {report['machine']}, "
        f"{report['date']}; medians of {report['repeats']} rounds of {report['measure_s']:g} s",
        "",
        "| pipeline | server | rows/s | p50 ms | p99 ms | server CPU µs/request | rounds (rows/s) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, p in report["pipelines"].items():
        for mode, m in p["modes"].items():
            cpu = "" if m["server_us"] != m["server_us"] else f"{m['server_us']:.0f}"
            lines.append(
                f"| {name} | {MODES[mode]} | {m['rows_s']:,.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
                f"{cpu} | {', '.join(f'{r:,}' for r in m['runs'])} |"
            )
    lines.append("")
    for name, p in report["pipelines"].items():
        m = p["modes"]
        rate = {k: v["rows_s"] for k, v in m.items()}
        lines.append(
            f"- {name}: batching on/off {rate['serve'] / rate['serve-b1']:.2f}x (target 1.5x, goal 2x "
            f"on the CNN); serve/in-process batcher {rate['serve'] / rate['in-process']:.0%} (target 50%; "
            f"the client's own ceiling, a server that runs nothing, is "
            f"{rate['null'] / rate['in-process']:.0%}); serve/hand-written {rate['serve'] / rate['hand']:.2f}x "
            "(must beat 1x)"
        )
    if "rss" in report:
        r = report["rss"]
        lines.append(
            f"- {r['requests']:,} requests to fastseq serve (cnn) in {r['seconds']:.0f} s, {r['errors']} "
            f"errors: RSS {r['rss_before_mb']:.1f} MB before, {r['rss_after_mb']:.1f} MB after; open files "
            f"{r['fds_before']:.0f} -> {r['fds_after']:.0f}; threads {r['threads_before']:.0f} -> "
            f"{r['threads_after']:.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--readme", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--quick", action="store_true", help="one short round, no RSS run")
    p.add_argument("--hand-server", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--null-server", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--client-count", help=argparse.SUPPRESS)
    p.add_argument("--in-process", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hand_server:
        hand_server(args.hand_server)
        return
    if args.null_server:
        shape = next(c[3] for c in cases().values() if c[1] == args.null_server)
        null_server(args.null_server, shape)
        return
    if args.client:
        port, input_name, shape, seconds, sources = json.loads(args.client)
        import numpy as np

        expected = build(sources)(np.random.default_rng(0).random(shape, dtype=np.float32))[0]
        print(json.dumps(client(port, input_name, shape, seconds, expected=expected)))
        return
    if args.client_count:
        port, input_name, shape, count = json.loads(args.client_count)
        print(json.dumps(client(port, input_name, shape, 1e9, count)))
        return
    if args.in_process:
        sources, shape, seconds = json.loads(args.in_process)
        print(json.dumps(in_process(sources, shape, seconds)))
        return
    report = measure(args.quick)
    RESULTS.write_text(json.dumps(report, indent=2))
    text = table(report)
    print(text)
    if args.readme:
        sys.path.insert(0, str(HERE))
        import bench

        bench.write_readme_section("netserve", text)


if __name__ == "__main__":
    main()
