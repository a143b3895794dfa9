"""Adapters are right or refused: where an edge's two sides differ by one axis of size 1,
the axis comes from the dims' sizes and names, the result equals numpy's, and the declared
output shape is the one ONNX Runtime computes; where the shapes do not say which axis, the
error lists the adapters that would fit. Every rank change between 1 and 4 dimensions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq

SHORT = ["N", 5, 6, 7]  # the first r dims make a rank-r tensor; N is the batch


def identity(dims_in: list, dims_out: list, name: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims_in)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims_out)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], name, [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def cases():
    for r in range(1, 4):
        short = SHORT[:r]
        for k in range(r + 1):
            yield short, k


def declared(pipe) -> tuple:
    return tuple(3 if d == "N" else d for d in pipe.outputs[0].shape)


@pytest.mark.parametrize("short,k", list(cases()))
def test_unsqueeze_matches_numpy_on_every_axis(short, k):
    long = short[:k] + [1] + short[k:]
    pipe = fastseq.Pipeline(
        {"a": identity(short, short, "a"), "b": identity(long, long, "b")},
        edges=["a.y -> b.x"],
        adapt=True,
    )
    x = np.random.default_rng(k).standard_normal([3 if d == "N" else d for d in short]).astype(np.float32)
    (y,) = pipe(x)
    np.testing.assert_array_equal(y, np.expand_dims(x, k))
    assert declared(pipe) == y.shape
    assert pipe.report()["adapters"] == [(0, f"Unsqueeze of axis {k}")]


@pytest.mark.parametrize("short,k", list(cases()))
def test_squeeze_matches_numpy_on_every_axis(short, k):
    long = short[:k] + [1] + short[k:]
    pipe = fastseq.ONNXSequential(identity(long, long, "a"), identity(short, short, "b"), adapt=True)
    x = np.random.default_rng(k).standard_normal([3 if d == "N" else d for d in long]).astype(np.float32)
    (y,) = pipe(x)
    np.testing.assert_array_equal(y, np.squeeze(x, k))
    assert declared(pipe) == y.shape


def test_the_issue_cases():
    """[N, 32] -> [N, 1, 32] unsqueezes axis 1 (was axis 0: (1, 3, 32) for a batch of 3),
    [N, 32] -> [N, 32, 1] axis 2 (was refused)."""
    x = np.ones((3, 32), np.float32)
    for long, axis in (["N", 1, 32], 1), (["N", 32, 1], 2):
        pipe = fastseq.ONNXSequential(identity(["N", 32], ["N", 32], "a"), identity(long, long, "b"), adapt=True)
        (y,) = pipe(x)
        assert y.shape == np.expand_dims(x, axis).shape == declared(pipe)


def test_an_ambiguous_edge_lists_what_would_fit():
    with pytest.raises(fastseq.CompositionError) as info:
        fastseq.Pipeline(
            {"a": identity(["a", "b"], ["a", "b"], "a"), "b": identity(["c", "d", "e"], ["c", "d", "e"], "b")},
            edges=["a.y -> b.x"],
            adapt=True,
        )
    text = str(info.value)
    assert "several adapters would fit (Unsqueeze of axis 0, Unsqueeze of axis 1, Unsqueeze of axis 2)" in text


def test_sequential_error_names_an_option_it_has():
    """ONNXSequential's shape-mismatch error advises adapt=True, which it accepts."""
    a, b = identity(["N", 32], ["N", 32], "a"), identity(["N", 1, 32], ["N", 1, 32], "b")
    with pytest.raises(fastseq.CompositionError, match=r"pass adapt=True .* Unsqueeze of axis 1"):
        fastseq.ONNXSequential(a, b)
    assert fastseq.ONNXSequential(a, b, adapt=True)(np.ones((2, 32), np.float32))[0].shape == (2, 1, 32)


def test_entry_points_without_adapt_name_one_that_has_it():
    a, b = identity(["N", 32], ["N", 32], "a"), identity(["N", 1, 32], ["N", 1, 32], "b")
    with pytest.raises(fastseq.CompositionError) as info:
        fastseq.compose([a, b])
    assert "adapt=True (or" not in str(info.value)
    assert "compose() inserts no adapters: fastseq.ONNXSequential(..., adapt=True)" in str(info.value)
    assert str(info.value).endswith("inserts a Unsqueeze of axis 1")


def test_a_failing_adapter_names_its_edge():
    """An adapter that fails at run time (the output was declared [N, 1, K] and is not) is
    named by its edge and what it does, not by its node name, also after pickling."""
    import pickle

    lying = identity(["N", "M", "K"], ["N", 1, "K"], "a")  # declares an axis of 1 it does not have
    b = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["u"], ["v"])],
            "b",
            [helper.make_tensor_value_info("u", TensorProto.FLOAT, ["N", "K"])],
            [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["N", "K"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    graph = fastseq.Pipeline({"a": lying, "b": b}, edges=["a.y -> b.u"], adapt=True)
    chain = fastseq.ONNXSequential(lying, b, adapt=True)
    x = np.ones((2, 3, 4), np.float32)
    for pipe, edge in (
        (graph, "a.y -> b.u"),
        (pickle.loads(pickle.dumps(graph)), "a.y -> b.u"),
        (chain, "a (#0).y -> b (#1).u"),
    ):
        with pytest.raises(fastseq.RunError) as info:
            pipe(x)
        text = str(info.value)
        assert f"the adapter on edge {edge} (Squeeze of axis 1)" in text, text
        assert "fastseq/adapt" not in text
