"""What a session says of its inputs and outputs: ONNX Runtime's type strings as numpy
dtypes, and :class:`TensorInfo`, one graph input or output described once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

# onnxruntime's type strings -> numpy dtypes
_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.str_,
}


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, numpy dtype (None if not a plain tensor) and
    shape (ints for static dimensions, strings or None for dynamic ones; None as a whole
    when the model declares no shape, and then any rank is taken)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def of(cls, arg: ort.NodeArg, unshaped: bool = False) -> TensorInfo:
        """The description of one of a session's inputs or outputs; ``unshaped``: the model
        declares no shape for it (ONNX Runtime reports that as rank 0, as for a scalar)."""
        dtype = _ORT_DTYPES.get(arg.type)
        shape = tuple(arg.shape) if arg.shape is not None and not unshaped else None
        return cls(arg.name, np.dtype(dtype) if dtype is not None else None, shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype if self.dtype is not None else '?'}[{dims}]"


def unshaped(
    inputs: Iterable[ort.NodeArg], outputs: Iterable[ort.NodeArg], model_bytes: Callable[[], bytes]
) -> tuple[frozenset[str], frozenset[str]]:
    """The inputs and the outputs that the model declares without a shape. ONNX Runtime
    reports them as rank 0, like scalars, but runs them with any shape: only when it reports
    one as rank 0 is the model read (``model_bytes()``, without its weights) to tell the two
    apart."""

    def scalars(args: Iterable[ort.NodeArg]) -> set[str]:
        return {a.name for a in args if a.shape is not None and len(a.shape) == 0}

    maybe_in, maybe_out = scalars(inputs), scalars(outputs)
    if not maybe_in and not maybe_out:
        return frozenset(), frozenset()
    import onnx

    graph = onnx.ModelProto.FromString(model_bytes()).graph

    def undeclared(values: Iterable[onnx.ValueInfoProto], names: set[str]) -> frozenset[str]:
        return frozenset(
            vi.name
            for vi in values
            if vi.name in names and vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
        )

    return undeclared(graph.input, maybe_in), undeclared(graph.output, maybe_out)
