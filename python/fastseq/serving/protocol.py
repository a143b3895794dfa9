"""The KServe v2 inference protocol (the "Open Inference Protocol" of Triton, KServe, Seldon
MLServer and OpenVINO Model Server) to and from arrays: pure functions over bytes, testable
without a socket.

An infer request is a JSON object; with Triton's binary tensor extension the JSON comes
first, its length in the ``Inference-Header-Content-Length`` header, and each input whose
``parameters`` say ``binary_data_size`` follows it as raw little-endian bytes, in input
order (``BYTES`` elements as a 4-byte length and the bytes). HTTP requests are decoded and
answers encoded by the core (``fastseq_serve::protocol``, through ``_core.decode_http`` and
``_core.encode_http``), which the Rust server shares: everything a request declares is
checked against the bytes it brings before anything is allocated for it (a shape that claims
10^9 values with one value of data, a binary size past the body's end, a header length past
the body are each a :class:`~fastseq.RequestError` (400) naming the model's own tensor);
binary inputs are read in place (views of the body, no copy); JSON values are checked to
keep their meaning in the datatype (300 is no UINT8, 1e39 no FP32). The helpers below the
HTTP functions check gRPC's messages (``grpc_service``) the same way."""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastseq import _core
from fastseq.errors import RequestError
from fastseq.serving.datatypes import DTYPES

#: the most axes a tensor of a request may have: numpy 1.x's limit (numpy 2's is 64)
MAX_RANK = 32
#: the largest size a request may declare for one axis
MAX_DIM = 2**62
#: the most elements the axes of a shape may multiply to, zero axes taken as 1: an array of
#: no values whose other axes multiply past what numpy indexes (``[0, 2**62, 2**62]``) is
#: refused too, where numpy would fail to make it
MAX_SPAN = 2**58


@dataclass(frozen=True)
class Tensor:
    """One input or output of a served pipeline: its name, KServe datatype and shape (-1
    for a dynamic axis; None where the model declares no shape)."""

    name: str
    datatype: str
    shape: tuple[int, ...] | None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape) if self.shape is not None else [-1]}


class InferRequest:
    """A decoded infer request: its id, the input arrays by name, and which outputs to
    return how (``outputs``: (name, binary) pairs in the order asked, None for every output,
    each binary where ``binary_output`` says so); ``timeout_s`` from its ``timeout``
    parameter (microseconds, as Triton's clients send it)."""

    __slots__ = ("id", "inputs", "outputs", "binary_output", "timeout_s")

    def __init__(self, id: str | None, inputs: dict[str, np.ndarray], outputs: list[tuple[str, bool]] | None,
                 binary_output: bool, timeout_s: float | None) -> None:
        self.id, self.inputs, self.outputs = id, inputs, outputs
        self.binary_output, self.timeout_s = binary_output, timeout_s


# --- requests -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def served_spec(model: str, version: str, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...],
                max_batch_size: int = 0, max_delay_us: int = 0) -> Any:
    """The core's description of a served model, made once (a :class:`ServedModel` keeps
    its own, ``spec``): its tensors, and how the server in the core batches it
    (``max_batch_size`` 0: each request alone)."""
    def described(tensors: tuple[Tensor, ...]) -> list[tuple[str, str, list[int] | None]]:
        return [(t.name, t.datatype, list(t.shape) if t.shape is not None else None) for t in tensors]

    return _core.served_spec(model, version, described(inputs), described(outputs), max_batch_size, max_delay_us)


def decode_infer(model: str, body: bytes, header_length: int | None, inputs: dict[str, Tensor],
                 outputs: dict[str, Tensor], *, every_input: bool = False, spec: Any = None) -> InferRequest:
    """The infer request in ``body`` for ``model`` (whose ``inputs`` and ``outputs`` are
    given by name; ``spec``, their :func:`served_spec`, where the caller keeps it);
    ``header_length`` is the ``Inference-Header-Content-Length`` header (None without it: the
    whole body is JSON). Each input given is checked against the model's (datatype, a safe
    widening converted; rank; fixed sizes); ``every_input`` refuses a request that leaves one
    out (else the pipeline's input rule says so)."""
    if spec is None:
        spec = served_spec(model, "", tuple(inputs.values()), tuple(outputs.values()))
    id, given, asked, timeout_s = _core.decode_http(spec, body, header_length, every_input)
    feeds: dict[str, np.ndarray] = {}
    for name, datatype, shape, values in given:
        if datatype == "BYTES":
            array = np.empty(len(values), dtype=object)
            array[:] = values
            feeds[name] = array.reshape(shape)
        elif type(values) is int:  # binary data: a view of the body, no copy (read-only)
            array = np.frombuffer(body, DTYPES[datatype], math.prod(shape), values).reshape(shape)
            # but where the JSON header's length leaves it unaligned for its dtype
            feeds[name] = array if array.flags.aligned else array.copy()
        else:
            feeds[name] = np.frombuffer(values, DTYPES[datatype]).reshape(shape)
    binary_output = bool(asked) and asked[0][1]
    # Every output in order, each as the request's binary_data_output, is what a request that
    # names none asks for: None, as the service reads it.
    if len(asked) == len(outputs) and all(k == n and b == binary_output for n, (k, b) in enumerate(asked)):
        return InferRequest(id, feeds, None, binary_output, timeout_s)
    names = list(outputs)
    return InferRequest(id, feeds, [(names[k], b) for k, b in asked], binary_output, timeout_s)


def input_dtype(model: str, inputs: dict[str, Tensor], given: dict[str, Any], name: str, datatype: Any) -> np.dtype:
    """The numpy dtype an input's values arrive in, for input ``name`` of ``datatype``: a 400
    for a name that is not an input (with the near miss), one ``given`` already, or a
    datatype the protocol does not have (over HTTP and gRPC alike)."""
    if name not in inputs:
        raise RequestError(f"'{name}' is not an input of model '{model}'{_core.did_you_mean(name, list(inputs))}; "
                           f"inputs: {', '.join(inputs)}")
    if name in given:
        raise RequestError(f"input '{name}' is given twice")
    dtype = DTYPES.get(datatype) if type(datatype) is str else None
    if dtype is None:
        near = _core.did_you_mean(datatype, list(DTYPES)) if type(datatype) is str else ""
        raise RequestError(f"input '{name}': {_kind(datatype) if type(datatype) is not str else repr(datatype)} "
                           f"is not a KServe datatype{near}; model '{model}' takes {inputs[name].datatype}")
    return dtype


def output_named(model: str, outputs: dict[str, Tensor], asked: set[str], name: str) -> None:
    """A 400 for a requested output that is not one (with the near miss) or asked twice."""
    if name not in outputs:
        raise RequestError(f"'{name}' is not an output of model '{model}'{_core.did_you_mean(name, list(outputs))}; "
                           f"outputs: {', '.join(outputs)}")
    if name in asked:
        raise RequestError(f"output '{name}' is asked for twice")
    asked.add(name)


def request_timeout(parameters: dict[str, Any]) -> float | None:
    """A request's own ``timeout`` parameter (microseconds, as Triton's clients send it) in
    seconds; a 400 for a bad one or for sequence batching's parameters."""
    for key in ("sequence_id", "sequence_start", "sequence_end"):
        if parameters.get(key) not in (None, 0, "", False):
            raise RequestError(f"the parameter {key}: sequence batching is not supported by fastseq serve")
    if "timeout" not in parameters:
        return None
    t = parameters["timeout"]
    if type(t) is not int or t <= 0:
        raise RequestError(f"the parameter timeout must be a positive integer of microseconds, got {t!r}")
    return t / 1e6


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def declared_shape(name: str, shape: Any) -> tuple[tuple[int, ...], int]:
    """A request's declared shape and the number of values it holds, checked before any
    allocation: integers from 0 to MAX_DIM, at most MAX_RANK of them."""
    if type(shape) is not list:
        raise RequestError(f"input '{name}' needs a 'shape', a list of integers, got {_kind(shape)}")
    if len(shape) > MAX_RANK:
        raise RequestError(f"input '{name}' has {len(shape)} axes, more than {MAX_RANK}")
    count = span = 1
    for d in shape:
        if type(d) is not int or not 0 <= d <= MAX_DIM:
            raise RequestError(f"input '{name}' has shape {json.dumps(shape)[:200]}: each axis must be an integer "
                               f"from 0 to {MAX_DIM}")
        count *= d
        span *= d or 1
    if span > MAX_SPAN:
        raise RequestError(f"input '{name}' has shape {json.dumps(shape)[:200]}: its axes multiply past {MAX_SPAN}, "
                           "more than any array holds")
    return tuple(shape), count


def _values(count: int) -> str:
    return f"{count} value{'s' if count != 1 else ''}"


def from_binary(name: str, body: bytes, offset: int, size: int, datatype: str, dtype: np.dtype,
                 shape: tuple[int, ...], count: int) -> np.ndarray:
    if datatype == "BYTES":
        return _strings(name, memoryview(body)[offset:offset + size], shape, count)
    expected = count * dtype.itemsize
    if size != expected:
        raise RequestError(f"input '{name}' has shape {list(shape)}, {_values(count)} of {datatype} ({expected} bytes), "
                           f"but binary_data_size is {size}")
    # A view of the body: no copy (read-only; little-endian, as the protocol and numpy here),
    # but where the JSON header's length leaves it unaligned for its dtype.
    array = np.frombuffer(body, dtype, count, offset).reshape(shape)
    return array if array.flags.aligned else array.copy()


def _strings(name: str, raw: memoryview, shape: tuple[int, ...], count: int) -> np.ndarray:
    """BYTES elements: each a 4-byte little-endian length and that many bytes of UTF-8
    (ONNX strings are text)."""
    if count * 4 > len(raw):
        raise RequestError(f"input '{name}' has shape {list(shape)}, {_values(count)} of BYTES, but only {len(raw)} "
                           "bytes of binary data (each element takes 4 bytes of length at least)")
    values = []
    at, end = 0, len(raw)
    unpack = struct.Struct("<I").unpack_from
    for _ in range(count):
        if at + 4 > end:
            break
        (n,) = unpack(raw, at)
        at += 4
        if n > end - at:
            raise RequestError(f"input '{name}': a BYTES element of {n} bytes runs past its binary data")
        try:
            values.append(str(raw[at:at + n], "utf-8"))
        except UnicodeDecodeError as e:
            raise RequestError(f"input '{name}': a BYTES element is not UTF-8 text ({e.reason}); ONNX strings are "
                               "text") from None
        at += n
    if len(values) != count or at != end:
        raise RequestError(f"input '{name}' has shape {list(shape)}, {_values(count)} of BYTES, but its "
                           f"{len(raw)} bytes of binary data hold {len(values)}{' and more' if at != end else ''}")
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)


def from_values(name: str, data: Any, datatype: str, dtype: np.dtype, shape: tuple[int, ...], count: int) -> np.ndarray:
    """JSON ``data`` (flat, or nested as the shape) as an array of ``shape``: its number of
    values checked before numpy reads it, and each value kept exactly in the datatype."""
    if type(data) is not list:
        data = [data]
    if any(type(v) is list for v in data):  # nested (as the shape, say): its values in row-major order
        data = _leaves(data, count)
    if len(data) != count:
        raise RequestError(f"input '{name}' has shape {list(shape)}, {_values(count)}, but its data holds "
                           f"{_values(len(data))}")
    kinds = {type(v) for v in data}
    if datatype == "BYTES":
        if not kinds <= {str}:
            raise RequestError(f"input '{name}' is BYTES: its JSON data must be strings")
        array = np.empty(count, dtype=object)
        array[:] = data
        return array.reshape(shape)
    if datatype == "BOOL":
        if not kinds <= {bool}:
            raise RequestError(f"input '{name}' is BOOL: its JSON data must be true or false")
        return np.array(data, dtype=np.bool_).reshape(shape)
    if dtype.kind in "iu":
        if not kinds <= {int}:
            raise RequestError(f"input '{name}' is {datatype}: its JSON data must be integers")
        info = np.iinfo(dtype)
        if data and (min(data) < info.min or max(data) > info.max):
            raise RequestError(f"input '{name}' is {datatype}: a value of its data is outside {info.min}..{info.max}")
        return np.array(data, dtype=dtype).reshape(shape)
    if not kinds <= {int, float}:
        raise RequestError(f"input '{name}' is {datatype}: its JSON data must be numbers")
    try:
        wide = np.array(data, dtype=np.float64)
    except OverflowError:  # an integer past float64's range
        raise RequestError(f"input '{name}' is {datatype}: a value of its data is past {datatype}'s range") from None
    with np.errstate(all="ignore"):
        array = wide.astype(dtype)
    if not np.array_equal(np.isfinite(array), np.isfinite(wide)):
        raise RequestError(f"input '{name}' is {datatype}: a value of its data is past {datatype}'s range")
    return array.reshape(shape)


def _leaves(data: list, count: int) -> list:
    """The values of nested lists in order, without recursion; stops one past ``count``."""
    found: list = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if type(v) is list:
                stack.append(iter(v))
                break
            found.append(v)
            if len(found) > count:
                return found
        else:
            stack.pop()
    return found


# --- responses ----------------------------------------------------------------------------------
def encode_infer(model: str, version: str, id: str | None, outputs: list[tuple[Tensor, np.ndarray, bool]], *,
                 spec: Any = None, index: dict[str, int] | None = None) -> tuple[bytes, int | None]:
    """The response body for ``outputs`` ((tensor, array, binary) each) and the length of its
    JSON header where binary data follows it (None: the body is JSON alone); ``spec`` the
    model's :func:`served_spec` and ``index`` its outputs' positions by name, where the caller
    keeps them. An output asked for as JSON that JSON cannot carry (NaN, infinities) is a
    :class:`~fastseq.RequestError` (400) saying to ask for it as binary data."""
    if spec is None or index is None:
        spec, index = served_spec(model, version, (), tuple(t for t, _, _ in outputs)), None
    items = []
    for k, (tensor, array, binary) in enumerate(outputs):
        datatype = _DATATYPES.get(array.dtype, tensor.datatype)
        if datatype == "BYTES" or array.dtype == object:
            values: Any = array.reshape(-1).tolist()
        else:
            values = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        items.append((k if index is None else index[tensor.name], binary, datatype, array.shape, values))
    return _core.encode_http(spec, id, items)


#: the KServe datatype of each numpy dtype an output array may have
_DATATYPES = {dtype: datatype for datatype, dtype in DTYPES.items() if datatype != "BYTES"}


def raw_data(datatype: str, array: np.ndarray) -> Any:
    """An output's binary data: its bytes in place where they are contiguous already."""
    if datatype == "BYTES":
        parts = []
        for v in array.reshape(-1).tolist():
            b = v.encode() if type(v) is str else bytes(v)
            parts += (struct.pack("<I", len(b)), b)
        return b"".join(parts)
    if array.flags.c_contiguous and array.size:  # memoryview cannot cast a view with a zero axis
        return memoryview(array).cast("B")
    return np.ascontiguousarray(array).tobytes()


def error_body(message: str) -> bytes:
    """``{"error": message}``, as the protocol answers a failure (always valid JSON)."""
    return _core.error_json(message)
