"""``fastseq serve`` as a process: ready only after its warm-up, SIGTERM drains (ready turns
false, new requests are refused, those open are answered) and exits 0, a warm-up that fails
exits 1, the command's own errors, and nothing leaked (threads, open files, memory) over a
long run. Bounded: every wait has a deadline."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import onnx
import pytest

pytest.importorskip("uvicorn")
http = pytest.importorskip("tritonclient.http")

from netserving import Process, busy, cnn, get, metrics, pairs, post, raw, read_answer, wait_ready  # noqa: E402


def request_body(rows: int = 1) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [rows, 1], "datatype": "FP32", "data": [1.0] * rows}]}
    ).encode()


def test_ready_only_after_the_warm_up(tmp_path):
    onnx.save(busy(400), tmp_path / "slow.onnx")  # a warm-up run of a second or so
    server = Process(str(tmp_path / "slow.onnx"))
    try:
        assert get(server.url + "/v2/health/live")[0] == 200
        first = get(server.url + "/v2/health/ready")[0]
        model = get(server.url + "/v2/models/slow/ready")[0]
        status, _, body = raw(server.port, post("/v2/models/slow/infer", request_body()))
        wait_ready(server.url)
        assert first == 503 and model == 503, "ready before the warm-up ran"
        assert status == 503 and "not ready yet" in json.loads(body)["error"]
        assert "ready: slow at" in server.text()
    finally:
        assert server.stop() == 0


def test_sigterm_drains_and_exits_0(tmp_path):
    onnx.save(busy(200), tmp_path / "slow.onnx")  # runs of half a second or so
    server = Process(str(tmp_path / "slow.onnx"), "--max-batch-size", "1")
    wait_ready(server.url)
    answers: list[int] = []

    def one() -> None:
        answers.append(raw(server.port, post("/v2/models/slow/infer", request_body()), timeout=60)[0])

    # A keep-alive connection, idle when the signal comes: closed, or a 503, never a hang.
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    idle.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_answer(idle)[0] == 200
    open_requests = [threading.Thread(target=one) for _ in range(3)]
    for t in open_requests:
        t.start()
    time.sleep(0.3)  # they are running
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    try:
        idle.sendall(post("/v2/models/slow/infer", request_body()))
        late = read_answer(idle)[0]
    except OSError:
        late = 0
    assert late in (0, 503)
    for t in open_requests:
        t.join(60)
    assert answers == [200, 200, 200], "a request open at the signal was not answered"
    assert server.proc.wait(60) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    assert "Traceback" not in server.text()


def test_a_warm_up_that_fails_exits_1(tmp_path):
    # Reshape to pairs: a row of one value (the warm-up's dynamic axes are 1) cannot be split.
    onnx.save(pairs(), tmp_path / "pairs.onnx")
    server = Process(str(tmp_path / "pairs.onnx"))
    code = server.proc.wait(60)
    assert code == 1
    assert "model 'pairs' failed its warm-up run" in server.text()


def test_the_commands_own_errors(tmp_path):
    import subprocess
    import sys

    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fastseq", "serve", *args], capture_output=True, text=True, timeout=120
        )

    r = serve(str(tmp_path / "missing.onnx"), "--port", "0")
    assert r.returncode == 1 and r.stderr.count("fastseq: error:") == 1 and "Traceback" not in r.stderr
    onnx.save(cnn(), tmp_path / "cnn.onnx")
    r = serve(str(tmp_path / "cnn.onnx"), "--max-batch-size", "0")
    assert r.returncode == 1 and "--max-batch-size must be at least 1" in r.stderr
    r = serve(str(tmp_path / "cnn.onnx"), "--max-request-bytes", "lots")
    assert r.returncode == 2 and "expected bytes" in r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        used = taken.getsockname()[1]
        r = serve(str(tmp_path / "cnn.onnx"), "--port", str(used))
        assert r.returncode == 1 and f"cannot listen: HTTP on 127.0.0.1:{used}:" in r.stderr, r.stderr
        r = serve(str(tmp_path / "cnn.onnx"), "--port", "0", "--grpc-port", str(used))
        assert r.returncode == 1 and f"cannot listen: gRPC on 127.0.0.1:{used}:" in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr  # one line, fastseq's
    r = serve(str(tmp_path / "cnn.onnx"), "--name", "a/b", "--port", "0")
    assert r.returncode == 1 and "letters, digits" in r.stderr


def test_nothing_leaks_over_a_long_run(tmp_path):
    """Threads, open files and memory of the server before and after thousands of requests
    from many connections (and some refused), read from its own /metrics."""
    onnx.save(cnn(), tmp_path / "cnn.onnx")
    server = Process(str(tmp_path / "cnn.onnx"))
    try:
        wait_ready(server.url)
        x = np.ones((1, 3, 20, 20), np.float32)

        def load(count: int, threads: int = 8) -> None:
            def caller() -> None:
                c = http.InferenceServerClient(f"127.0.0.1:{server.port}")
                i = http.InferInput("image", [1, 3, 20, 20], "FP32")
                i.set_data_from_numpy(x)
                for k in range(count // threads):
                    c.infer("cnn", [i])
                    if k % 50 == 0:  # a bad request now and then, and a connection of its own
                        raw(server.port, post("/v2/models/cnn/infer", b"{nope"))
                c.close()

            ts = [threading.Thread(target=caller) for _ in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(300)

        load(1000)
        before = metrics(server.url)
        load(6000)
        after = metrics(server.url)
        assert after["fastseq_threads"] == before["fastseq_threads"]
        assert after["process_open_fds"] <= before["process_open_fds"] + 2
        grown = (after["process_resident_memory_bytes"] - before["process_resident_memory_bytes"]) / 2**20
        assert grown < 16, f"RSS grew {grown:.1f} MB over 6,000 requests"
    finally:
        assert server.stop() == 0
    assert os.path.exists(tmp_path / "cnn.onnx")


def test_sigterm_answers_open_grpc_requests_too(tmp_path):
    tg = pytest.importorskip("tritonclient.grpc")
    onnx.save(busy(200), tmp_path / "slow.onnx")
    server = Process(str(tmp_path / "slow.onnx"), "--grpc-port", "0")
    wait_ready(server.url)
    answers: list = []

    def one() -> None:
        c = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        x = tg.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.ones((1, 1), np.float32))
        answers.append(c.infer("slow", [x]).as_numpy("y").shape)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert answers == [(1, 1), (1, 1)]
    assert server.proc.wait(60) == 0
