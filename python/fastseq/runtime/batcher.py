"""Dynamic batching: many callers' small requests joined along the batch axis into one run.

A service receives many small requests at once; run one by one, a small machine spends its
time on per-call overhead and small matrix products. The batcher queues every request
(threads' and coroutines' alike) and one worker thread of its own runs them: whenever it is
free it takes everything queued, up to ``max_batch_size`` rows of requests whose other axes
agree, joins them, runs the pipeline once and hands each caller its own rows. Under load the
queue fills while a batch runs, so batches grow with the load without anyone waiting for
them; a caller thread sleeps on a lock of its own until its answer is set, a coroutine awaits
a future of its loop, which one call per batch and loop resolves. (A leader thread that
waited for its batch to fill and ran it itself measured 0.57x the rows/s of threads calling
the pipeline directly on two cores; a throwaway of this design without the checks 0.94-1.01x;
this batcher 0.76-1.15x on a small tabular pipeline, more on heavier ones; its callers on
the network server's queue in the core 0.80-0.89x this batcher: docs/benchmarks.md.) The
paths every request takes are kept short: on two cores, the loop's and the worker's Python
per request, which the GIL runs one at a time, bound the rows/s.

Joining is only right when each row's outputs depend on that row alone: the core decides it
from the composed graph (``crates/fastseq/src/merge/rows``), and a pipeline whose rows may mix is
refused unless the user says otherwise (``row_independent=True``). A joint run that fails is
run again per request, so that only the caller whose request fails gets the error."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from fastseq._core import MAX_BATCH_SIZE  # the core's analysis relies on it (merge/rows)
from fastseq.errors import CompositionError, InputError, RunError
from fastseq.runtime.batches import Request, deliver, joinable, run
from fastseq.runtime.engine import Engine, Pipelined, engine_of
from fastseq.runtime.inputs import InputCheck
from fastseq.runtime.runner import Runner

#: A worker that finds nothing to do for this long ends; the next request starts another.
IDLE_S = 5.0


class Batcher:
    """Joins concurrent requests to one pipeline into batches (see
    :meth:`fastseq.ONNXSequential.batcher`).

    ``batcher(x)`` from any thread, ``await batcher.run_async(x)`` from coroutines (any
    loop, any number of them, and threads, on one batcher); both return what ``pipe(x)``
    returns for that request's rows (views of its own rows of the joint run's outputs: no
    copy, and no other caller's rows). One worker thread of the batcher runs the batches:
    whenever it is free, it takes everything queued (up to ``max_batch_size`` rows of
    requests whose other axes agree; the others form the next batches, and one of more than
    ``max_batch_size`` rows runs alone). With ``max_delay_ms`` > 0 a free worker that finds
    fewer rows waits for more, at most until the oldest request has waited that long;
    with 0 (the default) it runs what is queued at once: under load, requests pile up while
    a batch runs, so batches grow with the load and nobody waits for them.

    Only pipelines whose rows are independent are batched: every input's and output's
    first axis is the batch axis (a pipeline with one whose first axis is fixed, or whose
    first axes carry different names, is refused with :class:`fastseq.CompositionError`),
    and no node may compute one row's outputs from other rows (a Softmax, reduction, sort,
    MatMul or Reshape across the batch axis, an operator the analysis does not know...):
    the core decides it from the composed graph, and a pipeline whose rows may mix is
    refused with a :class:`fastseq.CompositionError` naming the stage and the node.
    ``row_independent=True`` skips that check, for a pipeline known to keep rows apart.

    A request is checked in its caller before it is joined: a wrong dtype, rank, size or
    name, or inputs with different row counts, is an :class:`fastseq.InputError` for that
    caller only. A joint run that fails is run again for each of its requests alone, so that
    only the callers whose own requests fail get an error (their own); the others get their
    rows. An output that does not keep its inputs' rows is a :class:`fastseq.RunError`
    rather than a wrong split. A cancelled coroutine's request (``asyncio.wait_for``'s
    timeout included) is left out of its batch if that has not run yet, and its answer
    dropped if it has: either way the coroutine raises ``asyncio.CancelledError``, as
    asyncio's cancellation does (docs/batching.md).

    A ``max_batch_size`` that is not an int >= 1, or a ``max_delay_ms`` that is not a finite
    number >= 0, is an :class:`fastseq.InputError`. ``close()`` (or leaving ``with
    pipe.batcher() as b:``) refuses new requests with :class:`fastseq.RunError`, runs those
    already taken at once and waits for them (those of the loop it is called from, if any,
    are answered once it returns and the loop goes on).

    On the CPU, batches with a thread's request run on a session of the batcher's own: the
    pipeline's session options with ONNX Runtime's spinning off (its pool threads would
    otherwise busy-wait on the cores the waiting threads need); where the pipeline's options
    set spinning themselves, that choice stands and the pipeline's session is used. A batch of
    coroutines alone runs on the pipeline's session; ``share_session=True`` runs every batch
    there (no second copy of the weights); ``spinning=False`` runs coroutines' batches without
    spinning too (a server whose clients share its cores: ``fastseq serve``). Batches follow
    the pipeline's session of the moment (``as_cuda`` and the like may switch it meanwhile;
    on a GPU the pipeline's session is used as it is). ``on_batch(rows, waits, run_s)``, if
    given, is called on the worker after each batch: its rows, each request's seconds in the
    queue and the run's seconds (what ``fastseq serve``'s metrics count).
    """

    def __init__(
        self,
        pipe: Engine | Pipelined,
        max_batch_size: int = 32,
        max_delay_ms: float = 0.0,
        *,
        row_independent: bool = False,
        share_session: bool = False,
        spinning: bool | None = None,
        on_batch: Callable[[int, list[float], float], None] | None = None,
    ) -> None:
        _check_settings(max_batch_size, max_delay_ms)
        for name, flag in (("row_independent", row_independent), ("share_session", share_session)):
            if not isinstance(flag, bool):
                raise InputError(f"{name} must be True or False, got {flag!r}")
        if spinning not in (None, False):
            raise InputError(f"spinning must be None (the batcher chooses) or False, got {spinning!r}")
        engine = engine_of(pipe)
        # declared by the call or by the pipeline's description (a pipeline file's row_independent)
        row_independent = row_independent or getattr(pipe, "row_independent", False) is True
        batchable(engine, row_independent)
        self.max_batch_size = int(max_batch_size)
        self.max_delay_ms = float(max_delay_ms)
        self.row_independent = row_independent
        self.share_session = share_session
        self.spinning = spinning
        self._delay = self.max_delay_ms / 1000
        self._on_batch = on_batch
        self._stamp = bool(self._delay or on_batch)  # requests note when they were queued
        self._engine = engine
        # The queue and the worker's state, under _lock (a plain lock: a C call on the hot
        # paths). The worker sleeps on _wake (held while it does not), which the first
        # caller to find it sleeping releases once.
        self._lock = threading.Lock()
        self._queue: deque[Request] = deque()
        self._rows = 0  # rows queued
        self._wake = threading.Lock()
        self._wake.acquire()
        self._sleeping = False  # the worker waits on _wake ...
        self._filling = False  # ... for a full batch (with a delay), rather than any request
        self._worker: threading.Thread | None = None
        self._closed = False
        self._one: tuple[tuple[InputCheck, ...] | None, InputCheck | None] = (None, None)  # see _one_input

    # --- callers ---------------------------------------------------------------------------
    def __call__(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``pipe(x)`` for this request's rows, run in a batch with other callers' rows."""
        request = self._request(inputs, named)
        done = request.done = threading.Lock()
        done.acquire()
        try:  # from the put on: an interrupt before the wait must not stop the chain either
            self._put(request)
            done.acquire()  # released once the answer is set (see Chain)
        except BaseException:  # interrupted while waiting: the caller after it is woken anyway
            request.gone = True
            if request.chain is not None:
                request.chain.wake()
            raise
        request.chain.wake()  # type: ignore[union-attr]  # set by _put before the answer's release
        answer = request.answer
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def run_async(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``await batcher.run_async(x)``: as :meth:`__call__`, from a coroutine."""
        loop = asyncio.get_running_loop()
        request = self._request(inputs, named)
        request.loop = loop
        future = request.future = loop.create_future()
        self._put(request)
        return await future

    def close(self) -> None:
        """Refuses new requests; runs those already taken at once and waits for them."""
        with self._lock:
            self._closed = True
            worker = self._worker
            self._wake_worker()
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"Batcher(max_batch_size={self.max_batch_size}, max_delay_ms={self.max_delay_ms:g}"
            f"{', row_independent=True' if self.row_independent else ''}; {state})"
        )

    def _request(self, inputs: tuple[Any, ...], named: dict[str, Any]) -> Request:
        """The request, checked in its caller, with the key of the batches it may join."""
        runner = self._engine.runner
        one = self._one
        if one[0] is not runner.checks:  # the pipeline's runner of the moment (as_cuda and the like switch it)
            one = self._one = _one_input(runner)
        check = one[1]
        if check is not None and len(inputs) == 1 and not named:
            # The common request, checked inline: one array of the input's dtype and rank.
            a = inputs[0]
            if (
                type(a) is np.ndarray
                and a.dtype is check.dtype
                and a.ndim == check.ndim
                and (check.fixed_of is None or check.fixed_of(a.shape) == check.fixed)
            ):
                return Request({check.name: a}, a.shape[0], (a.dtype, a.shape[1:]))
        return joinable(runner, runner.feeds(inputs, named))

    def _put(self, request: Request) -> None:
        """Queues a request and wakes the worker where it sleeps (or starts it)."""
        if self._stamp:
            request.since = time.monotonic()
        with self._lock:
            if self._closed:
                raise RunError("the batcher is closed: it takes no new requests")
            self._queue.append(request)
            self._rows += request.rows
            if self._sleeping and (not self._filling or self._rows >= self.max_batch_size):
                self._sleeping = False
                self._wake.release()
            elif self._worker is None:
                self._worker = threading.Thread(target=self._work, name="fastseq-batcher", daemon=_DAEMON)
                self._worker.start()
                _LIVE.add(self)

    def _wake_worker(self) -> None:
        """Wakes a sleeping worker (under the lock)."""
        if self._sleeping:
            self._sleeping = False
            self._wake.release()

    # --- the worker ------------------------------------------------------------------------------
    def _work(self) -> None:
        """The worker thread: batch after batch until closed, or idle for IDLE_S."""
        on_batch = self._on_batch
        while (taken := self._next()) is not None:
            batch, threads = taken
            start = time.monotonic() if on_batch is not None else 0.0
            try:
                run(self._runner(not threads), batch)
            except BaseException as e:  # noqa: BLE001 - no caller may be left waiting
                for r in batch:
                    if r.answer is None:
                        r.answer = RunError(f"the batched run failed: {e!r}")
            deliver(batch)
            if on_batch is not None:
                _observe(on_batch, batch, start)

    def _runner(self, coroutines_only: bool) -> Runner:
        """The runner for the next batch, following the pipeline's of the moment (``as_cuda``
        and the like switch it). A batch of coroutines alone runs on the pipeline's session:
        their loop waits on this one worker, and ONNX Runtime's spinning threads, which cost
        waiting threads their cores, start its next batch sooner (benchmarks.md: 1.4x-1.5x
        the rows/s of coroutines on the spinning-off session). A batch with threads runs on
        the batchers' own session, made with the first such batch: a batcher of coroutines
        alone never holds the weights twice."""
        if self.share_session or (coroutines_only and self.spinning is None):
            return self._engine.runner
        return self._engine.batch_runner()

    @property
    def _serving(self) -> Runner:
        """The runner a batch with threads runs on (for the tests)."""
        return self._runner(False)

    def _next(self) -> tuple[list[Request], bool] | None:
        """The next batch, sleeping while there is none (or, with a delay, while it fills);
        None when the worker is to end (closed and drained, or idle)."""
        while True:
            with self._lock:
                queue = self._queue
                if queue:
                    wait = 0.0
                    if self._delay and not self._closed and self._rows < self.max_batch_size:
                        wait = queue[0].since + self._delay - time.monotonic()
                    if wait <= 0:
                        taken = self._take()
                        if taken is not None:
                            return taken
                        continue  # every request queued was dropped
                    self._filling = True
                elif self._closed:
                    self._worker = None
                    return None
                else:
                    self._filling, wait = False, IDLE_S
                self._sleeping = True
            woken = self._wake.acquire(timeout=wait)
            with self._lock:
                if not woken:
                    if self._sleeping:  # nobody released _wake: it is still held
                        self._sleeping = False
                        if not self._queue and not self._filling:  # idle that long: end
                            self._worker = None
                            return None
                    else:  # released just after the timeout: take it back
                        self._wake.acquire()
                self._filling = False

    def _take(self) -> tuple[list[Request], bool] | None:
        """Takes the next batch off the queue (under the lock): the first request and those
        after it with the same key, up to max_batch_size rows, in order, leaving out those
        whose callers stopped waiting; and whether a thread's request is in it. None if all
        of them had."""
        queue = self._queue
        batch: list[Request] = []
        other: list[Request] = []  # another batch's: they stay ahead of those after them
        rows, limit, key, threads = 0, self.max_batch_size, None, False
        while queue:
            r = queue[0]
            if r.gone or (r.future is not None and r.future.done()):  # its caller stopped waiting
                self._rows -= queue.popleft().rows
                continue
            if key is None:
                key = r.key
            elif r.key is not key and r.key != key:
                other.append(queue.popleft())
                continue
            elif rows + r.rows > limit:
                break
            batch.append(queue.popleft())
            rows += r.rows
            threads = threads or r.future is None
            if rows >= limit:
                break
        if other:
            queue.extendleft(reversed(other))
        self._rows -= rows
        return (batch, threads) if batch else None


def _observe(on_batch: Callable[[int, list[float], float], None], batch: list[Request], start: float) -> None:
    """Tells ``on_batch`` of a batch run: its rows, each request's time in the queue and the
    run's time (seconds). A failing observer costs no caller its answer."""
    try:
        on_batch(sum(r.rows for r in batch), [start - r.since for r in batch], time.monotonic() - start)
    except Exception:  # noqa: BLE001 - metrics must never stop the worker
        pass


def _one_input(runner: Runner) -> tuple[tuple[InputCheck, ...], InputCheck | None]:
    """The runner's checks (the runner's own tuple, which says whose they are without keeping
    an old runner's session alive) and those of its one input with a batch axis, for the
    common request (one array, checked inline); None where a request is checked in full."""
    checks = runner.checks
    if len(checks) == 1 and checks[0].ndim and checks[0].dtype is not None:
        return checks, checks[0]
    return checks, None


# --- batchers still working when the interpreter exits ------------------------------------------
_LIVE: weakref.WeakSet[Batcher] = weakref.WeakSet()


def _close_all() -> None:
    """Before the interpreter waits for its threads: every batcher drains and stops."""
    for batcher in list(_LIVE):
        batcher.close()


# The hook that concurrent.futures uses for its own workers: it runs before the interpreter
# joins its threads, so a worker never outlives it; without it, a daemon worker that the
# interpreter does not wait for.
try:
    threading._register_atexit(_close_all)  # type: ignore[attr-defined]
    _DAEMON = False
except (AttributeError, RuntimeError):
    _DAEMON = True


# --- settings ------------------------------------------------------------------------------------
def _check_settings(max_batch_size: Any, max_delay_ms: Any) -> None:
    """The batcher's settings, each checked (an InputError naming it, as for a call's
    arguments): a NaN or infinite delay would never end a batch, or fail in a timer."""
    if (
        isinstance(max_batch_size, bool)
        or not isinstance(max_batch_size, (int, np.integer))
        or not 1 <= max_batch_size <= MAX_BATCH_SIZE
    ):
        raise InputError(f"max_batch_size must be an int from 1 to {MAX_BATCH_SIZE}, got {max_batch_size!r}")
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


def batchable(engine: Engine, row_independent: bool = False) -> None:
    """Whether requests to ``engine``'s pipeline may be joined along their first axis (the
    batcher's rule, and the network server's): a CompositionError saying why not.
    ``row_independent`` (declared) skips the core's check that no node mixes rows."""
    if not row_independent:  # the core's verdict first: it names the node at fault
        engine.check_rows()
    _check_batch_axis(engine.runner, declared=row_independent)


def _check_batch_axis(runner: Runner, declared: bool = False) -> None:
    """Refuses a pipeline whose inputs and outputs do not all share a dynamic first axis.

    The outputs' first axes may carry other names than the inputs' (paddle2onnx names each
    ``p2o.DynamicDimension.N``): the core's analysis has followed the inputs' batch axis to
    axis 0 of every output by then, or the user has declared the rows independent
    (``declared``), which also takes differently named inputs as one batch axis."""
    named: dict[str, str] = {}  # first axis name -> the first input that has it
    for kind, infos in (("input", runner.inputs), ("output", runner.outputs)):
        for info in infos:
            if info.shape is None or info.dtype is None:
                continue  # not described, or a sequence: the rows of each run are checked instead
            if not info.shape or isinstance(info.shape[0], int):
                what = "is a scalar" if not info.shape else f"has a fixed first axis {info}"
                hint = (
                    ""
                    if not info.shape or info.shape[0] != 1 or kind != "input"
                    else "; a model exported with a batch of 1 may be made batchable with dynamic_batch=True "
                    "(fastseq ... --dynamic-batch)"
                )
                raise CompositionError(
                    f"cannot batch this pipeline: {kind} '{info.name}' {what}; the batcher joins requests "
                    f"along a dynamic first axis that every input and output has{hint}"
                )
            if kind == "input" and isinstance(info.shape[0], str):
                named.setdefault(info.shape[0], f"{kind} '{info.name}'")
    if len(named) > 1 and not declared:
        raise CompositionError(
            "cannot batch this pipeline: its inputs' first axes have different names ("
            + ", ".join(f"'{axis}' on {where}" for axis, where in named.items())
            + "), so they need not be one batch axis; if they are (each request gives every input the same "
            "number of rows), say so with row_independent=True (fastseq serve --row-independent)"
        )
