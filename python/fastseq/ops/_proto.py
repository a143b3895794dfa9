"""The protobuf wire format of the few ONNX messages an operator's model is made of, written
directly: importing onnx costs over a second (most of it ml_dtypes), building an operator
costs microseconds.

Field numbers are those of ``crates/fastseq/proto/onnx-ml.proto`` (proto2: a field that is set is
written even when empty or zero; repeated scalars are not packed). Fields are written in
field-number order, as protobuf itself serializes, so the bytes equal what
``onnx.helper`` builds (tests/ops/test_proto.py compares both for every operator).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

#: struct codes of the element types constants are written in, by numpy name, and the
#: ONNX element type (TensorProto.DataType) of each.
PACK = {
    "float32": "f",
    "float64": "d",
    "float16": "e",
    "uint8": "B",
    "int8": "b",
    "uint16": "H",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "bool": "?",
}
ELEM = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
}

# AttributeProto.AttributeType
_FLOAT, _INT, _STRING, _INTS = 1, 2, 3, 7
# wire types
_VARINT, _FIXED32, _LEN = 0, 5, 2


def _varint(n: int) -> bytes:
    """An unsigned varint; a negative int64 is written as its two's complement (10 bytes)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, n: int) -> bytes:
    return _key(field, _VARINT) + _varint(n)


def _len(field: int, data: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _len(field, text.encode())


def tensor(name: str, dtype: str, dims: Sequence[int], values: Sequence[float | int]) -> bytes:
    """TensorProto: ``values`` (flat, row-major) as little-endian ``raw_data``, as
    ``onnx.numpy_helper.from_array`` writes them."""
    raw = struct.pack(f"<{len(values)}{PACK[dtype]}", *values)
    return b"".join(_int(1, d) for d in dims) + _int(2, ELEM[dtype]) + _str(8, name) + _len(9, raw)


def attribute(name: str, value: int | float | str | Sequence[int]) -> bytes:
    """AttributeProto, typed from the Python value as ``onnx.helper.make_attribute`` does
    (the kinds the operators use: an int, a float, a string, a list of ints)."""
    head = _str(1, name)
    if isinstance(value, int):
        return head + _int(3, int(value)) + _int(20, _INT)
    if isinstance(value, float):
        return head + _key(2, _FIXED32) + struct.pack("<f", value) + _int(20, _FLOAT)
    if isinstance(value, str):
        return head + _str(4, value) + _int(20, _STRING)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return head + b"".join(_int(8, v) for v in value) + _int(20, _INTS)
    raise TypeError(f"attribute {name}: unsupported value {value!r}")


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str, attrs: dict[str, Any]) -> bytes:
    """NodeProto in the default domain; attributes sorted by name (``make_node``'s order)."""
    return (
        b"".join(_str(1, i) for i in inputs)
        + b"".join(_str(2, o) for o in outputs)
        + _str(3, name)
        + _str(4, op_type)
        + b"".join(_len(5, attribute(k, v)) for k, v in sorted(attrs.items()))
    )


def value_info(name: str, elem: int, shape: Sequence[int | str]) -> bytes:
    """ValueInfoProto of a tensor: an int dim is a dim_value, a str a dim_param; the shape
    is written even when it has no dims (a scalar), as ``make_tensor_value_info`` does."""
    dims = b"".join(_len(1, _int(1, d) if isinstance(d, int) else _str(2, d)) for d in shape)
    tensor_type = _int(1, elem) + _len(2, dims)
    return _str(1, name) + _len(2, _len(1, tensor_type))


def model(
    graph_name: str,
    nodes: Sequence[bytes],
    initializers: Sequence[bytes],
    inputs: Sequence[bytes],
    outputs: Sequence[bytes],
    *,
    ir_version: int,
    opset: int,
    producer_name: str,
    producer_version: str,
    doc_string: str,
) -> bytes:
    """ModelProto with one graph and one default-domain opset import."""
    graph = (
        b"".join(_len(1, n) for n in nodes)
        + _str(2, graph_name)
        + b"".join(_len(5, t) for t in initializers)
        + b"".join(_len(11, v) for v in inputs)
        + b"".join(_len(12, v) for v in outputs)
    )
    opset_id = _str(1, "") + _int(2, opset)
    return (
        _int(1, ir_version)
        + _str(2, producer_name)
        + _str(3, producer_version)
        + _str(6, doc_string)
        + _len(7, graph)
        + _len(8, opset_id)
    )
