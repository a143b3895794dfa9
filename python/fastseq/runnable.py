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
    """The runtime API that ONNXSequential and ONNXModule (and the graph Pipeline) share:
    the ONNX Runtime session (``create_session``, ``get_session``, ``set_session``,
    ``as_cpu``/``as_cuda``/``as_tensorrt``/``as_openvino``, ``providers``), calls
    (``pipe(x)``, ``run``, ``inputs``, ``outputs``), the composed model (``model``,
    ``model_bytes``, ``summary``, ``export``, ``add_metadata``, ``metadata``, ``len``) and
    pickling (the composed model and the providers travel; the session is rebuilt).

    Subclasses build ``_composed`` (the core's model, weights as slices of the sources) and
    ``_labels``, then call :meth:`_start`."""

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

    def as_cpu(self, **kwargs: Any) -> Runnable:
        """Runs on the CPU from now on; returns the pipeline. ``kwargs`` are the CPU
        provider's options (e.g. ``arena_extend_strategy="kSameAsRequested"``)."""
        return self._switch([("CPUExecutionProvider", kwargs)] if kwargs else ["CPUExecutionProvider"])

    def as_cuda(self, device_id: int = 0, **kwargs: Any) -> Runnable:
        """Runs with the CUDA provider on GPU ``device_id`` (CPU as fallback) from now on;
        returns the pipeline. ``kwargs`` are more CUDA provider options
        (``gpu_mem_limit``, ``cudnn_conv_algo_search``, ...)."""
        return self._switch(
            [("CUDAExecutionProvider", {"device_id": device_id, **kwargs}), "CPUExecutionProvider"]
        )

    def as_tensorrt(self, device_id: int = 0, **kwargs: Any) -> Runnable:
        """Runs with the TensorRT provider on GPU ``device_id`` (CPU as fallback) from now on;
        returns the pipeline. ``kwargs`` are more TensorRT provider options
        (``trt_fp16_enable``, ``trt_engine_cache_enable``, ...)."""
        return self._switch(
            [("TensorrtExecutionProvider", {"device_id": device_id, **kwargs}), "CPUExecutionProvider"]
        )

    def as_openvino(self, device_type: str = "GPU", **kwargs: Any) -> Runnable:
        """Runs with the OpenVINO provider on ``device_type`` (``"CPU"``, ``"GPU"``,
        ``"GPU.0"``, ``"NPU"``, ...; CPU as fallback) from now on; returns the pipeline.
        ``kwargs`` are more OpenVINO provider options (``precision``, ``num_of_threads``, ...)."""
        return self._switch(
            [("OpenVINOExecutionProvider", {"device_type": device_type, **kwargs}), "CPUExecutionProvider"]
        )

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

    def export(
        self, file_path: str | os.PathLike[str], external_data: bool | None = None, **kwargs: Any
    ) -> Path:
        """Writes the composed model to ``file_path`` atomically and returns the path. The
        pipeline itself is not changed, whatever the options.

        ``external_data``: True puts the weights in one data file beside the model
        (``<name>.<token>.data``), False keeps them inline, None (default) decides by size
        (external above the 2 GB protobuf limit). A missing folder is an ``ExportError``.

        ``kwargs`` are ``onnx.save``'s keywords, with their meaning there (kornia passes its
        keywords to ``onnx.save``): ``save_as_external_data`` (same as ``external_data``),
        ``size_threshold`` (tensors of at least this many bytes go external; default 1024),
        ``all_tensors_to_one_file`` (False: one file per tensor, named after it),
        ``location`` (the data file's name, relative to the model's folder),
        ``convert_attribute`` (whether attribute tensors such as Constant values go external
        too; fastseq's default is True, ``onnx.save``'s is False: pass False to keep them
        inline) and ``format`` (``"protobuf"``, ``"textproto"``, ``"json"``, ...). The core
        writes the default layout itself; ``location``, one file per tensor,
        ``convert_attribute=False`` and a text format go through ``onnx.save`` on a copy.
        """
        from fastseq.export import export

        return export(self._composed, file_path, external_data, **kwargs)

    def add_metadata(self, additional_metadata: Sequence[tuple[str, Any]] | None = None) -> onnx.ModelProto:
        """Adds ``(key, value)`` pairs to the composed model's ``metadata_props``, as kornia's
        ``add_metadata`` does: ``("source", "fastseq")`` and ``("version", <fastseq version>)``
        first, then ``additional_metadata``; values are stored as ``str(value)``. A key that
        is already present keeps its position and takes the new value (``onnx.checker``
        refuses repeated keys). The metadata is kept by :meth:`export`, :attr:`model` and
        pickling; the running session is not rebuilt (metadata does not change what it
        computes). Returns the composed model as a fresh ``onnx.ModelProto`` (a copy, below
        2 GB, as kornia returns its model); the pipeline is the one to keep using."""
        from fastseq.metadata import metadata_pairs

        self._composed = self._composed.with_metadata(metadata_pairs(additional_metadata))
        return self.model

    @property
    def metadata(self) -> dict[str, str]:
        """The composed model's ``metadata_props`` as a dict, in order."""
        return dict(self._composed.metadata())

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
