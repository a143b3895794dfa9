"""Dynamic batching: many callers' small requests joined along the batch axis into one run.

A service receives many small requests at once; run one by one, a small machine spends its
time on per-call overhead and small matrix products. The batcher's one thread takes the
requests waiting, joins those that arrive within ``max_delay_ms`` of the first (up to
``max_batch_size`` rows), runs the pipeline once and hands each caller its own rows."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np

from fastseq.errors import CompositionError, InputError, RunError

_CLOSE = object()  # the last item a closed batcher's queue receives


class _Request:
    """One caller's checked arrays (in input order), its rows, and where its answer goes:
    a ``concurrent.futures.Future`` (a thread) or an asyncio future and its loop."""

    __slots__ = ("arrays", "rows", "key", "arrived", "future", "loop")

    def __init__(self, arrays: list[np.ndarray], rows: int, key: tuple, future: Any, loop: Any) -> None:
        self.arrays, self.rows, self.key, self.future, self.loop = arrays, rows, key, future, loop
        self.arrived = time.monotonic()


class Batcher:
    """Joins concurrent requests to one pipeline into batches (see
    :meth:`fastseq.ONNXSequential.batcher`).

    ``batcher(x)`` from any thread, ``await batcher.run_async(x)`` from coroutines (any
    loop); both return what ``pipe(x)`` returns for that request's rows. Every input's first
    axis is the batch axis: a pipeline with an input or output whose first axis is fixed,
    or inputs whose first axes carry different names, is refused with
    :class:`fastseq.CompositionError` (joining them would be wrong). A request is checked in
    its caller before it is joined: a wrong dtype, rank, size or name, or inputs with
    different row counts, is an :class:`fastseq.InputError` for that caller only. Requests
    join when their other axes agree (others run in their own batch); one larger than
    ``max_batch_size`` runs alone. An error in a joint run reaches every caller of that run
    (each gets its own copy of it); an output that does not keep the rows of its inputs is a
    :class:`fastseq.RunError` rather than a wrong split.

    A request waits at most ``max_delay_ms`` for others to join, plus the batches ahead of
    it. ``close()`` (or leaving ``with pipe.batcher() as b:``) runs the requests already
    taken and refuses new ones with :class:`fastseq.RunError`. The pipeline's session may be
    switched meanwhile (``as_cuda``, ...): each batch runs on the session of the moment.
    """

    def __init__(self, pipe: Any, max_batch_size: int = 32, max_delay_ms: float = 2.0) -> None:
        if max_batch_size < 1 or max_delay_ms < 0:
            raise ValueError(f"max_batch_size must be >= 1 and max_delay_ms >= 0, got {max_batch_size}, {max_delay_ms}")
        _check_batch_axis(pipe._runner)
        self.max_batch_size = max_batch_size
        self.max_delay_ms = max_delay_ms
        self._pipe = pipe
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=_serve, args=(self._queue, pipe, max_batch_size, max_delay_ms / 1000), daemon=True,
            name="fastseq-batcher",
        )
        self._thread.start()
        # A batcher dropped without close() stops its thread once the queue is worked off.
        self._finalizer = weakref.finalize(self, self._queue.put, _CLOSE)

    def __call__(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``pipe(x)`` for this request's rows, run in a batch with other callers' rows."""
        future: Future[list[np.ndarray]] = Future()
        self._submit(self._request(inputs, named, future, None))
        return future.result()

    async def run_async(self, *inputs: Any, **named: Any) -> list[np.ndarray]:
        """``await batcher.run_async(x)``: as :meth:`__call__`, from a coroutine; the batch
        thread resolves the future through the loop's ``call_soon_threadsafe``. A request
        cancelled before its batch runs is left out of it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(self._request(inputs, named, future, loop))
        return await future

    def close(self) -> None:
        """Refuses new requests and waits until those already taken have run."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._finalizer()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Batcher(max_batch_size={self.max_batch_size}, max_delay_ms={self.max_delay_ms:g}; {state})"

    # --- requests -------------------------------------------------------------------------
    def _request(self, inputs: tuple[Any, ...], named: dict[str, Any], future: Any, loop: Any) -> _Request:
        runner = self._pipe._runner
        feeds = runner.feeds(inputs, named)
        arrays = [feeds[i.name] for i in runner.inputs]
        rows = {a.shape[0] for a in arrays}
        if len(rows) != 1:
            sizes = ", ".join(f"'{i.name}' {a.shape[0]}" for i, a in zip(runner.inputs, arrays))
            raise InputError(f"the inputs of one request must have the same number of rows (axis 0): {sizes}")
        key = tuple((a.dtype.str, a.shape[1:]) for a in arrays)
        return _Request(arrays, rows.pop(), key, future, loop)

    def _submit(self, request: _Request) -> None:
        with self._lock:
            if self._closed:
                raise RunError("the batcher is closed: it takes no new requests")
            self._queue.put(request)


def _check_batch_axis(runner: Any) -> None:
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


# --- the batch thread -------------------------------------------------------------------------
def _serve(requests: queue.SimpleQueue[Any], pipe: Any, max_rows: int, delay: float) -> None:
    """Takes requests until the queue's close marker; runs them in batches."""
    waiting: deque[_Request] = deque()  # taken but not run yet: other axes, or no room left
    closing = False
    while True:
        if waiting:
            first = waiting.popleft()
        elif closing:
            return
        else:
            item = requests.get()
            if item is _CLOSE:
                return
            first = item
        if _cancelled(first):
            continue
        batch, rows = [first], first.rows
        for r in list(waiting):
            if rows >= max_rows:
                break
            if r.key == first.key and rows + r.rows <= max_rows:
                waiting.remove(r)
                batch.append(r)
                rows += r.rows
        deadline = first.arrived + delay
        while rows < max_rows and not closing:
            wait = deadline - time.monotonic()
            try:
                item = requests.get(timeout=wait) if wait > 0 else requests.get_nowait()
            except queue.Empty:
                break
            if item is _CLOSE:
                closing = True
            elif item.key == first.key and rows + item.rows <= max_rows:
                batch.append(item)
                rows += item.rows
            else:
                waiting.append(item)
        _run(pipe, [r for r in batch if r is first or not _cancelled(r)])


def _cancelled(r: _Request) -> bool:
    return r.loop is not None and r.future.cancelled()


def _run(pipe: Any, batch: list[_Request]) -> None:
    """Runs one batch and answers each of its callers."""
    runner = pipe._runner
    names = [i.name for i in runner.inputs]
    try:
        if len(batch) == 1:
            answers: list[Any] = [runner._call(runner._output_list, dict(zip(names, batch[0].arrays)), None)]
        else:
            feeds = {name: np.concatenate([r.arrays[k] for r in batch]) for k, name in enumerate(names)}
            outputs = runner._call(runner._output_list, feeds, None)
            rows = sum(r.rows for r in batch)
            for info, out in zip(runner.outputs, outputs):
                if out.ndim == 0 or out.shape[0] != rows:
                    raise RunError(
                        f"output '{info.name}' has shape {list(out.shape)} for {rows} rows of input: it does not keep "
                        "the batch axis, so the batcher cannot split it between callers; call the pipeline directly"
                    )
            answers, start = [], 0
            for r in batch:
                answers.append([out[start:start + r.rows].copy() for out in outputs])
                start += r.rows
    except Exception as e:
        answers = [_copy_error(e) for _ in batch]
    by_loop: dict[Any, list[tuple[Any, Any]]] = {}
    for r, answer in zip(batch, answers):
        if r.loop is None:
            if isinstance(answer, BaseException):
                r.future.set_exception(answer)
            else:
                r.future.set_result(answer)
        else:
            by_loop.setdefault(r.loop, []).append((r.future, answer))
    for loop, items in by_loop.items():  # one wake-up per loop, not per caller
        try:
            loop.call_soon_threadsafe(_settle, items)
        except RuntimeError:  # the loop was closed: nobody is waiting there
            pass


def _settle(items: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, answer in items:
        if future.done():  # cancelled while its batch ran
            continue
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)


def _copy_error(error: Exception) -> Exception:
    """The error of a joint run for one of its callers (each raises its own object)."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        copy = RunError(f"the batched run failed: {error}")
    copy.__cause__ = error.__cause__ if error.__cause__ is not None else error
    return copy
