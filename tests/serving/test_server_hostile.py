"""``fastseq serve`` under hostile requests, on raw sockets where no client library would
send them: each is a 4xx (or a closed connection) and the server still answers the next.
Bodies over the limit, slow bodies, lying lengths and shapes, a full queue, 1,000 concurrent
connections, clients that leave mid-request. Every loop is bounded in count and time."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("uvicorn")
http = pytest.importorskip("tritonclient.http")

from netserving import busy, cnn, cnn_request, get, metrics, pipe, post, raw, read_answer, running  # noqa: E402

INFER = "/v2/models/cnn/infer"


@pytest.fixture(scope="module")
def server():
    with running(
        {"cnn": pipe(cnn()), "slow": pipe(busy(30))}, max_request_bytes=1 << 20, body_timeout_s=0.5, max_queue=64
    ) as s:
        yield s


def still_answers(server) -> None:
    """The server answers a good request after whatever came before."""
    x = np.ones((1, 3, 20, 20), np.float32)
    body = json.dumps(
        {"inputs": [{"name": "image", "shape": [1, 3, 20, 20], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    ).encode()
    status, _, answer = raw(server.port, post(INFER, body))
    assert status == 200, answer
    assert len(json.loads(answer)["outputs"][0]["data"]) == 10


def refused(server, data: bytes, status: int) -> dict:
    got, headers, body = raw(server.port, data)
    assert got == status, body
    still_answers(server)
    return json.loads(body) if body else {}


def header_and(parts: list[dict], raw_bytes: bytes) -> tuple[bytes, int]:
    head = json.dumps({"inputs": parts}).encode()
    return head + raw_bytes, len(head)


def test_malformed_json(server):
    assert "not valid JSON" in refused(server, post(INFER, b'{"inputs": [}'), 400)["error"]
    assert "not valid JSON" in refused(server, post(INFER, b"\xff\xfe garbage"), 400)["error"]
    assert "not valid JSON" in refused(server, post(INFER, b"[" * 200_000), 400)["error"]


def test_a_shape_of_a_billion_rows_with_one_value(server):
    body = json.dumps(
        {"inputs": [{"name": "image", "shape": [10**9, 3, 20, 20], "datatype": "FP32", "data": [1.0]}]}
    ).encode()
    assert "1200000000000 values, but its data holds 1 value" in refused(server, post(INFER, body), 400)["error"]
    body, n = header_and(
        [{"name": "image", "shape": [10**9, 3, 20, 20], "datatype": "FP32", "parameters": {"binary_data_size": 4}}],
        b"\0\0\0\0",
    )
    error = refused(server, post(INFER, body, {"Inference-Header-Content-Length": str(n)}), 400)["error"]
    assert "binary_data_size is 4" in error


@pytest.mark.parametrize(
    "shape",
    [
        [-1, 3, 20, 20],
        [2**64, 3, 20, 20],
        [1, 3, 20, "20"],
        [1] * 100,
        "1,3,20,20",
        [0, 2**62],
        [2**62, 0, 2**62],
        [1] * 40,
    ],
)
def test_negative_huge_and_malformed_dims(server, shape):
    body = json.dumps({"inputs": [{"name": "image", "shape": shape, "datatype": "FP32", "data": [0.0]}]}).encode()
    assert "input 'image'" in refused(server, post(INFER, body), 400)["error"]


def test_wrong_datatypes_and_unknown_names(server):
    def one(**item):
        base = {"name": "image", "shape": [1, 3, 20, 20], "datatype": "FP32", "data": [0.0] * 1200}
        return json.dumps({"inputs": [{**base, **item}]}).encode()

    assert "expects float32, got float64" in refused(server, post(INFER, one(datatype="FP64")), 400)["error"]
    assert "is not a KServe datatype" in refused(server, post(INFER, one(datatype="FLOAT")), 400)["error"]
    assert "must be numbers" in refused(server, post(INFER, one(data=["x"] * 1200)), 400)["error"]
    assert "'img' is not an input" in refused(server, post(INFER, one(name="img")), 400)["error"]
    assert "no model 'cnm'" in refused(server, post("/v2/models/cnm/infer", one()), 404)["error"]
    out = json.loads(one())
    out["outputs"] = [{"name": "logitz"}]
    assert "'logitz' is not an output" in refused(server, post(INFER, json.dumps(out).encode()), 400)["error"]
    assert (
        "takes POST, not GET" in refused(server, b"GET /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\n\r\n", 405)["error"]
    )
    assert "no route" in refused(server, b"GET /v3/anything HTTP/1.1\r\nHost: x\r\n\r\n", 404)["error"]


def test_a_binary_header_length_past_the_body(server):
    x = np.zeros((1, 3, 20, 20), np.float32).tobytes()
    body, n = header_and(
        [{"name": "image", "shape": [1, 3, 20, 20], "datatype": "FP32", "parameters": {"binary_data_size": len(x)}}], x
    )
    for bad in (str(len(body) + 1), str(10**17), "-5", "abc", "1" * 40):
        error = refused(server, post(INFER, body, {"Inference-Header-Content-Length": bad}), 400)["error"]
        assert "Inference-Header-Content-Length" in error
    # a binary size past the body's end
    body, n = header_and(
        [
            {
                "name": "image",
                "shape": [1, 3, 20, 20],
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(x) * 2},
            }
        ],
        x,
    )
    assert (
        "past the end of the body"
        in refused(server, post(INFER, body, {"Inference-Header-Content-Length": str(n)}), 400)["error"]
    )


def test_a_body_over_the_limit(server):
    # Refused on its Content-Length, before it is read, and the connection closed.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(post(INFER, b"", length=10**12))
        status, headers, body = read_answer(s)
        assert status == 413 and headers.get("connection") == "close"
        assert "over the limit of 1048576" in json.loads(body)["error"]
    # Chunked, without a length: refused once it grows past the limit.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"x" * 65536
        sent = 0
        try:
            while sent < 4 << 20:  # at most 4 MB: the answer comes after 1 MB
                s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body = read_answer(s)
        assert status == 413
    still_answers(server)


def test_a_slow_body_is_cut_off_by_its_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        start = time.monotonic()
        s.sendall(post(INFER, b'{"inputs": [', length=5000))  # then nothing more
        status, headers, body = read_answer(s)
        assert status == 408 and time.monotonic() - start < 5
        assert "did not arrive within 0.5 s" in json.loads(body)["error"]
    still_answers(server)


def test_clients_that_leave_mid_request(server):
    before = metrics(server.url)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(post(INFER, b'{"inputs": [{"name"', length=2000))
        # and one that leaves while its request runs
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(post("/v2/models/slow/infer", body))
    time.sleep(1.0)
    still_answers(server)
    after = metrics(server.url)
    assert after['nv_inference_pending_request_count{model="cnn",version="1"}'] == 0
    left = 'nv_inference_request_failure{model="cnn",version="1",reason="CANCELED"}'
    assert after[left] - before[left] == 20


def test_a_full_queue_answers_503_and_recovers():
    """More requests open than max_queue: the rest are a 503 at once, not a growing queue."""
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
    with running({"slow": pipe(busy(60))}, max_queue=4, max_batch_size=1) as server:
        statuses: list[int] = []

        def one() -> None:
            statuses.append(raw(server.port, post("/v2/models/slow/infer", body), timeout=60)[0])

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(set(statuses)) == [200, 503] and statuses.count(200) >= 4
        _, headers, answer = raw(server.port, post("/v2/models/slow/infer", body), timeout=60)
        assert json.loads(answer)["outputs"][0]["shape"] == [1, 1]
        refused_count = metrics(server.url)['nv_inference_request_failure{model="slow",version="1",reason="REJECTED"}']
        assert refused_count == statuses.count(503)


def test_a_thousand_concurrent_connections(server):
    """1,000 connections at once, each with a request: every one is answered (200, or 503
    when the queue is full), and the server answers afterwards."""
    request = cnn_request()
    sockets = []
    try:
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sockets.append(s)
        for s in sockets:
            s.sendall(request)
        statuses = [read_answer(s)[0] for s in sockets]
    finally:
        for s in sockets:
            s.close()
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 64, sorted(set(statuses))
    still_answers(server)
    assert get(server.url + "/v2/health/ready")[0] == 200


def test_keep_alive_connections_take_many_requests(server):
    """One connection, 200 requests in a row (what tritonclient does), every answer right."""
    p = pipe(cnn())
    c = http.InferenceServerClient(f"127.0.0.1:{server.port}")
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.standard_normal((1, 3, 20, 20)).astype(np.float32)
        i = http.InferInput("image", [1, 3, 20, 20], "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("cnn", [i]).as_numpy("logits"), p(x)[0], rtol=1e-5, atol=1e-6)
