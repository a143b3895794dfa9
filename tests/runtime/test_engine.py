"""The engine: a pipeline's session lifecycle behind the Engine contract, which the batcher,
the served model, Ray and profiles take (a pipeline or its engine alike)."""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

import fastseq
from conftest import scale_model
from fastseq.runtime import profile
from fastseq.runtime.batcher import Batcher
from fastseq.runtime.engine import Engine, SessionEngine, engine_of
from fastseq.serving.model import ServedModel

X = np.array([[1, -2, 3, -4], [0.5, 1, -1, 2]], np.float32)


@pytest.fixture
def pipe(tmp_path):
    paths = []
    for k, scale in enumerate((2.0, 3.0)):
        paths.append(tmp_path / f"m{k}.onnx")
        paths[-1].write_bytes(scale_model(scale, shape=("n", 4)).SerializeToString())  # a batch axis
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return fastseq.ONNXSequential(*map(str, paths), session_options=options, session_cache=False)


def test_a_pipelines_engine_is_the_contract_and_either_is_taken(pipe):
    engine = pipe.engine
    assert isinstance(engine, Engine) and isinstance(engine, SessionEngine)
    assert engine_of(pipe) is engine_of(engine) is engine
    assert engine.runner is pipe.runner and len(engine.labels) == len(pipe) == 2
    with pytest.raises(fastseq.InputError, match="expected a fastseq pipeline .*got dict"):
        engine_of({"model": b""})  # type: ignore[arg-type]


def test_the_batcher_and_the_served_model_run_on_an_engine_as_on_a_pipeline(pipe):
    expected = pipe(X)[0]
    with Batcher(pipe.engine) as b, Batcher(pipe) as b2:
        np.testing.assert_array_equal(b(X)[0], expected)
        np.testing.assert_array_equal(b2(X)[0], expected)
    served = ServedModel("m", pipe.engine, max_batch_size=4)
    try:
        np.testing.assert_array_equal(asyncio.run(served.infer({pipe.inputs[0].name: X}))[0], expected)
    finally:
        served.close()


def test_the_batchers_session_is_made_once_per_session_of_the_moment(pipe):
    engine = pipe.engine
    own = engine.batch_runner()
    assert own is engine.batch_runner() and own.session is not pipe.get_session()
    assert own.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    pipe.as_cpu()  # a new session of the moment: a new one for the batchers too
    assert engine.batch_runner() is not own
    np.testing.assert_array_equal(engine.batch_runner().call((X,), {})[0], pipe(X)[0])


def test_session_options_are_a_copy_of_the_callers(pipe):
    engine = pipe.engine
    copy = engine.session_options()
    assert copy.intra_op_num_threads == 1
    copy.intra_op_num_threads = 2
    assert engine.session_options().intra_op_num_threads == 1


def test_an_engine_rebuilt_from_its_portable_form_calls_and_names_stages_alike(pipe):
    rebuilt = SessionEngine.from_portable(pipe.engine.portable())
    assert rebuilt.labels == pipe.engine.labels
    np.testing.assert_array_equal(rebuilt.runner.call((X,), {})[0], pipe(X)[0])
    with pytest.raises(fastseq.InputError, match="expects float32"):
        rebuilt.runner.call((X.astype(np.float64),), {})


def test_a_profile_takes_the_engine(pipe):
    measured = profile.measure(pipe.engine, {pipe.inputs[0].name: X}, runs=3, warmup=1)
    assert [s.name for s in measured.stages] == pipe.engine.labels and measured.runs == 3
