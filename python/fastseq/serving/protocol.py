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
keep their meaning in the datatype (300 is no UINT8, 1e39 no FP32)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastseq import _core
from fastseq.serving.datatypes import BY_DTYPE, DTYPES


@dataclass(frozen=True)
class Tensor:
    """One input or output of a served pipeline: its name, KServe datatype and shape (-1
    for a dynamic axis; None where the model declares no shape)."""

    name: str
    datatype: str
    shape: tuple[int, ...] | None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "datatype": self.datatype,
            "shape": list(self.shape) if self.shape is not None else [-1],
        }


class InferRequest:
    """A decoded infer request: its id, the input arrays by name, and which outputs to
    return how (``outputs``: (name, binary) pairs in the order asked, None for every output,
    each binary where ``binary_output`` says so); ``timeout_s`` from its ``timeout``
    parameter (microseconds, as Triton's clients send it)."""

    __slots__ = ("id", "inputs", "outputs", "binary_output", "timeout_s")

    def __init__(
        self,
        id: str | None,
        inputs: dict[str, np.ndarray],
        outputs: list[tuple[str, bool]] | None,
        binary_output: bool,
        timeout_s: float | None,
    ) -> None:
        self.id, self.inputs, self.outputs = id, inputs, outputs
        self.binary_output, self.timeout_s = binary_output, timeout_s


# --- requests -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def served_spec(
    model: str,
    version: str,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    max_batch_size: int = 0,
    max_delay_us: int = 0,
) -> Any:
    """The core's description of a served model, made once (a :class:`ServedModel` keeps
    its own, ``spec``): its tensors, and how the server in the core batches it
    (``max_batch_size`` 0: each request alone)."""

    def described(tensors: tuple[Tensor, ...]) -> list[tuple[str, str, list[int] | None]]:
        return [(t.name, t.datatype, list(t.shape) if t.shape is not None else None) for t in tensors]

    return _core.served_spec(model, version, described(inputs), described(outputs), max_batch_size, max_delay_us)


def decode_infer(
    model: str,
    body: bytes,
    header_length: int | None,
    inputs: dict[str, Tensor],
    outputs: dict[str, Tensor],
    *,
    every_input: bool = False,
    spec: Any = None,
) -> InferRequest:
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


# --- responses ----------------------------------------------------------------------------------
def encode_infer(
    model: str,
    version: str,
    id: str | None,
    outputs: list[tuple[Tensor, np.ndarray, bool]],
    *,
    spec: Any = None,
    index: dict[str, int] | None = None,
) -> tuple[bytes, int | None]:
    """The response body for ``outputs`` ((tensor, array, binary) each) and the length of its
    JSON header where binary data follows it (None: the body is JSON alone); ``spec`` the
    model's :func:`served_spec` and ``index`` its outputs' positions by name, where the caller
    keeps them. An output asked for as JSON that JSON cannot carry (NaN, infinities) is a
    :class:`~fastseq.RequestError` (400) saying to ask for it as binary data."""
    if spec is None or index is None:
        spec, index = served_spec(model, version, (), tuple(t for t, _, _ in outputs)), None
    items = []
    for k, (tensor, array, binary) in enumerate(outputs):
        datatype = BY_DTYPE.get(array.dtype, tensor.datatype)
        if datatype == "BYTES" or array.dtype == object:
            values: Any = array.reshape(-1).tolist()
        else:
            values = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        items.append((k if index is None else index[tensor.name], binary, datatype, array.shape, values))
    return _core.encode_http(spec, id, items)


def error_body(message: str) -> bytes:
    """``{"error": message}``, as the protocol answers a failure (always valid JSON)."""
    return _core.error_json(message)
