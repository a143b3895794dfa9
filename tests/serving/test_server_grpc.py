"""The KServe v2 protocol over gRPC, called by Triton's own gRPC client (``tritonclient.grpc``)
and by its generated stub with requests made by hand (typed contents, lying sizes): the same
models, batching, limits and errors in the pipeline's names as over HTTP."""

from __future__ import annotations

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("uvicorn")
tg = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

from netserving import cnn, every_type, metrics, pipe, running, several, wrong_answers  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with running(
        {"cnn": pipe(cnn()), "types": pipe(every_type()), "several": pipe(several())},
        grpc_port=0,
        max_request_bytes=1 << 20,
    ) as s:
        yield s


def client(server) -> tg.InferenceServerClient:
    return tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def tensor(name: str, a: np.ndarray) -> tg.InferInput:
    x = tg.InferInput(name, list(a.shape), "BYTES" if a.dtype == object else np_to_triton_dtype(a.dtype))
    x.set_data_from_numpy(a)
    return x


def test_health_and_metadata(server):
    c = client(server)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("cnn")
    assert c.get_server_metadata().name == "fastseq"
    meta = c.get_model_metadata("cnn", as_json=True)
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": ["-1", "3", "20", "20"]}]
    with pytest.raises(InferenceServerException, match="no model 'cn' \\(did you mean 'cnn'\\?\\)"):
        c.get_model_metadata("cn")
    with pytest.raises(InferenceServerException, match="has no version '3'"):
        c.is_model_ready("cnn", "3")


def test_infer_matches_the_pipeline_and_many_callers_are_batched(server):
    p = pipe(cnn())
    rows = np.random.default_rng(0).standard_normal((8, 10, 1, 3, 20, 20)).astype(np.float32)
    before = metrics(server.url)
    assert not wrong_answers(lambda: client(server), tensor, p, rows)
    after = metrics(server.url)
    label = '{model="cnn",version="1"}'
    assert after["nv_inference_request_success" + label] - before["nv_inference_request_success" + label] == 80


def test_every_datatype_and_requested_outputs(server):
    values = {
        "BOOL": np.array([[True, False, True]]),
        "UINT8": np.array([[0, 1, 255]], np.uint8),
        "UINT16": np.array([[0, 1, 65535]], np.uint16),
        "UINT32": np.array([[0, 1, 2**32 - 1]], np.uint32),
        "UINT64": np.array([[0, 1, 2**64 - 1]], np.uint64),
        "INT8": np.array([[-128, 0, 127]], np.int8),
        "INT16": np.array([[-(2**15), 0, 1]], np.int16),
        "INT32": np.array([[-(2**31), 0, 1]], np.int32),
        "INT64": np.array([[-(2**63), 0, 1]], np.int64),
        "FP16": np.array([[-1.5, 0.25, 65504]], np.float16),
        "FP32": np.array([[-1.5, 1e-30, 3e38]], np.float32),
        "FP64": np.array([[-1.5, 1e-300, 1e308]]),
        "BYTES": np.array([[b"", "café".encode(), b"x y"]], dtype=object),
    }
    c = client(server)
    result = c.infer(
        "types",
        [tensor(f"in_{d.lower()}", a) for d, a in values.items()],
        outputs=[tg.InferRequestedOutput(f"out_{d.lower()}") for d in reversed(list(values))],
    )
    assert [o.name for o in result.get_response().outputs] == [f"out_{d.lower()}" for d in reversed(list(values))]
    for d, a in values.items():
        got = result.as_numpy(f"out_{d.lower()}")
        if d == "BYTES":
            assert got.tolist() == a.tolist()
        else:
            assert got.dtype == a.dtype and np.array_equal(got, a), d
    x, k = np.ones((2, 4), np.float32), np.array([[1], [2]], np.int64)
    got = c.infer("several", [tensor("x", x), tensor("k", k)], outputs=[tg.InferRequestedOutput("doubled")])
    assert got.as_numpy("doubled").tolist() == [[2], [4]] and got.as_numpy("total") is None


def stub(server):
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}"))


def test_typed_contents_made_by_hand(server):
    """Inputs in ``contents`` rather than raw bytes (what other clients send), through the
    protocol's own generated stub."""
    request = service_pb2.ModelInferRequest(model_name="several", id="typed")
    x = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    x.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    k = request.inputs.add(name="k", datatype="INT64", shape=[1, 1])
    k.contents.int64_contents.extend([5])
    response = stub(server).ModelInfer(request)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["total", "doubled", "norm"]
    total = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(1, 4)
    assert total.tolist() == [[6.0, 7.0, 8.0, 9.0]]
    strings = service_pb2.ModelInferRequest(model_name="types")
    for d in (
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP32",
        "FP64",
        "BYTES",
    ):
        t = strings.inputs.add(name=f"in_{d.lower()}", datatype=d, shape=[1, 3])
        field = {
            "BOOL": "bool_contents",
            "INT64": "int64_contents",
            "UINT64": "uint64_contents",
            "FP32": "fp32_contents",
            "FP64": "fp64_contents",
            "BYTES": "bytes_contents",
        }.get(d, "uint_contents" if d.startswith("U") else "int_contents")
        getattr(t.contents, field).extend(
            [b"a", b"b", b"c"] if d == "BYTES" else [True, False, True] if d == "BOOL" else [1, 2, 3]
        )
    with pytest.raises(grpc.RpcError) as e:  # FP16 has no typed contents: raw only
        stub(server).ModelInfer(strings)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "missing input: in_fp16" in e.value.details()


def refused(server, request, code=grpc.StatusCode.INVALID_ARGUMENT) -> str:
    with pytest.raises(grpc.RpcError) as e:
        stub(server).ModelInfer(request)
    assert e.value.code() == code, e.value.details()
    return e.value.details()


def test_hostile_requests(server):
    def one(shape, raw=None, datatype="FP32", name="image"):
        r = service_pb2.ModelInferRequest(model_name="cnn")
        r.inputs.add(name=name, datatype=datatype, shape=shape)
        r.raw_input_contents.append(raw if raw is not None else np.zeros(shape, np.float32).tobytes())
        return r

    assert "1200000000000 values of FP32" in refused(server, one([10**9, 3, 20, 20], raw=b"\0" * 4))
    assert "each axis must be an integer from 0" in refused(server, one([-1, 3, 20, 20], raw=b""))
    assert "multiply past" in refused(server, one([0, 2**62], raw=b""))
    assert "expects float32, got float64" in refused(
        server, one([1, 3, 20, 20], np.zeros((1, 3, 20, 20)).tobytes(), "FP64")
    )
    assert "'FLOAT' is not a KServe datatype" in refused(server, one([1, 3, 20, 20], datatype="FLOAT"))
    assert "'imag' is not an input" in refused(server, one([1, 3, 20, 20], name="imag"))
    r = one([1, 3, 20, 20])
    r.raw_input_contents.append(b"extra")
    assert "2 raw_input_contents for 1 inputs" in refused(server, r)
    r = one([1, 3, 20, 20])
    r.outputs.add(name="logit")
    assert "'logit' is not an output" in refused(server, r)
    r = one([1, 3, 20, 20])
    r.parameters["sequence_id"].int64_param = 3
    assert "sequence batching" in refused(server, r)
    # over max_request_bytes (1 MB): refused by gRPC from the message's length
    big = one([300, 3, 20, 20])
    refused(server, big, grpc.StatusCode.RESOURCE_EXHAUSTED)
    # and the server answers on
    assert client(server).is_server_ready()
    x = np.ones((1, 3, 20, 20), np.float32)
    np.testing.assert_allclose(
        client(server).infer("cnn", [tensor("image", x)]).as_numpy("logits"), pipe(cnn())(x)[0], rtol=1e-5
    )
