"""The runner (fastseq.runtime.runner): its one seam into ONNX Runtime's private API
(``session._sess``, the compiled session without ``InferenceSession.run``'s per-call checks),
used where it is there, the public methods where it is not, with the same answers either
way; and run_async on ONNX Runtime's own threads, checked like a call, stopped by its
timeout or its cancellation through run options of its own."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import onnxruntime as ort
import pytest

import fastseq
from conftest import scale_model, session
from fastseq.runtime.runner import Runner, compiled_binding_run, compiled_calls
from runtime.models import light_heavy, rows, same, slow_input, slow_model

X = np.array([[1, -2, 3, -4], [0.5, 1, -1, 2]], np.float32)


class PublicOnly:
    """A session as another onnxruntime (or a wrapper) may offer it: public methods only."""

    def __init__(self, inner: ort.InferenceSession) -> None:
        self.inner = inner
        self.calls = 0

    def get_inputs(self):
        return self.inner.get_inputs()

    def get_outputs(self):
        return self.inner.get_outputs()

    def get_providers(self):
        return self.inner.get_providers()

    def run(self, output_names, feeds, run_options=None):
        self.calls += 1
        return self.inner.run(output_names, feeds, run_options)

    def run_async(self, output_names, feeds, callback, user_data, run_options=None):
        self.calls += 1
        return self.inner.run_async(output_names, feeds, callback, user_data, run_options)

    def run_with_iobinding(self, binding, run_options=None):
        self.calls += 1
        return self.inner.run_with_iobinding(binding, run_options)


def test_the_seam_takes_the_compiled_session_and_answers_as_the_public_run():
    real = session(scale_model(2.0))
    run, run_async = compiled_calls(real)
    assert run.__self__ is not real and run_async.__self__ is run.__self__  # the compiled session's
    (got,) = run(["y"], {"x": X}, ort.RunOptions())
    np.testing.assert_array_equal(got, real.run(["y"], {"x": X})[0])


def test_a_session_without_the_private_part_runs_through_its_public_methods():
    wrapped = PublicOnly(session(scale_model(2.0)))
    run, run_async = compiled_calls(wrapped)
    assert (run, run_async) == (wrapped.run, wrapped.run_async)
    runner = Runner(wrapped)
    expected = np.maximum(X * 2, 0)
    np.testing.assert_array_equal(runner.call((X,), {})[0], expected)
    np.testing.assert_array_equal(asyncio.run(runner.run_async({"x": X}, ["y"]))[0], expected)
    assert wrapped.calls == 2
    with pytest.raises(fastseq.InputError, match="'z' is not an input"):
        runner.run({"z": X}, None)


def test_a_pipeline_answers_alike_on_either_path(tmp_path):
    """The pipeline's calls (checks, errors in the stages' names) are the runner's whichever
    way it reaches ONNX Runtime."""
    path = tmp_path / "m.onnx"
    path.write_bytes(scale_model(3.0).SerializeToString())
    pipe = fastseq.ONNXSequential(str(path), session_cache=False)
    direct = pipe(X)[0]
    pipe.set_session(PublicOnly(pipe.get_session()))  # type: ignore[arg-type]
    np.testing.assert_array_equal(pipe(X)[0], direct)
    np.testing.assert_array_equal(pipe.run({"x": X})[0], direct)
    with pytest.raises(fastseq.InputError, match="input .x. expects float32, got float64"):
        pipe(X.astype(np.float64))


def test_io_binding_runs_through_the_seam_or_the_public_method():
    real = session(scale_model(2.0))
    expected = np.maximum(X * 2, 0)
    wrapped = PublicOnly(real)
    for target in (real, wrapped):
        binding = real.io_binding()
        binding.bind_cpu_input("x", X)
        binding.bind_output("y")
        run = compiled_binding_run(target, binding)
        # the compiled session's method on the compiled binding, or the wrapper's public one
        assert (run.func == wrapped.run_with_iobinding) == (target is wrapped)
        run(ort.RunOptions())
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], expected)
    assert wrapped.calls == 1


# --- run_async ----------------------------------------------------------------------------------
def test_run_async_equals_the_call_on_onnxruntimes_own_threads():
    pipe = light_heavy()
    inputs = [rows(1 + k % 3, seed=k) for k in range(16)]
    expected = [pipe(x) for x in inputs]

    async def main():
        loop = asyncio.get_running_loop()

        def no_executor(*args):  # ONNX Runtime's run_async, not a thread of ours
            raise AssertionError("run_async went through an executor")

        loop.run_in_executor = no_executor
        threads = {t.ident for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}
        got = await asyncio.gather(*(pipe.run_async(x) for x in inputs), pipe.run_async(x=inputs[0]))
        started = {t.ident for t in threading.enumerate() if not isinstance(t, threading._DummyThread)} - threads
        return got, started

    got, started = asyncio.run(main())
    assert not started
    for g, e in zip(got, [*expected, expected[0]]):
        same(g, e)


def test_run_async_checks_inputs_like_the_call():
    pipe = light_heavy()

    async def main():
        with pytest.raises(fastseq.InputError, match="expects float32"):
            await pipe.run_async(rows(2).astype(np.float64))
        with pytest.raises(fastseq.InputError, match="expects size 128 on axis 1"):
            await pipe.run_async(np.zeros((2, 5), np.float32))
        with pytest.raises(fastseq.InputError, match="'z' is not an input"):
            await pipe.run_async(z=rows(2))

    asyncio.run(main())


@pytest.mark.parametrize("threads", [2, 1], ids=["onnxruntime-pool", "no-pool-executor"])
def test_run_async_timeout_and_cancellation_stop_the_run(threads, monkeypatch):
    """A timeout or a cancelled task stops the run through run options of its own, a copy of
    the caller's: the caller's are never changed (before this fix the flag was set on theirs
    and reset later, which stopped every other call sharing them meanwhile)."""
    from fastseq.runtime import runner

    copies = []
    real = runner.run_copy
    monkeypatch.setattr(runner, "run_copy", lambda given: copies.append(real(given)) or copies[-1])
    pipe = slow_model(threads)
    x = slow_input()

    async def main():
        with pytest.raises(fastseq.RunTimeoutError, match="timeout of 0.05 s"):
            await pipe.run_async(x, timeout=0.05)
        options = ort.RunOptions()
        options.logid = "mine"
        task = asyncio.ensure_future(pipe.run_async(x, run_options=options))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert copies[-1].terminate and copies[-1].logid == "mine"  # the run's own options stop it ...
        assert not options.terminate  # ... and the caller's are untouched
        small = np.ones((1, 128), np.float32)
        same(await pipe.run_async(small, timeout=60, run_options=options), [small])

    asyncio.run(main())


@pytest.mark.parametrize("threads", [2, 1], ids=["onnxruntime-pool", "no-pool-executor"])
def test_two_run_async_calls_sharing_run_options_do_not_cancel_each_other(threads):
    """Issue 26 (12): cancelling one of two calls that share one RunOptions stopped both. Now
    the other finishes with its result, and the caller's terminate still stops a call."""
    pipe = slow_model(threads)
    x = slow_input()
    shared = ort.RunOptions()

    async def main():
        first = asyncio.ensure_future(pipe.run_async(x, run_options=shared))
        second = asyncio.ensure_future(pipe.run_async(x, run_options=shared))
        await asyncio.sleep(0.05)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        same(await second, [x])  # the identity weights: x through 3,000 MatMuls
        assert not shared.terminate
        # The caller's own flag, set while a call runs, stops it (fastseq watches theirs).
        third = asyncio.ensure_future(pipe.run_async(x, run_options=shared))
        await asyncio.sleep(0.05)
        shared.terminate = True
        with pytest.raises(fastseq.RunTimeoutError, match="stopped"):
            await third

    asyncio.run(main())
