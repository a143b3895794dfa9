"""The engine: a composed model's session lifecycle (its ONNX Runtime session started,
replaced and rebuilt elsewhere, through the session cache when there is one), and the typed
contract (:class:`Engine`) that everything running a pipeline from outside its own class
takes: the batcher, the served model, Ray Data and Ray Serve, profiles. They reach the
engine through that contract alone, never through a pipeline's private attributes."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import onnxruntime as ort

from fastseq import _core
from fastseq.errors import InputError
from fastseq.runtime import session
from fastseq.runtime.ort_options import session_copy
from fastseq.runtime.private_copy import PrivateCopy
from fastseq.runtime.providers import Provider, check_provider_options
from fastseq.runtime.runner import Runner
from fastseq.runtime.tensors import TensorInfo, unshaped

if TYPE_CHECKING:
    from fastseq.runtime.cache import SessionCache

#: Below this many bytes of weights in memory, a pipeline keeps them there rather than spill
#: them (weights still in the source files are always moved onto the session's copy).
SPILL_MIN = 32 << 20

#: Origins as the core gives them: the stages (label, first node, end) and renamed values.
Origins = tuple[list[tuple[str, int, int]], dict[str, tuple[int, str]]]


@runtime_checkable
class Engine(Protocol):
    """What a pipeline's runtime offers the code that runs it from outside: the batcher, the
    served model, Ray and profiles take this, not a pipeline's class. Every fastseq pipeline
    has one (``pipe.engine``); :func:`engine_of` takes either."""

    @property
    def runner(self) -> Runner:
        """The runner that calls go through at this moment (``as_cuda`` and the like replace it)."""
        ...

    @property
    def composed(self) -> _core.Composed:
        """The core's composed model: its origins, nodes and the verdict on its rows."""
        ...

    @property
    def labels(self) -> list[str]:
        """The stages, in order."""
        ...

    @property
    def inputs(self) -> list[TensorInfo]:
        """The graph inputs of the session of the moment."""
        ...

    @property
    def outputs(self) -> list[TensorInfo]:
        """The graph outputs of the session of the moment."""
        ...

    def check_rows(self) -> None:
        """Raises :class:`fastseq.CompositionError` naming the stage and node if a batch's rows may mix."""
        ...

    def batch_runner(self) -> Runner:
        """The runner that batches with waiting threads run on (see :meth:`SessionEngine.batch_runner`)."""
        ...

    def session_options(self) -> ort.SessionOptions:
        """A copy of the pipeline's session options, for one session's own settings."""
        ...

    def open_session(self, session_options: ort.SessionOptions) -> ort.InferenceSession:
        """A new session with the pipeline's providers on ``session_options``; the pipeline's
        own session is left as it is."""
        ...

    def portable(self) -> dict[str, Any]:
        """What rebuilds this runtime in another process, as picklable values."""
        ...


@runtime_checkable
class Pipelined(Protocol):
    """Anything that runs on an engine: every fastseq pipeline (``pipe.engine``)."""

    @property
    def engine(self) -> Engine: ...


def engine_of(pipe: Engine | Pipelined) -> Engine:
    """The engine of a pipeline, or ``pipe`` itself where it is one; anything else is an
    :class:`fastseq.InputError`."""
    if isinstance(pipe, Engine):
        return pipe
    if isinstance(pipe, Pipelined):
        return pipe.engine
    raise InputError(f"expected a fastseq pipeline (ONNXSequential, ONNXModule, Pipeline), got {type(pipe).__name__}")


class SessionEngine:
    """The session lifecycle of one composed model: the session started over its private
    copy (from the session cache where there is one), replaced (other providers, another
    session), a second one for the batcher, and what rebuilds it in another process.
    Implements :class:`Engine`.

    ``composed``: the core's model (weights as slices of the sources); ``stages``: the models
    that share its memory (ONNXSequential's, swapped with it when spilled); ``described``:
    what a session-cache entry records of the stages; ``origins``: the core's origins where
    ``composed`` no longer has them (a model rebuilt from its bytes). :meth:`start` starts
    the session."""

    def __init__(
        self,
        composed: _core.Composed,
        labels: Sequence[str],
        *,
        stages: list[_core.Composed] | None = None,
        described: Sequence[str] | None = None,
        origins: Origins | None = None,
    ) -> None:
        self._composed = composed
        self._labels = list(labels)
        self._stages = stages
        self._described = list(described) if described else None
        self._origins = origins
        self._providers: list[Provider] | None = None
        self._options: ort.SessionOptions | None = None
        self._cache: SessionCache | None = None
        #: how the session of the moment was made: ``cache`` ("hit", "stored", None), the
        #: entry's folder, ``copied`` and ``spilled`` bytes
        self.session_info: dict[str, Any] = {}
        self._runner: Runner | None = None
        # The batchers' runner, made once per runner of the moment (see batch_runner).
        self._batch: tuple[Runner, Runner] | None = None
        self._batch_lock = threading.Lock()

    def start(
        self,
        providers: Sequence[Provider] | None,
        session_options: ort.SessionOptions | None,
        session_cache: SessionCache | str | os.PathLike[str] | bool | None = None,
    ) -> None:
        """Starts the session with ``providers`` and the caller's ``session_options`` (never
        changed), through ``session_cache`` (see :func:`fastseq.runtime.cache.root_from`)."""
        from fastseq.runtime import cache

        caller_options(session_options)
        self._providers = list(providers) if providers else None
        self._options = session_options
        self._cache = cache.root_from(session_cache)
        self.session_info = {}
        self._runner = self.runner_for(self._new_session(providers, session_options, self.session_info))
        check_provider_options(providers, self._runner.session)  # options a provider does not have

    # --- what the engine holds -------------------------------------------------------------
    @property
    def runner(self) -> Runner:
        assert self._runner is not None, "SessionEngine.start() first"
        return self._runner

    @property
    def composed(self) -> _core.Composed:
        return self._composed

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def stages(self) -> list[_core.Composed] | None:
        """The models the pipeline was built from (ONNXSequential's), or None (unpickled)."""
        return self._stages

    @property
    def requested_providers(self) -> list[Provider] | None:
        """The providers as requested (names or ``(name, options)`` pairs), None: the default."""
        return self._providers

    @property
    def inputs(self) -> list[TensorInfo]:
        return list(self.runner.inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        return list(self.runner.outputs)

    def session_options(self) -> ort.SessionOptions:
        # The caller's options, not the session's: those may hold what the session cache set
        # for that one session (the optimised model's file), which a caller's may not name.
        return session_copy(self._options)

    def add_metadata(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Sets ``pairs`` in the composed model's ``metadata_props`` (the session stays: metadata
        does not change what it computes)."""
        self._composed = self._composed.with_metadata(pairs)

    # --- sessions ----------------------------------------------------------------------------
    def runner_for(self, new_session: ort.InferenceSession) -> Runner:
        """A runner over ``new_session``: its checks computed, its errors in the stages' names."""
        undeclared = unshaped(new_session.get_inputs(), new_session.get_outputs(), self._composed.stripped_bytes)
        return Runner(new_session, explain=self.explain, reader=self._reader, unshaped=undeclared)

    def create_session(
        self, providers: Sequence[Provider] | None = None, session_options: ort.SessionOptions | None = None
    ) -> ort.InferenceSession:
        """A new session over the composed model with these providers and options (None: the
        defaults, as kornia's ``create_session``), from the session cache when there is one."""
        caller_options(session_options)
        return self._new_session(providers, session_options, None)

    def open_session(self, session_options: ort.SessionOptions) -> ort.InferenceSession:
        return self._new_session(self._providers, session_options, None)

    def set_session(self, new_session: ort.InferenceSession) -> None:
        """Runs calls on ``new_session`` from now on (its inputs are read again)."""
        self._runner = self.runner_for(new_session)

    def switch(self, providers: list[Provider]) -> None:
        """A new session with ``providers`` (and the pipeline's options) for calls from now on."""
        self._providers = providers
        self.session_info = {}
        self.set_session(self._new_session(providers, self._options, self.session_info))

    def _new_session(
        self,
        providers: Sequence[Provider] | None,
        session_options: ort.SessionOptions | None,
        info: dict[str, Any] | None,
    ) -> ort.InferenceSession:
        def adopt(copy: PrivateCopy) -> None:
            spilled = self._take_spilled(copy)
            if info is not None:
                info["copied"] = copy.info.copied
                if spilled:
                    info["spilled"] = copy.info.mapped

        try:
            # The list is built in the call: no name here keeps the models it replaces alive.
            if self._cache is not None:
                return session.open_cached(
                    [self._composed, *(self._stages or [])],
                    SPILL_MIN,
                    providers,
                    session_options,
                    self._cache,
                    info if info is not None else {},
                    self._described or self._labels,
                    adopt,
                )
            with PrivateCopy.of([self._composed, *(self._stages or [])], SPILL_MIN) as copy:
                adopt(copy)
                return session.open_copy(copy, providers, session_options)
        except Exception as e:
            if type(e).__module__.startswith("onnxruntime"):
                raise self.explain(e) from e
            raise

    def _take_spilled(self, copy: PrivateCopy) -> bool:
        """Swaps in the copy's spilled copies of the composed model and its stages, which map
        the session's private copy instead of holding the sources' bytes or pointing at the
        source files; returns whether it did. Done before ONNX Runtime reads the copy: the
        weights then count once, not twice, while the session is built, not at all afterwards
        until something reads them again (an export, a new session), and no change to a
        source file reaches the pipeline."""
        spilled = copy.take_spilled()
        if spilled is None:
            return False
        self._composed, *stages = spilled
        if stages:
            self._stages = stages
        return True

    def batch_runner(self) -> Runner:
        """A runner over a session of the batchers' own, on the CPU: the pipeline's options with
        ONNX Runtime's spinning off. Between the parallel parts of a run, spinning pool threads
        busy-wait on the cores that the callers' Python needs while the batcher's worker runs a
        batch; off, the batcher measured 1.4-2.5x the rows/s on two cores
        (benches/bench_serve.py). Elsewhere (a GPU), or where the pipeline's options set
        spinning themselves, the runner of the moment: a second session would hold the weights
        twice, or override the caller's choice. Made once per session of the moment, shared by
        the pipeline's batchers."""
        base = self.runner
        with self._batch_lock:
            if self._batch is not None and self._batch[0] is base:
                return self._batch[1]
            own = self._spinless(base)
            self._batch = (base, own)
            return own

    def _spinless(self, base: Runner) -> Runner:
        providers = base.session.get_providers()
        if providers != ["CPUExecutionProvider"]:
            return base
        options = self.session_options()
        key = "session.intra_op.allow_spinning"
        try:
            options.get_session_config_entry(key)  # the caller's own choice stands
            return base
        except RuntimeError:  # onnxruntime raises for an entry that was never set
            options.add_session_config_entry(key, "0")
        return self.runner_for(self.create_session(providers, options))

    # --- errors in the stages' names ----------------------------------------------------------
    def _reader(self, name: str) -> str:
        """Which stages read graph input ``name``, in their own names (from the core's plan;
        nothing for a pipeline of one stage, or one rebuilt from its bytes)."""
        plan = self._composed.plan()
        if len(plan["stages"]) < 2:
            return ""
        readers = dict(plan["inputs"]).get(name) or []
        return "read by " + ", ".join(f"stage {stage} as '{own}'" for stage, own in readers) if readers else ""

    def explain(self, error: Exception) -> Exception:
        """An ONNX Runtime failure as a typed error in the stages' own names: any node or
        tensor that ONNX Runtime names is traced to its stage through the core's origins."""
        from fastseq.runtime.explain import explain, node_names

        stages, renamed = self.stage_origins()
        # The origins' stages: the pipeline's, or those of the stage map of a file it loaded.
        labels = [label for label, _, _ in stages] if len(stages) > 1 else self._labels
        return explain(
            error,
            labels,
            renamed,
            [(first, end) for _, first, end in stages],
            lambda: node_names(self._composed),
        )

    def stage_origins(self) -> Origins:
        """The core's origins of the composed model: stages and renamed values (adapters too)."""
        if self._origins is not None:
            return self._origins
        stages, renamed = self._composed.origins()
        from fastseq.runtime.explain import adapter_origins

        return stages, {**renamed, **adapter_origins(self._composed, stages)}

    def check_rows(self) -> None:
        from fastseq.runtime.rows import check_rows

        if findings := self._composed.row_mixing():  # the stages' names only for a finding to name
            check_rows(findings, *self.stage_origins(), self._composed.inserted_nodes())

    # --- another process ----------------------------------------------------------------------
    def portable(self) -> dict[str, Any]:
        """``model`` (the composed model's bytes), ``labels`` and ``origins`` (so that errors
        there name the stages too), ``providers`` (as requested), ``session_options`` (a dict
        of their settings: SessionOptions does not pickle) and ``session_cache``."""
        from fastseq.graph.session_settings import session_options_dict

        return {
            "model": self._composed.to_bytes(),
            "labels": list(self._labels),
            "origins": self.stage_origins(),
            "providers": self._providers,
            "session_options": session_options_dict(self._options),
            "session_cache": self._cache,
        }

    @classmethod
    def from_portable(cls, state: Mapping[str, Any], options: ort.SessionOptions | None = None) -> SessionEngine:
        """The engine that :meth:`portable`'s dict describes (``model`` may also be the path
        of an exported model), its session started; ``options`` in place of the dict's."""
        from fastseq.graph.session_settings import session_options

        labels = list(state["labels"])
        engine = cls(_core.load_model(state["model"], " -> ".join(labels)), labels, origins=state.get("origins"))
        if options is None:
            options = session_options(state.get("session_options") or None)
        engine.start(state.get("providers"), options, state.get("session_cache"))
        return engine


def caller_options(options: ort.SessionOptions | None) -> None:
    """A caller's options never make ONNX Runtime write a file (docs/security.md, "Files that
    ONNX Runtime would write"); fastseq's own copies do (a cache entry, a profile)."""
    from fastseq.graph.session_settings import file_option

    if found := file_option(options):
        raise InputError(
            f"session_options.{found[0]}: fastseq writes files only through its own writer, and a "
            f"session may start many times (the session cache, pickling, Ray actors); use {found[1]}"
        )
