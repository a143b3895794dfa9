"""ONNXSequential: kornia's ONNXSequential, composed by the Rust core in one pass."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from fastseq import _core, loader, session
from fastseq.compose import build
from fastseq.errors import InputError, human_size

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
        dtype = _ORT_DTYPES.get(arg.type)
        shape = tuple(arg.shape) if arg.shape is not None else None
        return cls(arg.name, np.dtype(dtype) if dtype is not None else None, shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype if self.dtype is not None else '?'}[{dims}]"


class ONNXSequential:
    """Chains ONNX models into one graph and runs it with ONNX Runtime.

    A drop-in for ``kornia.onnx.ONNXSequential``: same arguments, same ``io_maps``
    convention (``io_maps[i]`` joins model ``i`` to model ``i + 1``), same call
    (``pipe(x)`` returns the list of outputs). Models may be ``onnx.ModelProto``, bytes,
    paths, ``http(s)://`` URLs, ``hf://`` Hub ids or ``builtin:NAME`` operators.
    """

    def __init__(
        self,
        *models: loader.ModelSource,
        providers: Sequence[session.Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
        io_maps: Sequence[Sequence[tuple[str, str]]] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        auto_ir_version_conversion: bool = False,
        target_ir_version: int | None = None,
        target_opset_version: int | None = None,
        force_download: bool = False,
        keep_outputs: bool | Sequence[str] = False,
        token: str | bool | None = None,
        sha256: str | Sequence[str | None] | None = None,
    ) -> None:
        if not models:
            raise TypeError("ONNXSequential needs at least one model")
        self._composed, self._labels = build(
            models,
            io_maps,
            keep_outputs,
            ir_version=target_ir_version,
            opset=target_opset_version if target_opset_version is not None
            else ("highest" if auto_ir_version_conversion else None),
            cache_dir=cache_dir,
            force_download=force_download,
            token=token,
            sha256=sha256,
        )
        self._init_session(providers, session_options)

    def _init_session(self, providers, session_options) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._model_path: str | None = None
        if self._composed.encoded_len() >= _core.PROTOBUF_LIMIT:
            # Over 2 GB ONNX Runtime must read the model from a file with external data.
            self._tmp = tempfile.TemporaryDirectory(prefix="fastseq-")
            self._model_path = os.path.join(self._tmp.name, "model.onnx")
            self._composed.save(self._model_path, external_data=True)
        self._providers = list(providers) if providers else None
        self._session_options = session_options
        self._session = self.create_session(providers, session_options)

    # --- sessions -------------------------------------------------------------------
    def create_session(
        self,
        providers: Sequence[session.Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
    ) -> ort.InferenceSession:
        """A new session over the composed model (the pipeline's own is left as it is).
        The serialized bytes exist only while the session is built: ONNX Runtime keeps its
        own copy, and the core keeps the model (weights as slices of the source files)."""
        model = self._model_path or self._composed.to_bytes()
        return session.create(model, providers, session_options)

    def get_session(self) -> ort.InferenceSession:
        return self._session

    def set_session(self, new_session: ort.InferenceSession) -> None:
        self._session = new_session

    def _switch(self, providers: list[session.Provider]) -> ONNXSequential:
        self._providers = providers
        self._session = self.create_session(providers, self._session_options)
        return self

    def as_cpu(self) -> ONNXSequential:
        return self._switch(["CPUExecutionProvider"])

    def as_cuda(self, device_id: int = 0) -> ONNXSequential:
        return self._switch([("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"])

    def as_tensorrt(self, device_id: int = 0) -> ONNXSequential:
        return self._switch([("TensorrtExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"])

    def as_openvino(self, device_type: str = "GPU") -> ONNXSequential:
        return self._switch([("OpenVINOExecutionProvider", {"device_type": device_type}), "CPUExecutionProvider"])

    @property
    def providers(self) -> list[str]:
        return self._session.get_providers()

    # --- calls ----------------------------------------------------------------------
    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo.of(a) for a in self._session.get_inputs()]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo.of(a) for a in self._session.get_outputs()]

    def __call__(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in the model's input order, or ``pipe(name=array, ...)``;
        returns every output, in order."""
        infos = self.inputs  # read once per call: run() would read them again
        if inputs and named:
            raise InputError("pass inputs either by position or by name, not both")
        if inputs or not named:
            if len(inputs) != len(infos):
                raise InputError(
                    f"expected {len(infos)} input{'s' if len(infos) != 1 else ''} "
                    f"({', '.join(str(i) for i in infos)}), got {len(inputs)}"
                )
            feeds = {info.name: x for info, x in zip(infos, inputs)}
        else:
            feeds = named
        return self._run(feeds, infos, None)

    def run(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> list[np.ndarray]:
        """Runs with ``feeds`` by input name; ``output_names`` selects outputs."""
        return self._run(feeds, self.inputs, output_names)

    def _run(
        self, feeds: Mapping[str, Any], infos: list[TensorInfo], output_names: Sequence[str] | None
    ) -> list[np.ndarray]:
        checked = _check_feeds(feeds, infos)
        if output_names is not None:
            known = [o.name for o in self.outputs]
            for name in output_names:
                if name not in known:
                    raise InputError(
                        f"'{name}' is not an output{_core.did_you_mean(name, known)}; outputs: {', '.join(known)}"
                    )
        return self._session.run(list(output_names) if output_names is not None else None, checked)

    # --- scale-out ------------------------------------------------------------------
    def map_batches(self, ds: Any, **ray_kwargs: Any) -> Any:
        """Runs this pipeline over a Ray Dataset as stateful actors (``fastseq[ray]``);
        see :func:`fastseq.ray.map_batches`. Returns the new, lazy dataset."""
        from fastseq import ray as fastseq_ray

        return fastseq_ray.map_batches(self, ds, **ray_kwargs)

    # --- the model ------------------------------------------------------------------
    @property
    def model_bytes(self) -> bytes:
        """The composed model, serialized (weights inline)."""
        return self._composed.to_bytes()

    @property
    def model(self) -> onnx.ModelProto:
        """The composed model as a fresh ``onnx.ModelProto`` (a copy: editing it changes
        nothing here). Below 2 GB only; use :meth:`export` for larger ones."""
        return onnx.ModelProto.FromString(self.model_bytes)

    def summary(self) -> dict[str, Any]:
        """Inputs, outputs, opsets, node and weight counts of the composed model."""
        return self._composed.summary()

    def export(self, path: str | os.PathLike[str], external_data: bool | None = None) -> Path:
        """Writes the composed model to ``path`` atomically, its weights in one data file
        beside it when asked or when it is over 2 GB. The pipeline itself is not changed."""
        target = Path(path).expanduser()
        self._composed.save(str(target), external_data=external_data)
        return target

    def __len__(self) -> int:
        return len(self._labels)

    def __repr__(self) -> str:
        info = self._composed.summary()
        opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in info["opsets"])
        return (
            f"ONNXSequential({' -> '.join(self._labels)}; "
            f"inputs [{'; '.join(map(str, self.inputs))}]; outputs [{'; '.join(map(str, self.outputs))}]; "
            f"opset {opsets}; IR {info['ir_version']}; {info['nodes']} nodes; "
            f"{human_size(info['weight_bytes'])} of weights; {', '.join(self.providers)})"
        )

    # Pickling keeps the composed model and the providers; the session is rebuilt.
    def __getstate__(self) -> dict[str, Any]:
        return {"model": self._composed.to_bytes(), "labels": self._labels, "providers": self._providers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._labels = state["labels"]
        self._composed = _core.load_model(state["model"], " -> ".join(self._labels))
        self._init_session(state["providers"], None)


def _check_feeds(feeds: Mapping[str, Any], infos: list[TensorInfo]) -> dict[str, np.ndarray]:
    by_name = {i.name: i for i in infos}
    for name in feeds:
        if name not in by_name:
            raise InputError(
                f"'{name}' is not an input{_core.did_you_mean(name, list(by_name))}; inputs: "
                + ", ".join(map(str, infos))
            )
    missing = [i.name for i in infos if i.name not in feeds]
    if missing:
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
                    f"input '{name}' expects size {want} on axis {axis} {list(info.shape)}, got shape {list(array.shape)}"
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
