"""The KServe v2 inference protocol (the "Open Inference Protocol" of Triton, KServe, Seldon
MLServer and OpenVINO Model Server) to and from arrays: pure functions over bytes, testable
without a socket.

An infer request is a JSON object; with Triton's binary tensor extension the JSON comes
first, its length in the ``Inference-Header-Content-Length`` header, and each input whose
``parameters`` say ``binary_data_size`` follows it as raw little-endian bytes, in input
order (``BYTES`` elements as a 4-byte length and the bytes). Everything a request declares
is checked against the bytes it brings before anything is allocated for it: a shape that
claims 10^9 values with one value of data, a binary size past the body's end, a header
length past the body, are each a :class:`~fastseq.RequestError` (400) naming the model's
own tensor. Binary inputs are read in place (views of the body, no copy). JSON values are
checked to keep their meaning in the datatype (300 is no UINT8, 1e39 no FP32)."""

from __future__ import annotations

import functools
import json
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
def decode_infer(model: str, body: bytes, header_length: int | None, inputs: dict[str, Tensor],
                 outputs: dict[str, Tensor]) -> InferRequest:
    """The infer request in ``body`` for ``model`` (whose ``inputs`` and ``outputs`` are
    given by name); ``header_length`` is the ``Inference-Header-Content-Length`` header (None
    without it: the whole body is JSON)."""
    size = len(body)
    if header_length is None:
        header_length = size
    elif not 0 <= header_length <= size:
        raise RequestError(f"Inference-Header-Content-Length is {header_length}, but the body has {size} bytes")
    try:
        doc = json.loads(body[:header_length] if header_length != size else body)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the request is not valid JSON: {e}") from None
    if type(doc) is not dict:
        raise RequestError(f"the request must be a JSON object, got {_kind(doc)}")
    id = doc.get("id")
    if id is not None and type(id) is not str:
        raise RequestError(f"the request's id must be a string, got {_kind(id)}")
    parameters = _parameters(doc.get("parameters"), "the request's parameters")
    items = doc.get("inputs")
    if type(items) is not list or not items:
        raise RequestError(f"the request needs 'inputs', a list of the tensors of model '{model}': "
                           + ", ".join(t.name for t in inputs.values()))
    feeds: dict[str, np.ndarray] = {}
    offset = header_length
    for k, item in enumerate(items):
        if type(item) is not dict:
            raise RequestError(f"inputs[{k}] must be a JSON object, got {_kind(item)}")
        name = item.get("name")
        if type(name) is not str:
            raise RequestError(f"inputs[{k}] needs a 'name', a string")
        datatype = item.get("datatype")
        dtype = input_dtype(model, inputs, feeds, name, datatype)
        shape, count = declared_shape(name, item.get("shape"))
        params = _parameters(item.get("parameters"), f"input '{name}''s parameters")
        if "shared_memory_region" in params:
            raise RequestError(f"input '{name}': shared memory is not supported by fastseq serve; send the data")
        binary_size = params.get("binary_data_size")
        if binary_size is not None:
            if "data" in item:
                raise RequestError(f"input '{name}' has both 'data' and binary_data_size: give one")
            if type(binary_size) is not int or binary_size < 0:
                raise RequestError(f"input '{name}': binary_data_size must be an integer >= 0, got {binary_size!r}")
            if binary_size > size - offset:
                raise RequestError(f"input '{name}' has binary_data_size {binary_size}, past the end of the body "
                                   f"({size - offset} bytes left after the JSON and the inputs before it)")
            feeds[name] = from_binary(name, body, offset, binary_size, datatype, dtype, shape, count)
            offset += binary_size
        else:
            if "data" not in item:
                raise RequestError(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
            feeds[name] = from_values(name, item["data"], datatype, dtype, shape, count)
    if offset != size:
        raise RequestError(f"the body has {size - offset} bytes after the binary data of its inputs: "
                           "each binary input's binary_data_size must give its exact length")
    binary_output = parameters.get("binary_data_output", False)
    if type(binary_output) is not bool:
        raise RequestError(f"the parameter binary_data_output must be true or false, got {binary_output!r}")
    timeout_s = request_timeout(parameters)
    asked = None
    wanted = doc.get("outputs")
    if wanted is not None:  # an empty list asks for every output, as none does (Triton's reading)
        asked = _outputs(model, wanted, outputs, binary_output) or None
    return InferRequest(id, feeds, asked, binary_output, timeout_s)


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


def _parameters(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise RequestError(f"{what} must be a JSON object, got {_kind(value)}")
    return value


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


def _outputs(model: str, wanted: Any, outputs: dict[str, Tensor], binary_output: bool) -> list[tuple[str, bool]]:
    if type(wanted) is not list:
        raise RequestError(f"the request's 'outputs' must be a list, got {_kind(wanted)}")
    asked: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for k, item in enumerate(wanted):
        if type(item) is not dict or type(item.get("name")) is not str:
            raise RequestError(f"outputs[{k}] must be a JSON object with a 'name'")
        name = item["name"]
        output_named(model, outputs, seen, name)
        params = _parameters(item.get("parameters"), f"output '{name}''s parameters")
        if params.get("classification"):
            raise RequestError(f"output '{name}': the classification extension is not supported by fastseq serve")
        if "shared_memory_region" in params:
            raise RequestError(f"output '{name}': shared memory is not supported by fastseq serve")
        binary = params.get("binary_data", binary_output)
        if type(binary) is not bool:
            raise RequestError(f"output '{name}': binary_data must be true or false, got {binary!r}")
        asked.append((name, binary))
    return asked


# --- responses ----------------------------------------------------------------------------------
def encode_infer(model: str, version: str, id: str | None, outputs: list[tuple[Tensor, np.ndarray, bool]]
                 ) -> tuple[bytes, int | None]:
    """The response body for ``outputs`` ((tensor, array, binary) each) and the length of its
    JSON header where binary data follows it (None: the body is JSON alone)."""
    if all(binary for _, _, binary in outputs):  # what Triton's clients ask for: the header from parts
        parts = [_model_head(model, version)]
        if id is not None:
            parts.append(f',"id":{json.dumps(id)}')
        parts.append(',"outputs":[')
        buffers: list[Any] = []
        for k, (tensor, array, _) in enumerate(outputs):
            raw = raw_data(tensor.datatype, array)
            buffers.append(raw)
            parts.append(f'{"," if k else ""}{_tensor_head(tensor)}{",".join(map(str, array.shape))}],'
                         f'"parameters":{{"binary_data_size":{len(raw)}}}}}')
        parts.append("]}")
        head = "".join(parts).encode()
        return b"".join([head, *buffers]), len(head)
    entries = []
    buffers: list[Any] = []
    for tensor, array, binary in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(array.shape)}
        if binary:
            raw = raw_data(tensor.datatype, array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            buffers.append(raw)
        elif tensor.datatype == "BYTES":
            entry["data"] = [v if type(v) is str else str(v) for v in array.reshape(-1).tolist()]
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version}
    if id is not None:
        doc["id"] = id
    doc["outputs"] = entries
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not buffers:
        return head, None
    return b"".join([head, *buffers]), len(head)


@functools.lru_cache(maxsize=256)
def _model_head(model: str, version: str) -> str:
    return f'{{"model_name":{json.dumps(model)},"model_version":{json.dumps(version)}'


@functools.lru_cache(maxsize=1024)
def _tensor_head(tensor: Tensor) -> str:
    return f'{{"name":{json.dumps(tensor.name)},"datatype":"{tensor.datatype}","shape":['


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
    """``{"error": message}``, as the protocol answers a failure."""
    return json.dumps({"error": message}).encode()
