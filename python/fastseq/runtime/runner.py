"""The runner: one ONNX Runtime session over a composed model, its inputs described and
their checks computed once, and calls checked on them (the rule of :mod:`.inputs`). Its
public interface is what every entry point calls through: ``pipe(x)``, ``run``,
``run_async``, the batcher, IO binding, profiles and Ray actors."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from fastseq import _core
from fastseq.errors import InputError
from fastseq.runtime.inputs import InputCheck, Reader, check_feeds
from fastseq.runtime.ort_options import quiet_run_options, run_copy
from fastseq.runtime.tensors import TensorInfo
from fastseq.runtime.timeouts import POLL, check_timeout


# --- the seam: ONNX Runtime's private API, here and nowhere else ---------------------------------
def compiled_calls(session: ort.InferenceSession) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The session's ``run`` and ``run_async`` without ``InferenceSession.run``'s per-call
    Python checks (the runner's replace them): ONNX Runtime's compiled session
    (``session._sess``). The public methods cost about 1 us more per call (onnxruntime 1.32,
    a one-node model: 3.0-3.6 against 2.2 us), a tenth of a small pipeline's call. A session
    without one (another onnxruntime, a wrapper) is called through its public methods: same
    arguments, same results. A provider failure still goes through ``session.run``'s
    fallback (see :meth:`Runner.run_checked`)."""
    compiled = getattr(session, "_sess", None)
    run, run_async = getattr(compiled, "run", None), getattr(compiled, "run_async", None)
    if callable(run) and callable(run_async):
        return run, run_async
    return session.run, session.run_async


def compiled_binding_run(session: ort.InferenceSession, binding: ort.IOBinding) -> Callable[[Any], Any]:
    """``run_with_iobinding`` on ``binding`` as a function of the run options, without the
    public method's per-call Python (its checks are for WebGPU graph capture): the compiled
    session's on the compiled binding where both are there, else the public method."""
    compiled, c_binding = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
    run = getattr(compiled, "run_with_iobinding", None)
    if callable(run) and c_binding is not None:
        return functools.partial(run, c_binding)
    return functools.partial(session.run_with_iobinding, binding)


class Runner:
    """A session and the description of its inputs and outputs, read once. Calls check the
    feeds against that description (the checks are what give clear errors) and go straight to
    the session's compiled ``run``.

    ``explain`` turns an ONNX Runtime failure into a typed error in the stages' names;
    ``reader`` says which stages read an input (for messages); ``unshaped``: the inputs and
    the outputs the model declares without a shape (ONNX Runtime reports them as rank 0)."""

    def __init__(
        self,
        session: ort.InferenceSession,
        explain: Callable[[Exception], Exception] | None = None,
        reader: Reader | None = None,
        unshaped: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
    ) -> None:
        self.session = session
        #: the graph inputs and outputs, as the session and the model describe them
        self.inputs = [TensorInfo.of(a, a.name in unshaped[0]) for a in session.get_inputs()]
        self.outputs = [TensorInfo.of(a, a.name in unshaped[1]) for a in session.get_outputs()]
        #: per input, in order: what a call is checked against
        self.checks = tuple(InputCheck.of(i) for i in self.inputs)
        #: run options for calls that bring none: quiet (fastseq raises the errors itself)
        self.quiet = quiet_run_options()
        self._by_name = {c.name: c for c in self.checks}
        self._all_outputs = [o.name for o in self.outputs]
        self._output_set = set(self._all_outputs)
        self._n = len(self.checks)
        self._run, self._run_async = compiled_calls(session)
        # run_async runs on a thread of the session's intra-op pool, which may have none.
        self._pooled = True
        self._explain = explain
        self._reader = reader

    # --- what a call is checked against ---------------------------------------------------------
    def check_of(self, name: str) -> InputCheck:
        """The checks of input ``name`` (an InputError naming the inputs if there is none)."""
        check = self._by_name.get(name)
        if check is None:
            names = [c.name for c in self.checks]
            raise InputError(
                f"'{name}' is not an input{_core.did_you_mean(str(name), names)}; inputs: "
                + ", ".join(map(str, self.inputs))
            )
        return check

    def stage_note(self, name: str) -> str:
        """`` (stage a reads it as 'x')`` for input ``name``, where the pipeline knows it."""
        from fastseq.runtime.inputs import stage_note

        return stage_note(name, self._reader)

    def output_names(self, names: Sequence[str] | None) -> list[str]:
        """The outputs a call returns: ``names`` checked, or every output (the runner's own
        list: not to be changed)."""
        if names is None:
            return self._all_outputs
        for name in names:
            if name not in self._output_set:
                raise InputError(
                    f"'{name}' is not an output{_core.did_you_mean(str(name), self._all_outputs)}; "
                    f"outputs: {', '.join(self._all_outputs)}"
                )
        return list(names) or self._all_outputs

    def feeds(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The checked feeds of a call by position or by name (:meth:`call`'s checks)."""
        if not named and len(inputs) == self._n:
            feeds = {}
            for check, x in zip(self.checks, inputs):
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

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """``feeds`` by input name, checked and converted by the one input rule."""
        return check_feeds(self.inputs, self._by_name, feeds, self._reader)

    # --- calls ------------------------------------------------------------------------------------
    def call(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in input order, or ``pipe(name=array, ...)``."""
        return self.run_checked(self._all_outputs, self.feeds(inputs, named), None)

    def run(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None, run_options: ort.RunOptions | None = None
    ) -> list[np.ndarray]:
        """``pipe.run(feeds, output_names)``: feeds by name, checked; ``run_options`` as given."""
        checked = self.check_feeds(feeds)
        return self.run_checked(self.output_names(output_names), checked, run_options)

    def run_checked(
        self, output_names: list[str], feeds: dict[str, Any], run_options: ort.RunOptions | None = None
    ) -> list[Any]:
        """Runs feeds already checked (:meth:`feeds`, :meth:`check_feeds`) for ``output_names``
        (:meth:`output_names`); a failure raised as :meth:`explain` says."""
        if run_options is None:
            run_options = self.quiet
        try:
            return self._run(output_names, feeds, run_options)
        except Exception as e:
            if type(e).__name__ == "EPFail":  # let onnxruntime fall back to its other providers
                return self.session.run(output_names, feeds, run_options)
            raise self.explain(e) from e

    def explain(self, error: Exception) -> Exception:
        """An ONNX Runtime failure as a typed error in the stages' own names."""
        return self._explain(error) if self._explain is not None else error

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
        the ``terminate`` flag of the call's own run options, a copy of ``run_options``
        (:class:`~fastseq.errors.RunTimeoutError` for a timeout): other calls sharing
        ``run_options`` go on, and setting their ``terminate`` still stops this one."""
        import asyncio

        from fastseq.errors import RunTimeoutError

        check_timeout(timeout)
        loop = asyncio.get_running_loop()
        options = run_copy(run_options)  # this call's own: stopping it stops no other
        stopped: list[str] = []  # why the terminate flag was set: "timeout", "cancelled" or "caller"

        def stop(why: str) -> None:
            stopped.append(why)
            options.terminate = True

        done = loop.create_future()

        def finished(outputs: list[np.ndarray], _: Any, error: str) -> None:
            # On ONNX Runtime's thread. Naming the feeds and the options keeps them alive
            # until ONNX Runtime is done with them, whatever happens to the awaiting task.
            _ = feeds, options
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
                raise self.explain(e) from e
            self._pooled = False  # this session has no pool thread to lend
            done = loop.run_in_executor(None, self._settled_call, output_names, feeds, options)
        timer = loop.call_later(timeout, stop, "timeout") if timeout is not None else None
        watch = None

        def poll() -> None:  # the caller's own run options asking for a stop
            nonlocal watch
            if done.done() or stopped:
                return
            if run_options is not None and run_options.terminate:  # (polled only when given)
                stop("caller")
            else:
                watch = loop.call_later(POLL, poll)

        if run_options is not None:
            watch = loop.call_later(POLL, poll)
        try:
            # Shielded: a cancelled task leaves the run's future to ONNX Runtime, which
            # settles it once the terminate flag has stopped the run.
            outputs, error = await asyncio.shield(done)
        except asyncio.CancelledError:
            stop("cancelled")
            raise
        finally:
            for handle in (timer, watch):
                if handle is not None:
                    handle.cancel()
        if not error:
            return outputs
        if stopped and stopped[0] == "timeout":
            raise RunTimeoutError(f"the call ran past its timeout of {timeout:g} s and was stopped: {error}")
        failure = RuntimeError(error)
        raise self.explain(failure) from failure

    def _settled_call(
        self, output_names: list[str], feeds: dict[str, Any], options: ort.RunOptions
    ) -> tuple[list[Any], str]:
        """:meth:`run_checked` as (outputs, error text), as ``run_async`` reports it."""
        try:
            return self._run(output_names, feeds, options), ""
        except Exception as e:  # noqa: BLE001 - the error's text is the result, as run_async reports it
            return [], str(e)


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
