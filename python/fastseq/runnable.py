"""A composed model ready to call: the session, call, export and pickling API that
ONNXSequential (kornia's linear façade) and Pipeline (stages and edges) share."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from fastseq import _core, session
from fastseq.errors import human_size
from fastseq.session import TensorInfo


class Runnable:
    """Holds the composed model (``_composed``, weights as slices of the sources) and the
    runner over it. Subclasses build ``_composed`` and ``_labels``, then call
    :meth:`_start`."""

    _composed: _core.Composed
    _labels: list[str]

    def _start(
        self, providers: Sequence[session.Provider] | None, session_options: ort.SessionOptions | None
    ) -> None:
        self._providers = list(providers) if providers else None
        self._session_options = session_options
        self._runner = session.Runner(self.create_session(providers, session_options))

    # --- sessions -------------------------------------------------------------------
    def create_session(
        self,
        providers: Sequence[session.Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
    ) -> ort.InferenceSession:
        """A new session over the composed model (the pipeline's own is left as it is)."""
        return session.create(self._composed, providers, session_options)

    def get_session(self) -> ort.InferenceSession:
        """The session that calls run on."""
        return self._runner.session

    def set_session(self, new_session: ort.InferenceSession) -> None:
        """Runs calls on ``new_session`` from now on (its inputs are read again)."""
        self._runner = session.Runner(new_session)

    def _switch(self, providers: list[session.Provider]) -> Runnable:
        self._providers = providers
        self.set_session(self.create_session(providers, self._session_options))
        return self

    def as_cpu(self) -> Runnable:
        """Runs on the CPU from now on; returns the pipeline."""
        return self._switch(["CPUExecutionProvider"])

    def as_cuda(self, device_id: int = 0) -> Runnable:
        """Runs with the CUDA provider (CPU as fallback) from now on; returns the pipeline."""
        return self._switch([("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"])

    def as_tensorrt(self, device_id: int = 0) -> Runnable:
        """Runs with the TensorRT provider (CPU as fallback) from now on; returns the pipeline."""
        return self._switch([("TensorrtExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"])

    def as_openvino(self, device_type: str = "GPU") -> Runnable:
        """Runs with the OpenVINO provider (CPU as fallback) from now on; returns the pipeline."""
        return self._switch([("OpenVINOExecutionProvider", {"device_type": device_type}), "CPUExecutionProvider"])

    @property
    def providers(self) -> list[str]:
        """The providers the session runs with, in priority order."""
        return self._runner.session.get_providers()

    # --- calls ----------------------------------------------------------------------
    @property
    def inputs(self) -> list[TensorInfo]:
        """The graph inputs: name, dtype and shape."""
        return list(self._runner.inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        """The graph outputs: name, dtype and shape."""
        return list(self._runner.outputs)

    def __call__(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in the model's input order, or ``pipe(name=array, ...)``;
        returns every output, in order."""
        return self._runner.call(inputs, named)

    def run(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> list[np.ndarray]:
        """Runs with ``feeds`` by input name; ``output_names`` selects outputs."""
        return self._runner.run(feeds, output_names)

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

    def _title(self) -> str:
        return " -> ".join(self._labels)

    def __repr__(self) -> str:
        info = self._composed.summary()
        opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in info["opsets"])
        return (
            f"{type(self).__name__}({self._title()}; "
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
        self._start(state["providers"], None)
