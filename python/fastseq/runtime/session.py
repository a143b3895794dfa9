"""The runner: one ONNX Runtime session over a composed model, with its providers, its
inputs described once, and calls checked on that description."""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from fastseq import _core
from fastseq.errors import InputError, LoadError, ProviderError

if TYPE_CHECKING:
    from fastseq.runtime.cache import SessionCache

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


@dataclass
class PrivateCopy:
    """A composed model written for ONNX Runtime into a folder only this process uses (in
    the temporary folder, removed on exit): ``path``. It holds no reference to the model, so that a caller can let go of the model's memory while ONNX Runtime builds a
    session from the copy (:func:`open_copy`).

    ONNX Runtime gets the model as a file with its weights in a data file beside it, written
    by the core into a private folder (not synced: the page cache) and removed once the
    session exists: ONNX Runtime maps the weights instead of parsing them out of one
    serialized buffer (it starts faster from external data than from inline weights), and
    the session no longer depends on the source files. The weights go from the sources into
    the data file in the kernel (``copy_file_range``, or ``sendfile`` across file systems),
    never through this process's memory; only weights that exist in memory alone are
    written. ``info`` says how many bytes each way (``copied``, ``written``) and how many the
    spilled models map (``mapped``): the core's :class:`fastseq._core.PrivateCopyInfo`."""

    folder: str
    path: str
    info: _core.PrivateCopyInfo
    #: with ``spill_min``: copies of the models given that map the copy's data file, or None
    spilled: list[_core.Composed] | None = None

    @classmethod
    def of(
        cls, models: _core.Composed | Sequence[_core.Composed], spill_min: int | None = None
    ) -> PrivateCopy:
        """Writes the copy of ``models`` (one composed model, or it followed by the models
        that share its memory). Its files are not synced: they
        live in the page cache, which the system can reclaim.

        With ``spill_min``, ``spilled`` holds copies of ``models`` that map the copy's data
        file instead of their sources: always when they still hold weights in the source
        files (a pipeline must not depend on them), and when they hold at least
        ``spill_min`` bytes of weights in memory. The caller swaps them in and lets the
        originals go before ONNX Runtime reads the copy, so the weights count once, not
        twice. The mapping keeps the data file alive, unlinked, once the folder is gone."""
        models = [models] if isinstance(models, _core.Composed) else list(models)
        models[0].check_sources()  # the files still referred to are the ones loaded
        folder = tempfile.mkdtemp(prefix="fastseq-session-")
        try:
            path = os.path.join(folder, "model.onnx")
            info, copies = _core.write_private_copy(models, path, spill_min)
            del models  # the caller decides how long the originals live
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(folder, path, info, copies)

    def take_spilled(self) -> list[_core.Composed] | None:
        """The spilled copies (see :meth:`of`), handed over: the copy keeps no reference."""
        spilled, self.spilled = self.spilled, None
        return spilled

    def __enter__(self) -> PrivateCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def open_copy(
    copy: PrivateCopy,
    providers: Sequence[Provider] | None = None,
    session_options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """A session over a private copy (see :class:`PrivateCopy`)."""
    options = session_options if session_options is not None else default_options()
    return _session(copy.path, options, usable_providers(providers))


class PendingCopy:
    """A private copy (:meth:`PrivateCopy.of`) written on a thread of its own while the
    caller does something else: the core releases the GIL, and the kernel does the copying.
    :meth:`result` waits for it (and raises what writing it raised) and, the first time,
    hands it to ``adopt`` (to swap in its spilled models); :meth:`close` waits and removes
    it."""

    def __init__(
        self, models: Sequence[_core.Composed], spill_min: int | None, adopt: Callable[[PrivateCopy], None]
    ) -> None:
        import threading

        self._args: tuple | None = (list(models), spill_min)
        self._adopt: Callable[[PrivateCopy], None] | None = adopt
        self._copy: PrivateCopy | None = None
        self._error: BaseException | None = None
        #: once adopted: the first model spilled onto the copy (it reads the copy's weights), or
        #: None when nothing was spilled (the weights stayed in memory)
        self.mapped: _core.Composed | None = None
        self._thread = threading.Thread(target=self._write, name="fastseq-copy", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        try:
            models, spill_min = self._args
            self._args = None  # the caller decides how long the models live
            self._copy = PrivateCopy.of(models, spill_min)
        except BaseException as e:
            self._error = e

    def result(self) -> PrivateCopy:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._copy is not None
        if self._adopt is not None:
            adopt, self._adopt = self._adopt, None
            self.mapped = self._copy.spilled[0] if self._copy.spilled else None  # before adopt takes them
            adopt(self._copy)
        return self._copy

    def close(self) -> None:
        self._thread.join()
        self.mapped = None
        if self._copy is not None:
            self._copy.__exit__()


def open_cached(
    models: Sequence[_core.Composed],
    spill_min: int | None,
    providers: Sequence[Provider] | None,
    session_options: ort.SessionOptions | None,
    cache: SessionCache,
    info: dict[str, Any],
    labels: Sequence[str],
    adopt: Callable[[PrivateCopy], None],
) -> ort.InferenceSession:
    """A session over ``models[0]`` (the models sharing its memory after it) through the
    session cache: the optimised model is stored there on the first start and loaded with
    optimisation off on later ones (see :mod:`fastseq.runtime.cache`; ``labels``, the stages,
    are recorded with the entry). ``info`` is filled with how the session was made:
    ``cache`` ("hit", "stored" or None) and the entry's folder.

    The private copy is still written (the pipeline must not depend on its sources), on a
    thread beside the rest: the key is the model's digest, read by the core from where the
    weights are while the kernel copies them; on a hit ONNX Runtime loads the entry
    meanwhile (unless the models hold ``spill_min`` bytes in memory, which the copy lets
    go of first), and on a miss it loads the copy once written. ``adopt`` receives the copy
    when it is written, before ONNX Runtime reads it (to swap in its spilled models); on a
    hit, before this returns."""
    from fastseq.runtime import cache as session_cache

    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    models = list(models)
    pending = PendingCopy(models, spill_min, adopt)

    def checked() -> str:
        """The copy, for a start that may store an entry under the key: the key and the copy
        read the sources apart (each checking the files are the ones loaded), so before an
        entry outlives this start the copy is read back against the key. Weights held in
        memory (nothing mapped) cannot have changed between the two."""
        path = pending.result().path
        if pending.mapped is not None and _core.model_digest(pending.mapped) != digest:
            raise LoadError(
                "a source file changed while the pipeline was built (the weights copied differ from those the "
                "session cache's key read); nothing was cached: build the pipeline again"
            )
        return path

    def make(path: str, optimise: bool, save_to: str | None) -> ort.InferenceSession:
        return _session(path, options, usable, optimise, save_to, session_cache.DATA)

    try:
        digest = _core.model_digest(models[0])  # a source changed since it was loaded fails here, by name
        if spill_min is not None and _core.memory_bytes(models) >= spill_min:
            # The copy lets go of the weights the models hold in memory: ONNX Runtime loads
            # the entry after it, so that they do not count twice.
            pending.result()
        del models
        parts = session_cache.key_parts(digest, usable, options)
        made = session_cache.start(cache, parts, labels, info, make, checked)
        pending.result()  # a hit: the pipeline still takes the copy, or fails as the copy failed
        return made
    finally:
        pending.close()


def _session(
    path: str,
    options: ort.SessionOptions,
    providers: list[Provider],
    optimise: bool = True,
    save_to: str | Path | None = None,
    data_name: str | None = None,
) -> ort.InferenceSession:
    """A session from a model file; the caller's options are changed only for the call."""
    level, saved_path = options.graph_optimization_level, options.optimized_model_filepath
    try:
        if not optimise:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if save_to is not None:
            options.optimized_model_filepath = str(save_to)
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                             str(_core.LAYOUT.threshold))
        made = ort.InferenceSession(path, sess_options=options, providers=providers)
        warn_if_optimized_elsewhere(made, providers)
        return made
    finally:
        options.graph_optimization_level = level
        options.optimized_model_filepath = saved_path


def quiet_run_options() -> ort.RunOptions:
    """Run options whose log shows no errors: fastseq raises each one itself, in the stages'
    names (:func:`explain`), and ONNX Runtime would print it on stderr first. Its warnings
    (an output of another shape than declared, for one) come from the session's log and
    still show."""
    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


@dataclass(frozen=True)
class _Check:
    """One input's checks, computed once per session: what a call compares against."""

    name: str
    dtype: np.dtype | None
    ndim: int | None
    static: tuple[tuple[int, int], ...]  # (axis, size) for each fixed dimension
    # The fixed sizes read out of a shape in one C call, and what they must be: a call's
    # check costs a fraction of a generator over ``static``.
    fixed_of: Callable[[tuple[int, ...]], Any] | None = None
    fixed: Any = None

    @classmethod
    def of(cls, info: TensorInfo) -> _Check:
        static = tuple((axis, d) for axis, d in enumerate(info.shape or ()) if isinstance(d, int) and d > 0)
        if not static:
            return cls(info.name, info.dtype, len(info.shape) if info.shape is not None else None, static)
        sizes = tuple(size for _, size in static)
        return cls(info.name, info.dtype, len(info.shape), static, itemgetter(*(axis for axis, _ in static)),
                   sizes[0] if len(sizes) == 1 else sizes)


class Runner:
    """A session and the description of its inputs and outputs, read once. Calls check the
    feeds against that description (the checks are what give clear errors) and go straight to
    the session's compiled ``run``."""

    def __init__(self, session: ort.InferenceSession, explain: Callable[[Exception], Exception] | None = None) -> None:
        self.session = session
        self.inputs = [TensorInfo.of(a) for a in session.get_inputs()]
        self.outputs = [TensorInfo.of(a) for a in session.get_outputs()]
        self._by_name = {i.name: i for i in self.inputs}
        self._output_list = [o.name for o in self.outputs]
        self._output_names = set(self._output_list)
        self._checks = [_Check.of(i) for i in self.inputs]
        self._n = len(self._checks)
        # The compiled run, without InferenceSession.run's per-call Python checks (ours
        # replace them); a provider failure still goes through session.run's fallback.
        self._run = getattr(session, "_sess", session).run
        self._run_async = getattr(session, "_sess", session).run_async
        # run_async runs on a thread of the session's intra-op pool, which may have none.
        self._pooled = True
        self._explain = explain
        self.quiet = quiet_run_options()

    def call(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in input order, or ``pipe(name=array, ...)``."""
        return self._call(self._output_list, self.feeds(inputs, named), None)

    def feeds(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The checked feeds of a call by position or by name (:meth:`call`'s checks)."""
        if not named and len(inputs) == self._n:
            feeds = {}
            for check, x in zip(self._checks, inputs):
                if (
                    type(x) is not np.ndarray
                    or x.dtype != check.dtype
                    or x.ndim != check.ndim
                    or (check.fixed_of is not None and check.fixed_of(x.shape) != check.fixed)
                ):
                    break
                feeds[check.name] = x
            else:
                return feeds
        if inputs and named:
            raise InputError("pass inputs either by position or by name, not both")
        if inputs or not named:
            if len(inputs) != self._n:
                n = self._n
                raise InputError(
                    f"expected {n} input{'s' if n != 1 else ''} "
                    f"({', '.join(str(i) for i in self.inputs)}), got {len(inputs)}"
                )
            named = {info.name: x for info, x in zip(self.inputs, inputs)}
        return self.check_feeds(named)

    def run(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None, run_options: ort.RunOptions | None = None
    ) -> list[np.ndarray]:
        checked = self.check_feeds(feeds)
        return self._call(self.output_names(output_names), checked, run_options)

    def output_names(self, names: Sequence[str] | None) -> list[str]:
        """The outputs a call returns: ``names`` checked, or every output."""
        if names is None:
            return self._output_list
        for name in names:
            if name not in self._output_names:
                raise InputError(
                    f"'{name}' is not an output{_core.did_you_mean(name, self._output_list)}; "
                    f"outputs: {', '.join(self._output_list)}"
                )
        return list(names) or self._output_list

    async def run_async(
        self,
        feeds: dict[str, np.ndarray],
        output_names: list[str],
        run_options: ort.RunOptions | None = None,
        timeout: float | None = None,
    ) -> list[np.ndarray]:
        """Runs checked ``feeds`` with ONNX Runtime's ``run_async``: the call runs on a thread
        of the session's intra-op pool, which resolves the awaiting future through the
        loop's ``call_soon_threadsafe``; no thread is started per call. A session without
        pool threads (``intra_op_num_threads=1``) runs the call in the loop's default
        executor instead. Cancelling the awaiting task, or ``timeout`` seconds passing, sets
        the run's ``terminate`` flag (:class:`~fastseq.errors.RunTimeoutError` for a timeout)."""
        import asyncio

        from fastseq.errors import RunTimeoutError

        check_timeout(timeout)
        loop = asyncio.get_running_loop()
        options = run_options if run_options is not None else quiet_run_options()
        stopped: list[str] = []  # why the terminate flag was set: "timeout" or "cancelled"

        def stop(why: str) -> None:
            stopped.append(why)
            options.terminate = True

        done = loop.create_future()

        def finished(outputs: list[np.ndarray], _: Any, error: str) -> None:
            # On ONNX Runtime's thread. Naming the feeds keeps their arrays alive until
            # ONNX Runtime is done with them, whatever happens to the awaiting task.
            _ = feeds
            try:
                loop.call_soon_threadsafe(_settle, done, outputs, error)
            except RuntimeError:  # the loop was closed meanwhile: nobody is waiting
                pass
            finally:
                _CALLBACKS.leave()

        try:
            if self._pooled:
                _CALLBACKS.enter()
                try:
                    self._run_async(output_names, feeds, finished, None, options)
                except BaseException:
                    _CALLBACKS.leave()  # refused: no callback will come
                    raise
            else:
                done = loop.run_in_executor(None, self._settled_call, output_names, feeds, options)
        except Exception as e:
            if "intra op thread pool" not in str(e):
                raise self._explained(e) from e
            self._pooled = False  # this session has no pool thread to lend
            done = loop.run_in_executor(None, self._settled_call, output_names, feeds, options)
        timer = loop.call_later(timeout, stop, "timeout") if timeout is not None else None
        try:
            # Shielded: a cancelled task leaves the run's future to ONNX Runtime, which
            # settles it once the terminate flag has stopped the run.
            outputs, error = await asyncio.shield(done)
        except asyncio.CancelledError:
            stop("cancelled")
            done.add_done_callback(lambda _: setattr(options, "terminate", False))
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if stopped:
            options.terminate = False  # ONNX Runtime is done with the options
        if not error:
            return outputs
        if stopped == ["timeout"]:
            raise RunTimeoutError(f"the call ran past its timeout of {timeout:g} s and was stopped: {error}")
        failure = RuntimeError(error)
        raise self._explained(failure) from failure

    def _settled_call(self, output_names: list[str], feeds: dict[str, Any], options: ort.RunOptions) -> tuple:
        """:meth:`_call` as (outputs, error text), as ``run_async`` reports it."""
        try:
            return self._run(output_names, feeds, options), ""
        except Exception as e:
            return [], str(e)

    def _explained(self, error: Exception) -> Exception:
        return self._explain(error) if self._explain is not None else error

    def _call(self, output_names: list[str], feeds: dict[str, Any], run_options: ort.RunOptions | None) -> list:
        if run_options is None:
            run_options = self.quiet
        try:
            return self._run(output_names, feeds, run_options)
        except Exception as e:
            if type(e).__name__ == "EPFail":  # let onnxruntime fall back to its other providers
                return self.session.run(output_names, feeds, run_options)
            raise self._explained(e) from e

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
            array = _as_array(name, value, info.dtype)
            if not dtype_accepts(info.dtype, array.dtype):
                if not np.can_cast(array.dtype, info.dtype, "safe"):
                    raise InputError(
                        f"input '{name}' expects {info.dtype}, got {array.dtype}, which does not convert without "
                        f"changing values; convert it if that is meant: x.astype(np.{info.dtype})"
                    )
                # Every value converts exactly (int32 to int64, float16 to float32, bool).
                array = array.astype(info.dtype)
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


class _Callbacks:
    """ONNX Runtime's ``run_async`` callbacks still to come or still running. The interpreter
    must not finalize under one: waking the loop (a socket write) lets the main thread take
    the GIL, finish and start finalizing while the callback thread still has Python to run;
    taking the GIL back then ends that thread with a forced unwind, which ONNX Runtime's
    ``catch (...)`` swallows, and the process aborts ("FATAL: exception not rethrown").
    Interpreter shutdown waits for them (atexit hooks run before it finalizes)."""

    #: the longest a shutdown waits for runs still going
    WAIT = 30.0

    def __init__(self) -> None:
        import threading

        self._pending = 0
        self._idle = threading.Condition()
        self._hooked = False

    def enter(self) -> None:
        with self._idle:
            self._pending += 1
            if not self._hooked:
                import atexit

                atexit.register(self._drain)
                self._hooked = True

    def leave(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _drain(self) -> None:
        import time

        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, self.WAIT)
        # The last callback has left its Python code; a moment for its thread to return
        # through pybind11 and release the GIL.
        time.sleep(0.02)


_CALLBACKS = _Callbacks()


def _settle(done: Any, outputs: list[np.ndarray], error: str) -> None:
    """Resolves a ``run_async`` future on its loop (unless its task was cancelled)."""
    if not done.done():
        done.set_result((outputs, error))


def _as_array(name: str, value: Any, dtype: np.dtype | None) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, as kornia takes
        return value.detach().cpu().numpy()
    # Lists and scalars carry no dtype of their own: they take the input's, unless a value
    # would change on the way (1.5 or 300 for a uint8 input).
    if dtype is None or dtype.kind not in "biu":
        return np.asarray(value, dtype=dtype)
    given = np.asarray(value)
    try:
        with np.errstate(all="ignore"):  # a NaN or an overflow is caught below
            array = given.astype(dtype) if given.dtype.kind in "biuf" else np.asarray(value, dtype=dtype)
    except (OverflowError, ValueError) as e:
        raise InputError(f"input '{name}' expects {dtype}: {e}") from None
    if given.dtype.kind in "biuf" and not np.array_equal(array, given):
        raise InputError(f"input '{name}' expects {dtype}, and the values given ({given.dtype}) do not all fit it")
    return array


# --- errors in the stages' own names ----------------------------------------------------------
_PREFIXED = re.compile(r"\bm(\d+)/([^\s'\"\]\[,:;()]+)")
_TOKEN = r"[^\s'\"\]\[,;()]+"
# Where ONNX Runtime names a node: "... running Reshape node. Name:'reshape' Status ..." at
# run time, "Node (reshape) Op (Reshape) ..." when a session is made.
_NODE = r"(?<=Name:')[^']+(?=')|(?<=Node \()[^()]+(?=\))"
_WORDS = re.compile(f"(?P<node>{_NODE})|(?P<token>{_TOKEN})")


def node_names(composed: _core.Composed) -> dict[str, set[int]]:
    """Every node name of a composed model's graph, subgraphs' nodes included, mapped to the
    indices of the top-level nodes they sit in: what a node that ONNX Runtime names is
    traced back to its stage with. Reads the model without its weights."""
    import onnx

    graph = onnx.ModelProto.FromString(composed.stripped_bytes(0)).graph
    names: dict[str, set[int]] = {}
    for index, top in enumerate(graph.node):
        todo = [top]
        while todo:
            node = todo.pop()
            names.setdefault(node.name, set()).add(index)
            for attribute in node.attribute:
                for sub in [attribute.g, *attribute.graphs]:
                    todo.extend(sub.node)
    return names


def explain(
    error: Exception,
    labels: Sequence[str],
    renamed: Mapping[str, tuple[int, str]] | None = None,
    ranges: Sequence[tuple[int, int]] | None = None,
    nodes: Callable[[], Mapping[str, set[int]]] | None = None,
) -> Exception:
    """An ONNX Runtime error as a :class:`RunError` whose message names the stage and its own
    node and tensor names, from the core's origins: ``renamed`` maps every name the core
    changed in the merged graph to (stage, original name); ``ranges`` gives each stage's
    nodes in the merged graph (first, end), and ``nodes`` the merged graph's node names
    (:func:`node_names`; read only when the error names a node the core did not rename), so
    that a node is traced to its stage whatever its name. Without them, the core's ``m<i>/``
    prefix (given only where two stages clash) says the stage."""
    from fastseq.errors import RunError, RunTimeoutError

    text = str(error).strip()
    if "terminate flag" in text.lower():
        return RunTimeoutError(f"the call was stopped: {text}")
    stages: list[str] = []
    known: list[Mapping[str, set[int]]] = []  # the node names, once read

    def named(stage: int, original: str) -> str:
        label = labels[stage] if stage < len(labels) else f"model {stage}"
        if label not in stages:
            stages.append(label)
        return f"{original} (in {label})"

    def stage_of_node(name: str) -> int | None:
        if not ranges or nodes is None:
            return None
        if not known:
            known.append(nodes())
        found = {k for i in known[0].get(name, ()) for k, (first, end) in enumerate(ranges) if first <= i < end}
        return found.pop() if len(found) == 1 else None

    def word(m: re.Match[str]) -> str:
        text = m.group(0)
        for candidate in (text, text.rstrip(".:")):
            hit = renamed.get(candidate) if renamed else None
            if hit is not None:
                return named(*hit) + text[len(candidate):]
        if m.group("node") is not None and not _PREFIXED.match(text):
            stage = stage_of_node(text)
            if stage is not None:
                return named(stage, text)
        return _PREFIXED.sub(lambda p: named(int(p.group(1)), p.group(2)), text)

    translated = _WORDS.sub(word, text)
    where = f"stage {', '.join(stages)}" if stages else "the pipeline " + " -> ".join(labels)
    return RunError(f"{where}: onnxruntime {type(error).__name__}: {translated}")


def dtype_accepts(expected: np.dtype | None, got: np.dtype) -> bool:
    """Whether an input declared ``expected`` takes an array of ``got`` as it is (strings
    as str or object arrays); nothing is cast: a cast would change what is computed."""
    return expected is None or got == expected or (expected.kind == "U" and got.kind in "UO")


def check_timeout(timeout: Any) -> None:
    """``timeout=`` is None or a positive, finite number of seconds (an InputError
    otherwise): anything else would fail in the timer's thread, or never fire, and the call
    would run with no timeout at all."""
    import threading

    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise InputError(f"timeout must be a positive, finite number of seconds or None, got {timeout!r}")
    if timeout > threading.TIMEOUT_MAX:
        raise InputError(f"timeout must be at most {threading.TIMEOUT_MAX:g} s (what a timer can wait), got {timeout!r}")


def check_log_level(level: Any) -> None:
    """``log_level=`` is None or one of ONNX Runtime's severities, 0 (verbose) .. 4 (fatal)."""
    if level is not None and (isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 4):
        raise InputError(f"log_level must be an int from 0 (verbose) to 4 (fatal) or None, got {level!r}")


def with_timeout(timeout: float, options: ort.RunOptions, call: Callable[[], Any]) -> Any:
    """Runs ``call`` and sets ``options.terminate`` if it takes more than ``timeout`` s
    (checked first, by :func:`check_timeout`, before any thread starts)."""
    import threading

    from fastseq.errors import RunTimeoutError

    check_timeout(timeout)
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        options.terminate = True

    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    try:
        return call()
    except Exception as e:
        if fired.is_set():
            raise RunTimeoutError(f"the call ran past its timeout of {timeout:g} s and was stopped") from e
        raise
    finally:
        timer.cancel()
        options.terminate = False


# --- optimised artefacts ------------------------------------------------------------------------
OPTIMIZED_FOR = "fastseq.optimized_for"


def export_optimized(
    composed: _core.Composed,
    target: Path,
    providers: Sequence[Provider] | None,
    session_options: ort.SessionOptions | None,
) -> _core.Saved:
    """Writes the model ONNX Runtime makes of ``composed`` after its graph optimisations,
    with what it was optimised for in its metadata; returns what the core wrote (see
    ``_core.Staging.commit``). Its weights are in a data file beside it (``<name>.data``
    unless a file fastseq did not write has that name): ONNX Runtime maps external data
    instead of parsing it out of the model, so sessions start faster from it. ONNX Runtime
    writes into a staging folder beside the target; the core commits the model from there."""
    import json

    target.parent.mkdir(parents=True, exist_ok=True)
    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    with _core.stage(str(target)) as stage:
        staged = stage.folder() / target.name
        with PrivateCopy.of(composed) as copy:
            _session(copy.path, options, usable, save_to=staged, data_name=_core.LAYOUT.data_file(target.name))
        made_for = json.dumps({
            "onnxruntime": ort.__version__,
            "providers": [provider_name(p) for p in usable],
            "graph_optimization_level": int(options.graph_optimization_level),
        })
        return stage.commit(target.name, metadata=[(OPTIMIZED_FOR, made_for)])


def warn_if_optimized_elsewhere(new_session: ort.InferenceSession, providers: Sequence[Provider]) -> None:
    """A model exported with ``optimized=True`` for other providers or another onnxruntime
    may hold operators those cannot run or run slowly: say so."""
    import json

    meta = new_session.get_modelmeta().custom_metadata_map.get(OPTIMIZED_FOR)
    if not meta:
        return
    try:
        made = json.loads(meta)
    except ValueError:
        return
    now = {"onnxruntime": ort.__version__, "providers": new_session.get_providers()}
    if made.get("onnxruntime") != now["onnxruntime"] or made.get("providers") != now["providers"]:
        warnings.warn(
            f"this model was optimised by onnxruntime {made.get('onnxruntime')} for "
            f"{', '.join(made.get('providers') or [])}; it is running on onnxruntime {now['onnxruntime']} with "
            f"{', '.join(now['providers'])}: re-export it with optimized=True for this setup",
            RuntimeWarning,
            stacklevel=4,
        )
