"""The C load generators of bench_netserve.py and what they send: request bodies built once
in Python (Triton binary tensors, JSON, a framed gRPC ``ModelInferRequest``), wrk's Lua
script, how wrk, h2load and perf_analyzer are run and read, the one-request answer checks,
and what /proc says of a server (CPU time, memory, open files).

Nothing here imports fastseq: the harness measures whatever speaks the protocol."""

from __future__ import annotations

import csv
import http.client
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

CLIENT_CORE, SERVER_CORE = "1", "0"
DTYPES = {
    "FP32": np.float32,
    "FP64": np.float64,
    "INT64": np.int64,
    "INT32": np.int32,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "BOOL": np.bool_,
    "FP16": np.float16,
}
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
APT = {"wrk": "wrk", "h2load": "nghttp2-client"}  # tool -> Debian package


# --- the bodies ------------------------------------------------------------------------------------
def binary_body(input_name: str, row: np.ndarray, outputs: list[str]) -> tuple[bytes, int]:
    """Triton's binary tensor extension: the JSON header, then the raw row; outputs asked in binary."""
    raw = row.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": list(row.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        },
        separators=(",", ":"),
    ).encode()
    return header + raw, len(header)


def json_body(input_name: str, row: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": input_name, "shape": list(row.shape), "datatype": "FP32", "data": row.ravel().tolist()}]},
        separators=(",", ":"),
    ).encode()


def grpc_message(model: str, input_name: str, row: np.ndarray, outputs: list[str]) -> bytes:
    """A serialized ``ModelInferRequest`` (tritonclient.grpc's generated classes), raw contents."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model)
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = input_name, "FP32"
    tensor.shape.extend(row.shape)
    req.raw_input_contents.append(row.tobytes())
    for o in outputs:
        req.outputs.add().name = o
    return req.SerializeToString()


def grpc_frame(message: bytes) -> bytes:
    """gRPC's length-prefixed message: not compressed, 4 bytes of length (big-endian)."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


WRK_LUA = """-- written by benches/netserve_clients.py: POST one fixed body; count answers that are not 200
local f = assert(io.open(%(body)s, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
%(headers)s
bad = 0
local threads = {}
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end
function done(summary, latency, requests)
  local non200 = 0
  for _, t in ipairs(threads) do non200 = non200 + t:get("bad") end
  local e = summary.errors
  io.write(string.format('WRK {"requests": %%d, "duration_us": %%d, "non200": %%d, "socket_errors": %%d, '
    .. '"p50_us": %%d, "p99_us": %%d}\\n', summary.requests, summary.duration, non200,
    e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_script(path: Path, body_path: Path, headers: dict[str, str]) -> Path:
    """wrk's Lua script for one body (read from ``body_path`` when wrk starts)."""
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    path.write_text(WRK_LUA % {"body": json.dumps(str(body_path)), "headers": lines})
    return path


# --- the tools -------------------------------------------------------------------------------------
def perf_analyzer(venv: Path) -> tuple[str | None, dict[str, str]]:
    """perf_analyzer from the tritonclient==2.40.0 wheel in ``venv``, and the environment it needs
    (libcudart.so.12 from nvidia-cuda-runtime-cu12); (None, {}) where it is not there."""
    exe = venv / "bin" / "perf_analyzer"
    libs = sorted(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    if not exe.exists() or not libs:
        return None, {}
    env = dict(os.environ, LD_LIBRARY_PATH=":".join([str(libs[0]), os.environ.get("LD_LIBRARY_PATH", "")]))
    return str(exe), env


def missing_tools() -> list[str]:
    """What of wrk, h2load and taskset is not on PATH, as the line that installs it."""
    out = [f"{tool} (apt-get install -y {pkg})" for tool, pkg in APT.items() if shutil.which(tool) is None]
    if shutil.which("taskset") is None:
        out.append("taskset (apt-get install -y util-linux)")
    return out


def pinned(core: str, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", core, *cmd]


def run_wrk(url: str, script: Path, seconds: float, connections: int, timeout_s: float = 600) -> dict:
    """wrk on the client core, one thread; what its done() wrote."""
    cmd = pinned(
        CLIENT_CORE,
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url],
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRK ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    r = json.loads(line[4:])
    return {
        "requests": r["requests"],
        "rows_s": r["requests"] / (r["duration_us"] / 1e6),
        "p50_ms": r["p50_us"] / 1e3,
        "p99_ms": r["p99_us"] / 1e3,
        "errors": r["non200"] + r["socket_errors"],
        "non200": r["non200"],
    }


def run_h2load(url: str, body: Path, seconds: float, connections: int, log: Path, answer_bytes: int) -> dict:
    """h2load on the client core: ``connections`` connections, one stream each, gRPC POSTs of
    ``body`` for ``seconds``; latency percentiles from its per-request log. h2load cannot read
    grpc-status (a trailer), but an error carries no message: any of the answers short of
    ``answer_bytes`` of DATA each (the checked answer's framed size) counts as an error."""
    cmd = pinned(
        CLIENT_CORE,
        [
            "h2load",
            "-t1",
            f"-c{connections}",
            "-m1",
            f"-D{max(1, round(seconds))}",
            "-d",
            str(body),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            f"--log-file={log}",
            url,
        ],
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    text = out.stdout
    done = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        text,
    )
    took = re.search(r"finished in ([\d.]+)(m?s)", text)
    status = re.search(r"status codes: (\d+) 2xx", text)
    data = re.search(r"\((\d+)\) data", text)
    if out.returncode != 0 or not done or not took:
        raise RuntimeError(f"h2load failed ({out.returncode}): {out.stderr.strip() or text.strip()[-500:]}")
    n_done, ok, failed, errored, timeouts = (int(done.group(i)) for i in (3, 4, 5, 6, 7))
    secs = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1)
    times = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line.count("\t") >= 2)
    pct = (lambda q: times[min(len(times) - 1, int(len(times) * q))] / 1e3) if times else (lambda q: float("nan"))
    non2xx = n_done - int(status.group(1)) if status else 0
    short = max(0, n_done * answer_bytes - int(data.group(1))) if data else 0
    return {
        "requests": ok,
        "rows_s": ok / secs,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "errors": failed + errored + timeouts + non2xx + -(-short // answer_bytes),
        "non200": non2xx,
    }


def run_perf_analyzer(
    exe: str, env: dict, url: str, protocol: str, model: str, seconds: float, connections: int, csv_path: Path
) -> dict:
    """perf_analyzer on the client core at concurrency ``connections``, one row a request: three
    windows of ``seconds`` / 3 (stable or not: ``-s 1000``, a busy machine never settles); its
    CSV read back (rows/s, p50, p99)."""
    window_ms = max(1000, int(seconds * 1000 / 3))
    cmd = pinned(
        CLIENT_CORE,
        [
            exe,
            "-m",
            model,
            "-u",
            url,
            "-i",
            protocol,
            "-b",
            "1",
            "--concurrency-range",
            f"{connections}:{connections}",
            "-p",
            str(window_ms),
            "--max-trials",
            "10",
            "-s",
            "1000",
            "-f",
            str(csv_path),
        ],
    )
    limit = seconds * 5 + 120
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        # Seen on the tabular pipeline over HTTP at 32 connections: its first window reported,
        # the next never closed, while the server answered every request it was sent (none
        # pending once perf_analyzer was stopped). perf_analyzer's own main thread was at 100%
        # of the client core (its ValidLatencyMeasurement over every request's timestamps,
        # beside its 32 sending threads): the client's limit at ~29,000 requests a second, not
        # the server's (2026-12-08). Said in the report, as its refusals are.
        raise RuntimeError(f"perf_analyzer did not report within {limit:.0f} s") from None
    if out.returncode != 0 or not csv_path.exists():
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"perf_analyzer failed ({out.returncode}): {' / '.join(lines[-3:])}")
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    count = re.search(r"Request count: (\d+)", out.stdout)
    return {
        "requests": int(count.group(1)) if count else 0,
        "rows_s": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1e3,
        "p99_ms": float(row["p99 latency"]) / 1e3,
        "errors": 0,
        "non200": 0,
    }


# --- the answers -----------------------------------------------------------------------------------
def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", path, body, headers)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def http_outputs(headers: dict, body: bytes) -> dict[str, np.ndarray]:
    """The outputs of a v2 answer, JSON or binary (Triton's extension)."""
    length = int(headers.get("inference-header-content-length", len(body)))
    doc, offset, found = json.loads(body[:length]), length, {}
    for o in doc["outputs"]:
        dtype = DTYPES[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            found[o["name"]] = np.frombuffer(body[offset : offset + size], dtype).reshape(o["shape"])
            offset += size
        else:
            found[o["name"]] = np.asarray(o["data"], dtype).reshape(o["shape"])
    return found


def grpc_outputs(port: int, message: bytes) -> tuple[dict[str, np.ndarray], int]:
    """The very message h2load sends, through grpcio: its answer's outputs and framed size."""
    import grpc
    from tritonclient.grpc import service_pb2

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = channel.unary_unary(GRPC_INFER)(message, timeout=30)
    answer = service_pb2.ModelInferResponse.FromString(raw)
    found = {}
    for i, o in enumerate(answer.outputs):
        dtype = DTYPES[o.datatype]
        if i < len(answer.raw_output_contents):
            data = np.frombuffer(answer.raw_output_contents[i], dtype)
        else:
            field = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents"}[o.datatype]
            data = np.asarray(getattr(o.contents, field), dtype)
        found[o.name] = data.reshape(list(o.shape))
    return found, len(grpc_frame(raw))


def compare(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> str | None:
    """None where every expected output is there and close; else what differs."""
    for name, want in expected.items():
        if name not in got:
            return f"no output '{name}' (got {sorted(got)})"
        have = got[name]
        if have.shape != want.shape and have.size == want.size:
            have = have.reshape(want.shape)
        if have.shape != want.shape or not np.allclose(have, want, rtol=1e-4, atol=1e-5):
            return f"'{name}': {have.ravel()[:4]} {have.shape} against {want.ravel()[:4]} {want.shape}"
    return None


# --- /proc -----------------------------------------------------------------------------------------
def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (MLServer's workers are processes of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) of a process and its descendants, from /proc/PID/stat."""
    total = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def footprint(pid: int) -> dict:
    """Resident memory (MB), open files and threads of a process and its descendants."""
    rss, fds, threads = 0, 0, 0
    for p in tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            rss += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
            threads += int(re.search(r"Threads:\s+(\d+)", status).group(1))
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except (OSError, AttributeError):
            pass
    return {"rss_mb": rss / 1024, "open_files": fds, "threads": threads}
