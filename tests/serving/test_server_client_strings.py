"""What clients send, as the server shows it: truncated in error bodies (a 24 MB datatype is an
error of a few hundred bytes, answered at once), escaped in log lines (one line per error
whatever was sent: ``%0A`` in a path, ``\\n`` in a name), a near miss searched only for short
names; and every client mistake a 4xx (HTTP) or INVALID_ARGUMENT / NOT_FOUND / ... (gRPC) with
the protocol's error body, never a 500, UNKNOWN or INTERNAL: a seeded fuzz of both transports
sending random Unicode, lone surrogates, huge and non-finite numbers and bytes that are not
UTF-8 into every field."""

from __future__ import annotations

import json
import logging
import random
import socket
import struct
import time
import urllib.parse

import pytest

from conftest import varint
from netserving import cnn, every_type, metrics, pipe, post, raw, read_answer, running, several

pytest.importorskip("tritonclient.grpc")
from serving.h2wire import Connection

INFER = "/v2/models/cnn/infer"
GRPC_FAILURES = {2: "UNKNOWN", 13: "INTERNAL", 15: "DATA_LOSS"}


@pytest.fixture(scope="module")
def server():
    with running({"cnn": pipe(cnn()), "types": pipe(every_type()), "several": pipe(several())}, grpc_port=0) as s:
        yield s


def cnn_json(**item) -> dict:
    base = {"name": "image", "shape": [1, 3, 20, 20], "datatype": "FP32", "data": [0.0] * 1200}
    return {"inputs": [{**base, **item}]}


# --- a protobuf encoder of our own: any bytes in any field, UTF-8 or not ------------------------------
def field(tag: int, value) -> bytes:
    if isinstance(value, int):
        return varint(tag << 3) + varint(value)
    if isinstance(value, float):
        return varint(tag << 3 | 1) + struct.pack("<d", value)
    return varint(tag << 3 | 2) + varint(len(value)) + value


def parameter(key: bytes, choice: tuple[int, object]) -> bytes:
    tag, v = choice
    return field(1, key) + field(2, field(tag, v if not isinstance(v, str) else v.encode()))


def grpc_infer(
    name: bytes = b"cnn",
    *,
    inputs: list[bytes] | None = None,
    raw: list[bytes] | None = None,
    outputs: list[bytes] = (),
    parameters: list[bytes] = (),
    id: bytes = b"",
    version: bytes = b"",
) -> bytes:
    if inputs is None:
        inputs = [field(1, b"image") + field(2, b"FP32") + field(3, b"".join(varint(d) for d in (1, 3, 20, 20)))]
        raw = [bytes(4800)] if raw is None else raw
    out = field(1, name) + (field(2, version) if version else b"") + (field(3, id) if id else b"")
    out += b"".join(field(4, p) for p in parameters)
    out += b"".join(field(5, i) for i in inputs) + b"".join(field(6, o) for o in outputs)
    return out + b"".join(field(7, r) for r in (raw or []))


# --- truncated, escaped, near misses --------------------------------------------------------------
def test_a_24_mb_datatype_is_a_short_error_at_once(server):
    huge = "F" * (24 << 20)
    body = json.dumps(cnn_json(datatype=huge)).encode()
    began = time.monotonic()
    status, _, answer = raw(server.port, post(INFER, body), timeout=60)
    assert status == 400 and len(answer) < 300, (status, len(answer), answer[:300])
    assert "is not a KServe datatype" in json.loads(answer)["error"]
    assert time.monotonic() - began < 10
    # the same over gRPC
    c = Connection(server.grpc_port)
    began = time.monotonic()
    got = c.call(
        "ModelInfer",
        grpc_infer(
            inputs=[field(1, b"image") + field(2, huge.encode()) + field(3, b"\x01\x03\x14\x14")], raw=[bytes(4800)]
        ),
    )
    assert got.status == 3 and len(got.headers["grpc-message"]) < 300, got.headers.get("grpc-message", "")[:300]
    assert time.monotonic() - began < 10
    c.close()


def test_long_names_are_not_searched_for_near_misses(server):
    c = Connection(server.grpc_port)
    for size in (1 << 20, 8 << 20):
        began = time.monotonic()
        got = c.call("ModelInfer", grpc_infer(b"c" * size))
        assert got.status == 5 and "did you mean" not in got.message and len(got.message) < 300
        assert time.monotonic() - began < 5
        body = json.dumps(cnn_json(name="i" * size)).encode()
        began = time.monotonic()
        status, _, answer = raw(server.port, post(INFER, body), timeout=60)
        assert status == 400 and b"did you mean" not in answer and len(answer) < 300
        assert time.monotonic() - began < 5
    got = c.call("ModelMetadata", field(1, b"c" * 60_000))
    assert got.status == 5 and "did you mean" not in got.message and len(got.message) < 300
    # a short one is
    assert "did you mean 'cnn'" in c.call("ModelMetadata", field(1, b"cnm")).message
    c.close()


def error_lines(caplog, count: int, timeout: float = 10.0) -> list[logging.LogRecord]:
    """The server's log records (they come from a thread of the core's): at least ``count``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        records = [r for r in caplog.records if r.name == "fastseq.serve"]
        if len(records) >= count:
            return records
        time.sleep(0.05)
    return [r for r in caplog.records if r.name == "fastseq.serve"]


def test_log_lines_are_one_line_whatever_the_client_sent(server, caplog):
    caplog.set_level(logging.WARNING, logger="fastseq.serve")
    fake = "\n2026-01-01 ERROR fastseq.serve: forged"
    sent = [
        raw(server.port, b"GET /v2/models/a%0A2026-01-01%20ERROR%20forged/ready HTTP/1.1\r\nHost: x\r\n\r\n")[0],
        raw(server.port, b"GET /v2/models/a%0D%0Ab%E2%80%A8c/ready HTTP/1.1\r\nHost: x\r\n\r\n")[0],
        raw(server.port, post(INFER, json.dumps(cnn_json(name="x" + fake)).encode()))[0],
        raw(server.port, post(INFER, json.dumps(cnn_json(datatype="FP32" + fake)).encode()))[0],
        raw(server.port, post(INFER, json.dumps({**cnn_json(), "id": 5, "parameters": {"t\nx": 1}}).encode()))[0],
    ]
    assert sent == [404, 404, 400, 400, 400], sent
    c = Connection(server.grpc_port)
    assert c.call("ModelInfer", grpc_infer(b"cnn" + fake.encode())).status == 5
    assert c.call("ModelInfer", grpc_infer(id=fake.encode(), inputs=[field(1, fake.encode())])).status == 3
    c.close()
    records = error_lines(caplog, 7)
    assert len(records) >= 7, [r.getMessage() for r in records]
    for r in records:
        line = r.getMessage()
        assert "\n" not in line and "\r" not in line and "\u2028" not in line, repr(line)
    assert any("a\\n2026-01-01 ERROR forged" in r.getMessage() for r in records), [r.getMessage() for r in records]


def test_a_model_name_that_is_not_utf8_is_a_4xx(server):
    c = Connection(server.grpc_port)
    for name in (b"\xff\xfe", b"cnn\x80", b"\xed\xa0\x80"):  # the last: a surrogate, as UTF-8 would spell it
        for method, message in [
            ("ModelInfer", grpc_infer(name)),
            ("ModelMetadata", field(1, name)),
            ("ModelReady", field(1, name)),
            ("ModelConfig", field(1, name)),
            ("ModelStatistics", field(1, name)),
        ]:
            got = c.call(method, message)
            assert got.status in (3, 5), (method, name, got.headers)
    c.close()
    status, _, body = raw(server.port, b"GET /v2/models/%FF%FE/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404 and "error" in json.loads(body)


# --- the fuzz -------------------------------------------------------------------------------------
class Hostile:
    """A seeded source of what a careless or hostile client puts in a field."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def text(self) -> str:
        r = self.r
        kind = r.randrange(8)
        if kind == 0:
            return "".join(chr(r.randrange(0x20, 0x7F)) for _ in range(r.randrange(0, 20)))
        if kind == 1:  # any code point, surrogates included
            return "".join(chr(r.randrange(0, 0x110000)) for _ in range(r.randrange(1, 12)))
        if kind == 2:
            return r.choice(["\ud800", "a\udfffb", "\udbff\udc00", "\x00", "\n", "\u2028", "\ufeff", "%0A"])
        if kind == 3:
            return r.choice(["image", "logits", "FP32", "BYTES", "cnn", "x", "k", "total"]) + r.choice(
                ["", " ", "\n", "\x00", "é"]
            )
        if kind == 4:
            return "é" * r.randrange(1, 5000)
        if kind == 5:
            return r.choice(["FP32", "fp32", "BF16", "FP8", "TYPE_FP32", "", "INT64", "BYTES", "BOOL", "UINT8"])
        if kind == 6:
            return "x" * r.choice([64, 65, 128, 129, 10_000])
        return str(r.random())

    def number(self) -> str:
        """A JSON number's text, or a token some parsers take for one."""
        return self.r.choice(
            [
                "0",
                "-0",
                "1",
                "-1",
                "1e400",
                "-1e400",
                "1e-400",
                "10" + "0" * 400,
                "NaN",
                "Infinity",
                "-Infinity",
                "2e308",
                "9223372036854775808",
                "18446744073709551616",
                "-9223372036854775809",
                "3.4e38",
                "3.5e38",
                "1.5",
                "0.1e1",
                "00",
                "1e",
                "--1",
                "0x10",
                "1_000",
                "65535",
                "65536",
                "4294967296",
                "255",
                "256",
                "-129",
                str(self.r.randrange(-(10**6), 10**6)),
            ]
        )

    def json_value(self, depth: int = 0) -> str:
        r = self.r
        kind = r.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return self.number()
        if kind == 1:
            return json.dumps(self.text(), ensure_ascii=r.random() < 0.5)
        if kind == 2:
            return r.choice(["null", "true", "false", '"\\ud800"', '"\\udc00x"', '"\\u0000"', '"\\x"'])
        if kind == 3:
            return json.dumps([1, 3, 20, 20])
        if kind == 4:
            return "[" + ",".join(self.json_value(depth + 1) for _ in range(r.randrange(0, 5))) + "]"
        if kind == 5:
            return (
                "{"
                + ",".join(f"{json.dumps(self.text())}:{self.json_value(depth + 1)}" for _ in range(r.randrange(0, 3)))
                + "}"
            )
        return "[" * r.randrange(1, 300)

    def raw_bytes(self) -> bytes:
        return bytes(self.r.randrange(256) for _ in range(self.r.randrange(1, 16)))


def http_case(h: Hostile) -> bytes:
    """A request whose fields are each left as a good request has them or replaced."""
    r = h.r
    model = "cnn"
    item = {
        "name": '"image"',
        "shape": "[1,3,20,20]",
        "datatype": '"FP32"',
        "data": "[" + ",".join(["0.5"] * 1200) + "]",
    }
    doc = {"inputs": None}
    for key in list(item):
        if r.random() < 0.3:
            item[key] = h.json_value()
    if r.random() < 0.2:
        item["parameters"] = (
            "{"
            + ",".join(
                f"{json.dumps(r.choice(['binary_data_size', 'shared_memory_region', h.text()]))}:{h.json_value()}"
                for _ in range(r.randrange(1, 3))
            )
            + "}"
        )
    if r.random() < 0.3:
        doc["id"] = h.json_value()
    if r.random() < 0.3:
        keys = ["timeout", "binary_data_output", "sequence_id", "priority", h.text()]
        doc["parameters"] = (
            "{" + ",".join(f"{json.dumps(r.choice(keys))}:{h.json_value()}" for _ in range(r.randrange(1, 3))) + "}"
        )
    if r.random() < 0.3:
        name = r.choice(['"logits"', h.json_value()])
        params = r.choice(
            ["", ',"parameters":' + h.json_value(), ',"parameters":{"binary_data":' + h.json_value() + "}"]
        )
        doc["outputs"] = f'[{{"name":{name}{params}}}]' if r.random() < 0.8 else h.json_value()
    items = "{" + ",".join(f'"{k}":{v}' for k, v in item.items()) + "}"
    doc["inputs"] = f"[{items}]" if r.random() < 0.9 else h.json_value()
    body = ("{" + ",".join(f'"{k}":{v}' for k, v in doc.items()) + "}").encode("utf-8", "surrogatepass")
    if r.random() < 0.1:  # bytes that are not UTF-8 somewhere in the body
        at = r.randrange(len(body))
        body = body[:at] + h.raw_bytes() + body[at:]
    headers = {}
    if r.random() < 0.15:
        headers["Inference-Header-Content-Length"] = r.choice(
            [
                str(len(body)),
                str(len(body) + 1),
                "0",
                "-1",
                "1e3",
                "99999999999999999999",
                h.text().encode("utf-8", "replace").decode("latin-1")[:40],
            ]
        )
    if r.random() < 0.1:
        headers["Content-Type"] = h.text().encode("utf-8", "replace").decode("latin-1")[:60]
    if r.random() < 0.15:  # the model's name in the path, percent-encoded
        model = urllib.parse.quote(
            h.text().encode("utf-8", "surrogatepass") if r.random() < 0.5 else h.raw_bytes(), safe=""
        )
    path = f"/v2/models/{model}/infer"
    if r.random() < 0.1:
        version = urllib.parse.quote(h.text().encode("utf-8", "surrogatepass"), safe="")
        path = f"/v2/models/{model}/versions/{version}/infer"
    clean = {k: v.replace("\r", " ").replace("\n", " ") for k, v in headers.items()}
    return post(path, body, clean)


def grpc_case(h: Hostile) -> tuple[str, bytes]:
    r = h.r

    def b() -> bytes:
        t = h.text()
        return h.raw_bytes() if r.random() < 0.25 else t.encode("utf-8", "surrogatepass")

    method = r.choices(
        ["ModelInfer", "ModelMetadata", "ModelReady", "ModelConfig", "ModelStatistics"], [6, 1, 1, 1, 1]
    )[0]
    if method != "ModelInfer":
        return method, field(1, b() if r.random() < 0.7 else b"cnn") + (field(2, b()) if r.random() < 0.3 else b"")

    def param() -> bytes:
        choice = r.choice(
            [
                (1, r.randrange(2)),
                (2, r.randrange(-(2**63), 2**63)),
                (3, h.text()),
                (4, r.choice([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 1.5, 1e-300])),
                (5, r.randrange(2**64)),
            ]
        )
        if choice[0] == 3:
            choice = (3, b())
        return parameter(
            r.choice(
                [b"timeout", b"binary_data_output", b"sequence_id", b"shared_memory_region", b"classification", b()]
            ),
            choice,
        )

    name, datatype = b"image", b"FP32"
    shape = [1, 3, 20, 20]
    if r.random() < 0.3:
        name = b()
    if r.random() < 0.3:
        datatype = r.choice([b(), b"FP64", b"BYTES", b"INT8", b"FP16"])
    if r.random() < 0.3:
        shape = [r.choice([0, 1, 3, 20, -1, -(2**63), 2**63 - 1, 2**40]) for _ in range(r.randrange(0, 6))]
    tensor = field(1, name) + field(2, datatype) + field(3, b"".join(varint(d) for d in shape))
    if r.random() < 0.2:
        tensor += field(4, param())
    raw_contents = [bytes(4800)]
    if r.random() < 0.3:
        contents = r.choice(
            [
                field(6, struct.pack("<1200f", *([0.5] * 1200))),
                field(7, struct.pack("<2d", float("nan"), 1e308)),
                field(8, b()) + field(8, b""),
                field(3, b"".join(varint(v) for v in (0, 2**63, 1))),
                field(1, b"\x01\x00\x02"),
            ]
        )
        tensor += field(5, contents)
        if r.random() < 0.6:
            raw_contents = []
    if r.random() < 0.2:
        raw_contents = r.choice([[], [b""], [bytes(4799)], [bytes(4800)] * 2, [b()]])
    outputs = []
    if r.random() < 0.3:
        outputs = [field(1, r.choice([b"logits", b()])) + (field(2, param()) if r.random() < 0.3 else b"")]
    parameters = [param() for _ in range(r.randrange(0, 3))] if r.random() < 0.3 else []
    message = grpc_infer(
        b() if r.random() < 0.15 else b"cnn",
        inputs=[tensor],
        raw=raw_contents,
        outputs=outputs,
        parameters=parameters,
        id=b() if r.random() < 0.3 else b"",
        version=b() if r.random() < 0.1 else b"",
    )
    if r.random() < 0.05:  # a message cut short
        message = message[: r.randrange(len(message))]
    return method, message


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzed_http_requests_are_4xx_with_the_protocols_error(server, seed):
    h = Hostile(seed)
    before = metrics(server.url)
    seen: dict[int, int] = {}
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        for k in range(200):
            request = http_case(h)
            try:
                s.sendall(request)
                status, headers, body = read_answer(s)
            except OSError:
                status = 0
            if status == 0 or headers.get("connection") == "close":  # a new connection for the next one
                s.close()
                s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            if status == 0:  # the connection closed before an answer: try it alone once more
                status, headers, body = raw(server.port, request)
            seen[status] = seen.get(status, 0) + 1
            assert 200 <= status < 500, (k, status, request[:600], body[:600])
            if status >= 400:
                try:
                    error = json.loads(body)["error"]
                except ValueError:
                    raise AssertionError(
                        ("not the protocol's error body", k, status, headers, body[:300], request[:600])
                    ) from None
                assert isinstance(error, str) and len(body) < 2000, (k, body[:600])
    after = metrics(server.url)
    backend = 'nv_inference_request_failure{model="cnn",version="1",reason="BACKEND"}'
    assert after.get(backend, 0) == before.get(backend, 0)
    assert len(seen) > 2, seen  # the fuzz reached more than one answer


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzed_grpc_calls_are_client_errors_never_unknown_or_internal(server, seed):
    h = Hostile(1000 + seed)
    c = Connection(server.grpc_port)
    seen: dict[int, int] = {}
    try:
        for k in range(200):
            method, message = grpc_case(h)
            timeout = (
                [("grpc-timeout", h.r.choice(["1S", "0n", "99999999H", "1x", "-1S", "", "1", "é"]))]
                if h.r.random() < 0.1
                else []
            )
            try:
                got = c.call(method, message, headers=timeout)
            except Exception:  # noqa: BLE001 - the connection went: a new one, and the call once more
                c.close()
                c = Connection(server.grpc_port)
                got = c.call(method, message)
            seen[got.status] = seen.get(got.status, 0) + 1
            assert got.status is not None and got.status not in GRPC_FAILURES, (k, method, message[:300], got.headers)
            if got.status:
                assert got.message and len(got.headers["grpc-message"]) < 2000
    finally:
        c.close()
    assert len(seen) > 2, seen
