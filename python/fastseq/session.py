"""The runner: one ONNX Runtime session over a composed model, with its providers, its
inputs described once, and calls checked on that description."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from fastseq import _core
from fastseq.errors import InputError, ProviderError

Provider = str | tuple[str, dict[str, Any]]

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
    shape (ints for static dimensions, strings or None for dynamic ones)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def of(cls, arg: ort.NodeArg) -> TensorInfo:
        """The description of one of a session's inputs or outputs."""
        dtype = _ORT_DTYPES.get(arg.type)
        shape = tuple(arg.shape) if arg.shape is not None else None
        return cls(arg.name, np.dtype(dtype) if dtype is not None else None, shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype if self.dtype is not None else '?'}[{dims}]"


def provider_name(p: Provider) -> str:
    return p if isinstance(p, str) else p[0]


def default_options() -> ort.SessionOptions:
    """kornia's default: extended graph optimizations."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return options


def usable_providers(providers: Sequence[Provider] | None) -> list[Provider]:
    """The requested providers that this onnxruntime build has, in order. Each missing one
    is a warning naming it and what is available, never a silent fallback; a name that no
    onnxruntime build knows (a typo) is a ProviderError with the near miss."""
    requested = list(providers) if providers else ["CPUExecutionProvider"]
    known = ort.get_all_providers()  # every provider any onnxruntime build has
    for p in requested:
        if provider_name(p) not in known:
            raise ProviderError(
                f"unknown execution provider '{provider_name(p)}'{_core.did_you_mean(provider_name(p), known)}; "
                f"this onnxruntime build has: {', '.join(ort.get_available_providers())}"
            )
    available = ort.get_available_providers()
    usable = [p for p in requested if provider_name(p) in available]
    for p in requested:
        if provider_name(p) not in available:
            warnings.warn(
                f"{provider_name(p)} is not available in this onnxruntime build "
                f"(available: {', '.join(available)}); "
                + (
                    f"using {', '.join(provider_name(u) for u in usable)}"
                    if usable
                    else "falling back to CPUExecutionProvider"
                ),
                RuntimeWarning,
                stacklevel=4,
            )
    return usable or ["CPUExecutionProvider"]


def create(
    composed: _core.Composed,
    providers: Sequence[Provider] | None = None,
    session_options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """A new session over a composed model."""
    options = session_options if session_options is not None else default_options()
    if composed.encoded_len() < _core.PROTOBUF_LIMIT:
        return ort.InferenceSession(composed.to_bytes(), sess_options=options, providers=usable_providers(providers))
    # Over 2 GB ONNX Runtime must read the model from a file with external data.
    with tempfile.TemporaryDirectory(prefix="fastseq-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        composed.save(path, external_data=True)
        return ort.InferenceSession(path, sess_options=options, providers=usable_providers(providers))


class Runner:
    """A session and the description of its inputs and outputs, read once."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.inputs = [TensorInfo.of(a) for a in session.get_inputs()]
        self.outputs = [TensorInfo.of(a) for a in session.get_outputs()]
        self._by_name = {i.name: i for i in self.inputs}
        self._output_names = {o.name for o in self.outputs}

    def call(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in input order, or ``pipe(name=array, ...)``."""
        if inputs and named:
            raise InputError("pass inputs either by position or by name, not both")
        if inputs or not named:
            if len(inputs) != len(self.inputs):
                n = len(self.inputs)
                raise InputError(
                    f"expected {n} input{'s' if n != 1 else ''} "
                    f"({', '.join(str(i) for i in self.inputs)}), got {len(inputs)}"
                )
            feeds = {info.name: x for info, x in zip(self.inputs, inputs)}
        else:
            feeds = named
        return self.run(feeds, None)

    def run(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None) -> list[np.ndarray]:
        checked = self.check_feeds(feeds)
        if output_names is not None:
            for name in output_names:
                if name not in self._output_names:
                    known = [o.name for o in self.outputs]
                    raise InputError(
                        f"'{name}' is not an output{_core.did_you_mean(name, known)}; outputs: {', '.join(known)}"
                    )
            output_names = list(output_names)
        return self.session.run(output_names, checked)

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        by_name = self._by_name
        for name in feeds:
            if name not in by_name:
                raise InputError(
                    f"'{name}' is not an input{_core.did_you_mean(name, list(by_name))}; inputs: "
                    + ", ".join(map(str, self.inputs))
                )
        if len(feeds) != len(by_name):
            missing = [i.name for i in self.inputs if i.name not in feeds]
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
        checked: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            info = by_name[name]
            array = _as_array(value, info.dtype)
            if info.dtype is not None and array.dtype != info.dtype and not (
                info.dtype.kind == "U" and array.dtype.kind in "UO"
            ):
                raise InputError(f"input '{name}' expects {info.dtype}, got {array.dtype}")
            if info.shape is not None and array.ndim != len(info.shape):
                raise InputError(
                    f"input '{name}' expects rank {len(info.shape)} {list(info.shape)}, got shape {list(array.shape)}"
                )
            for axis, (want, got) in enumerate(zip(info.shape or (), array.shape)):
                if isinstance(want, int) and want > 0 and want != got:
                    raise InputError(
                        f"input '{name}' expects size {want} on axis {axis} {list(info.shape)}, "
                        f"got shape {list(array.shape)}"
                    )
            checked[name] = array
        return checked


def _as_array(value: Any, dtype: np.dtype | None) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, as kornia takes
        return value.detach().cpu().numpy()
    # Lists and scalars carry no dtype of their own: they take the input's.
    return np.asarray(value, dtype=dtype)
