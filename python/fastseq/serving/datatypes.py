"""The KServe v2 datatypes and the ONNX element types they carry: each tensor a pipeline
serves is one of ``BOOL``, ``UINT8``-``UINT64``, ``INT8``-``INT64``, ``FP16``, ``FP32``,
``FP64`` and ``BYTES`` (ONNX strings). ONNX types with no KServe datatype (complex, the
float8 and 4-bit types, sequences and maps) cannot cross the protocol: a pipeline with one
among its inputs or outputs is refused when it is served, naming the tensor. ``BF16`` is
a KServe datatype too, but ONNX Runtime's Python API cannot hand a bfloat16 array back, so
a pipeline exchanging one is refused as well (a Cast to float32 around it serves it)."""

from __future__ import annotations

import numpy as np

from fastseq.errors import CompositionError

#: ONNX Runtime's type string -> (KServe datatype, numpy dtype of its values)
BY_ORT_TYPE: dict[str, tuple[str, np.dtype]] = {
    "tensor(bool)": ("BOOL", np.dtype(np.bool_)),
    "tensor(uint8)": ("UINT8", np.dtype(np.uint8)),
    "tensor(uint16)": ("UINT16", np.dtype(np.uint16)),
    "tensor(uint32)": ("UINT32", np.dtype(np.uint32)),
    "tensor(uint64)": ("UINT64", np.dtype(np.uint64)),
    "tensor(int8)": ("INT8", np.dtype(np.int8)),
    "tensor(int16)": ("INT16", np.dtype(np.int16)),
    "tensor(int32)": ("INT32", np.dtype(np.int32)),
    "tensor(int64)": ("INT64", np.dtype(np.int64)),
    "tensor(float16)": ("FP16", np.dtype(np.float16)),
    "tensor(float)": ("FP32", np.dtype(np.float32)),
    "tensor(double)": ("FP64", np.dtype(np.float64)),
    "tensor(string)": ("BYTES", np.dtype(object)),
}

#: KServe datatype -> the numpy dtype its values arrive in (BYTES: Python str objects)
DTYPES: dict[str, np.dtype] = {datatype: dtype for datatype, dtype in BY_ORT_TYPE.values()}

#: KServe datatype -> Triton's model-configuration type (``/config``)
CONFIG_TYPES = {datatype: "TYPE_" + ("STRING" if datatype == "BYTES" else datatype) for datatype in DTYPES}

#: numpy dtype -> KServe datatype, for outputs (strings come back from ONNX Runtime as objects)
BY_DTYPE: dict[np.dtype, str] = {dtype: datatype for datatype, dtype in DTYPES.items()}
BY_DTYPE[np.dtype(np.str_)] = "BYTES"


def of_ort_type(ort_type: str, kind: str, name: str) -> str:
    """The KServe datatype of a pipeline's input or output (``kind`` says which) declared as
    ONNX Runtime's ``ort_type``; a :class:`~fastseq.CompositionError` naming it if none fits."""
    found = BY_ORT_TYPE.get(ort_type)
    if found is not None:
        return found[0]
    why = ("ONNX Runtime's Python API cannot return bfloat16 arrays; a Cast to float32 around the pipeline serves it"
           if ort_type == "tensor(bfloat16)" else "the KServe v2 protocol has no datatype for it")
    raise CompositionError(f"cannot serve {kind} '{name}' of type {ort_type}: {why}")
