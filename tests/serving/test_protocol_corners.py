"""Corners of the protocol: gRPC typed ``contents`` beside ``raw_input_contents`` refused by
name; empty (0-row) outputs in binary, JSON and gRPC; answers always valid JSON (NaN and
infinities: a 400 naming the output and how to ask for it as binary data, where it goes back
exactly); a connection upgrade (WebSocket, ``h2c``) refused with a 4xx, logged and counted."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from netserving import _model, cnn, metrics, pipe, post, raw, running

tg = pytest.importorskip("tritonclient.grpc")
th = pytest.importorskip("tritonclient.http")
from tritonclient.grpc import service_pb2  # noqa: E402

from serving.h2wire import Connection  # noqa: E402


def divide():
    """x [N, 3] -> y = x / 0 (inf, -inf, NaN) and z = x (finite)."""
    zero = numpy_helper.from_array(np.zeros(1, np.float32), "zero")
    return pipe(
        _model(
            [helper.make_node("Div", ["x", "zero"], ["y"]), helper.make_node("Identity", ["x"], ["z"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
            [
                helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
                helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3]),
            ],
            [zero],
        )
    )


@pytest.fixture(scope="module")
def server():
    with running({"cnn": pipe(cnn()), "divide": divide()}, grpc_port=0) as s:
        yield s


def strict(body: bytes):
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are not JSON."""

    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    return json.loads(body, parse_constant=refuse)


def test_contents_beside_raw_contents_are_refused_by_name(server):
    c = Connection(server.grpc_port)
    m = service_pb2.ModelInferRequest(model_name="cnn")
    t = m.inputs.add(name="image", datatype="FP32", shape=[1, 3, 20, 20])
    t.contents.fp32_contents.extend([0.5] * 1200)
    m.raw_input_contents.append(np.zeros((1, 3, 20, 20), np.float32).tobytes())
    got = c.call("ModelInfer", m.SerializeToString())
    assert got.status == 3 and got.message == "input 'image' has both contents and raw_input_contents: give one"
    # either alone is answered, alike
    del m.raw_input_contents[:]
    typed = c.call("ModelInfer", m.SerializeToString())
    assert typed.status == 0
    t.ClearField("contents")
    m.raw_input_contents.append(np.full((1, 3, 20, 20), 0.5, np.float32).tobytes())
    rawly = c.call("ModelInfer", m.SerializeToString())
    assert rawly.status == 0 and rawly.payload() == typed.payload()
    c.close()


def test_zero_row_answers_in_binary_json_and_grpc(server):
    x = np.zeros((0, 3, 20, 20), np.float32)
    h = th.InferenceServerClient(f"127.0.0.1:{server.port}")
    for binary_in in (True, False):
        for binary_out in (True, False):
            i = th.InferInput("image", [0, 3, 20, 20], "FP32")
            i.set_data_from_numpy(x, binary_data=binary_in)
            out = h.infer("cnn", [i], outputs=[th.InferRequestedOutput("logits", binary_data=binary_out)])
            assert out.as_numpy("logits").shape == (0, 10), (binary_in, binary_out)
    # the binary answer by hand: a size of 0, nothing after the header
    head = json.dumps(
        {
            "inputs": [
                {"name": "image", "shape": [0, 3, 20, 20], "datatype": "FP32", "parameters": {"binary_data_size": 0}}
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    status, headers, body = raw(
        server.port, post("/v2/models/cnn/infer", head, {"Inference-Header-Content-Length": str(len(head))})
    )
    assert status == 200
    n = int(headers["inference-header-content-length"])
    assert len(body) == n
    assert strict(body)["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": [0, 10], "parameters": {"binary_data_size": 0}}
    ]
    g = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    i = tg.InferInput("image", [0, 3, 20, 20], "FP32")
    i.set_data_from_numpy(x)
    assert g.infer("cnn", [i]).as_numpy("logits").shape == (0, 10)


def test_non_finite_outputs_never_make_invalid_json(server):
    x = np.array([[1, -1, 0], [2, 3, 4]], np.float32)
    expected = x / np.float32(0)
    h = th.InferenceServerClient(f"127.0.0.1:{server.port}")
    i = th.InferInput("x", [2, 3], "FP32")
    i.set_data_from_numpy(x, binary_data=False)
    # asked for as JSON: a 400 naming the output and the way to ask for it
    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": x.ravel().tolist()}]})
    for outputs in (None, [{"name": "y"}], [{"name": "y", "parameters": {"binary_data": False}}]):
        doc = json.loads(body)
        if outputs is not None:
            doc["outputs"] = outputs
        status, _, answer = raw(server.port, post("/v2/models/divide/infer", json.dumps(doc).encode()))
        assert status == 400, answer
        error = strict(answer)["error"]
        assert "output 'y' holds NaN or infinite values" in error and '"binary_data": true' in error
    # the finite output alone is answered as JSON, strictly valid
    doc = json.loads(body)
    doc["outputs"] = [{"name": "z"}]
    status, _, answer = raw(server.port, post("/v2/models/divide/infer", json.dumps(doc).encode()))
    assert status == 200 and strict(answer)["outputs"][0]["data"] == x.ravel().tolist()
    # as binary data: exactly, NaN and the infinities included (the header still strict JSON)
    out = h.infer(
        "divide",
        [i],
        outputs=[th.InferRequestedOutput("y", binary_data=True), th.InferRequestedOutput("z", binary_data=False)],
    )
    np.testing.assert_array_equal(out.as_numpy("y"), expected)
    np.testing.assert_array_equal(out.as_numpy("z"), x)
    doc["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
    status, headers, answer = raw(server.port, post("/v2/models/divide/infer", json.dumps(doc).encode()))
    assert status == 200
    strict(answer[: int(headers["inference-header-content-length"])])
    # and over gRPC, raw, as they are
    g = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    gi = tg.InferInput("x", [2, 3], "FP32")
    gi.set_data_from_numpy(x)
    np.testing.assert_array_equal(g.infer("divide", [gi]).as_numpy("y"), expected)


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Content-Length: 2\r\n\r\n{}",
    ],
    ids=["websocket", "h2c", "websocket-post"],
)
def test_upgrades_are_refused_logged_and_counted(server, caplog, request_head):
    caplog.set_level(logging.WARNING, logger="fastseq.serve")
    before = metrics(server.url).get("fastseq_upgrades_refused", 0)
    status, headers, body = raw(server.port, request_head)
    assert status == 400 and headers.get("connection") == "close"
    assert "upgrading the connection" in strict(body)["error"]
    assert metrics(server.url)["fastseq_upgrades_refused"] == before + 1
    end = time.monotonic() + 10
    while time.monotonic() < end and not any("upgrading the connection" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if "upgrading the connection" in r.getMessage()]
    assert lines and lines[-1].split(":")[0] in ("GET '/v2/health/live'", "GET '/v2'", "POST '/v2/models/cnn/infer'")


def test_http2_spoken_to_the_http_port_is_refused_not_a_500(server):
    """An HTTP/2 client (prior knowledge) on the HTTP/1.1 port: refused, never a 5xx."""
    status, _, body = raw(server.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\4\0\0\0\0\0")
    # hyper closes on the HTTP/2 preface without an answer (where it answers, a 505, it is said
    # as a 400 naming the gRPC port): refused either way, never a 5xx
    assert status == 0 or (status == 400 and "gRPC port" in strict(body)["error"]), (status, body)
    # a request hyper cannot parse at all: closed, or a 400 with the protocol's error, never a 5xx
    status, _, body = raw(server.port, b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    assert status == 0 or (status == 400 and strict(body)["error"] == "the request is not valid HTTP/1.1"), (
        status,
        body,
    )
    assert raw(server.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
