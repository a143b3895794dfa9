"""Limits before work: request headers bounded in size and count (431) and in time (408, with
the protocol's JSON error body); an 80 MB header costs the server little and does not hold up
another client's health check; a queue place is taken only once a request is complete, and
uploads in progress are bounded apart (``max_uploads``); health, metadata, config and
statistics are answered over HTTP and gRPC however full the queue and the uploads are."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from netserving import Process, busy, cnn, cnn_request, get, metrics, pipe, post, raw, read_answer, running, wait_ready

INFER = "/v2/models/cnn/infer"


def slow_request() -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
    return post("/v2/models/slow/infer", body)


@pytest.fixture(scope="module")
def server():
    with running({"cnn": pipe(cnn())}, header_timeout_s=0.5) as s:
        yield s


def test_headers_too_large_or_too_many_are_a_431(server):
    big = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 << 10) + b"\r\n\r\n"
    many = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % k for k in range(100)) + b"\r\n"
    for request in (big, many):
        status, headers, body = raw(server.port, request)
        assert status == 431 and headers["content-type"] == "application/json", (status, headers, body)
        assert json.loads(body) == {"error": "the request's headers are over the limit of 16384 bytes or 64 headers"}
    # and just under both limits, answered
    fine = (
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % k for k in range(50))
        + b"X-Big: "
        + b"a" * (8 << 10)
        + b"\r\n\r\n"
    )
    assert raw(server.port, fine)[0] == 200


def test_headers_that_do_not_arrive_in_time_are_a_408_with_the_protocols_error(server):
    for start in (b"", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n", b"POST /v2/models/cnn/in"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            began = time.monotonic()
            s.sendall(start)
            status, headers, body = read_answer(s)
            assert status == 408, (start, status, body)
            assert time.monotonic() - began < 5
            assert headers["content-type"] == "application/json"
            assert json.loads(body) == {"error": "the request's headers did not arrive within 0.5 s"}
    assert get(server.url + "/v2/health/ready")[0] == 200


def test_an_80_mb_header_costs_little_and_holds_up_no_one(tmp_path):
    """The header is cut off at the limit (431, the connection closed): the server does not
    read 80 MB, spends well under a second of CPU on it, and another client's health checks
    meanwhile are answered as quickly as ever (a generous bound: 2 s each)."""
    import onnx

    path = tmp_path / "cnn.onnx"
    onnx.save(cnn(), path)
    p = Process(str(path), "--name", "cnn")
    try:
        wait_ready(p.url)

        def cpu() -> float:
            with open(f"/proc/{p.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in ticks of 10 ms

        before = cpu()
        outcome: dict = {}

        def hostile() -> None:
            sent = 0
            began = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
                    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
                    chunk = b"a" * (1 << 20)
                    while sent < 80 << 20:
                        s.sendall(chunk)
                        sent += len(chunk)
                    s.sendall(b"\r\n\r\n")
                    outcome["status"] = read_answer(s)[0]
            except OSError as e:
                outcome["error"] = type(e).__name__
            outcome["sent"], outcome["took"] = sent, time.monotonic() - began

        t = threading.Thread(target=hostile)
        t.start()
        waits = []
        for _ in range(20):
            began = time.monotonic()
            assert get(p.url + "/v2/health/live")[0] == 200
            waits.append(time.monotonic() - began)
            time.sleep(0.02)
        t.join(60)
        assert not t.is_alive()
        assert max(waits) < 2.0, waits
        # refused: a 431 read back, or the connection closed on a sender that went on
        assert outcome.get("status") in (None, 431), outcome
        assert outcome["sent"] < 80 << 20 or outcome.get("status") == 431, outcome
        assert cpu() - before < 1.0
    finally:
        p.stop()


def test_pending_uploads_take_no_queue_place_and_are_bounded_apart():
    """8 uploads left pending after 10 bytes under max_queue 8 and max_uploads 8: a ninth is a
    503 naming max_uploads; complete requests from everyone else are answered (200), 16 of
    them, 8 at once; and the pending ones end with their body timeout (408)."""
    with running({"cnn": pipe(cnn())}, max_queue=8, max_uploads=8, body_timeout_s=4) as server:
        pending = []
        try:
            for _ in range(8):
                s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                s.sendall(post(INFER, b'{"inputs": ', length=1000))
                pending.append(s)
            time.sleep(0.3)  # each has stopped arriving: each holds an upload place
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                s.sendall(post(INFER, b'{"inputs": ', length=1000))
                status, _, body = read_answer(s)
                assert status == 503 and "max_uploads" in json.loads(body)["error"], body
            for _ in range(2):
                statuses: list[int] = []

                def call(into: list[int] = statuses) -> None:
                    into.append(raw(server.port, cnn_request())[0])

                threads = [threading.Thread(target=call) for _ in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                assert statuses == [200] * 8, statuses
            for s in pending:
                assert read_answer(s)[0] == 408
        finally:
            for s in pending:
                s.close()


def test_health_metadata_config_and_stats_are_answered_however_full_the_server():
    """The queue full (slow gRPC calls) and every upload place taken (gRPC calls and HTTP
    bodies left pending), over one gRPC connection that holds as many streams as both (the
    streams hyper allowed a connection before):
    ServerLive, ServerReady, ModelMetadata, ModelConfig and ModelStatistics on that very
    connection and on another, and HTTP's health, metadata, config, stats and metrics, are
    all answered, while another infer call is turned away (503, UNAVAILABLE)."""
    tg = pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc import service_pb2

    from serving.h2wire import Connection

    with running(
        {"slow": pipe(busy(80)), "cnn": pipe(cnn())},
        grpc_port=0,
        max_queue=2,
        max_uploads=4,
        max_batch_size=1,
        body_timeout_s=20,
    ) as server:
        held = Connection(server.grpc_port)
        pending_http = []
        try:
            infer = service_pb2.ModelInferRequest(model_name="slow")
            infer.inputs.add(name="x", datatype="FP32", shape=[1, 1])
            infer.raw_input_contents.append(np.ones((1, 1), np.float32).tobytes())
            whole = infer.SerializeToString()
            # two slow calls fill the queue (max_queue 2), on the connection the others use
            slow = [held.start("ModelInfer", whole) for _ in range(2)]
            # gRPC calls whose message never ends: each takes an upload place (4), the rest are turned away
            for _ in range(6):
                held.start("ModelInfer", whole[:5], frame=False, end=False)
            for _ in range(2):
                s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                s.sendall(post("/v2/models/cnn/infer", b'{"inputs": ', length=1000))
                pending_http.append(s)
            end = time.monotonic() + 30
            pending = 'nv_inference_pending_request_count{model="slow",version="1"}'
            while metrics(server.url)[pending] < 2 and time.monotonic() < end:
                time.sleep(0.05)
            # the queue and the uploads are full: another infer is turned away...
            status, _, body = raw(server.port, cnn_request())
            assert status == 503 and b"max_queue" in body, body
            other = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            # ...but everything else is answered, on the busy connection and on another
            for method, message in [
                ("ServerLive", b""),
                ("ServerReady", b""),
                ("ModelMetadata", service_pb2.ModelMetadataRequest(name="slow").SerializeToString()),
                ("ModelConfig", service_pb2.ModelConfigRequest(name="slow").SerializeToString()),
                ("ModelStatistics", service_pb2.ModelStatisticsRequest(name="slow").SerializeToString()),
            ]:
                answer = held.call(method, message)
                assert answer.status == 0, (method, answer.headers)
            assert other.is_server_live() and other.is_server_ready()
            assert other.get_model_metadata("slow").name == "slow"
            assert other.get_model_config("slow").config.name == "slow"
            assert other.get_inference_statistics("slow").model_stats[0].name == "slow"
            for path in (
                "/v2/health/live",
                "/v2/health/ready",
                "/v2/models/slow",
                "/v2/models/slow/config",
                "/v2/models/slow/stats",
                "/v2/models/stats",
                "/v2",
                "/metrics",
            ):
                began = time.monotonic()
                assert get(server.url + path)[0] == 200, path
                assert time.monotonic() - began < 5
            assert [held.wait(sid, 120).status for sid in slow] == [0, 0]
        finally:
            held.close()
            for s in pending_http:
                s.close()
