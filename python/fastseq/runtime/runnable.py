"""A composed model ready to call: the session, call, export and pickling API that
ONNXSequential (kornia's linear façade) and Pipeline (stages and edges) share."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from fastseq import _core
from fastseq.runtime import session
from fastseq.errors import human_size
from fastseq.runtime.session import TensorInfo

if TYPE_CHECKING:
    import onnx

    from fastseq.runtime.binding import Binding


#: Below this many bytes of weights in memory, a pipeline keeps them there rather than spill
#: them (weights still in the source files are always moved onto the session's copy).
SPILL_MIN = 32 << 20


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
        self,
        providers: Sequence[session.Provider] | None,
        session_options: ort.SessionOptions | None,
        session_cache: str | os.PathLike[str] | bool | None = None,
    ) -> None:
        from fastseq.runtime import cache

        self._providers = list(providers) if providers else None
        self._session_options = session_options
        self._cache_root = cache.root_from(session_cache)
        self.session_info: dict[str, Any] = {}
        self._runner = self._runner_for(self._new_session(providers, session_options, self.session_info))

    def _runner_for(self, new_session: ort.InferenceSession) -> session.Runner:
        return session.Runner(new_session, explain=self._explain)

    def _explain(self, error: Exception) -> Exception:
        """An ONNX Runtime failure as a typed error in the stages' own names."""
        origins = getattr(self._composed, "origins", None)
        renamed = origins()[1] if origins is not None else None
        return session.explain(error, self._labels, renamed)

    # --- sessions -------------------------------------------------------------------
    def create_session(
        self,
        providers: Sequence[session.Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
    ) -> ort.InferenceSession:
        """A new session over the composed model (the pipeline's own is left as it is), from
        the session cache when the pipeline has one."""
        return self._new_session(providers, session_options, None)

    def _new_session(self, providers, session_options, info: dict[str, Any] | None) -> ort.InferenceSession:
        try:
            # The list is built in the call: no name here keeps the models it replaces alive.
            with session.PrivateCopy.of(
                [self._composed, *self._sharing()], SPILL_MIN, digest=self._cache_root is not None
            ) as copy:
                spilled = self._take_spilled(copy)
                if info is not None:
                    info["copied"] = copy.info["copied"]
                    if spilled:
                        info["spilled"] = copy.info["mapped"]
                return session.open_copy(copy, providers, session_options, self._cache_root, info)
        except Exception as e:
            if type(e).__module__.startswith("onnxruntime"):
                raise self._explain(e) from e
            raise

    def _sharing(self) -> list[_core.Composed]:
        """The models besides ``_composed`` that share its memory (ONNXSequential's stages)."""
        return getattr(self, "_stages", None) or []

    def _take_spilled(self, copy: session.PrivateCopy) -> bool:
        """Swaps in the copy's spilled copies of ``_composed`` and :meth:`_sharing`'s models,
        which map the session's private copy instead of holding the sources' bytes or
        pointing at the source files; returns whether it did. Done before ONNX Runtime reads
        the copy: the weights then count once, not twice, while the session is built, not at
        all afterwards until something reads them again (an export, a new session), and no
        change to a source file reaches the pipeline."""
        spilled = copy.take_spilled()
        if spilled is None:
            return False
        self._composed, *stages = spilled
        if stages:
            self._stages = stages
        return True

    def get_session(self) -> ort.InferenceSession:
        """The session that calls run on."""
        return self._runner.session

    def set_session(self, new_session: ort.InferenceSession) -> None:
        """Runs calls on ``new_session`` from now on (its inputs are read again)."""
        self._runner = self._runner_for(new_session)

    def _switch(self, providers: list[session.Provider]) -> Runnable:
        self._providers = providers
        self.session_info = {}
        self.set_session(self._new_session(providers, self._session_options, self.session_info))
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

    def run(
        self,
        feeds: Mapping[str, Any],
        output_names: Sequence[str] | None = None,
        *,
        run_options: ort.RunOptions | None = None,
        timeout: float | None = None,
        log_level: int | None = None,
        tag: str | None = None,
    ) -> list[np.ndarray]:
        """Runs with ``feeds`` by input name; ``output_names`` selects outputs.

        ``run_options``: an ``onnxruntime.RunOptions`` (set its ``terminate`` from another
        thread to stop the call); ``timeout``: seconds after which the call is stopped;
        ``log_level`` (0 verbose .. 4 fatal) and ``tag`` go to ONNX Runtime's log. A stopped
        call raises :class:`fastseq.RunTimeoutError`."""
        if timeout is None and log_level is None and tag is None:
            return self._runner.run(feeds, output_names, run_options)
        options = run_options if run_options is not None else ort.RunOptions()
        if log_level is not None:
            options.log_severity_level = log_level
        if tag is not None:
            options.logid = tag
        if timeout is None:
            return self._runner.run(feeds, output_names, options)
        return session.with_timeout(timeout, options, lambda: self._runner.run(feeds, output_names, options))

    def bind(
        self,
        *inputs: Any,
        outputs: str = "numpy",
        output_names: Sequence[str] | None = None,
        run_options: ort.RunOptions | None = None,
        **named: Any,
    ) -> Binding:
        """IO binding: binds the inputs given (numpy arrays, torch tensors on the CPU or a GPU,
        anything with ``__dlpack__``) where they live, and output buffers allocated once and
        reused; ``binding()`` then runs with ``run_with_iobinding``. ``outputs``: "numpy",
        "torch" (on the input's device) or "ortvalue" (left where the provider put them).

        ``b = pipe.bind(x); y, = b()`` runs on ``x``'s buffer (fill it in place for the next
        call, or pass a new array: ``b(x2)``). Returned outputs are overwritten by the next call."""
        from fastseq.runtime.binding import Binding

        binding = Binding(self._runner, outputs, output_names, run_options)
        if inputs or named:
            binding.bind(*inputs, **named)
        return binding

    # --- the model ------------------------------------------------------------------
    @property
    def model_bytes(self) -> bytes:
        """The composed model, serialized (weights inline)."""
        return self._composed.to_bytes()

    @property
    def model(self) -> onnx.ModelProto:
        """The composed model as a fresh ``onnx.ModelProto`` (a copy: editing it changes
        nothing here). Below 2 GB only; use :meth:`export` for larger ones."""
        import onnx

        return onnx.ModelProto.FromString(self.model_bytes)

    def summary(self) -> dict[str, Any]:
        """Inputs, outputs, opsets, node and weight counts of the composed model."""
        return self._composed.summary()

    def export(
        self,
        file_path: str | os.PathLike[str],
        external_data: bool | None = None,
        *,
        optimized: bool = False,
        **kwargs: Any,
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

        ``optimized=True`` writes the model as ONNX Runtime leaves it after its graph
        optimisations for this pipeline's providers and session options (weights in
        ``<name>.data`` beside it), recording the providers and onnxruntime version in its
        metadata, so that a deployment can start its sessions with optimisation off.
        """
        from fastseq.runtime.export import export

        if optimized:
            if kwargs or external_data is not None:
                raise TypeError("export(optimized=True) writes its own layout: no other options")
            return session.export_optimized(self._composed, Path(file_path).expanduser(), self._providers,
                                            self._session_options)
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
        from fastseq.graph.metadata import metadata_pairs

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

    # Pickling keeps the composed model, the providers and the session cache; the session
    # is rebuilt (from the cache, when there is one).
    def __getstate__(self) -> dict[str, Any]:
        from fastseq.graph.options import session_options_dict

        return {
            "model": self._composed.to_bytes(),
            "labels": self._labels,
            "providers": self._providers,
            # SessionOptions does not pickle: its settings travel as a dict
            "session_options": session_options_dict(self._session_options),
            "session_cache": None if self._cache_root is None else str(self._cache_root),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        from fastseq.graph.options import session_options

        self._labels = state["labels"]
        self._composed = _core.load_model(state["model"], " -> ".join(self._labels))
        options = session_options(state.get("session_options") or None)
        self._start(state["providers"], options, state.get("session_cache"))
