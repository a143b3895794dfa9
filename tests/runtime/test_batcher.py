"""Dynamic batching (fastseq.runtime.batcher) and many threads on one pipeline, on real
sessions, real threads and real asyncio loops: mixed batch sizes, a bad request failing only
its caller, closing, cancelled coroutines, what cannot be batched. The batcher's worker and
its queue are test_batcher_worker.py's."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from runtime.models import light_heavy, matmuls, pipe_processes, rows, same, slow_input, slow_model

N = 64  # concurrent callers


def run_in_thread(call, timeout: float = 60):
    """``call()`` in a thread of its own, failing the test (not hanging it) past ``timeout``."""
    box: dict = {}

    def target():
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def outcomes(batcher, inputs: list) -> list:
    """Each of ``inputs`` sent to ``batcher`` from a thread of its own, all at once: what
    each caller got, its outputs or the exception it raised."""
    results: list = [None] * len(inputs)

    def call(k):
        try:
            results[k] = batcher(inputs[k])
        except Exception as e:  # noqa: BLE001 (returned to the test)
            results[k] = e

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# --- the batcher --------------------------------------------------------------------------------
def test_batcher_under_64_threads_with_mixed_batch_sizes():
    pipe = light_heavy()
    inputs = [rows(1 + k % 4, seed=k) for k in range(N)]
    expected = [pipe(x) for x in inputs]
    got: list = [None] * N
    errors = []
    with pipe.batcher(max_batch_size=16, max_delay_ms=5) as batcher:
        barrier = threading.Barrier(N)

        def caller(k: int) -> None:
            barrier.wait()
            try:
                for _ in range(3):
                    got[k] = batcher(inputs[k])
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    for g, e in zip(got, expected):
        same(g, e)


def test_batcher_under_64_coroutines_with_mixed_batch_sizes_and_named_inputs():
    pipe = light_heavy()
    inputs = [rows(1 + k % 4, seed=k) for k in range(N)]
    expected = [pipe(x) for x in inputs]

    async def main(batcher):
        return await asyncio.gather(
            *(batcher.run_async(x) if k % 2 else batcher.run_async(x=x) for k, x in enumerate(inputs))
        )

    with pipe.batcher(max_batch_size=16, max_delay_ms=5) as batcher:
        got = asyncio.run(main(batcher))
        again = asyncio.run(main(batcher))  # a second loop
    for g, a, e in zip(got, again, expected):
        same(g, e)
        same(a, e)


def test_batcher_fails_only_the_bad_request_before_joining():
    pipe = light_heavy()
    good = [rows(1, seed=k) for k in range(7)]
    bad = {
        "dtype": (rows(1).astype(np.float64),),
        "shape": (np.zeros((1, 5), np.float32),),
        "rank": (np.zeros(128, np.float32),),
    }
    results: dict = {}
    with pipe.batcher(max_batch_size=7, max_delay_ms=10_000) as batcher:  # the good ones fill one batch

        def call(key, *args, **named):
            try:
                results[key] = batcher(*args, **named)
            except Exception as e:  # noqa: BLE001
                results[key] = e

        threads = [threading.Thread(target=call, args=(k, x)) for k, x in enumerate(good)]
        threads += [threading.Thread(target=call, args=(name, *args)) for name, args in bad.items()]
        threads.append(threading.Thread(target=call, args=("name",), kwargs={"z": rows(1)}))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for k, x in enumerate(good):
        same(results[k], pipe(x))
    assert isinstance(results["dtype"], fastseq.InputError) and "expects float32" in str(results["dtype"])
    assert isinstance(results["shape"], fastseq.InputError) and "axis 1" in str(results["shape"])
    assert isinstance(results["rank"], fastseq.InputError) and "rank 2" in str(results["rank"])
    assert isinstance(results["name"], fastseq.InputError) and "'z' is not an input" in str(results["name"])


def gather_model() -> onnx.ModelProto:
    """y = table[i]: an index out of range fails the run (ONNX Runtime checks it)."""
    table = numpy_helper.from_array(np.arange(4, dtype=np.float32), "table")
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"], name="lookup")],
        "gather",
        [helper.make_tensor_value_info("i", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        [table],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_joint_run_that_fails_is_run_again_per_request_so_only_the_bad_caller_fails():
    """Issue 28 (4): one out-of-range index among 16 callers failed the whole batch. Now the
    joint run is retried for each request alone: the bad caller gets its error, the 15
    others their rows, equal to pipe(x) alone."""
    pipe = fastseq.Pipeline({"lookup": gather_model()})
    indices = [np.array([k % 4] * (1 + k % 2), np.int64) for k in range(15)]
    indices.insert(7, np.array([99], np.int64))
    with pipe.batcher(max_batch_size=23, max_delay_ms=10_000) as batcher:  # all sixteen (23 rows) in one run
        results = outcomes(batcher, indices)
        later = np.arange(23, dtype=np.int64) % 4  # the batcher goes on (a full batch)
        same(batcher(later), [later.astype(np.float32)])
    assert isinstance(results[7], fastseq.RunError) and "out of data bounds" in str(results[7])
    assert "stage lookup" in str(results[7])  # in the stage's own name
    for k, r in enumerate(results):
        if k != 7:
            same(r, pipe(indices[k]))


def test_close_runs_the_requests_waiting_and_refuses_new_ones():
    pipe = light_heavy()
    inputs = [rows(1, seed=k) for k in range(5)]
    results: list = [None] * 5
    batcher = pipe.batcher(max_batch_size=100, max_delay_ms=60_000)  # they would wait a minute

    def call(k):
        results[k] = batcher(inputs[k])

    threads = [threading.Thread(target=call, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(batcher._queue) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)  # (peeks at the queue: all five are waiting for their batch to fill)
    batcher.close()
    for t in threads:
        t.join(timeout=30)
    for r, x in zip(results, inputs):
        same(r, pipe(x))
    with pytest.raises(fastseq.RunError, match="closed"):
        batcher(inputs[0])


def test_close_from_another_thread_runs_a_loops_waiting_requests():
    pipe = light_heavy()
    inputs = [rows(1, seed=k) for k in range(5)]
    batcher = pipe.batcher(max_batch_size=100, max_delay_ms=60_000)

    async def main():
        tasks = [asyncio.ensure_future(batcher.run_async(x)) for x in inputs]
        await asyncio.sleep(0)  # they join
        closer = threading.Thread(target=batcher.close)
        closer.start()
        got = await asyncio.gather(*tasks)
        closer.join(timeout=30)
        with pytest.raises(fastseq.RunError, match="closed"):
            await batcher.run_async(inputs[0])
        return got

    for g, x in zip(asyncio.run(main()), inputs):
        same(g, pipe(x))


def test_closing_inside_the_loop_does_not_wait_for_the_loop_itself():
    pipe = light_heavy()
    inputs = [rows(1, seed=k) for k in range(3)]

    async def main():
        with pipe.batcher(max_batch_size=100, max_delay_ms=60_000) as batcher:
            tasks = [asyncio.ensure_future(batcher.run_async(x)) for x in inputs]
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks)  # closed: the batch runs once the loop goes on

    for g, x in zip(asyncio.run(main()), inputs):
        same(g, pipe(x))


def test_a_cancelled_coroutine_is_left_out_of_its_batch():
    pipe = light_heavy()

    async def main(batcher):
        keep = asyncio.ensure_future(batcher.run_async(rows(1, seed=1)))
        drop = asyncio.ensure_future(batcher.run_async(rows(2, seed=2)))
        await asyncio.sleep(0)
        drop.cancel()
        return await keep, drop

    with pipe.batcher(max_batch_size=100, max_delay_ms=20) as batcher:
        got, drop = asyncio.run(main(batcher))
    same(got, pipe(rows(1, seed=1)))
    assert drop.cancelled()


def test_a_cancelled_coroutines_rows_are_not_run(monkeypatch):
    """The worker leaves a cancelled request out as it takes a batch: the joint runs have the
    others' rows only, the batch filled up to max_batch_size by the requests after it."""
    from fastseq.runtime import batcher as batcher_module

    pipe = light_heavy()
    real = batcher_module.run
    runs = []

    def recording(runner, requests):
        runs.append([r.rows for r in requests])
        return real(runner, requests)

    monkeypatch.setattr(batcher_module, "run", recording)

    async def main(batcher):
        first = asyncio.ensure_future(batcher.run_async(rows(1, seed=1)))
        drop = asyncio.ensure_future(batcher.run_async(rows(2, seed=2)))
        other = asyncio.ensure_future(batcher.run_async(rows(4, seed=4)))
        last = asyncio.ensure_future(batcher.run_async(rows(3, seed=5)))
        await asyncio.sleep(0)
        drop.cancel()
        return await asyncio.gather(first, other, last), drop

    with pipe.batcher(max_batch_size=5, max_delay_ms=50) as batcher:
        (a, b, c), drop = asyncio.run(main(batcher))
    assert drop.cancelled()
    same(a, pipe(rows(1, seed=1)))
    same(b, pipe(rows(4, seed=4)))
    same(c, pipe(rows(3, seed=5)))
    assert runs == [[1, 4], [3]]


@pytest.mark.parametrize("then", ["deadline", "close"])
def test_a_batch_whose_only_request_was_cancelled_does_not_stall_its_loop(then):
    # A service's request timeout (wait_for) cancels the only request of a batch; its
    # deadline, or close() on the loop, then finds nothing to run (this once deadlocked the
    # loop on the batcher's own lock).
    pipe = light_heavy()

    async def main(batcher):
        task = asyncio.ensure_future(batcher.run_async(rows(1)))
        await asyncio.sleep(0)
        task.cancel()
        if then == "deadline":
            await asyncio.sleep(0.1)
        else:
            batcher.close()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return task.cancelled()
        return await batcher.run_async(rows(1, seed=3))

    batcher = pipe.batcher(max_batch_size=100, max_delay_ms=20)
    result = run_in_thread(lambda: asyncio.run(main(batcher)))
    if then == "deadline":
        same(result, pipe(rows(1, seed=3)))
    else:
        assert result is True
    batcher.close()


def test_close_from_a_thread_then_on_the_loop_answers_the_waiting_request():
    # The first close() hands the loop's batch to the worker; the second, on the loop
    # (a `with` block's exit), must not end the worker before it ran (the request was once
    # lost and the first close() waited for ever).
    pipe = light_heavy()
    batcher = pipe.batcher(max_batch_size=100, max_delay_ms=60_000)
    closers = []

    async def main():
        task = asyncio.ensure_future(batcher.run_async(rows(1, seed=4)))
        await asyncio.sleep(0)
        closer = threading.Thread(target=batcher.close)
        closers.append(closer)
        closer.start()
        time.sleep(0.3)  # the loop is busy while the closer seals its batch
        batcher.close()
        return await asyncio.wait_for(task, 30)

    got = run_in_thread(lambda: asyncio.run(main()))
    closers[0].join(timeout=30)
    assert not closers[0].is_alive()
    same(got, pipe(rows(1, seed=4)))


def test_coroutines_get_only_their_own_error_for_a_bad_request_before_or_in_the_joint_run():
    pipe = fastseq.Pipeline({"lookup": gather_model()})
    good = [np.array([k % 4], np.int64) for k in range(3)]

    async def call(batcher, *args):
        try:
            return await batcher.run_async(*args)
        except Exception as e:  # noqa: BLE001
            return e

    async def main(batcher):
        # One batch of four: three good requests and one whose index fails the joint run
        # (retried alone: only it fails); a request of the wrong dtype fails in its caller,
        # before it joins.
        wrong = call(batcher, np.array([0.5], np.float32))
        return await asyncio.gather(wrong, *(call(batcher, i) for i in good), call(batcher, np.array([99], np.int64)))

    with pipe.batcher(max_batch_size=4, max_delay_ms=10_000) as batcher:
        wrong, *good_ones, bad = asyncio.run(main(batcher))

        async def again():  # the batcher goes on: a later batch of good requests, row for row
            return await asyncio.gather(*(batcher.run_async(i) for i in good + [good[0]]))

        for g, i in zip(asyncio.run(again()), good + [good[0]]):
            same(g, pipe(i))
    assert isinstance(wrong, fastseq.InputError) and "expects int64" in str(wrong)
    assert isinstance(bad, fastseq.RunError) and "out of data bounds" in str(bad)
    for g, i in zip(good_ones, good):
        same(g, pipe(i))


def test_coroutines_of_two_loops_in_two_threads_share_the_worker_and_get_their_own_rows():
    pipe = light_heavy()
    inputs = [rows(1 + k % 3, seed=k) for k in range(N)]
    expected = [pipe(x) for x in inputs]
    got: dict = {}

    def loop_thread(half: int) -> None:
        async def main():
            return await asyncio.gather(*(batcher.run_async(x) for x in inputs[half::2]))

        got[half] = asyncio.run(main())

    with pipe.batcher(max_batch_size=8, max_delay_ms=5) as batcher:
        threads = [threading.Thread(target=loop_thread, args=(h,)) for h in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for half in (0, 1):
        for g, e in zip(got[half], expected[half::2]):
            same(g, e)


def test_a_coroutine_cancelled_while_its_batch_runs_leaves_the_others_their_answers():
    pipe = slow_model(intra_op_threads=1)  # the worker is still running when the task is cancelled
    inputs = [rows(1, seed=k) for k in range(3)]

    async def main(batcher):
        tasks = [asyncio.ensure_future(batcher.run_async(x)) for x in inputs]  # fills the batch: it runs
        await asyncio.sleep(0.001)
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    with pipe.batcher(max_batch_size=3, max_delay_ms=60_000) as batcher:
        got = asyncio.run(main(batcher))
    assert isinstance(got[1], asyncio.CancelledError)
    for k in (0, 2):
        same(got[k], pipe(inputs[k]))


def test_a_loop_closed_before_its_batch_is_answered_does_not_hold_up_close():
    pipe = slow_model(intra_op_threads=1)

    async def main(batcher):
        asyncio.ensure_future(batcher.run_async(rows(1)))  # noqa: RUF006 - a full batch: given to the worker at once
        await asyncio.sleep(0)  # then the loop ends (its task cancelled) while the worker runs

    batcher = pipe.batcher(max_batch_size=1, max_delay_ms=60_000)
    asyncio.run(main(batcher))
    closer = threading.Thread(target=batcher.close)
    closer.start()
    closer.join(timeout=60)
    assert not closer.is_alive()


def test_close_ends_the_worker_thread_after_the_batches_given_to_it():
    pipe = light_heavy()
    inputs = [rows(1, seed=k) for k in range(4)]

    async def main(batcher):
        return await asyncio.gather(*(batcher.run_async(x) for x in inputs))

    before = {t.ident for t in threading.enumerate()}
    batcher = pipe.batcher(max_batch_size=2, max_delay_ms=5)
    got = asyncio.run(main(batcher))
    worker = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("fastseq-batcher")]
    assert len(worker) == 1  # one thread for all of the loop's batches
    batcher.close()
    worker[0].join(timeout=30)
    assert not worker[0].is_alive()
    for g, x in zip(got, inputs):
        same(g, pipe(x))


def test_requests_with_other_axes_or_too_many_rows_run_apart():
    wide = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            "relu",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "D"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "D"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    pipe = fastseq.ONNXSequential(wide)
    inputs = [rows(1, dim=3, seed=1), rows(2, dim=5, seed=2), rows(9, dim=3, seed=3), rows(1, dim=3, seed=4)]

    async def main(batcher):
        return await asyncio.gather(*(batcher.run_async(x) for x in inputs))

    with pipe.batcher(max_batch_size=4, max_delay_ms=5) as batcher:
        for g, x in zip(asyncio.run(main(batcher)), inputs):
            same(g, [np.maximum(x, 0)])


def test_batcher_refuses_a_pipeline_without_a_shared_dynamic_batch_axis():
    with pytest.raises(fastseq.CompositionError, match="input 'x' has a fixed first axis"):
        fastseq.ONNXSequential(matmuls(1, batch=1)).batcher()
    two = fastseq.Pipeline(
        {"a": matmuls(1), "b": matmuls(1, batch="B")},
        inputs={"xa": ["a.x"], "xb": ["b.x"]},
        outputs=["ya=a.y", "yb=b.y"],
    )
    with pytest.raises(fastseq.CompositionError, match="first axes have different names"):
        two.batcher()
    with pytest.raises(ValueError, match="max_batch_size"):
        light_heavy().batcher(max_batch_size=0)
    # Below 2**31: the batch analysis takes the number of rows cast to INT32 as that number.
    with pytest.raises(fastseq.InputError, match="from 1 to 2147483647"):
        light_heavy().batcher(max_batch_size=2**31)


def test_an_output_that_does_not_keep_the_rows_is_an_error_not_a_wrong_split():
    # [N, 4] -> [2N, 2]: the output's first axis is not the batch axis. The core refuses it
    # (it may split rows); forced with row_independent=True, the joint run's split is
    # checked and refused rather than handing out wrong rows.
    shape = numpy_helper.from_array(np.array([-1, 2], np.int64), "shape")
    total = helper.make_model(
        helper.make_graph(
            [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
            "reshape",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [shape],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    pipe = fastseq.ONNXSequential(total)
    with pytest.raises(
        fastseq.CompositionError, match=r"node 'reshape' \(Reshape\): output 'y' holds several entries per row"
    ):
        pipe.batcher()
    with pipe.batcher(max_batch_size=2, max_delay_ms=10_000, row_independent=True) as batcher:
        results = outcomes(batcher, [np.ones((1, 4), np.float32) for _ in range(2)])
    assert all(isinstance(r, fastseq.RunError) and "does not keep the batch axis" in str(r) for r in results)
    assert results[0] is not results[1]  # each caller raises its own


def test_many_threads_calling_one_pipeline_get_what_one_thread_gets():
    pipe = light_heavy()
    inputs = [rows(1 + k % 3, seed=k) for k in range(16)]
    expected = [pipe(x) for x in inputs]
    got: dict = {}
    bound: dict = {}
    barrier = threading.Barrier(16)

    def caller(k):
        barrier.wait()
        for _ in range(20):
            got[k] = pipe(inputs[k])
        binding = pipe.bind(inputs[k])  # a binding per thread
        for _ in range(20):
            bound[k] = [o.copy() for o in binding()]

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(16):
        same(got[k], expected[k])
        same(bound[k], expected[k])


def test_a_binding_used_by_two_threads_at_once_refuses_instead_of_mixing_them():
    pipe = slow_model(1)
    binding = pipe.bind(slow_input(), run_options=ort.RunOptions())
    stopped = []

    def run():
        try:
            binding()
        except fastseq.RunTimeoutError as e:
            stopped.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while not binding._busy.locked() and time.monotonic() < deadline:
        time.sleep(0.001)  # (peeks: the other thread is inside its call)
    with pytest.raises(fastseq.RunError, match="one binding per thread"):
        binding()
    with pytest.raises(fastseq.RunError, match="one binding per thread"):
        binding.bind(slow_input())
    binding._run_options.terminate = True
    worker.join(timeout=60)
    assert stopped


def test_a_process_that_ends_right_after_run_async_exits_cleanly(tmp_path):
    """ONNX Runtime's callback thread wakes the loop and still has Python to run; a process
    whose main thread then finished used to finalize under it and abort ("FATAL: exception
    not rethrown", 5 of 12 runs of this script). Shutdown now waits for the callbacks."""
    script = (
        "import asyncio\n"
        "async def main():\n"
        "    y, = await pipe.run_async(x)\n"
        "    with pipe.batcher(max_batch_size=32, max_delay_ms=2) as b:\n"
        "        y, = await b.run_async(x)\n"
        "asyncio.run(main())\n"
    )
    for r in pipe_processes(tmp_path, script, 8):
        assert r.returncode == 0, r.stderr
