"""Operators that fit: every builder's keywords checked with the near miss (as builtin:
strings are), and the heads (flatten, softmax, argmax, topk) built without rank= taking the
rank of what feeds them in a pipeline, against numpy on real ONNX Runtime sessions."""

from __future__ import annotations

import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq
from fastseq import ops
from fastseq.ops import OperatorError
from fastseq.ops._graph import parameters

REQUIRED = {"resize": (8,), "center_crop": (8,), "letterbox": (8,), "topk": (2,)}


def every_keyword():
    for name in ops.names():
        known, _, _ = parameters(ops.OPERATORS[name])
        for param in known:
            yield name, param


@pytest.mark.parametrize("name,param", list(every_keyword()))
def test_a_misspelt_keyword_of_any_operator_gets_the_near_miss(name, param):
    builder = getattr(ops, name)
    with pytest.raises(OperatorError) as info:
        builder(*REQUIRED.get(name, ()), **{param + "s": 1})
    text = str(info.value)
    assert text.startswith(f"{name} has no parameter '{param}s' (did you mean "), text
    assert f"'{param}'" in text.partition("(did you mean ")[2].partition("?)")[0], text
    assert isinstance(info.value, ValueError) and not isinstance(info.value, TypeError)


def test_the_issue_case_and_the_other_call_mistakes():
    with pytest.raises(
        OperatorError, match=r"^resize has no parameter 'keep_aspects' \(did you mean 'keep_aspect'\?\)"
    ):
        ops.resize(224, keep_aspects=True)
    with pytest.raises(OperatorError, match=r"^resize needs size \(e.g. resize\(size=...\)\)"):
        ops.resize()
    with pytest.raises(OperatorError, match=r"^softmax got axis twice \(by position and by name\)"):
        ops.softmax(1, axis=1)
    with pytest.raises(OperatorError, match=r"^topk takes at most 3 positional arguments, got 4"):
        ops.topk(1, 1, True, 2)
    assert ops.resize(224, keep_aspect=True).name == "resize"


def image_model(dims) -> onnx.ModelProto:
    """An identity over float32 ``dims``: what feeds the head."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "img", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


IMAGES = np.random.default_rng(0).standard_normal((2, 3, 5, 4)).astype(np.float32)


@pytest.mark.parametrize("form", ["operator", "string"])
def test_heads_take_the_rank_of_what_feeds_them(form):
    img = image_model(["N", 3, 5, 4])
    heads = {
        "softmax": (ops.softmax(axis=1), "builtin:softmax?axis=1", lambda x: softmax(x, 1)),
        "argmax": (ops.argmax(axis=1), "builtin:argmax?axis=1", lambda x: x.argmax(1)),
        "topk": (ops.topk(2, axis=1), "builtin:topk?k=2&axis=1", lambda x: -np.sort(-x, axis=1)[:, :2]),
        "flatten": (ops.flatten(), "builtin:flatten", lambda x: x.reshape(2, -1)),
    }
    for name, (op, text, reference) in heads.items():
        pipe = fastseq.ONNXSequential(img, op if form == "operator" else text)
        np.testing.assert_allclose(pipe(IMAGES)[0], reference(IMAGES), rtol=1e-6, err_msg=name)
        assert len(pipe.inputs[0].shape) == 4
    assert op.inputs[0].shape == ("N", "d1", "d2", "d3"), "flatten's own rank is 4 on its own"
    assert ops.softmax().inputs[0].shape == ("N", "d1"), "[N, classes] on its own"


def test_heads_fit_in_graphs_in_chains_of_heads_and_after_pickling():
    img = image_model(["N", 3, 5, 4])
    pipe = fastseq.Pipeline(
        {"m": img, "sm": ops.softmax(axis=1), "top": pickle.loads(pickle.dumps(ops.topk(2, axis=1)))},
        edges=["m.y -> sm.input", "sm.probabilities -> top.input"],
    )
    values, indices = pipe(IMAGES)
    probs = softmax(IMAGES, 1)
    np.testing.assert_allclose(values, -np.sort(-probs, axis=1)[:, :2], rtol=1e-6)
    np.testing.assert_array_equal(indices, np.argsort(-probs, axis=1, kind="stable")[:, :2])
    chain = fastseq.ONNXSequential(img, ops.softmax(axis=1), ops.argmax(axis=1))
    np.testing.assert_array_equal(chain(IMAGES)[0], probs.argmax(1))
    named = fastseq.ONNXSequential(img, ops.softmax(axis=1), io_maps=[[("y", "input")]])
    assert len(named.outputs[0].shape) == 4


def test_a_given_rank_is_kept_and_an_axis_out_of_the_fed_rank_is_an_operator_error():
    img = image_model(["N", 3, 5, 4])
    with pytest.raises(fastseq.CompositionError, match="shape mismatch"):
        fastseq.ONNXSequential(img, ops.softmax(axis=1, rank=2))
    with pytest.raises(
        OperatorError,
        match=r"softmax \(#1\): fed img \(#0\).y of rank 2: softmax: axis must be in "
        r"\[-2, 1\] for rank 2, got 3",
    ):
        fastseq.ONNXSequential(image_model(["N", 5]), ops.softmax(axis=3))
    assert ops.softmax(axis=3).inputs[0].shape == ("N", "d1", "d2", "d3"), "on its own: the rank the axis needs"


def test_a_head_after_an_output_of_unknown_shape_stays_as_built():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "u", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    pipe = fastseq.ONNXSequential(model, ops.softmax())
    np.testing.assert_allclose(pipe(IMAGES[:, 0, 0])[0], softmax(IMAGES[:, 0, 0], -1), rtol=1e-6)
