"""The KServe v2 protocol's pure functions (no socket): requests decoded against a model's
inputs, checked before anything is allocated, and responses that tritonclient's own parser
reads back; every datatype both ways, JSON and binary."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput, InferResult

import fastseq
from fastseq.runtime.tensors import TensorInfo
from fastseq.serving.datatypes import DTYPES, datatype_of
from fastseq.serving.protocol import Tensor, decode_infer, encode_infer

EVERY = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0]], np.float16),
    "FP32": np.array([[-1.5, 1e-30, 3.4e38]], np.float32),
    "FP64": np.array([[-1.5, 1e-300, 1.7e308]], np.float64),
    "BYTES": np.array([[b"", b"caf\xc3\xa9", b"a\x00b"]], dtype=object),
}
INPUTS = {f"in_{d.lower()}": Tensor(f"in_{d.lower()}", d, (-1, 3)) for d in EVERY}
OUTPUTS = {f"out_{d.lower()}": Tensor(f"out_{d.lower()}", d, (-1, 3)) for d in EVERY}


def request(arrays: dict[str, np.ndarray], binary: bool = True, outputs=None, **kw) -> tuple[bytes, int | None]:
    """The body tritonclient.http sends for ``arrays`` (name -> array), and its header length."""
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, a in arrays.items():
        x = InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype) if a.dtype != object else "BYTES")
        x.set_data_from_numpy(a, binary_data=binary)
        inputs.append(x)
    body, length = InferenceServerClient.generate_request_body(
        inputs, outputs, request_id=kw.pop("request_id", ""), timeout=kw.pop("timeout", None), parameters=kw or None
    )
    return (body.encode() if isinstance(body, str) else body), length


def decode(body: bytes, length: int | None):
    return decode_infer("m", body, length, INPUTS, OUTPUTS)


def expected(datatype: str, a: np.ndarray) -> np.ndarray:
    """What the server hands the pipeline: strings as str (ONNX strings are text)."""
    if datatype == "BYTES":
        return np.array([[v.decode() for v in row] for row in a], dtype=object)
    return a


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_decodes_exactly(binary):
    arrays = {f"in_{d.lower()}": a for d, a in EVERY.items()}
    body, length = request(arrays, binary)
    assert (length is not None) == binary
    got = decode(body, length)
    for d, a in EVERY.items():
        x = got.inputs[f"in_{d.lower()}"]
        assert x.dtype == DTYPES[d] and x.shape == a.shape, d
        assert x.tolist() == expected(d, a).tolist(), d


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_encodes_as_tritonclient_reads_it(binary):
    outputs = [(OUTPUTS[f"out_{d.lower()}"], expected(d, a) if d == "BYTES" else a, binary) for d, a in EVERY.items()]
    body, length = encode_infer("m", "1", "req-7", outputs)
    result = InferResult.from_response_body(body, header_length=length)
    assert result.get_response()["id"] == "req-7" and result.get_response()["model_name"] == "m"
    for d, a in EVERY.items():
        got = result.as_numpy(f"out_{d.lower()}")
        if d == "BYTES":
            want = [[v if binary else v.decode() for v in row] for row in a.tolist()]
            got = [[v.decode() if isinstance(v, bytes) and not binary else v for v in row] for row in got.tolist()]
            assert got == want
        else:
            assert got.dtype == a.dtype and np.array_equal(got, a), d


def test_binary_inputs_are_views_of_the_body_where_aligned():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    head = json.dumps(
        {"inputs": [{"name": "in_fp32", "shape": [4, 3], "datatype": "FP32", "parameters": {"binary_data_size": 48}}]}
    ).encode()
    for pad in range(4):  # the JSON header's length puts the data at every offset modulo 4
        header = head + b" " * pad
        body = header + x.tobytes()
        got = decode(body, len(header)).inputs["in_fp32"]
        assert np.array_equal(got, x) and got.flags.aligned
        assert np.shares_memory(got, np.frombuffer(body, np.uint8)) == (len(header) % 4 == 0)


def test_requested_outputs_ids_and_parameters():
    body, length = request(
        {"in_fp32": EVERY["FP32"]},
        outputs=[InferRequestedOutput("out_int64", binary_data=False), InferRequestedOutput("out_fp32")],
        request_id="abc",
        timeout=2500,
    )
    got = decode(body, length)
    assert got.id == "abc" and got.outputs == [("out_int64", False), ("out_fp32", True)]
    assert got.timeout_s == pytest.approx(0.0025)
    body, length = request({"in_fp32": EVERY["FP32"]})  # no outputs: all, binary (tritonclient's default)
    got = decode(body, length)
    assert got.outputs is None and got.binary_output is True


def refused(body: bytes | str, length: int | None = None, status: int = 400) -> str:
    if isinstance(body, str):
        body = body.encode()
    with pytest.raises(fastseq.RequestError) as e:
        decode(body, length)
    assert e.value.status == status
    assert isinstance(e.value, fastseq.InputError)
    return str(e.value)


def doc(**item) -> str:
    base = {"name": "in_fp32", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
    return json.dumps({"inputs": [{**base, **item}]})


def test_hostile_requests_are_refused_before_allocation():
    # A shape that claims 10^9 rows with one value: refused on the count, nothing allocated.
    assert "1000000000 values" in refused(doc(shape=[10**9], data=[1.0]))
    assert "each axis must be an integer from 0" in refused(doc(shape=[-1, 3]))
    assert "each axis must be an integer from 0" in refused(doc(shape=[2**63, 3]))
    assert "each axis must be an integer from 0" in refused(doc(shape=[1.5, 3]))
    assert "each axis must be an integer from 0" in refused(doc(shape=[True, 3]))
    assert "more than 32" in refused(doc(shape=[1] * 33))
    # Zero axes make no values, but the others must still fit an array: refused, never numpy's error.
    assert "multiply past" in refused(doc(shape=[0, 2**62], data=[]))
    assert "multiply past" in refused(doc(shape=[2**62, 0, 2**62], data=[]))
    # Huge dims whose product overflows int64: still counted exactly and refused.
    assert "multiply past" in refused(doc(shape=[2**62, 2**62, 2**62], data=[1.0]))
    # Binary sizes that disagree with the shape, or run past the body.
    x = np.zeros((1, 3), np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {"name": "in_fp32", "shape": [10**9, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}
            ]
        }
    ).encode()
    assert "binary_data_size is 12" in refused(header + x, len(header))
    header = json.dumps(
        {
            "inputs": [
                {"name": "in_fp32", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 10**12}}
            ]
        }
    ).encode()
    assert "past the end of the body" in refused(header + x, len(header))
    assert "Inference-Header-Content-Length is 99999" in refused(header + x, 99999)
    header = json.dumps(
        {"inputs": [{"name": "in_fp32", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}
    ).encode()
    assert "bytes after the binary data" in refused(header + x + b"junk", len(header))
    # BYTES: more elements claimed than 4-byte lengths could fit, a length past the end, not UTF-8.
    strings = json.dumps(
        {"inputs": [{"name": "in_bytes", "shape": [1, 3], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}]}
    ).encode()
    assert "only 8 bytes" in refused(strings + b"\0" * 8, len(strings))
    strings = json.dumps(
        {"inputs": [{"name": "in_bytes", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}]}
    ).encode()
    assert "runs past" in refused(strings + struct.pack("<I", 2**31) + b"abcd", len(strings))
    assert "not UTF-8" in refused(strings + struct.pack("<I", 4) + b"\xff\xfe\xfd\xfc", len(strings))


def test_malformed_requests_name_what_is_wrong():
    assert "not valid JSON" in refused("{nope")
    assert "not valid JSON" in refused("[" * 100_000 + "]" * 100_000)  # deep nesting: an error, not a crash
    assert "must be a JSON object" in refused("[1, 2]")
    assert "needs 'inputs'" in refused("{}")
    assert "'in_fp32x' is not an input of model 'm' (did you mean 'in_fp32'?)" in refused(doc(name="in_fp32x"))
    assert "input 'in_fp32': 'FLOAT32' is not a KServe datatype; model 'm' takes FP32" in refused(
        doc(datatype="FLOAT32")
    )
    assert "given twice" in refused(json.dumps({"inputs": [json.loads(doc())["inputs"][0]] * 2}))
    assert "neither 'data'" in refused(json.dumps({"inputs": [{"name": "in_fp32", "shape": [1], "datatype": "FP32"}]}))
    assert "its data holds 2 values" in refused(doc(data=[1, 2]))
    assert "its data holds 3 values" in refused(doc(shape=[2, 2], data=[[1, 2], [3]]))
    out = json.loads(doc())
    out["outputs"] = []  # as none: every output
    assert decode(json.dumps(out).encode(), None).outputs is None
    assert "its data holds 5 values" in refused(doc(shape=[2, 2], data=[[1, 2], [3, [4, [5, [6]]]]]))
    assert "must be numbers" in refused(doc(data=["a", "b", "c"]))
    assert "past FP32's range" in refused(doc(data=[1e39, 0, 0]))
    assert "outside 0..255" in refused(doc(name="in_uint8", datatype="UINT8", data=[300, 0, 0]))
    assert "must be integers" in refused(doc(name="in_int32", datatype="INT32", data=[1.5, 0, 0]))
    assert "must be true or false" in refused(doc(name="in_bool", datatype="BOOL", data=[1, 0, 1]))
    assert "must be strings" in refused(doc(name="in_bytes", datatype="BYTES", data=[1, 2, 3]))
    out = json.loads(doc())
    out["outputs"] = [{"name": "out_fp32x"}]
    assert "'out_fp32x' is not an output of model 'm' (did you mean 'out_fp32'" in refused(json.dumps(out))
    out["outputs"] = [{"name": "out_fp32", "parameters": {"classification": 3}}]
    assert "classification" in refused(json.dumps(out))
    out = json.loads(doc())
    out["parameters"] = {"timeout": -5}
    assert "timeout must be a positive integer" in refused(json.dumps(out))
    out["parameters"] = {"sequence_id": 4}
    assert "sequence batching" in refused(json.dumps(out))
    assert "shared memory" in refused(doc(parameters={"shared_memory_region": "r"}))


def test_json_data_nested_as_the_shape():
    got = decode(doc(shape=[1, 3], data=[[1, 2, 3]]).encode(), None)
    assert got.inputs["in_fp32"].tolist() == [[1.0, 2.0, 3.0]]


def test_every_onnx_tensor_type_maps_or_is_refused_by_name():
    """Each tensor type ONNX Runtime gives a numpy dtype has its KServe datatype; the others are
    refused by name (read off real sessions: tests/serving/test_server.py's model of every type)."""
    assert set(DTYPES) == set(EVERY)
    for datatype, a in EVERY.items():
        dtype = np.dtype(np.str_) if datatype == "BYTES" else a.dtype
        assert datatype_of(TensorInfo("t", dtype, ("N", 3)), "tensor(?)", "input") == datatype
    with pytest.raises(fastseq.CompositionError, match="output 'p' of type tensor\\(complex64\\)"):
        datatype_of(TensorInfo("p", None, ("N",)), "tensor(complex64)", "output")
    with pytest.raises(fastseq.CompositionError, match="bfloat16 arrays"):
        datatype_of(TensorInfo("x", None, ("N",)), "tensor(bfloat16)", "input")
    with pytest.raises(fastseq.CompositionError, match="no datatype"):
        datatype_of(TensorInfo("probabilities", None, None), "seq(map(int64,tensor(float)))", "output")
