"""One input rule for every entry point (runtime/inputs.py): the same inputs through
``pipe(x)``, ``pipe(name=x)``, ``run``, ``run_async``, IO binding, the batcher (threads and
coroutines) and Ray's Predictor give the same result or the same error class. Where an entry
point differs by design it says so here: binding binds buffers where they live, so what only
a copy would take (a cast, a strided view) is refused; Ray's columns that feed no input pass
through. Plus the checks of call arguments and settings (issue 26, items 5, 6 and 10)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq

OPSET = [helper.make_opsetid("", 17)]


def pair_model() -> onnx.ModelProto:
    """y = a + b, both float32[N, 4]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "pair",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def free_model() -> onnx.ModelProto:
    """y = relu(x), x and y declared without a shape (make_tensor_value_info(..., None)),
    which ONNX Runtime runs with any shape and reports as rank 0."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "free",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


@pytest.fixture(scope="module")
def pipes():
    return {"pair": fastseq.ONNXSequential(pair_model()), "free": fastseq.ONNXSequential(free_model())}


RNG = np.random.default_rng(0)
A = RNG.standard_normal((2, 4)).astype(np.float32)
B = RNG.standard_normal((2, 4)).astype(np.float32)
WIDE = RNG.standard_normal((2, 8)).astype(np.float32)
FREE = RNG.standard_normal((2, 3, 5)).astype(np.float32)

# case -> (model, feeds by name, the reference output or None for an InputError)
CASES = {
    "right dtype": ("pair", {"a": A, "b": B}, A + B),
    "safe cast": (
        "pair",
        {"a": (A * 8).astype(np.int16), "b": B.astype(np.float16)},
        (A * 8).astype(np.int16).astype(np.float32) + B.astype(np.float16).astype(np.float32),
    ),
    "unsafe cast": ("pair", {"a": A.astype(np.float64), "b": B}, None),
    "wrong rank": ("pair", {"a": A[..., None], "b": B}, None),
    "wrong dim": ("pair", {"a": WIDE[:, :5].copy(), "b": B}, None),
    "missing input": ("pair", {"a": A}, None),
    "extra input": ("pair", {"a": A, "b": B, "c": B}, None),
    "non-array": ("pair", {"a": "abc", "b": B}, None),
    "strided": ("pair", {"a": WIDE[:, ::2], "b": B}, WIDE[:, ::2] + B),
    "declared without a shape": ("free", {"x": FREE}, np.maximum(FREE, 0)),
}


def positional(pipe, feeds):
    return pipe(*feeds.values())


def by_name(pipe, feeds):
    return pipe(**feeds)


def run(pipe, feeds):
    return pipe.run(feeds)


def run_async(pipe, feeds):
    return asyncio.run(pipe.run_async(**feeds))


def bound(pipe, feeds):
    return [o.copy() for o in pipe.bind(**feeds)()]


def batcher_thread(pipe, feeds):
    with pipe.batcher(max_delay_ms=0) as b:
        return b(**feeds)


def batcher_coroutine(pipe, feeds):
    async def main():
        with pipe.batcher(max_delay_ms=0) as b:
            return await b.run_async(**feeds)

    return asyncio.run(main())


def ray_predictor(pipe, feeds):
    """The Ray Data callable as an actor runs it, in this process: columns by input name."""
    fray = pytest.importorskip("fastseq.ray", reason="needs the ray extra")
    out = fray.Predictor(pipe, drop_columns=True)(dict(feeds))
    return [out[o.name] for o in pipe.outputs]


ENTRIES = [positional, by_name, run, run_async, bound, batcher_thread, batcher_coroutine, ray_predictor]

# Where an entry point differs from the rule by design (the module docstring says why).
DIFFERS = {
    (bound, "safe cast"): None,  # a cast would bind a copy: refused
    (bound, "strided"): None,  # a strided view would bind a copy: refused
    (ray_predictor, "extra input"): "result",  # other columns pass through
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda f: f.__name__)
def test_every_entry_point_follows_the_one_input_rule(pipes, entry, case):
    model, feeds, expected = CASES[case]
    pipe = pipes[model]
    if (entry, case) in DIFFERS:
        expected = A + B if DIFFERS[(entry, case)] == "result" else None
    if expected is None:
        with pytest.raises(fastseq.InputError) as info:
            entry(pipe, feeds)
        if case == "unsafe cast":
            assert "float64" in str(info.value) and "float32" in str(info.value)
        return
    (out,) = entry(pipe, feeds)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_the_rule_is_numpys_safe_casts():
    from fastseq.runtime.inputs import converts

    for got in (np.bool_, np.int8, np.int16, np.uint8, np.uint16, np.float16, np.float32):
        assert converts(np.dtype(np.float32), np.dtype(got))
    for got in (np.int32, np.int64, np.float64, np.complex64):
        assert not converts(np.dtype(np.float32), np.dtype(got))
    assert converts(np.dtype(np.int64), np.dtype(np.int32)) and not converts(np.dtype(np.int32), np.dtype(np.int64))
    assert converts(np.dtype(np.str_), np.dtype(object)) and not converts(np.dtype(np.str_), np.dtype(np.int64))


def test_a_refused_dtype_names_the_stage_that_reads_the_input():
    """The error names the input, both dtypes and, in a pipeline of several stages, the
    stage that reads the input in its own name."""
    first = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["pixels"], ["h"])],
            "first",
            [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 4])],
        ),
        opset_imports=OPSET,
        ir_version=8,
    )
    second = helper.make_model(
        helper.make_graph(
            [helper.make_node("Neg", ["h"], ["y"])],
            "second",
            [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        ),
        opset_imports=OPSET,
        ir_version=8,
    )
    pipe = fastseq.Pipeline({"prep": first, "net": second}, edges=["prep.h -> net.h"])
    with pytest.raises(
        fastseq.InputError,
        match=r"input 'pixels' expects float32, got float64, which does not "
        r"convert without changing values \(read by stage prep as 'pixels'\); .*astype",
    ):
        pipe(A.astype(np.float64))
    with pytest.raises(fastseq.InputError, match=r"read by stage prep as 'pixels'"):
        pipe.bind(A.astype(np.float64))


def test_inputs_declared_without_a_shape_take_any_rank(pipes):
    """Issue 26 (6): such an input was refused as "expects rank 0" by pipe(x), run, run_async
    and the batcher. It is described as shapeless, and a declared scalar stays rank 0."""
    pipe = pipes["free"]
    assert pipe.inputs[0].shape is None and str(pipe.inputs[0]) == "x: float32[?]"
    for x in (np.float32(-2.0), np.ones(3, np.float32), -FREE, FREE[None]):
        np.testing.assert_array_equal(pipe(x)[0], np.maximum(x, 0))
        np.testing.assert_array_equal(pipe.run({"x": x})[0], np.maximum(x, 0))
        np.testing.assert_array_equal(asyncio.run(pipe.run_async(x))[0], np.maximum(x, 0))
    with pipe.batcher() as b:
        np.testing.assert_array_equal(b(FREE)[0], np.maximum(FREE, 0))
    scalar = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "scalar",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        ),
        opset_imports=OPSET,
        ir_version=8,
    )
    strict = fastseq.ONNXSequential(scalar)
    assert strict.inputs[0].shape == ()
    assert strict(np.float32(-1))[0] == 0
    with pytest.raises(fastseq.InputError, match=r"input 'x' expects rank 0"):
        strict(np.ones(2, np.float32))


@pytest.mark.parametrize("value", ["abc", None, [[1.0, 2.0], [3.0]], {"a": 1}, object()])
def test_values_numpy_cannot_read_as_numbers_are_input_errors(pipes, value):
    """Issue 26 (10): run_async("abc") raised a plain ValueError; None became NaN."""
    pipe = pipes["free"]
    with pytest.raises(fastseq.InputError, match="input 'x' expects float32"):
        asyncio.run(pipe.run_async(value))
    with pytest.raises(fastseq.InputError, match="input 'x' expects float32"):
        pipe(value)


def test_feeds_that_are_not_a_mapping_are_an_input_error(pipes):
    with pytest.raises(fastseq.InputError, match="feeds must map input names to arrays, got a ndarray"):
        pipes["free"].run(FREE)


# --- settings and arguments -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting",
    [
        {"max_delay_ms": math.nan},
        {"max_delay_ms": math.inf},
        {"max_delay_ms": -1},
        {"max_delay_ms": "32"},
        {"max_delay_ms": True},
        {"max_delay_ms": 1e300},
        {"max_batch_size": 0},
        {"max_batch_size": -1},
        {"max_batch_size": "32"},
        {"max_batch_size": 2.5},
        {"max_batch_size": math.inf},
        {"max_batch_size": True},
    ],
    ids=str,
)
def test_batcher_settings_are_checked_with_a_typed_error(pipes, setting):
    """Issue 26 (5): max_delay_ms=nan was taken and coroutine requests never ran; inf, 0, -1
    and "32" gave untyped errors. Each is an InputError (a ValueError) naming the setting."""
    (name,) = setting
    with pytest.raises(fastseq.InputError, match=name):
        pipes["free"].batcher(**setting)
    with pytest.raises(fastseq.InputError, match=name):
        fastseq.Batcher(pipes["free"], **setting)


def test_a_batcher_without_delay_runs_coroutine_requests(pipes):
    """max_delay_ms=0: a request joins only those already waiting, and every one is run."""
    pipe = pipes["free"]

    async def main():
        with pipe.batcher(max_batch_size=np.int64(4), max_delay_ms=0) as b:
            return await asyncio.wait_for(asyncio.gather(*(b.run_async(FREE * k) for k in range(6))), 60)

    for k, (out,) in enumerate(asyncio.run(main())):
        np.testing.assert_array_equal(out, np.maximum(FREE * k, 0))


@pytest.mark.parametrize(
    "arguments",
    [
        {"runs": 0},
        {"runs": 2.5},
        {"runs": "3"},
        {"runs": True},
        {"warmup": -1},
        {"warmup": 1.0},
        {"warmup": None},
    ],
    ids=str,
)
def test_profile_arguments_are_checked_with_a_typed_error(pipes, arguments):
    """Issue 26 (10): profile(runs=0) gave ValueError, runs=2.5 TypeError, warmup=-1 ran."""
    (name,) = arguments
    with pytest.raises(fastseq.InputError, match=f"profile needs {name} >="):
        pipes["free"].profile(FREE, **arguments)
