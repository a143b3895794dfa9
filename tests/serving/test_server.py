"""``fastseq serve`` called by a client nobody here wrote (``tritonclient.http``, Triton's own)
on 127.0.0.1: health, metadata, infer in JSON and binary, every datatype, several inputs and
outputs, requested outputs, many callers batched, errors in the pipeline's own names, the
metrics, a pipeline file of two pipelines, and the app mounted in another application."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

http = pytest.importorskip("tritonclient.http")
pytest.importorskip("uvicorn")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

import fastseq  # noqa: E402
from fastseq.serving.runs import BatchRun  # noqa: E402
from netserving import (  # noqa: E402
    TYPES,
    Process,
    busy,
    cnn,
    every_type,
    get,
    lookup,
    metrics,
    mixing,
    pairs,
    pipe,
    running,
    several,
    wrong_answers,
)


def client(server) -> http.InferenceServerClient:
    return http.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)


def tensor(name: str, a: np.ndarray, binary: bool = True) -> http.InferInput:
    x = http.InferInput(name, list(a.shape), "BYTES" if a.dtype == object else np_to_triton_dtype(a.dtype))
    x.set_data_from_numpy(a, binary_data=binary)
    return x


@pytest.fixture(scope="module")
def cnn_server():
    p = pipe(cnn())
    with running({"cnn": p, "types": pipe(every_type()), "several": pipe(several())}) as server:
        yield server, p


def test_health_and_metadata(cnn_server):
    server, p = cnn_server
    c = client(server)
    assert c.is_server_live() and c.is_server_ready()
    meta = c.get_server_metadata()
    assert meta["name"] == "fastseq" and meta["version"] == fastseq.__version__
    assert "binary_tensor_data" in meta["extensions"]
    assert c.is_model_ready("cnn") and c.is_model_ready("cnn", "1") and not c.is_model_ready("cnn", "2")
    m = c.get_model_metadata("cnn")
    assert m["name"] == "cnn" and m["versions"] == ["1"]
    assert m["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 20, 20]}]
    assert m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert c.get_model_metadata("cnn", "1") == m
    config = c.get_model_config("cnn")
    assert config["max_batch_size"] == 32 and config["input"][0]["dims"] == [3, 20, 20]
    types = c.get_model_metadata("types")
    assert [i["datatype"] for i in types["inputs"]] == list(TYPES)
    with pytest.raises(InferenceServerException, match="no model 'cn' \\(did you mean 'cnn'\\?\\)"):
        c.get_model_metadata("cn")
    with pytest.raises(InferenceServerException, match="has no version '7'"):
        c.get_model_metadata("cnn", "7")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_matches_the_pipeline(cnn_server, binary):
    server, p = cnn_server
    x = np.random.default_rng(1).standard_normal((5, 3, 20, 20)).astype(np.float32)
    out = http.InferRequestedOutput("logits", binary_data=binary)
    result = client(server).infer("cnn", [tensor("image", x, binary)], outputs=[out], request_id="r1")
    assert result.get_response()["id"] == "r1"
    got = result.as_numpy("logits")
    np.testing.assert_allclose(got, p(x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(cnn_server, binary):
    server, _ = cnn_server
    values = {
        "BOOL": np.array([[True, False, True], [False, False, True]]),
        "UINT8": np.array([[0, 1, 255]] * 2, np.uint8),
        "UINT16": np.array([[0, 1, 65535]] * 2, np.uint16),
        "UINT32": np.array([[0, 1, 2**32 - 1]] * 2, np.uint32),
        "UINT64": np.array([[0, 1, 2**64 - 1]] * 2, np.uint64),
        "INT8": np.array([[-128, 0, 127]] * 2, np.int8),
        "INT16": np.array([[-(2**15), 0, 2**15 - 1]] * 2, np.int16),
        "INT32": np.array([[-(2**31), 0, 2**31 - 1]] * 2, np.int32),
        "INT64": np.array([[-(2**63), 0, 2**63 - 1]] * 2, np.int64),
        "FP16": np.array([[-1.5, 0.25, 65504]] * 2, np.float16),
        "FP32": np.array([[-1.5, 1e-30, 3e38]] * 2, np.float32),
        "FP64": np.array([[-1.5, 1e-300, 1e308]] * 2, np.float64),
        "BYTES": np.array([[b"", "café".encode(), b"x"], [b"yz", b"ab", b"c d"]], dtype=object),
    }
    inputs = [tensor(f"in_{d.lower()}", a, binary) for d, a in values.items()]
    outputs = [http.InferRequestedOutput(f"out_{d.lower()}", binary_data=binary) for d in values]
    result = client(server).infer("types", inputs, outputs=outputs)
    for d, a in values.items():
        got = result.as_numpy(f"out_{d.lower()}")
        if d == "BYTES":
            got = [[v if isinstance(v, bytes) else v.encode() for v in row] for row in got.tolist()]
            assert got == a.tolist()
        else:
            assert got.dtype == a.dtype and np.array_equal(got, a), d


def test_several_inputs_and_outputs(cnn_server):
    server, _ = cnn_server
    p = pipe(several())
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    k = np.array([[3], [-1]], np.int64)
    want = dict(zip(["total", "doubled", "norm"], p(x, k)))
    c = client(server)
    result = c.infer("several", [tensor("x", x), tensor("k", k, binary=False)])  # all outputs, binary
    for name, a in want.items():
        np.testing.assert_allclose(result.as_numpy(name), a)
    # Requested outputs: only those, in the order asked, each as asked.
    result = c.infer(
        "several",
        [tensor("k", k), tensor("x", x)],
        outputs=[http.InferRequestedOutput("norm", binary_data=False), http.InferRequestedOutput("doubled")],
    )
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["norm", "doubled"]
    assert "data" in response["outputs"][0] and "parameters" in response["outputs"][1]
    np.testing.assert_allclose(result.as_numpy("norm"), want["norm"])
    assert result.as_numpy("total") is None
    # An input of a safe wider cast (INT32 for INT64) is taken, as pipe(x) takes it.
    result = c.infer("several", [tensor("x", x), tensor("k", k.astype(np.int32))])
    np.testing.assert_array_equal(result.as_numpy("doubled"), want["doubled"])


def test_errors_name_the_pipelines_tensors(cnn_server):
    server, _ = cnn_server
    c = client(server)
    x = np.zeros((1, 3, 20, 20), np.float32)
    with pytest.raises(InferenceServerException, match="'imag' is not an input of model 'cnn' \\(did you mean 'image'"):
        c.infer("cnn", [tensor("imag", x)])
    with pytest.raises(
        InferenceServerException, match="'logit' is not an output of model 'cnn' \\(did you mean 'logits'"
    ):
        c.infer("cnn", [tensor("image", x)], outputs=[http.InferRequestedOutput("logit")])
    with pytest.raises(InferenceServerException, match="input 'image' expects float32, got float64"):
        c.infer("cnn", [tensor("image", x.astype(np.float64))])
    with pytest.raises(InferenceServerException, match="input 'image' expects size 20 on axis 3"):
        c.infer("cnn", [tensor("image", np.zeros((1, 3, 20, 21), np.float32))])
    with pytest.raises(InferenceServerException, match="missing input: k"):
        c.infer("several", [tensor("x", np.zeros((1, 4), np.float32))])
    with pytest.raises(InferenceServerException, match="same number of rows"):
        c.infer("several", [tensor("x", np.zeros((2, 4), np.float32)), tensor("k", np.zeros((1, 1), np.int64))])
    with pytest.raises(InferenceServerException, match="no model 'nope'"):
        c.infer("nope", [tensor("image", x)])
    assert c.is_server_ready()  # and the server goes on
    np.testing.assert_allclose(c.infer("cnn", [tensor("image", x)]).as_numpy("logits"), pipe(cnn())(x)[0], rtol=1e-5)


def test_the_servers_threads_keep_one_python_thread_state_each(monkeypatch):
    """The core's threads that enter Python (a model's batch worker, the log writer) each keep
    one Python thread state for their whole life: what Python code leaves in a thread's
    locals lives on between batches and log lines. Made afresh for each and cleared after,
    a gevent hub left there (tritonclient's finalizers make one in whatever thread collects
    them) crashed the interpreter: a segmentation fault in these tests, once in a few runs."""
    gevent = pytest.importorskip("gevent")
    local = threading.local()
    seen: dict[str, list[tuple[int, int]]] = {"batch": [], "log": []}

    def note(where: str) -> None:
        local.n = getattr(local, "n", 0) + 1
        gevent.get_hub()  # a hub in this thread's locals
        seen[where].append((threading.get_ident(), local.n))

    run = BatchRun.__call__
    monkeypatch.setattr(BatchRun, "__call__", lambda self, tensors: (note("batch"), run(self, tensors))[1])
    handler = logging.Handler()
    handler.emit = lambda record: note("log")  # type: ignore[method-assign]
    logging.getLogger("fastseq.serve").addHandler(handler)
    x = np.zeros((1, 3, 20, 20), np.float32)
    try:
        with running({"cnn": pipe(cnn())}) as server:
            c = client(server)
            for _ in range(3):
                np.testing.assert_allclose(c.infer("cnn", [tensor("image", x)]).as_numpy("logits"), pipe(cnn())(x)[0])
                with pytest.raises(InferenceServerException, match="no model 'nope'"):
                    c.infer("nope", [tensor("image", x)])  # a log line
                deadline = time.monotonic() + 30
                while len(seen["log"]) < len(seen["batch"]) - 1 and time.monotonic() < deadline:
                    time.sleep(0.01)  # each line on its own, written before the next request
    finally:
        logging.getLogger("fastseq.serve").removeHandler(handler)
    for where, calls in seen.items():
        assert len(calls) >= 3, (where, calls)
        assert len({ident for ident, _ in calls}) == 1, f"{where}: more than one thread"
        assert [n for _, n in calls] == list(range(1, len(calls) + 1)), f"{where}: its thread's locals were lost"


def test_a_server_dropped_without_its_shutdown_ends_its_threads_and_returns():
    """The core's server object, let go by Python without a shutdown (Python holds the GIL
    while it drops it), closes its batch workers and waits for them; each ends its Python
    thread state, which takes the GIL: the drop lets go of it meanwhile rather than hang."""
    script = """
import numpy as np
from fastseq import serving
from fastseq._core import start_server
from fastseq.serving.server import Server, _log_line
from netserving import cnn, pipe

server = Server(serving.app({"cnn": pipe(cnn())}), "127.0.0.1", 0)
models = [(m.spec, m.batch_run()) for m in server.service.models.values()]
core = start_server(models, server._sockets[0].detach(), None, server._options(), _log_line)
core.warm_up()  # the worker has run a batch: it holds its Python thread state
del core
print("dropped")
"""
    tests = Path(__file__).resolve().parents[1]  # netserving's folder
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tests)
    assert r.returncode == 0 and r.stdout.strip() == "dropped", r.stderr[-2000:]


def test_many_callers_are_batched_and_get_their_own_rows(cnn_server):
    server, p = cnn_server
    before = metrics(server.url)
    callers, each = 16, 20
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((callers, each, 1, 3, 20, 20)).astype(np.float32)
    assert not wrong_answers(lambda: client(server), tensor, p, rows)
    after = metrics(server.url)
    label = '{model="cnn",version="1"}'
    requests = after["nv_inference_request_success" + label] - before["nv_inference_request_success" + label]
    runs = after["nv_inference_exec_count" + label] - before["nv_inference_exec_count" + label]
    assert requests == callers * each
    assert runs < requests  # joined: fewer runs than requests
    assert after["nv_inference_count" + label] - before["nv_inference_count" + label] == requests
    assert after['fastseq_batch_size_count{model="cnn",version="1"}'] >= runs


def test_metrics_count_successes_failures_and_latency(cnn_server):
    server, _ = cnn_server
    c = client(server)
    before = metrics(server.url)
    c.infer("several", [tensor("x", np.zeros((1, 4), np.float32)), tensor("k", np.zeros((1, 1), np.int64))])
    with pytest.raises(InferenceServerException):
        c.infer("several", [tensor("x", np.zeros((1, 5), np.float32)), tensor("k", np.zeros((1, 1), np.int64))])
    after = metrics(server.url)
    label = 'model="several",version="1"'
    assert after[f"nv_inference_request_success{{{label}}}"] - before[f"nv_inference_request_success{{{label}}}"] == 1
    key = f'nv_inference_request_failure{{{label},reason="OTHER"}}'
    assert after[key] - before[key] == 1
    count = f"fastseq_request_duration_seconds_count{{{label}}}"
    assert after[count] - before[count] == 2
    assert after[f"nv_inference_pending_request_count{{{label}}}"] == 0
    assert after['fastseq_http_responses{status="400"}'] >= 1
    assert "process_resident_memory_bytes" in after and after["fastseq_threads"] >= 1
    status, text = get(server.url + "/metrics")
    assert status == 200 and b"# TYPE nv_inference_request_success counter" in text


def test_a_pipeline_whose_rows_mix_is_served_request_by_request(caplog):
    p = pipe(mixing())
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with caplog.at_level("WARNING", logger="fastseq.serve"), running({"mix": p}) as server:
        got = client(server).infer("mix", [tensor("x", x)]).as_numpy("y")
        np.testing.assert_allclose(got, p(x)[0], rtol=1e-6)
        assert client(server).get_model_config("mix")["max_batch_size"] == 0
    assert "served request by request" in caplog.text and "cannot batch" in caplog.text


def test_a_request_past_its_timeout_is_a_503_and_the_server_goes_on():
    p = pipe(busy(60))
    x = np.ones((1, 1), np.float32)
    with running({"slow": p}, timeout_s=30) as server:
        c = client(server)
        start = time.monotonic()
        with pytest.raises(InferenceServerException, match="not answered within its timeout of 0.001 s") as e:
            c.infer("slow", [tensor("x", x)], timeout=1000)  # microseconds, Triton's unit
        assert e.value.status() == "503" and time.monotonic() - start < 10
        np.testing.assert_allclose(c.infer("slow", [tensor("x", x)]).as_numpy("y"), p(x)[0], rtol=1e-5)


def test_batching_off_serves_each_request_on_its_own():
    p = pipe(cnn())
    x = np.random.default_rng(2).standard_normal((2, 3, 20, 20)).astype(np.float32)
    with running({"cnn": p}, max_batch_size=1) as server:
        c = client(server)
        assert c.get_model_config("cnn")["max_batch_size"] == 0
        np.testing.assert_allclose(c.infer("cnn", [tensor("image", x)]).as_numpy("logits"), p(x)[0], rtol=1e-5)


def test_a_pipeline_file_of_two_pipelines(tmp_path):
    import onnx

    onnx.save(cnn(), tmp_path / "cnn.onnx")
    onnx.save(several(), tmp_path / "several.onnx")
    (tmp_path / "serve.toml").write_text(
        '[pipelines.classify]\nchain = ["pre", "net"]\n'
        '[pipelines.classify.stages]\npre = "builtin:normalize?mean=0.5&std=0.25"\nnet = "cnn.onnx"\n\n'
        '[pipelines.tabular.stages]\nsums = "several.onnx"\n'
    )
    server = Process(str(tmp_path / "serve.toml"))
    try:
        from netserving import wait_ready

        wait_ready(server.url)
        c = client(server)
        assert c.is_model_ready("classify") and c.is_model_ready("tabular")
        x = np.random.default_rng(4).random((2, 3, 20, 20), dtype=np.float32)
        want = fastseq.ONNXSequential("builtin:normalize?mean=0.5&std=0.25", tmp_path / "cnn.onnx")(x)[0]
        np.testing.assert_allclose(
            c.infer("classify", [tensor("input", x)]).as_numpy("logits"), want, rtol=1e-5, atol=1e-6
        )
        got = c.infer("tabular", [tensor("x", np.ones((1, 4), np.float32)), tensor("k", np.array([[2]], np.int64))])
        assert got.as_numpy("doubled").tolist() == [[4]]
        assert "ready: classify at" in server.text() and "tabular at" in server.text()
    finally:
        assert server.stop() == 0


def test_the_app_mounts_in_another_application():
    """fastseq.serving.app mounted under a prefix of a Starlette application, which passes no
    lifespan to it: the first request starts its warm-up."""
    starlette = pytest.importorskip("starlette")  # noqa: F841
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from fastseq import serving
    from fastseq.serving.server import bind
    from netserving import wait_ready

    p = pipe(cnn())
    inner = serving.app(p, name="cnn")
    outer = Starlette(routes=[Route("/hello", lambda r: PlainTextResponse("hi")), Mount("/triton", app=inner)])
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(outer, log_config=None, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/triton")
        assert get(f"http://127.0.0.1:{port}/hello") == (200, b"hi")
        c = http.InferenceServerClient(f"127.0.0.1:{port}/triton")
        x = np.ones((1, 3, 20, 20), np.float32)
        np.testing.assert_allclose(c.infer("cnn", [tensor("image", x)]).as_numpy("logits"), p(x)[0], rtol=1e-5)
    finally:
        server.should_exit = True
        thread.join(30)
        inner_models = list(inner.models.values())
        for m in inner_models:
            m.close()


def test_a_request_whose_run_fails_in_a_joined_batch_gets_its_own_error_and_the_others_their_rows():
    """Requests of 1 to 3 rows joined in batches (a 50 ms delay fills them); one of them holds
    an index ONNX Runtime refuses at run time: the joint run fails, is run again per request,
    and only that caller gets an error (a 400: its values), the others their own rows."""
    p = pipe(lookup())
    requests = [np.array([[k % 5]] * (1 + k % 3), np.int64) for k in range(12)]
    requests[5] = np.array([[1], [7]], np.int64)
    answers: dict[int, object] = {}
    with running({"lookup": p}, max_delay_ms=50) as server:
        barrier = threading.Barrier(len(requests))

        def caller(k: int) -> None:
            c = client(server)
            barrier.wait()
            try:
                answers[k] = c.infer("lookup", [tensor("idx", requests[k])]).as_numpy("y")
            except InferenceServerException as e:
                answers[k] = e

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        label = '{model="lookup",version="1"}'
        m = metrics(server.url)
        assert m["nv_inference_exec_count" + label] < len(requests) + 1  # joined (the warm-up is one run)
    bad = answers.pop(5)
    assert isinstance(bad, InferenceServerException) and bad.status() == "400" and "Gather" in str(bad)
    for k, got in answers.items():
        np.testing.assert_array_equal(got, p(requests[k])[0])


def test_a_failed_warm_up_is_said_to_every_request_and_no_warm_up_serves_anyway():
    import onnx as _onnx

    model = pairs()
    _onnx.checker.check_model(model)
    from fastseq import serving
    from fastseq.serving.server import Server

    app = serving.app({"pairs": pipe(model)}, row_independent=True)
    server = Server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    thread.join(60)
    assert server.exit_code == 1 and isinstance(app.service.failed, fastseq.FastseqError)
    # Without the warm-up run it serves what the model takes.
    with running({"pairs": pipe(model)}, row_independent=True, warm_up=False) as s:
        got = client(s).infer("pairs", [tensor("x", np.arange(8, dtype=np.float32).reshape(2, 4))]).as_numpy("y")
        assert got.shape == (2, 2, 2)


def test_a_compressed_body_is_refused_by_name(cnn_server):
    server, _ = cnn_server
    from netserving import post, raw

    status, headers, body = raw(server.port, post("/v2/models/cnn/infer", b"\x1f\x8b...", {"Content-Encoding": "gzip"}))
    assert status == 415 and "Content-Encoding gzip is not supported" in body.decode()
    assert client(server).is_server_ready()


def test_a_pipeline_with_a_tensor_the_protocol_cannot_carry_is_refused_by_name():
    """A sequence output (what skl2onnx's ZipMap and SequenceConstruct give): no KServe
    datatype, refused when served, naming it and its type."""
    from onnx import TensorProto, helper

    from fastseq import serving

    g = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["pair"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_sequence_value_info("pair", TensorProto.FLOAT, ["N", 2])],
    )
    p = pipe(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    with pytest.raises(fastseq.CompositionError, match=r"cannot serve output 'pair' of type seq\(tensor\(float\)\)"):
        serving.app(p)
