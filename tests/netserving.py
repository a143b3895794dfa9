"""What the network-serving tests share: models made here (a small CNN, one of every KServe
datatype, several inputs and outputs, a busy one, one whose warm-up fails, one whose rows mix), a server of
``fastseq.serving`` running in a thread on 127.0.0.1 (port 0), ``fastseq serve`` in a
process of its own, and small raw-HTTP helpers for what no client library would send."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import fastseq

#: every KServe datatype and the ONNX type it carries
TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def cnn() -> onnx.ModelProto:
    """image [N, 3, 20, 20] -> two 3x3 convs -> global pool -> logits [N, 10] (nodes unnamed, as users' are)."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    return _model(
        [
            helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c2"], ["r2"]),
            helper.make_node("GlobalAveragePool", ["r2"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["features"], axis=1),
            helper.make_node("Gemm", ["features", "w3", "b3"], ["logits"], transB=1),
        ],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 20, 20])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [w("w1", 8, 3, 3, 3), w("b1", 8), w("w2", 8, 8, 3, 3), w("b2", 8), w("w3", 10, 8), w("b3", 10)],
    )


def every_type() -> onnx.ModelProto:
    """One input per KServe datatype, ``in_<type>`` [N, 3], each copied to ``out_<type>``."""
    names = [d.lower() for d in TYPES]
    return _model(
        [helper.make_node("Identity", [f"in_{n}"], [f"out_{n}"]) for n in names],
        [helper.make_tensor_value_info(f"in_{d.lower()}", t, ["N", 3]) for d, t in TYPES.items()],
        [helper.make_tensor_value_info(f"out_{d.lower()}", t, ["N", 3]) for d, t in TYPES.items()],
    )


def several() -> onnx.ModelProto:
    """x float [N, 4] and k int64 [N, 1]: total = x + k (float), doubled = 2k (int64), norm = |x|^2 [N, 1]."""
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    return _model(
        [
            helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "kf"], ["total"]),
            helper.make_node("Mul", ["k", "two"], ["doubled"]),
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axes"], ["norm"], keepdims=1),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("k", TensorProto.INT64, ["N", 1]),
        ],
        [
            helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("doubled", TensorProto.INT64, ["N", 1]),
            helper.make_tensor_value_info("norm", TensorProto.FLOAT, ["N", 1]),
        ],
        [two, numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )


def busy(convs: int = 10, size: int = 256) -> onnx.ModelProto:
    """x [N, 1] -> a [N, 16, size, size] map of it -> ``convs`` 3x3 convs -> its mean, y [N, 1]:
    each row costs the same whatever its value (about 25 ms a conv here), one row included."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["x", "as_map"], ["x4"]), helper.make_node("Expand", ["x4", "map"], ["h0"])]
    inits = [
        numpy_helper.from_array(np.array([-1, 1, 1, 1], np.int64), "as_map"),
        numpy_helper.from_array(np.array([1, 16, size, size], np.int64), "map"),
        numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.05).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes"),
    ]
    for k in range(convs):
        nodes.append(helper.make_node("Conv", [f"h{k}", "w"], [f"h{k + 1}"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("ReduceMean", [f"h{convs}", "axes"], ["y0"], keepdims=0))
    nodes.append(helper.make_node("Unsqueeze", ["y0", "one"], ["y"]))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        inits,
        opset=18,
    )


def lookup() -> onnx.ModelProto:
    """idx int64 [N, 1] -> y = 10 * idx [N, 1], by a Gather from a table of 5: an index of 5 or
    more fails in ONNX Runtime, at run time (no check before can see it)."""
    table = numpy_helper.from_array(np.arange(5, dtype=np.float32) * 10, "table")
    return _model(
        [helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [table],
    )


def pairs() -> onnx.ModelProto:
    """x [N, W] -> y [N, W / 2, 2], a Reshape to pairs: a row of one value (the warm-up's
    dynamic axes are 1) cannot be split, so the warm-up run fails."""
    return _model(
        [helper.make_node("Reshape", ["x", "pairs"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", None, 2])],
        [numpy_helper.from_array(np.array([0, -1, 2], np.int64), "pairs")],
    )


def mixing() -> onnx.ModelProto:
    """Softmax over the batch axis: a row's output depends on the other rows."""
    return _model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )


def pipe(model: onnx.ModelProto, **kwargs) -> fastseq.ONNXSequential:
    return fastseq.ONNXSequential(model, **kwargs)


# --- servers ------------------------------------------------------------------------------------
def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{url} was not ready within {timeout} s")


@contextlib.contextmanager
def running(pipelines, **options) -> Iterator:
    """``fastseq.serving.app(pipelines, **options)`` served in a thread on 127.0.0.1, ready;
    stopped (and its thread joined) at the end."""
    from fastseq import serving
    from fastseq.serving.server import Server

    grpc_port = options.pop("grpc_port", None)
    app = serving.app(pipelines, **options)
    server = Server(app, "127.0.0.1", 0, grpc_port=grpc_port)
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    try:
        wait_ready(server.url)
        yield server
    finally:
        server.stop()
        thread.join(60)
        assert not thread.is_alive(), "the server did not stop"


class Process:
    """``fastseq serve ARGS --port 0`` in a process of its own: its port once listening."""

    def __init__(self, *args: str, env: dict | None = None, cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fastseq", "serve", *args, "--port", "0"],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        self.lines: list[str] = []
        self.port = self.grpc_port = None
        self._listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._listening.wait(120):
            self.proc.kill()
            raise RuntimeError("fastseq serve did not start: " + "".join(self.lines))
        if self.port is None:
            raise RuntimeError("fastseq serve ended: " + "".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if "listening on http://127.0.0.1:" in line:
                self.port = int(line.split("127.0.0.1:")[1].split()[0])
                if "gRPC on 127.0.0.1:" in line:
                    self.grpc_port = int(line.split("gRPC on 127.0.0.1:")[1].split(")")[0].split(";")[0])
                self._listening.set()
        self._listening.set()

    def text(self) -> str:
        return "".join(self.lines)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout)


def wrong_answers(
    connect, make_input, pipe, rows, model: str = "cnn", input_name: str = "image", output: str = "logits"
) -> list[tuple[int, int]]:
    """Callers at once, one per ``rows[k]``, each on a connection of its own (``connect()``),
    sending its requests ``rows[k][j]`` (any number of rows each, 0 included) one after
    another; the (k, j) of each answer that is not what ``pipe(x)`` gives, shape included."""
    wrong: list[tuple[int, int]] = []

    def caller(k: int) -> None:
        c = connect()
        for j, x in enumerate(rows[k]):
            got = c.infer(model, [make_input(input_name, x)]).as_numpy(output)
            expected = pipe(x)[0]
            if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
                wrong.append((k, j))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return wrong


# --- raw HTTP -----------------------------------------------------------------------------------
def raw(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Sends ``data`` (a whole HTTP request) on a new connection; the status, headers and
    body of the answer (status 0: the connection closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return read_answer(s)


def read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return 0, {}, buf
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def post(path: str, body: bytes, headers: dict[str, str] | None = None, length: int | None = None) -> bytes:
    """An HTTP/1.1 POST request's bytes (``length``: the Content-Length to claim)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body) if length is None else length}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def cnn_request() -> bytes:
    """A POST of one image (ones) to cnn(), served as ``cnn``, its tensor as binary data."""
    x = np.ones((1, 3, 20, 20), np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [1, 3, 20, 20],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    return post("/v2/models/cnn/infer", head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))})


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def metrics(url: str) -> dict[str, float]:
    """``/metrics`` as {sample with labels: value}."""
    _, text = get(url + "/metrics")
    found = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


def infer_json(name: str, x: np.ndarray, datatype: str = "FP32", input_name: str = "image") -> bytes:
    return json.dumps(
        {"inputs": [{"name": input_name, "shape": list(x.shape), "datatype": datatype, "data": x.reshape(-1).tolist()}]}
    ).encode()
