"""The runner's one seam into ONNX Runtime's private API (``session._sess``, the compiled
session without ``InferenceSession.run``'s per-call checks): used where it is there, the
public methods where it is not, with the same answers either way."""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

import fastseq
from conftest import scale_model, session
from fastseq.runtime.runner import Runner, compiled_binding_run, compiled_calls

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
