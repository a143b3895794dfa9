"""A composed model ready to call: the session, call, export and pickling API that
ONNXSequential (kornia's linear façade) and Pipeline (stages and edges) share."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from fastseq.errors import human_size
from fastseq.runtime.engine import SessionEngine
from fastseq.runtime.ort_options import check_log_level, run_copy
from fastseq.runtime.providers import Provider
from fastseq.runtime.runner import Runner
from fastseq.runtime.tensors import TensorInfo
from fastseq.runtime.timeouts import check_timeout, with_timeout

if TYPE_CHECKING:
    import onnx

    from fastseq.runtime.batcher import Batcher
    from fastseq.runtime.binding import Binding
    from fastseq.runtime.profile import Profile


class Runnable:
    """The runtime API that ONNXSequential and ONNXModule (and the graph Pipeline) share:
    the ONNX Runtime session (``create_session``, ``get_session``, ``set_session``,
    ``as_cpu``/``as_cuda``/``as_tensorrt``/``as_openvino``, ``providers``), calls
    (``pipe(x)``, ``run``, ``inputs``, ``outputs``), the composed model (``model``,
    ``model_bytes``, ``summary``, ``export``, ``add_metadata``, ``metadata``, ``len``) and
    pickling (the composed model and the providers travel; the session is rebuilt).

    The session's lifecycle is the pipeline's :attr:`engine`'s (a
    :class:`~fastseq.runtime.engine.SessionEngine`): subclasses build one over the core's
    model and call its ``start``."""

    _engine: SessionEngine

    @property
    def engine(self) -> SessionEngine:
        """The pipeline's engine: its session's lifecycle, behind the contract
        (:class:`~fastseq.runtime.engine.Engine`) that the batcher, the server, Ray and
        profiles take."""
        return self._engine

    @property
    def session_info(self) -> dict[str, Any]:
        """How the session of the moment was made: ``cache`` ("hit", "stored" or None), the
        cache entry's folder, the bytes ``copied`` and ``spilled``."""
        return self._engine.session_info

    # --- sessions -------------------------------------------------------------------
    def create_session(
        self,
        providers: Sequence[Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
    ) -> ort.InferenceSession:
        """A new session over the composed model (the pipeline's own is left as it is), from
        the session cache when the pipeline has one."""
        return self._engine.create_session(providers, session_options)

    def get_session(self) -> ort.InferenceSession:
        """The session that calls run on."""
        return self._engine.runner.session

    def set_session(self, new_session: ort.InferenceSession) -> None:
        """Runs calls on ``new_session`` from now on (its inputs are read again)."""
        self._engine.set_session(new_session)

    def _switch(self, providers: list[Provider]) -> Runnable:
        self._engine.switch(providers)
        return self

    def as_cpu(self, **kwargs: Any) -> Runnable:
        """Runs on the CPU from now on; returns the pipeline. ``kwargs`` are the CPU
        provider's options (e.g. ``arena_extend_strategy="kSameAsRequested"``)."""
        return self._switch([("CPUExecutionProvider", kwargs)] if kwargs else ["CPUExecutionProvider"])

    def as_cuda(self, device_id: int = 0, **kwargs: Any) -> Runnable:
        """Runs with the CUDA provider on GPU ``device_id`` (CPU as fallback) from now on;
        returns the pipeline. ``kwargs`` are more CUDA provider options
        (``gpu_mem_limit``, ``cudnn_conv_algo_search``, ...)."""
        return self._switch([("CUDAExecutionProvider", {"device_id": device_id, **kwargs}), "CPUExecutionProvider"])

    def as_tensorrt(self, device_id: int = 0, **kwargs: Any) -> Runnable:
        """Runs with the TensorRT provider on GPU ``device_id`` (CPU as fallback) from now on;
        returns the pipeline. ``kwargs`` are more TensorRT provider options
        (``trt_fp16_enable``, ``trt_engine_cache_enable``, ...)."""
        return self._switch([("TensorrtExecutionProvider", {"device_id": device_id, **kwargs}), "CPUExecutionProvider"])

    def as_openvino(self, device_type: str = "GPU", **kwargs: Any) -> Runnable:
        """Runs with the OpenVINO provider on ``device_type`` (``"CPU"``, ``"GPU"``,
        ``"GPU.0"``, ``"NPU"``, ...; CPU as fallback) from now on; returns the pipeline.
        ``kwargs`` are more OpenVINO provider options (``precision``, ``num_of_threads``, ...)."""
        return self._switch(
            [("OpenVINOExecutionProvider", {"device_type": device_type, **kwargs}), "CPUExecutionProvider"]
        )

    @property
    def runner(self) -> Runner:
        """The runner that calls go through at this moment (``as_cuda`` and the like replace
        it): the session, its inputs' checks, and calls checked on them. What the batcher
        calls, and what a tool beside the pipeline calls to run it as ``pipe(x)`` does."""
        return self._engine.runner

    @property
    def providers(self) -> list[str]:
        """The providers the session runs with, in priority order."""
        return self._engine.runner.session.get_providers()

    # --- calls ----------------------------------------------------------------------
    @property
    def inputs(self) -> list[TensorInfo]:
        """The graph inputs: name, dtype and shape."""
        return list(self._engine.runner.inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        """The graph outputs: name, dtype and shape."""
        return list(self._engine.runner.outputs)

    def __call__(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in the model's input order, or ``pipe(name=array, ...)``;
        returns every output, in order. Every entry point takes inputs by one rule: an
        array of the input's dtype as it is, one that converts to it without changing a
        value (numpy's safe casts: int32 to int64, float16 to float32) converted, anything
        else an :class:`fastseq.InputError` naming the input; lists take the input's dtype
        unless a value would change; an input declared without a shape takes any shape."""
        return self._engine.runner.call(inputs, named)

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
        ``log_level`` (0 verbose .. 4 fatal) and ``tag`` go to ONNX Runtime's log. fastseq
        never changes ``run_options``: ``timeout``, ``log_level`` and ``tag`` go on a copy
        for this call (one stopped by its timeout stops no other call sharing them). A stopped
        call raises :class:`fastseq.RunTimeoutError`; a ``timeout`` that is not a positive,
        finite number, or a ``log_level`` out of range, is an :class:`fastseq.InputError`. A
        failed call raises :class:`fastseq.RunError` naming the stage; ONNX Runtime's own
        log line for it is left out unless ``log_level`` or ``run_options`` ask for it."""
        check_timeout(timeout)
        check_log_level(log_level)
        if timeout is None and log_level is None and tag is None:
            return self._engine.runner.run(feeds, output_names, run_options)
        # This call's settings go on run options of its own, a copy of the caller's: theirs
        # are never changed, and a timeout stops no other call that shares them.
        options = run_copy(run_options)
        if log_level is not None:
            options.log_severity_level = log_level
        if tag is not None:
            options.logid = tag
        return with_timeout(
            timeout, options, lambda: self._engine.runner.run(feeds, output_names, options), run_options
        )

    async def run_async(
        self, *inputs: Any, timeout: float | None = None, run_options: ort.RunOptions | None = None, **named: Any
    ) -> list[np.ndarray]:
        """``await pipe.run_async(x)``: ``pipe(x)`` from asyncio (FastAPI, aiohttp), same
        checks and outputs. The call runs on ONNX Runtime's ``run_async`` (a thread of the
        session's intra-op pool; no thread is started per call; with
        ``intra_op_num_threads=1`` the loop's default executor). Cancelling the awaiting task
        stops the run through run options of its own, a copy of ``run_options`` (which are
        never changed: other calls sharing them go on; setting their ``terminate`` stops this
        one too); ``timeout`` as in :meth:`run` (:class:`fastseq.RunTimeoutError`; one that
        is not a positive, finite number is an :class:`fastseq.InputError`)."""
        check_timeout(timeout)
        runner = self._engine.runner
        return await runner.run_async(runner.feeds(inputs, named), runner.output_names(None), run_options, timeout)

    def batcher(self, max_batch_size: int = 32, max_delay_ms: float = 0.0, **options: Any) -> Batcher:
        """Dynamic batching for many concurrent callers (``batcher(x)`` from threads, ``await
        batcher.run_async(x)`` from coroutines): one worker joins everything queued along the batch
        axis and runs it once, on the CPU on a session of its own (``share_session=True``: on this one);
        a pipeline whose rows may mix is refused unless ``row_independent=True``. ``options``:
        :class:`fastseq.Batcher`'s keywords (``row_independent``, ``share_session``, ``on_batch``)."""
        from fastseq.runtime.batcher import Batcher

        if getattr(self, "row_independent", False) is True:  # declared by the pipeline's description
            options.setdefault("row_independent", True)
        return Batcher(self._engine, max_batch_size, max_delay_ms, **options)

    def check_rows(self) -> None:
        """Raises :class:`fastseq.CompositionError` naming the stage and node if a batch's rows
        may mix (the core's verdict)."""
        self._engine.check_rows()

    def profile(self, *inputs: Any, runs: int = 20, warmup: int = 3, **named: Any) -> Profile:
        """Where the time goes, per stage: ONNX Runtime's profiler on a profiling session of
        the composed model (this pipeline's own session is untouched), ``warmup`` runs then
        ``runs`` measured ones on ``inputs``, every merged node mapped back to its stage and
        its own name. Returns a :class:`fastseq.Profile`: ``str()`` is a
        table, ``to_dict()`` the numbers; ``Pipeline.to_dot(profile=...)`` draws them.
        ``runs`` that is not an int >= 1, or ``warmup`` not an int >= 0, is an
        :class:`fastseq.InputError`; profiling is switched on in a copy of the pipeline's
        session options, never in the caller's."""
        from fastseq.runtime import profile

        profile.check_runs(runs, warmup)
        feeds = self._engine.runner.feeds(inputs, named)
        return profile.measure(self._engine, feeds, runs, warmup)

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
        call, or pass a new array: ``b(x2)``). Returned outputs are overwritten by the next call.
        An input that is not C-contiguous (a strided view, Fortran order) cannot be bound in
        place and is an :class:`fastseq.InputError` (bind ``np.ascontiguousarray(x)``), as is
        an unknown ``outputs``. A binding is one thread's: threads make one each (concurrent
        use raises RunError)."""
        from fastseq.runtime.binding import Binding

        binding = Binding(self._engine.runner, outputs, output_names, run_options)
        if inputs or named:
            binding.bind(*inputs, **named)
        return binding

    # --- the model ------------------------------------------------------------------
    @property
    def model_bytes(self) -> bytes:
        """The composed model, serialized (weights inline)."""
        return self._engine.composed.to_bytes()

    @property
    def model(self) -> onnx.ModelProto:
        """The composed model as a fresh ``onnx.ModelProto`` (a copy: editing it changes
        nothing here). Below 2 GB only; use :meth:`export` for larger ones."""
        import onnx

        return onnx.ModelProto.FromString(self.model_bytes)

    def summary(self) -> dict[str, Any]:
        """Inputs, outputs, opsets, node and weight counts of the composed model."""
        return self._engine.composed.summary()

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
        (``<name>.data``; a name with a token, ``<name>.fastseq-<8 hex>.data``, when a file
        that fastseq did not write holds that one), False keeps them inline, None (default) decides by size
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
        optimisations for this pipeline's providers and session options (weights in a data
        file beside it, as above: ONNX Runtime starts faster from external data), recording the
        providers and onnxruntime version in its metadata, so that a deployment can start its
        sessions with optimisation off.
        """
        from fastseq.runtime.export import export

        if optimized:
            if kwargs or external_data is not None:
                raise TypeError("export(optimized=True) writes its own layout: no other options")
            target = Path(file_path).expanduser()
            from fastseq.runtime.optimized import export_optimized

            engine = self._engine
            export_optimized(engine.composed, target, engine.requested_providers, engine.session_options())
            return target
        return export(self._engine.composed, file_path, external_data, **kwargs)

    def add_metadata(self, additional_metadata: Sequence[tuple[str, Any]] | None = None) -> onnx.ModelProto:
        """Adds ``(key, value)`` pairs to the composed model's ``metadata_props``, as kornia's
        ``add_metadata`` does: ``source`` and ``version`` first (kornia's in a program that has
        imported kornia, else ``("source", "fastseq")`` and fastseq's version), then
        ``additional_metadata``; values are stored as ``str(value)``. A key that
        is already present keeps its position and takes the new value (``onnx.checker``
        refuses repeated keys). The metadata is kept by :meth:`export`, :attr:`model` and
        pickling; the running session is not rebuilt (metadata does not change what it
        computes). Returns the composed model as a fresh ``onnx.ModelProto`` (a copy, below
        2 GB, as kornia returns its model); the pipeline is the one to keep using."""
        from fastseq.graph.metadata import metadata_pairs

        self._engine.add_metadata(metadata_pairs(additional_metadata))
        return self.model

    @property
    def metadata(self) -> dict[str, str]:
        """The composed model's ``metadata_props`` as a dict, in order."""
        return dict(self._engine.composed.metadata())

    def __len__(self) -> int:
        return len(self._engine.labels)

    def _title(self) -> str:
        return " -> ".join(self._engine.labels)

    def __repr__(self) -> str:
        info = self._engine.composed.summary()
        opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in info["opsets"])
        return (
            f"{type(self).__name__}({self._title()}; "
            f"inputs [{'; '.join(map(str, self.inputs))}]; outputs [{'; '.join(map(str, self.outputs))}]; "
            f"opset {opsets}; IR {info['ir_version']}; {info['nodes']} nodes; "
            f"{human_size(info['weight_bytes'])} of weights; {', '.join(self.providers)})"
        )

    # --- another process ----------------------------------------------------------------
    def portable(self) -> dict[str, Any]:
        """What rebuilds this pipeline's runtime in another process (a Ray actor, pickling),
        as a dict of picklable values: ``model`` (the composed model's bytes), ``labels``
        and ``origins`` (the stages, so that errors there name them too), ``providers`` (as
        requested), ``session_options`` (a dict of their settings) and ``session_cache``
        (the cache, its folder and limit, or None). Change what the other side needs and
        pass it to :meth:`from_portable`."""
        return self._engine.portable()

    @staticmethod
    def from_portable(portable: Mapping[str, Any]) -> Runnable:
        """The runtime of a pipeline rebuilt from :meth:`portable`'s dict (``model`` may also
        be the path of an exported model), its session started: calls, their checks and
        errors (in the stages' names), IO binding and export as in the original."""
        runnable = Runnable.__new__(Runnable)
        runnable._engine = SessionEngine.from_portable(portable)
        return runnable

    # Pickling keeps the composed model, its origins, the providers and the session cache (its
    # folder and limit); the session is rebuilt (from the cache, when there is one).
    def __getstate__(self) -> dict[str, Any]:
        return self.portable()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._engine = SessionEngine.from_portable(state)
