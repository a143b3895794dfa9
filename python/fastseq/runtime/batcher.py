"""Dynamic batching: many callers' small requests joined along the batch axis into one run.

A service receives many small requests at once; run one by one, a small machine spends its
time on per-call overhead and small matrix products. The batcher joins the requests that
arrive within ``max_delay_ms`` of the first waiting one (up to ``max_batch_size`` rows),
runs the pipeline once and hands each caller its own rows.

Threads join a batch under a lock and the first of them (the leader) runs it in its own
thread: a request costs no hand-over to another thread. Each waiting thread sleeps on a
lock of its own, which the leader releases once its answer is set (no shared condition
for the woken threads to queue on again). Coroutines join a batch of their own loop, which
hands it to the batcher's one worker thread (started with the first such batch, ended by
``close()``): the loop stays free while ONNX Runtime runs, and one call back to the loop
resolves the batch's futures. That worker was measured faster than ONNX Runtime's own
``run_async`` (whose callback, on a pool thread that Python does not know, pays for a new
thread state and runs the model without that pool's other threads) and than running the
batch on the loop itself, which would also stall everything else on the loop
(benches/bench_serve.py)."""

from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fastseq.errors import CompositionError, InputError, RunError
from fastseq.runtime.runner import Runner


class _Request:
    """One caller's checked arrays (in input order), its rows, and its answer once run; a
    thread waits on ``done`` (held until answered), a coroutine on ``future``."""

    __slots__ = ("arrays", "rows", "done", "future", "answer")

    def __init__(self, arrays: list[np.ndarray], rows: int) -> None:
        self.arrays, self.rows, self.answer = arrays, rows, None
        self.done: Any = None
        self.future: Any = None


class _Batch:
    """Requests with the same non-batch axes, from one group (the threads, or one loop)."""

    __slots__ = ("requests", "rows", "loop", "sealed", "full")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.requests: list[_Request] = []
        self.rows = 0
        self.loop = loop
        self.sealed = False  # no request joins any more
        if loop is None:  # the threads' batches: released when sealed, which wakes the leader
            self.full = threading.Lock()
            self.full.acquire()


class Batcher:
    """Joins concurrent requests to one pipeline into batches (see
    :meth:`fastseq.ONNXSequential.batcher`).

    ``batcher(x)`` from any thread, ``await batcher.run_async(x)`` from coroutines (any
    loop); both return what ``pipe(x)`` returns for that request's rows (views of its own
    rows of the joint run's outputs: no copy, and no other caller's rows). Threads are
    batched with threads, and coroutines with the coroutines of their own loop; a thread's
    batch runs in the thread of its first request, a loop's batch on the batcher's worker
    thread (one, so a loop's batches run one after the other, each with the session's
    intra-op threads).

    Every input's and output's first axis is the batch axis: a pipeline with one whose first
    axis is fixed, or whose first axes carry different names, is refused with
    :class:`fastseq.CompositionError` (joining would be wrong). A request is checked in its
    caller before it is joined: a wrong dtype, rank, size or name, or inputs with different
    row counts, is an :class:`fastseq.InputError` for that caller only. Requests join when
    their other axes agree (others form their own batch); one of more than
    ``max_batch_size`` rows runs alone. An error in a joint run reaches every caller of that
    run (each gets its own copy); an output that does not keep its inputs' rows is a
    :class:`fastseq.RunError` rather than a wrong split. A cancelled coroutine's request is
    left out of its batch if that has not run yet.

    A request waits at most ``max_delay_ms`` for others to join, plus the batches ahead of
    it (0: it joins only requests already waiting). A ``max_batch_size`` that is not an int
    >= 1, or a ``max_delay_ms`` that is not a finite number >= 0, is an
    :class:`fastseq.InputError`. ``close()`` (or leaving ``with pipe.batcher() as b:``) refuses new requests with
    :class:`fastseq.RunError`, runs those already taken at once and waits for them (those
    of the loop it is called from, if any, finish once it returns and the loop goes on).
    Each batch runs on the pipeline's session of the moment (``as_cuda`` and the like may
    switch it meanwhile).
    """

    def __init__(self, pipe: Any, max_batch_size: int = 32, max_delay_ms: float = 2.0) -> None:
        _check_settings(max_batch_size, max_delay_ms)
        _check_batch_axis(pipe.runner)
        self.max_batch_size = int(max_batch_size)
        self.max_delay_ms = float(max_delay_ms)
        self._delay = self.max_delay_ms / 1000
        self._pipe = pipe
        # The state below; taken as the plain lock (a C call) on the hot paths, and as the
        # condition it is the lock of where close() waits.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._open: dict[tuple, _Batch] = {}  # (loop or None, non-batch axes) -> the batch taking requests
        self._leading = 0  # the threads' batches not yet run by their leaders
        self._looping: dict[asyncio.AbstractEventLoop, int] = {}  # per loop: its batches not yet answered
        self._closed = False
        # Runs the loops' batches; its thread starts with the first one.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastseq-batcher")

    # --- callers ---------------------------------------------------------------------------
    def __call__(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``pipe(x)`` for this request's rows, run in a batch with other threads' rows."""
        request, key = self._request(inputs, named)
        request.done = threading.Lock()
        request.done.acquire()
        with self._lock:
            batch, leader = self._join(request, (None, key), None)
        if leader:
            try:
                batch.full.acquire(timeout=self._delay)  # until sealed (full, or close()), at most the delay
            finally:  # interrupted or not, the others get their answers
                try:
                    with self._lock:
                        self._seal(batch, (None, key))
                    _run(self._pipe.runner, batch.requests)
                finally:
                    for r in batch.requests[1:]:
                        if r.answer is None:  # the run itself was interrupted (KeyboardInterrupt)
                            r.answer = RunError("the batched run was interrupted in the thread running it")
                        r.done.release()
                    with self._lock:
                        self._leading -= 1
                        self._cond.notify_all()
        else:
            request.done.acquire()
        if isinstance(request.answer, BaseException):
            raise request.answer
        return request.answer

    async def run_async(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``await batcher.run_async(x)``: as :meth:`__call__`, from a coroutine, batched
        with the coroutines of the same loop."""
        loop = asyncio.get_running_loop()
        request, key = self._request(inputs, named)
        request.future = loop.create_future()
        with self._lock:
            batch, new = self._join(request, (loop, key), loop)
        if new and not batch.sealed:
            loop.call_later(self._delay, self._expire, batch, (loop, key))
        return await request.future

    def close(self) -> None:
        """Refuses new requests; runs those already taken at once and waits for them."""
        here = asyncio._get_running_loop()
        with self._cond:
            self._closed = True
            for where, batch in list(self._open.items()):
                self._seal(batch, where)
            while self._leading or any(n and loop is not here for loop, n in self._looping.items()):
                self._cond.wait()
            if not self._looping:  # else the last of this loop's batches ends the worker (_ran)
                self._worker.shutdown(wait=False)

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Batcher(max_batch_size={self.max_batch_size}, max_delay_ms={self.max_delay_ms:g}; {state})"

    # --- batches (under self._lock) -----------------------------------------------------------
    def _request(self, inputs: tuple[Any, ...], named: dict[str, Any]) -> tuple[_Request, tuple]:
        """The request, checked in its caller, and the key of the batches it may join."""
        runner = self._pipe.runner
        feeds = runner.feeds(inputs, named)
        arrays = [feeds[i.name] for i in runner.inputs]
        rows = None
        key: list[Any] = []  # what the batches it may join share: dtypes and the other axes
        for info, a in zip(runner.inputs, arrays):
            if a.ndim == 0:
                raise InputError(f"input '{info.name}' of a batched request needs a batch axis (axis 0); got a scalar")
            if rows is None:
                rows = a.shape[0]
            elif a.shape[0] != rows:
                sizes = ", ".join(f"'{i.name}' {x.shape[0]}" for i, x in zip(runner.inputs, arrays))
                raise InputError(f"the inputs of one request must have the same number of rows (axis 0): {sizes}")
            key += (a.dtype, a.shape[1:])
        return _Request(arrays, rows), tuple(key)

    def _join(self, request: _Request, where: tuple, loop: Any) -> tuple[_Batch, bool]:
        """Adds ``request`` to the open batch at ``where`` or a new one; True if new."""
        if self._closed:
            raise RunError("the batcher is closed: it takes no new requests")
        batch = self._open.get(where)
        new = batch is None or batch.rows + request.rows > self.max_batch_size
        if new:
            if batch is not None:
                self._seal(batch, where)  # full enough: it runs now, this request starts the next
            batch = self._open[where] = _Batch(loop)
            if loop is None:
                self._leading += 1
            else:
                self._looping[loop] = self._looping.get(loop, 0) + 1
        batch.requests.append(request)
        batch.rows += request.rows
        if batch.rows >= self.max_batch_size:
            self._seal(batch, where)
        return batch, new

    def _seal(self, batch: _Batch, where: tuple) -> None:
        """Closes ``batch`` to new requests and sets it running."""
        if batch.sealed:
            return
        batch.sealed = True
        if self._open.get(where) is batch:
            del self._open[where]
        loop = batch.loop
        if loop is None:
            batch.full.release()  # its leader runs it
        else:  # straight to the worker, from the loop or from close() in another thread
            self._submit(batch)

    def _expire(self, batch: _Batch, where: tuple) -> None:
        """A loop's batch at its deadline (on the loop)."""
        with self._lock:
            self._seal(batch, where)

    # --- a loop's batch: sealed on the loop, run on the worker, answered on the loop ----------
    # A batch is counted in _looping from its first request until the worker has run it and
    # handed its answers to the loop (or found the loop closed): the count never waits on a
    # callback that a stopped loop may drop.
    def _submit(self, batch: _Batch) -> None:
        """Gives a sealed batch's requests, less the cancelled ones, to the worker (under the
        lock)."""
        loop = batch.loop
        requests = [r for r in batch.requests if not r.future.done()]  # done: cancelled
        if requests:
            try:
                self._worker.submit(self._work, loop, requests)
                return
            except RuntimeError as e:  # the interpreter is shutting down: fail them, never drop them
                _fail(requests, RunError(f"the batcher could not run this batch: {e}"))
                self._deliver(loop, requests)
        self._ran(loop)

    def _work(self, loop: asyncio.AbstractEventLoop, requests: list[_Request]) -> None:
        """On the worker: runs the batch and calls its loop back with the answers."""
        try:
            _run(self._pipe.runner, requests)
            self._deliver(loop, requests)
        finally:
            with self._lock:
                self._ran(loop)

    def _deliver(self, loop: asyncio.AbstractEventLoop, requests: list[_Request]) -> None:
        """Hands a batch's answers to its loop; a closed loop has nobody awaiting them."""
        try:
            loop.call_soon_threadsafe(self._answer, requests)
        except RuntimeError:
            pass

    def _answer(self, requests: list[_Request]) -> None:
        """On the loop: resolves the callers' futures (but those cancelled meanwhile)."""
        for r in requests:
            if r.future.done():
                continue
            if isinstance(r.answer, BaseException):
                r.future.set_exception(r.answer)
            else:
                r.future.set_result(r.answer)

    def _ran(self, loop: asyncio.AbstractEventLoop) -> None:
        """A loop's batch is done with (under the lock); the last one after close() ends the
        worker."""
        self._looping[loop] -= 1
        if not self._looping[loop]:
            del self._looping[loop]
        if self._closed and not self._looping:
            self._worker.shutdown(wait=False)
        self._cond.notify_all()


def _check_settings(max_batch_size: Any, max_delay_ms: Any) -> None:
    """The batcher's settings, each checked (an InputError naming it, as for a call's
    arguments): a NaN or infinite delay would never end a batch, or fail in a timer."""
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1:
        raise InputError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
    if (
        isinstance(max_delay_ms, bool)
        or not isinstance(max_delay_ms, (int, float, np.integer, np.floating))
        or not math.isfinite(max_delay_ms)
        or not 0 <= max_delay_ms <= threading.TIMEOUT_MAX * 1000
    ):
        raise InputError(
            f"max_delay_ms must be a finite number of milliseconds from 0 to {threading.TIMEOUT_MAX * 1000:g}, "
            f"got {max_delay_ms!r}"
        )


def _check_batch_axis(runner: Runner) -> None:
    """Refuses a pipeline whose inputs and outputs do not all share a dynamic first axis."""
    named: dict[str, str] = {}  # first axis name -> the first input or output that has it
    for kind, infos in (("input", runner.inputs), ("output", runner.outputs)):
        for info in infos:
            if info.shape is None:
                continue  # not described: the rows of each run are checked instead
            if not info.shape or isinstance(info.shape[0], int):
                what = "is a scalar" if not info.shape else f"has a fixed first axis {info}"
                raise CompositionError(
                    f"cannot batch this pipeline: {kind} '{info.name}' {what}; the batcher joins requests "
                    "along a dynamic first axis that every input and output has"
                )
            if isinstance(info.shape[0], str):
                named.setdefault(info.shape[0], f"{kind} '{info.name}'")
    if len(named) > 1:
        raise CompositionError(
            "cannot batch this pipeline: its first axes have different names ("
            + ", ".join(f"'{axis}' on {where}" for axis, where in named.items())
            + "), so they need not be one batch axis"
        )


# --- running a batch ------------------------------------------------------------------------
def _joined(runner: Runner, requests: list[_Request]) -> dict[str, np.ndarray]:
    """The requests' arrays joined along the batch axis, by input name."""
    if len(requests) == 1:
        return {i.name: a for i, a in zip(runner.inputs, requests[0].arrays)}
    return {i.name: np.concatenate([r.arrays[k] for r in requests]) for k, i in enumerate(runner.inputs)}


def _hand_out(runner: Runner, requests: list[_Request], outputs: list[np.ndarray]) -> None:
    """Gives each request its own rows of a joint run's ``outputs``."""
    if len(requests) == 1:
        requests[0].answer = outputs
        return
    rows = sum(r.rows for r in requests)
    for info, out in zip(runner.outputs, outputs):
        if out.ndim == 0 or out.shape[0] != rows:
            raise RunError(
                f"output '{info.name}' has shape {list(out.shape)} for {rows} rows of input: it does not keep "
                "the batch axis, so the batcher cannot split it between callers; call the pipeline directly"
            )
    start = 0
    for r in requests:  # views: each caller's rows, disjoint from the others', without a copy
        r.answer = [out[start:start + r.rows] for out in outputs]
        start += r.rows


def _run(runner: Runner, requests: list[_Request]) -> None:
    """Runs a threads' batch in the calling thread; sets each request's answer."""
    try:
        _hand_out(runner, requests, runner.run_checked(runner.output_names(None), _joined(runner, requests)))
    except Exception as e:
        _fail(requests, e)


def _fail(requests: list[_Request], error: Exception) -> None:
    """Each request of a failed joint run gets its own copy of the error to raise."""
    for r in requests:
        try:
            copy = type(error)(*error.args)
        except Exception:
            copy = RunError(f"the batched run failed: {error}")
        copy.__cause__ = error.__cause__ if error.__cause__ is not None else error
        r.answer = copy
