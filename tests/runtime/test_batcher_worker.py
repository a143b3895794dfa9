"""The batcher's worker, its queue and its callers: threads and coroutines on one batcher,
a caller interrupted while it waits, a worker that ends when idle and at interpreter exit,
a failing worker, the batcher's own session and the pipeline's of the moment. Real
sessions, real threads, real loops (tests/runtime/test_batcher.py has the rest of the batcher's
guarantees)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

import fastseq
from fastseq.runtime import batcher as batcher_module
from fastseq.runtime import batches
from runtime.models import light_heavy, pipe_processes, rows, same, slow_model


def test_threads_and_coroutines_of_two_loops_share_one_batcher_and_get_their_own_rows():
    pipe = light_heavy()
    inputs = [rows(1 + k % 4, seed=k) for k in range(96)]
    expected = [pipe(x) for x in inputs]
    got: dict = {}
    errors: list = []

    def thread(k):
        try:
            for _ in range(3):
                got[k] = b(inputs[k])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    def loop(first):
        async def main():
            return await asyncio.gather(*(b.run_async(inputs[k]) for k in range(first, first + 32)))

        for k, g in enumerate(asyncio.run(main()), first):
            got[k] = g

    with pipe.batcher(max_batch_size=16) as b:
        workers = [threading.Thread(target=thread, args=(k,)) for k in range(32)]
        workers += [threading.Thread(target=loop, args=(first,)) for first in (32, 64)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert not errors
    for k, e in enumerate(expected):
        same(got[k], e)


def interrupt_main_when(ready, timeout: float = 30) -> threading.Thread:
    """Sends SIGINT to the main thread (a real signal: a waiting lock wakes) once ready(), and
    again every 20 ms until it has raised KeyboardInterrupt there once: a signal that lands
    just before the main thread blocks on a lock is handled only once the lock is released.
    Later ones are ignored until join() restores the handler (call it from the main thread)."""
    main = threading.main_thread().ident
    raised = threading.Event()

    def once(signum, frame):
        if not raised.is_set():
            raised.set()
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, once)

    class Watcher(threading.Thread):
        def run(self):
            deadline = time.monotonic() + timeout
            while not ready() and time.monotonic() < deadline:
                time.sleep(0.005)
            while not raised.is_set() and time.monotonic() < deadline + timeout:
                signal.pthread_kill(main, signal.SIGINT)
                raised.wait(0.02)

        def join(self, timeout=None):
            super().join(timeout)
            for _ in range(5):  # a signal still pending is handled (and ignored) here
                time.sleep(0.01)
            signal.signal(signal.SIGINT, previous)

    watcher = Watcher(daemon=True)
    watcher.start()
    return watcher


def test_a_thread_interrupted_while_it_waits_leaves_the_others_their_answers(monkeypatch):
    """A caller interrupted (KeyboardInterrupt) while its batch runs, or while it is still
    queued: it raises, every other caller of the batch is still woken with its rows (the
    callers wake each other one after the other; the interrupted one is passed over), and
    a queued one is left out of its batch."""
    pipe = light_heavy()
    inputs = [rows(1, seed=k) for k in range(4)]
    got: dict = {}
    running, release = threading.Event(), threading.Event()
    real = batcher_module.run

    def held(runner, requests):  # a long run: the interrupt lands while it runs
        running.set()
        release.wait(60)
        real(runner, requests)

    monkeypatch.setattr(batcher_module, "run", held)

    def call(k):
        got[k] = b(inputs[k])

    with pipe.batcher(max_batch_size=4, max_delay_ms=60_000) as b:
        others = [threading.Thread(target=call, args=(k,)) for k in (1, 2, 3)]
        for t in others:
            t.start()
        deadline = time.monotonic() + 30
        while len(b._queue) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)  # (peeks: the three wait for a fourth)
        watcher = interrupt_main_when(running.is_set)
        with pytest.raises(KeyboardInterrupt):
            b(inputs[0])  # fills the batch, which runs; interrupted while it does
        watcher.join()
        release.set()
        for t in others:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in others)
        for k in (1, 2, 3):
            same(got[k], pipe(inputs[k]))
        # Interrupted while still queued (its batch waits to fill): left out of the batch.
        running.clear()
        watcher = interrupt_main_when(lambda: len(b._queue) == 1)
        with pytest.raises(KeyboardInterrupt):
            b(inputs[0])
        watcher.join()
        assert b._queue[0].gone
        got.clear()
        others = [threading.Thread(target=call, args=(k,)) for k in (1, 2, 3)]  # its rows still count: full
        for t in others:
            t.start()
        for t in others:
            t.join(timeout=60)
        assert sorted(got) == [1, 2, 3]
        for k in (1, 2, 3):
            same(got[k], pipe(inputs[k]))


@pytest.mark.parametrize(
    "when",
    ["while its batch runs", "once run, before its loop is called back", "once answered, before the task resumes"],
)
def test_a_coroutine_cancelled_before_it_has_its_rows_raises_cancelled_error(monkeypatch, when):
    """Issue 37, item 4: a cancelled coroutine raises CancelledError, as asyncio's cancellation
    does, whenever the cancel lands before the task has resumed with its rows: while a slow
    batch runs (ONNX Runtime still at work), after the run but before its loop's callback,
    or after the callback set its future but before the task ran again. Its rows are
    dropped; the others of its batch get theirs. A cancel after the task returned does
    nothing (``cancel()`` is False) and the rows it returned stand."""
    pipe = slow_model(intra_op_threads=1)
    inputs = [rows(256, seed=k) for k in range(2)]
    running, ran = threading.Event(), threading.Event()
    cancelled, tasks = threading.Event(), []
    real_run, real_deliver, real_settle = batcher_module.run, batcher_module.deliver, batches._settle

    def run(runner, requests):
        running.set()
        real_run(runner, requests)
        ran.set()

    def deliver(batch):
        if when == "once run, before its loop is called back":
            cancelled.wait(60)
        real_deliver(batch)

    def settle(requests):
        real_settle(requests)
        if when == "once answered, before the task resumes":
            assert tasks[1].cancel()  # its future is done: the task is woken, not yet run
            cancelled.set()

    monkeypatch.setattr(batcher_module, "run", run)
    monkeypatch.setattr(batcher_module, "deliver", deliver)
    monkeypatch.setattr(batches, "_settle", settle)

    async def main(batcher):
        tasks.extend(asyncio.ensure_future(batcher.run_async(x)) for x in inputs)  # a full batch
        if when != "once answered, before the task resumes":
            while not (running.is_set() if when == "while its batch runs" else ran.is_set()):
                await asyncio.sleep(0.001)
            assert tasks[1].cancel()
            ran_already = ran.is_set()
            cancelled.set()
            assert ran_already == (when != "while its batch runs")  # (the run took its time)
        return await asyncio.gather(*tasks, return_exceptions=True)

    with pipe.batcher(max_batch_size=512, max_delay_ms=60_000) as batcher:  # runs once both are queued
        got = asyncio.run(main(batcher))
    assert isinstance(got[1], asyncio.CancelledError) and tasks[1].cancelled()
    same(got[0], pipe(inputs[0]))

    async def after(batcher):
        task = asyncio.ensure_future(batcher.run_async(inputs[1]))
        answer = await task
        return answer, task.cancel()

    with pipe.batcher() as batcher:
        answer, cancel = asyncio.run(after(batcher))
    assert cancel is False
    same(answer, pipe(inputs[1]))


def test_the_worker_ends_when_idle_and_the_next_request_starts_another(monkeypatch):
    monkeypatch.setattr(batcher_module, "IDLE_S", 0.1)
    pipe = light_heavy()
    with pipe.batcher() as b:
        same(b(rows(2)), pipe(rows(2)))
        first = b._worker
        assert first is not None and first.name == "fastseq-batcher"
        first.join(timeout=30)
        assert not first.is_alive() and b._worker is None
        same(b(rows(3, seed=1)), pipe(rows(3, seed=1)))
        assert b._worker is not first


def test_a_failure_in_the_worker_reaches_the_callers_and_the_worker_goes_on(monkeypatch):
    pipe = light_heavy()
    real = batches.run
    calls = []

    def broken(runner, requests):
        calls.append(len(requests))
        if len(calls) == 1:
            raise MemoryError("no memory for this batch")
        real(runner, requests)

    monkeypatch.setattr(batcher_module, "run", broken)
    with pipe.batcher() as b:
        with pytest.raises(fastseq.RunError, match="the batched run failed: MemoryError"):
            b(rows(1))
        same(b(rows(1)), pipe(rows(1)))


def test_the_batchers_own_session_does_not_spin_and_follows_the_pipelines():
    pipe = light_heavy()
    with pipe.batcher() as b, pipe.batcher() as again, pipe.batcher(share_session=True) as shared:
        own = b._serving.session
        assert own is not pipe.get_session()
        assert own.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert again._serving is b._serving  # made once for the pipeline's session
        assert shared._serving is pipe.runner
        same(b(rows(2)), pipe(rows(2)))
        pipe.as_cpu()  # a new session for the pipeline: the batcher follows it
        same(b(rows(2)), pipe(rows(2)))
        assert b._serving.session is not own and b._serving is pipe.engine.batch_runner()
        same(shared(rows(2)), pipe(rows(2)))
        assert shared._serving is pipe.runner
    spinning = ort.SessionOptions()
    spinning.add_session_config_entry("session.intra_op.allow_spinning", "1")
    spinning_pipe = light_heavy(session_options=spinning)
    with spinning_pipe.batcher() as b:  # the caller's own choice stands, on the pipeline's own session
        assert (
            b._serving.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "1"
        )
        assert b._serving is spinning_pipe.runner
    with pipe.batcher(spinning=False) as b:  # coroutines' batches too on the spinning-off session
        assert b._runner(True) is pipe.engine.batch_runner() is not pipe.runner
    with pytest.raises(fastseq.InputError, match="spinning must be None"):
        pipe.batcher(spinning=True)
    with pytest.raises(fastseq.InputError, match="share_session must be True or False"):
        pipe.batcher(share_session="yes")


def test_batches_of_threads_run_on_the_own_session_and_batches_of_coroutines_on_the_pipelines(monkeypatch):
    """Threads' batches on the spinning-off session (spinning threads take the waiting
    threads' cores); a batch of coroutines alone on the pipeline's (its loop waits on the one
    worker, which spinning serves sooner). Either way each caller gets pipe(x)'s rows."""
    pipe = light_heavy()
    used = []

    def recording(runner, requests):
        used.append((runner.session, all(r.future is not None for r in requests)))
        return batches.run(runner, requests)

    monkeypatch.setattr(batcher_module, "run", recording)
    with pipe.batcher() as b:
        same(b(rows(2)), pipe(rows(2)))

        async def coroutines():
            return await asyncio.gather(*(b.run_async(rows(k + 1)) for k in range(4)))

        for k, got in enumerate(asyncio.run(coroutines())):
            same(got, pipe(rows(k + 1)))
        own = b._serving.session
    assert own is not pipe.get_session()
    assert used[0] == (own, False)
    assert used[1:] and all(session is pipe.get_session() and only for session, only in used[1:])


def test_a_batcher_of_coroutines_alone_never_makes_a_second_session():
    """Coroutines' batches run on the pipeline's session, so an asyncio server holds the
    weights once; the batchers' own session comes with the first batch that has a thread."""
    pipe = light_heavy()
    with pipe.batcher() as b:

        async def coroutines():
            return await asyncio.gather(*(b.run_async(rows(k + 1)) for k in range(4)))

        for k, got in enumerate(asyncio.run(coroutines())):
            same(got, pipe(rows(k + 1)))
        assert pipe.engine._batch is None  # no second session yet
        same(b(rows(2)), pipe(rows(2)))
        assert pipe.engine.batch_runner().session is not pipe.get_session()


def test_a_pipeline_that_made_a_batcher_is_freed_with_its_sessions():
    """The batchers' own runner is kept with the pipeline, not in a mapping keyed by it whose
    value (runners referring back to the pipeline) would keep it, and its second session,
    alive for ever."""
    import gc
    import weakref

    pipe = light_heavy()
    with pipe.batcher() as b:
        same(b(rows(2)), pipe(rows(2)))
        assert b._serving.session is not pipe.get_session()
    gone = weakref.ref(pipe)
    del pipe, b
    gc.collect()
    assert gone() is None


def test_the_batchers_own_session_starts_from_the_session_cache(tmp_path):
    """A pipeline's session stored in the session cache carries options the cache set for it
    (the optimised model's file); the batcher's own session starts from the pipeline's options."""
    pipe = light_heavy(session_cache=tmp_path / "cache")
    assert pipe.session_info["cache"] == "stored"
    with pipe.batcher() as b:
        assert b._serving.session is not pipe.get_session()
        assert (
            b._serving.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
        )
        same(b(rows(3)), pipe(rows(3)))
    again = light_heavy(session_cache=tmp_path / "cache")  # a hit: its own session too
    assert again.session_info["cache"] == "hit"
    with again.batcher() as b:
        same(b(rows(2)), again(rows(2)))


def test_a_process_that_never_closes_its_batcher_exits_cleanly(tmp_path):
    """The worker is a thread the interpreter waits for; an exit hook closes every batcher
    first (as concurrent.futures does for its workers): the queued request runs, the worker
    ends, and the process exits without an error (several times: no race at exit)."""
    script = (
        "import threading\n"
        "b = pipe.batcher(max_delay_ms=1_000)\n"
        "print(b(x)[0].shape)\n"
        "t = threading.Thread(target=lambda: print('late', b(x)[0].shape), daemon=True)\n"
        "t.start()\n"
    )
    for r in pipe_processes(tmp_path, script, 4):
        assert r.returncode == 0 and not r.stderr, r.stderr
        assert "(2, 8)" in r.stdout


def test_closing_twice_and_from_several_threads_is_fine():
    pipe = light_heavy()
    b = pipe.batcher()
    same(b(rows(1)), pipe(rows(1)))
    closers = [threading.Thread(target=b.close) for _ in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(timeout=30)
    b.close()
    assert "closed" in repr(b)
    with pytest.raises(fastseq.RunError, match="closed"):
        b(rows(1))


def test_requests_as_users_make_them_get_what_pipe_x_gives():
    """The common request is checked inline; anything else (another byte order, a strided
    view, nested lists, float64 where the rule refuses it, a name) takes the full rule, and
    each gets what pipe(x) gives or raises what it raises."""
    pipe = light_heavy()
    x = rows(3, seed=7)
    with pipe.batcher() as b:
        for given in (x, x.astype(">f4"), np.repeat(x, 2, axis=1)[:, ::2], x.tolist(), x[:0]):
            same(b(given), pipe(given))
        same(b(**{pipe.inputs[0].name: x}), pipe(x))
        for wrong in (x.astype(np.float64), x[:, :5], x[0]):
            with pytest.raises(fastseq.InputError) as direct:
                pipe(wrong)
            with pytest.raises(fastseq.InputError) as batched:
                b(wrong)
            assert str(batched.value) == str(direct.value)


def test_run_all_joins_what_shares_a_key_and_keeps_each_answer_its_own():
    """Requests gathered by another batching (Ray Serve's) run by the batcher's rules: checked
    one by one, joined where their keys agree, at most max_rows rows a run, a failing joint run
    retried per request."""
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    ident = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", T.FLOAT, ["N", "W"])],
            [helper.make_tensor_value_info("y", T.FLOAT, ["N", "W"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    p = fastseq.ONNXSequential(ident)
    feeds = [{"x": np.full((1, 2), k, np.float32)} for k in range(5)] + [
        {"x": np.ones((2, 3), np.float32)},
        {"x": np.zeros((1, 2), np.float64)},
    ]
    answers = batches.run_all(p.runner, feeds, 2)
    for f, a in zip(feeds[:6], answers[:6]):
        np.testing.assert_array_equal(a[0], f["x"])
    assert isinstance(answers[6], fastseq.InputError)  # float64 for float32: refused for that request alone
    table = numpy_helper.from_array(np.arange(5, dtype=np.float32), "table")
    lookup = helper.make_model(
        helper.make_graph(
            [helper.make_node("Gather", ["table", "i"], ["y"], axis=0)],
            "g",
            [helper.make_tensor_value_info("i", T.INT64, ["N", 1])],
            [helper.make_tensor_value_info("y", T.FLOAT, ["N", 1])],
            [table],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    q = fastseq.ONNXSequential(lookup)
    answers = batches.run_all(
        q.runner, [{"i": np.array([[1]])}, {"i": np.array([[9]])}, {"i": np.array([[2], [3]])}], 8
    )
    assert answers[0][0].tolist() == [[1.0]] and answers[2][0].tolist() == [[2.0], [3.0]]
    assert isinstance(answers[1], fastseq.RunError)
