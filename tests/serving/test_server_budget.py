"""The server's one memory budget (``--memory-budget``), a test per kind of holder: answers
that their clients never read (HTTP/1.1 and gRPC), BYTES inputs, JSON bodies (their decoded
tensors), large binary batches; and a request alone over the budget, a 413. Each runs
``fastseq serve`` as a process of its own so that its resident memory is its own: held bytes
(``fastseq_memory_held_bytes``) never pass the budget, later requests wait and then get a
503, RSS stays within the budget's reach, and everything is given back afterwards."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from netserving import Process, _model, metrics, post, raw, wait_ready

MB = 1 << 20
HELD = "fastseq_memory_held_bytes"


# --- models ---------------------------------------------------------------------------------------
def wide(n: int) -> onnx.ModelProto:
    """x [N, 1] -> y [N, n], x tiled: a few bytes in, 4n bytes out a row."""
    reps = numpy_helper.from_array(np.array([1, n], np.int64), "reps")
    return _model(
        [helper.make_node("Tile", ["x", "reps"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
        [reps],
    )


def echo(n: int) -> onnx.ModelProto:
    """x [N, n] -> y = -x [N, n]: as many bytes out as in."""
    return _model(
        [helper.make_node("Neg", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
    )


def total() -> onnx.ModelProto:
    """x FP64 [N, K] -> its sum per row [N, 1]: large in, small out."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    return _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", "K"])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 1])],
        [axes],
    )


def strings() -> onnx.ModelProto:
    """s BYTES [N, K] -> t = s [N, K]."""
    return _model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N", "K"])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["N", "K"])],
    )


def serve(tmp_path: Path, model: onnx.ModelProto, name: str, *args: str) -> Process:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    p = Process(str(path), "--name", name, *args)
    try:
        wait_ready(p.url)
    except BaseException:
        p.stop()
        raise
    return p


# --- what the tests read --------------------------------------------------------------------------
def rss(p: Process) -> int:
    with open(f"/proc/{p.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def held(p: Process) -> float:
    return metrics(p.url)[HELD]


class Watch:
    """Samples the server's held bytes and RSS every 50 ms in a thread, keeping the highest."""

    def __init__(self, p: Process) -> None:
        self.p, self.held, self.rss = p, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.held = max(self.held, held(self.p))
                self.rss = max(self.rss, rss(self.p))
            except (OSError, KeyError, ValueError):
                pass

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join(10)
        return self


def settle(p: Process, until_s: float = 30.0) -> float:
    """Waits (bounded) for the held bytes to come back to 0; what they are at the end."""
    end = time.monotonic() + until_s
    now = held(p)
    while now and time.monotonic() < end:
        time.sleep(0.1)
        now = held(p)
    return now


def binary_request(
    path: str, name: str, x: np.ndarray, outputs: list[str] | None = None, datatype: str = "FP32"
) -> bytes:
    head = {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": datatype, "parameters": {"binary_data_size": x.nbytes}}
        ]
    }
    if outputs:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    h = json.dumps(head).encode()
    return post(path, h + x.tobytes(), {"Inference-Header-Content-Length": str(len(h))})


def deaf_socket(port: int) -> socket.socket:
    """A connection whose client reads nothing (and whose receive buffer is small)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    return s


def statuses_of(port: int, requests: list[bytes], timeout: float = 60) -> list[tuple[int, bytes]]:
    """Each request on a connection of its own, all at once; (status, body) each."""
    out: list = [None] * len(requests)

    def one(k: int) -> None:
        try:
            status, _, body = raw(port, requests[k], timeout=timeout)
        except OSError as e:
            status, body = 0, repr(e).encode()
        out[k] = (status, body)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return out


# --- unread answers -------------------------------------------------------------------------------
def test_answers_nobody_reads_over_http_hold_at_most_the_budget_and_are_given_back(tmp_path):
    """30 connections each ask for an 8 MB answer and read nothing: the answers held stay
    within the 64 MB budget (later requests wait, then 503), RSS stays within reach of it,
    and the bytes come back when the write timeout ends those connections."""
    p = serve(tmp_path, wide(2_000_000), "wide", "--memory-budget", "64M", "--timeout-s", "2", "--body-timeout-s", "3")
    request = binary_request("/v2/models/wide/infer", "x", np.ones((1, 1), np.float32), ["y"])
    try:
        status, _, body = raw(p.port, request)  # one read in full: the path is warm
        assert status == 200 and len(body) > 8_000_000
        base = rss(p)
        watch = Watch(p)
        deaf = []
        for _ in range(30):
            s = deaf_socket(p.port)
            s.sendall(request)
            deaf.append(s)
        time.sleep(1.0)
        # A client that reads: it waits for room, and gets a 503 naming the budget.
        late = statuses_of(p.port, [request] * 4)
        w = watch.stop()
        assert w.held <= 64 * MB, f"held {w.held / MB:.0f} MB with a 64 MB budget"
        assert w.rss - base <= 128 * MB, f"RSS grew {(w.rss - base) / MB:.0f} MB with a 64 MB budget"
        assert any(s == 503 and b"memory budget" in b for s, b in late), late
        # The write timeout (3 s) ends the deaf connections: everything is given back.
        assert settle(p) == 0
        status, _, body = raw(p.port, request)
        assert status == 200
        for s in deaf:
            s.close()
    finally:
        p.stop()


def test_answers_nobody_reads_over_grpc_hold_at_most_the_budget_and_are_given_back(tmp_path):
    """The same over gRPC: calls whose client never opens its flow-control window (so the
    answers stay on the server's side, not in a socket's write buffer) hold at most the
    budget, and an answer not read within the body timeout ends its connection."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    from serving.h2wire import Connection

    p = serve(
        tmp_path,
        wide(2_000_000),
        "wide",
        "--memory-budget",
        "64M",
        "--timeout-s",
        "2",
        "--body-timeout-s",
        "3",
        "--grpc-port",
        "0",
    )
    message = service_pb2.ModelInferRequest(model_name="wide")
    t = message.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    message.raw_input_contents.append(np.ones((1, 1), np.float32).tobytes())
    body = message.SerializeToString()
    del t
    try:
        ok = Connection(p.grpc_port).call("ModelInfer", body)
        assert ok.status == 0 and len(ok.data) > 8_000_000
        base = rss(p)
        watch = Watch(p)
        deaf = [Connection(p.grpc_port, read=False) for _ in range(6)]
        for c in deaf:
            for _ in range(5):
                c.start("ModelInfer", body)
            c.pump(0.1)
        time.sleep(1.0)
        late = [
            Connection(p.grpc_port).call(
                "ModelInfer",
                body,
            )
            for _ in range(2)
        ]
        w = watch.stop()
        assert w.held <= 64 * MB, f"held {w.held / MB:.0f} MB with a 64 MB budget"
        assert w.rss - base <= 128 * MB, f"RSS grew {(w.rss - base) / MB:.0f} MB with a 64 MB budget"
        assert any(a.status == 14 and "memory budget" in a.message for a in late), [(a.status, a.message) for a in late]
        # The deaf connections stay open on the client's side, and keep answering pings: the
        # server ends them once their answers go unread for the body timeout (3 s).
        end = time.monotonic() + 30
        while held(p) and time.monotonic() < end:
            for c in deaf:
                c.pump(0.02)
            time.sleep(0.1)
        assert held(p) == 0
        assert Connection(p.grpc_port).call("ModelInfer", body).status == 0
        for c in deaf:
            c.close()
    finally:
        p.stop()


# --- what requests bring ----------------------------------------------------------------------------
def strings_body(count: int, seed: int) -> bytes:
    """A binary request of ``count`` one-character BYTES elements, [1, count]."""
    chars = np.random.default_rng(seed).integers(97, 123, count).astype(np.uint8)
    data = b"".join(struct.pack("<I", 1) + bytes([c]) for c in chars.tolist())
    head = json.dumps(
        {
            "inputs": [
                {"name": "s", "shape": [1, count], "datatype": "BYTES", "parameters": {"binary_data_size": len(data)}}
            ],
            "outputs": [{"name": "t", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return post("/v2/models/strings/infer", head + data, {"Inference-Header-Content-Length": str(len(head))})


def test_bytes_inputs_are_counted_by_their_elements_not_their_bytes(tmp_path):
    """A BYTES element of one character is 5 bytes on the wire and a Python str, a numpy
    slot, an ONNX Runtime string and an answer's element on the way: 16 concurrent requests of
    200,000 elements each (1 MB bodies) stay within a 64 MB budget's reach, and one of
    2,000,000 elements (a 10 MB body, under the body limit) is over the budget alone: a 413."""
    p = serve(tmp_path, strings(), "strings", "--memory-budget", "64M", "--timeout-s", "5")
    try:
        status, _, _ = raw(p.port, strings_body(1000, 0))
        assert status == 200
        base = rss(p)
        watch = Watch(p)
        answers = statuses_of(p.port, [strings_body(200_000, k) for k in range(16)])
        w = watch.stop()
        codes = [s for s, _ in answers]
        assert set(codes) <= {200, 503} and 200 in codes, codes
        assert w.held <= 64 * MB
        assert w.rss - base <= 160 * MB, f"RSS grew {(w.rss - base) / MB:.0f} MB with a 64 MB budget"
        status, _, body = raw(p.port, strings_body(2_000_000, 1))
        assert status == 413 and b"memory budget" in body, body[:300]
        assert settle(p) == 0
    finally:
        p.stop()


def test_json_bodies_count_their_decoded_tensors(tmp_path):
    """A JSON body of FP64 zeros decodes to 4x its size ("0," is 8 bytes): 12 concurrent
    6 MB bodies (24 MB of tensors each) under a 64 MB budget wait their turn or get a 503,
    never holding more than the budget; RSS stays within its reach."""
    p = serve(tmp_path, total(), "total", "--memory-budget", "64M", "--timeout-s", "5")
    count = 3 * MB
    body = (
        f'{{"inputs":[{{"name":"x","shape":[1,{count}],"datatype":"FP64","data":['.encode()
        + b"0," * (count - 1)
        + b"0]}]}"
    )
    request = post("/v2/models/total/infer", body)
    try:
        status, _, answer = raw(p.port, request)
        assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [0.0]
        base = rss(p)
        watch = Watch(p)
        answers = statuses_of(p.port, [request] * 12)
        w = watch.stop()
        codes = [s for s, _ in answers]
        assert set(codes) <= {200, 503} and 200 in codes, codes
        assert w.held <= 64 * MB
        assert w.rss - base <= 128 * MB, f"RSS grew {(w.rss - base) / MB:.0f} MB with a 64 MB budget"
        assert settle(p) == 0
    finally:
        p.stop()


def test_large_binary_batches_stay_within_the_budget(tmp_path):
    """24 concurrent 8 MB binary requests of a batched model under a 64 MB budget: each holds
    its body, its share of the joined batch and its answer; none is over the budget alone,
    some wait or get a 503, held bytes never pass it, RSS stays within its reach, and both come
    back afterwards."""
    n = 2 * MB
    p = serve(tmp_path, echo(n), "echo", "--memory-budget", "64M", "--timeout-s", "4", "--max-batch-size", "8")
    x = np.ones((1, n), np.float32)
    request = binary_request("/v2/models/echo/infer", "x", x, ["y"])
    try:
        status, _, body = raw(p.port, request)
        assert status == 200
        base = rss(p)
        watch = Watch(p)
        answers = statuses_of(p.port, [request] * 24)
        w = watch.stop()
        codes = [s for s, _ in answers]
        assert set(codes) <= {200, 503} and codes.count(200) >= 2, codes
        assert w.held <= 64 * MB, f"held {w.held / MB:.0f} MB"
        assert w.rss - base <= 128 * MB, f"RSS grew {(w.rss - base) / MB:.0f} MB with a 64 MB budget"
        assert settle(p) == 0
        time.sleep(0.5)
        assert rss(p) - base <= 64 * MB, "RSS did not come back near where it was"
    finally:
        p.stop()


def test_a_request_alone_over_the_budget_is_a_413_at_once(tmp_path):
    """Its body, its share of the batch and its answer cannot fit in the budget however long
    it waits: a 413 naming the budget, answered without waiting for the timeout."""
    p = serve(tmp_path, echo(MB), "echo", "--memory-budget", "6M", "--timeout-s", "30")
    try:
        start = time.monotonic()
        # 4 MB of body, and 4 MB more for the joined batch's copy: over 6 MB, however long it waits
        status, _, body = raw(p.port, binary_request("/v2/models/echo/infer", "x", np.ones((1, MB), np.float32)))
        assert status == 413 and b"memory budget of 6291456 bytes" in body, body[:300]
        assert time.monotonic() - start < 10
        # one that fits is answered
        status, _, _ = raw(p.port, binary_request("/v2/models/echo/infer", "x", np.ones((0, MB), np.float32)))
        assert status == 200
        assert settle(p) == 0
    finally:
        p.stop()


def test_a_small_call_is_answered_while_large_uploads_fill_their_half_of_the_budget(tmp_path):
    """Uploads of a client that stopped, large enough to fill the half of the budget that
    bodies may hold, do not turn other clients away: a small call's body takes the rest of
    the pool (found by a review: before, every other call waited for their body timeout)."""
    h2_connection = pytest.importorskip("h2.connection")
    h2_config = pytest.importorskip("h2.config")
    h2_exceptions = pytest.importorskip("h2.exceptions")
    tg = pytest.importorskip("tritonclient.grpc")

    p = serve(tmp_path, echo(4), "echo", "--memory-budget", "64M", "--body-timeout-s", "20", "--grpc-port", "0")
    s = socket.create_connection(("127.0.0.1", p.grpc_port), timeout=10)
    try:
        conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True))
        conn.initiate_connection()
        left = {}
        for _ in range(6):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/inference.GRPCInferenceService/ModelInfer"),
                    (":authority", "127.0.0.1"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ],
            )
            size = 8 << 20
            conn.send_data(sid, b"\0" + struct.pack(">I", size))
            left[sid] = size
        s.sendall(conn.data_to_send())
        # the uploads go on as far as the server's windows let them, then stall
        end = time.monotonic() + 30
        while time.monotonic() < end:
            sent = False
            for sid in left:
                n = min(left[sid], conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if n > 0:
                    try:
                        conn.send_data(sid, b"\0" * n)
                    except h2_exceptions.StreamClosedError:
                        # the youngest of the stuck uploads gives up (the budget's rule)
                        left[sid] = 0
                        continue
                    left[sid] -= n
                    sent = True
            s.sendall(conn.data_to_send())
            if not sent:
                s.settimeout(1.0)
                try:
                    data = s.recv(1 << 16)
                except TimeoutError:
                    break
                conn.receive_data(data)
                s.sendall(conn.data_to_send())
        assert held(p) >= 30 << 20, held(p)  # the bodies' half (32 MB), or near it
        c = tg.InferenceServerClient(f"127.0.0.1:{p.grpc_port}")
        x = tg.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        np.testing.assert_array_equal(c.infer("echo", [x], client_timeout=10).as_numpy("y"), -np.ones((1, 4)))
    finally:
        s.close()
        p.stop()
