"""The KServe v2 datatypes and the numpy dtypes their values arrive in: each tensor a pipeline
serves is one of ``BOOL``, ``UINT8``-``UINT64``, ``INT8``-``INT64``, ``FP16``, ``FP32``,
``FP64`` and ``BYTES`` (ONNX strings). A tensor's datatype comes from the dtype the runtime
reads off its session (:class:`~fastseq.runtime.tensors.TensorInfo`: the one map of ONNX
Runtime's types). ONNX types with no KServe datatype (complex, the float8 and 4-bit types,
sequences and maps) cannot cross the protocol: a pipeline with one among its inputs or
outputs is refused when it is served, naming the tensor. ``BF16`` is a KServe datatype too,
but ONNX Runtime's Python API cannot hand a bfloat16 array back, so a pipeline exchanging
one is refused as well (a Cast to float32 around it serves it)."""

from __future__ import annotations

import numpy as np

from fastseq.errors import CompositionError
from fastseq.runtime.tensors import TensorInfo

#: KServe datatype -> the numpy dtype its values arrive in (BYTES: Python str objects)
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in (
        ("BOOL", np.bool_),
        ("UINT8", np.uint8),
        ("UINT16", np.uint16),
        ("UINT32", np.uint32),
        ("UINT64", np.uint64),
        ("INT8", np.int8),
        ("INT16", np.int16),
        ("INT32", np.int32),
        ("INT64", np.int64),
        ("FP16", np.float16),
        ("FP32", np.float32),
        ("FP64", np.float64),
        ("BYTES", object),
    )
}

#: numpy dtype -> the KServe datatype of an array of it (strings: see :func:`datatype_of`)
BY_DTYPE = {dtype: datatype for datatype, dtype in DTYPES.items() if datatype != "BYTES"}


def datatype_of(info: TensorInfo, ort_type: str, kind: str) -> str:
    """The KServe datatype of a pipeline's input or output (``kind`` says which), as the
    runtime describes it; a :class:`~fastseq.CompositionError` naming it and its type
    (``ort_type``, ONNX Runtime's) if none fits."""
    dtype = info.dtype
    if dtype is not None and dtype.kind == "U":  # ONNX strings
        return "BYTES"
    if dtype is not None and dtype in BY_DTYPE:
        return BY_DTYPE[dtype]
    why = (
        "ONNX Runtime's Python API cannot return bfloat16 arrays; a Cast to float32 around the pipeline serves it"
        if ort_type == "tensor(bfloat16)"
        else "the KServe v2 protocol has no datatype for it"
    )
    raise CompositionError(f"cannot serve {kind} '{info.name}' of type {ort_type}: {why}")
