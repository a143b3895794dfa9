"""Rows that never mix: the core follows the batch axis through the composed graph
(``Composed.row_mixing``, crates/fastseq/src/merge/rows) and the batcher refuses a pipeline whose rows
may depend on other rows, naming the stage and the node; row-wise pipelines (conv nets,
MLPs, recurrent nets, the builtin operators, scikit-learn models) are batched, and each
caller gets what ``pipe(x)`` alone gives. Real sessions and real threads throughout."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import FIXTURES

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(nodes, inputs, outputs, inits=(), opset=17, functions=(), extra_opsets=()):
    """A model from (name, elem type, dims) inputs and outputs and numpy initializers."""
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    return helper.make_model(g, opset_imports=opsets, functions=list(functions), ir_version=8)


def x_to_y(*nodes, dims=("N", 4), out=("N", 4), inits=(), opset=17, out_type=F, **kw):
    """x [N, 4] -> y; an output whose first axis is not the batch axis is declared without a
    shape (as the batcher's own first check would refuse a fixed one before the core's)."""
    declared = list(out) if out and out[0] == "N" else [None] * (len(out) if out else 2)
    return model(list(nodes), [("x", F, list(dims))], [("y", out_type, declared)], inits, opset, **kw)


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or op.lower(), **attrs)


def refusal(pipe) -> str:
    with pytest.raises(fastseq.CompositionError) as info:
        pipe.batcher()
    return str(info.value)


# --- each kind of mixing, refused with its node named -------------------------------------------
_SHAPE_N = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0)]
MIXING = {
    "softmax over the batch axis": (
        x_to_y(node("Softmax", ["x"], ["y"], "over_rows", axis=0)),
        "over_rows",
        "Softmax",
        "normalises along axis 0, which is the batch axis",
    ),
    "log-softmax, negative axis": (
        x_to_y(node("LogSoftmax", ["x"], ["y"], axis=-2)),
        "logsoftmax",
        "LogSoftmax",
        "batch axis",
    ),
    "softmax opset 11 (a 2-D view)": (
        x_to_y(node("Softmax", ["x"], ["y"], axis=0), opset=11),
        "softmax",
        "Softmax",
        "over axes that include the batch axis",
    ),
    "reduce-sum over axis 0 (input axes)": (
        x_to_y(node("ReduceSum", ["x", "axes"], ["y"], keepdims=1), out=(1, 4), inits={"axes": np.array([0])}),
        "reducesum",
        "ReduceSum",
        "include the batch axis",
    ),
    "reduce-mean over every axis": (
        x_to_y(node("ReduceMean", ["x"], ["y"], keepdims=0), out=()),
        "reducemean",
        "ReduceMean",
        "every axis, the batch axis included",
    ),
    "reduce-max opset 18 axes": (
        x_to_y(node("ReduceMax", ["x", "axes"], ["y"]), out=(1, 4), opset=18, inits={"axes": np.array([-2])}),
        "reducemax",
        "ReduceMax",
        "include the batch axis",
    ),
    "argmax with its default axis": (
        x_to_y(node("ArgMax", ["x"], ["y"]), out=(1, 4), out_type=I64),
        "argmax",
        "ArgMax",
        "axis 0, the batch axis",
    ),
    "topk along the batch axis": (
        model(
            [node("TopK", ["x", "k"], ["y", "i"], axis=0)],
            [("x", F, ["N", 4])],
            [("y", F, [None, 4]), ("i", I64, [None, 4])],
            {"k": np.array([2])},
        ),
        "topk",
        "TopK",
        "sorts along axis 0",
    ),
    "matmul contracting the batch axis": (
        x_to_y(node("Transpose", ["x"], ["t"], perm=[1, 0]), node("MatMul", ["t", "x"], ["y"], "gram"), out=(4, 4)),
        "gram",
        "MatMul",
        "contracts the batch axis",
    ),
    "gemm with transA": (
        x_to_y(node("Gemm", ["x", "x"], ["y"], transA=1), out=(4, 4)),
        "gemm",
        "Gemm",
        "contracts the batch axis",
    ),
    "einsum summing over the batch": (
        x_to_y(node("Einsum", ["x", "x"], ["y"], equation="ij,ik->jk"), out=(4, 4)),
        "einsum",
        "Einsum",
        "sums over the batch axis",
    ),
    "transpose that moves it to the output": (
        x_to_y(node("Transpose", ["x"], ["y"], "turn", perm=[1, 0]), out=(4, "N")),
        "turn",
        "Transpose",
        "on axis 1",
    ),
    "flatten with axis 0": (
        x_to_y(node("Flatten", ["x"], ["y"], axis=0), dims=("N", 2, 2), out=(1, None)),
        "flatten",
        "Flatten",
        "batch axis of output 'y' on axis 1",
    ),
    "reshape merging the batch axis": (
        x_to_y(node("Reshape", ["x", "shape"], ["y"]), out=(None,), inits={"shape": np.array([-1])}),
        "reshape",
        "Reshape",
        "holds several entries per row on its batch axis",
    ),
    "reshape whose -1 may split rows": (
        x_to_y(node("Reshape", ["x", "shape"], ["y"]), out=(None, 3), inits={"shape": np.array([-1, 3])}),
        "reshape",
        "Reshape",
        "may merge rows or split them",
    ),
    "reshape splitting merged rows unevenly": (
        x_to_y(
            node("Reshape", ["x", "s1"], ["h"]),
            node("Reshape", ["h", "s2"], ["y"], "regroup"),
            dims=("N", 6),
            out=(None, 4),
            inits={"s1": np.array([-1, 2]), "s2": np.array([-1, 4])},
        ),
        "regroup",
        "Reshape",
        "may merge rows or split them",
    ),
    "attention heads combined with rows of another layout": (
        x_to_y(
            node("Reshape", ["x", "pairs"], ["h"], "to_pairs"),
            node("Reshape", ["x", "three"], ["t3"], "to_3d"),
            node("Transpose", ["t3"], ["tt"], perm=[1, 0, 2]),
            node("Reshape", ["tt", "pairs"], ["o"], "outer_rows"),
            node("Add", ["h", "o"], ["s"], "mixed_layouts"),
            node("Reshape", ["s", "back"], ["y"], "back"),
            inits={"pairs": np.array([-1, 2]), "three": np.array([0, 2, 2]), "back": np.array([-1, 4])},
        ),
        "mixed_layouts",
        "Add",
        "hold their rows differently",
    ),
    "reshape to N*2 rows from Shape": (
        x_to_y(
            *_SHAPE_N,
            node("Mul", ["n", "two"], ["m"]),
            node("Unsqueeze", ["m", "zero1"], ["m1"]),
            node("Concat", ["m1", "minus1"], ["shape"], axis=0),
            node("Reshape", ["x", "shape"], ["y"], "split_rows"),
            out=(None, 2),
            inits={"zero": np.array(0), "two": np.array(2), "zero1": np.array([0]), "minus1": np.array([-1])},
        ),
        "split_rows",
        "Reshape",
        "holds several entries per row on its batch axis",
    ),
    "concat along the batch axis": (
        x_to_y(node("Concat", ["x", "x"], ["y"], axis=0)),
        "concat",
        "Concat",
        "along the batch axis",
    ),
    "split along the batch axis": (
        model(
            [node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2)],
            [("x", F, ["N", 4])],
            [("a", F, [None, 4]), ("b", F, [None, 4])],
            opset=18,
        ),
        "split",
        "Split",
        "cuts along the batch axis",
    ),
    "slice taking the first row": (
        x_to_y(
            node("Slice", ["x", "s", "e"], ["y"], "first_row"),
            out=(1, 4),
            inits={"s": np.array([0]), "e": np.array([1])},
        ),
        "first_row",
        "Slice",
        "part of the batch axis",
    ),
    "gather picking a row": (
        x_to_y(node("Gather", ["x", "i"], ["y"], axis=0), out=(4,), inits={"i": np.array(0)}),
        "gather",
        "Gather",
        "picks entries of the batch axis",
    ),
    "cumsum down the rows": (
        x_to_y(node("CumSum", ["x", "a"], ["y"]), inits={"a": np.array(0)}),
        "cumsum",
        "CumSum",
        "along the batch axis",
    ),
    "pad adding rows": (
        x_to_y(node("Pad", ["x", "pads"], ["y"]), out=(None, 4), inits={"pads": np.array([1, 0, 0, 0])}),
        "pad",
        "Pad",
        "adds entries to the batch axis",
    ),
    "tile repeating the rows": (
        x_to_y(node("Tile", ["x", "r"], ["y"]), out=(None, 4), inits={"r": np.array([2, 1])}),
        "tile",
        "Tile",
        "repeats the batch axis",
    ),
    "batch normalisation in training mode": (
        model(
            [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], "bn", training_mode=1)],
            [("x", F, ["N", 2, 3])],
            [("y", F, ["N", 2, 3])],
            {
                "s": np.ones(2, np.float32),
                "b": np.zeros(2, np.float32),
                "m": np.zeros(2, np.float32),
                "v": np.ones(2, np.float32),
            },
            opset=15,
        ),
        "bn",
        "BatchNormalization",
        "statistics of the whole batch",
    ),
    "mean-variance normalisation (default axes)": (
        x_to_y(node("MeanVarianceNormalization", ["x"], ["y"]), dims=("N", 2, 3, 3), out=("N", 2, 3, 3)),
        "meanvariancenormalization",
        "MeanVarianceNormalization",
        "include the batch axis",
    ),
    "layer normalisation from axis 0": (
        x_to_y(node("LayerNormalization", ["x", "s"], ["y"], axis=0), inits={"s": np.ones(4, np.float32)}),
        "layernormalization",
        "LayerNormalization",
        "include the batch axis",
    ),
    "dynamic quantisation": (
        model(
            [node("DynamicQuantizeLinear", ["x"], ["y", "sc", "zp"])],
            [("x", F, ["N", 4])],
            [("y", TensorProto.UINT8, ["N", 4])],
        ),
        "dynamicquantizelinear",
        "DynamicQuantizeLinear",
        "range of the whole batch",
    ),
    "the batch size used as data": (
        x_to_y(
            *_SHAPE_N,
            node("Cast", ["n"], ["nf"], to=F),
            node("Div", ["x", "nf"], ["y"], "mean_share"),
            inits={"zero": np.array(0)},
        ),
        "mean_share",
        "Div",
        "number of rows",
    ),
    "range over the rows": (
        x_to_y(
            *_SHAPE_N,
            node("Range", ["zero", "n", "one"], ["r"], "positions"),
            node("Cast", ["r"], ["rf"], to=F),
            node("Unsqueeze", ["rf", "ax"], ["r1"]),
            node("Add", ["x", "r1"], ["y"]),
            inits={"zero": np.array(0), "one": np.array(1), "ax": np.array([1])},
        ),
        "cast",  # the places are followed up to where they become data
        "Cast",
        "each row's place",
    ),
    "an LSTM running along the batch axis": (
        model(
            [node("LSTM", ["x", "w", "r"], ["y"], hidden_size=2)],
            [("x", F, ["N", 3, 4])],
            [("y", F, [None] * 4)],
            {"w": np.zeros((1, 8, 4), np.float32), "r": np.zeros((1, 8, 2), np.float32)},
        ),
        "lstm",
        "LSTM",
        "recurrence along the batch axis",
    ),
    "max-pool indices": (
        model(
            [node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])],
            [("x", F, ["N", 1, 4, 4])],
            [("y", F, ["N", 1, 2, 2]), ("i", I64, ["N", 1, 2, 2])],
        ),
        "maxpool",
        "MaxPool",
        "indices count across the whole batch",
    ),
    "non-zero positions": (
        x_to_y(node("NonZero", ["x"], ["y"]), out=(2, None), out_type=I64),
        "nonzero",
        "NonZero",
        "whole batch",
    ),
    "an operator of another domain": (
        x_to_y(
            node("Gelu", ["x"], ["y"], "fused", domain="com.microsoft"),
            extra_opsets=[helper.make_opsetid("com.microsoft", 1)],
        ),
        "fused",
        "Gelu",
        "domain 'com.microsoft') is not known",
    ),
    "a Loop over rows": (
        x_to_y(
            node(
                "Loop",
                ["", "cond"],
                ["y"],
                "loop",
                body=helper.make_graph(
                    [node("Identity", ["c"], ["c2"], "keep"), node("Identity", ["x"], ["o"], "pass")],
                    "body",
                    [
                        helper.make_tensor_value_info("i", I64, []),
                        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                    ],
                    [
                        helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
                        helper.make_tensor_value_info("o", F, None),
                    ],
                ),
            ),
            out=None,
            inits={"cond": np.array(False)},
        ),
        "loop",
        "Loop",
        "leaves the batch axis of output 'y' on axis 1",  # each step's rows stacked before them
    ),
    "an If on the number of rows": (
        x_to_y(
            *_SHAPE_N,
            node("Greater", ["n", "one"], ["c"]),
            node(
                "If",
                ["c"],
                ["y"],
                "branch",
                then_branch=helper.make_graph(
                    [node("Identity", ["x"], ["a"])], "t", [], [helper.make_tensor_value_info("a", F, None)]
                ),
                else_branch=helper.make_graph(
                    [node("Neg", ["x"], ["b"])], "e", [], [helper.make_tensor_value_info("b", F, None)]
                ),
            ),
            inits={"zero": np.array(0), "one": np.array(1)},
        ),
        "branch",
        "If",
        "number of rows",
    ),
}


@pytest.mark.parametrize("case", list(MIXING))
def test_each_kind_of_mixing_is_refused_with_its_node_named(case):
    m, name, op, reason = MIXING[case]
    onnx.checker.check_model(m)
    text = refusal(fastseq.ONNXSequential(m))
    assert f"node '{name}' ({op})" in text, text
    assert reason in text, text
    assert "row_independent=True" in text
    try:  # the user may insist (unless the outputs' first axes refuse it on their own)
        fastseq.ONNXSequential(m).batcher(row_independent=True).close()
    except fastseq.CompositionError as e:
        assert "dynamic first axis" in str(e)


def test_the_softmax_of_the_issue_is_refused_and_would_have_mixed_the_callers():
    """Issue 28: Softmax(axis=0) batched from 8 threads gave every caller values computed from
    the others' rows (0.00058 where pipe(x) alone gives 1.0). It is now refused; forced, it
    shows why."""
    pipe = fastseq.ONNXSequential(MIXING["softmax over the batch axis"][0])
    assert "node 'over_rows' (Softmax)" in refusal(pipe)
    xs = [np.full((1, 4), k, np.float32) for k in range(8)]
    got = batched(pipe, xs, row_independent=True)
    assert all(np.allclose(pipe(x)[0], 1.0) for x in xs)
    assert max(abs(g[0] - 1.0).max() for g in got) > 0.5  # what joining does to them


def test_the_stage_and_the_nodes_own_name_are_given_in_a_pipeline():
    """Two stages whose nodes have the same names: the merge renames one, the error gives
    the stage and the name in the user's model; a node inside a function is named too."""
    first = x_to_y(node("Relu", ["x"], ["y"], "act"))
    second = x_to_y(node("Softmax", ["x"], ["y"], "act", axis=0))
    pipe = fastseq.Pipeline({"prep": first, "head": second}, edges=["prep.y -> head.x"])
    text = refusal(pipe)
    assert "stage 'head', node 'act' (Softmax)" in text, text
    body = helper.make_function(
        "local", "Mix", ["a"], ["b"], [node("Softmax", ["a"], ["b"], "inner", axis=0)], [helper.make_opsetid("", 17)]
    )
    called = x_to_y(
        node("Mix", ["x"], ["y"], "call", domain="local"),
        functions=[body],
        extra_opsets=[helper.make_opsetid("local", 1)],
    )
    text = refusal(fastseq.Pipeline({"net": called}))
    assert "node 'call' (Mix), at node 'inner' (Softmax) in function 'Mix'" in text, text


def test_a_function_attribute_reference_is_followed():
    """A function body's Softmax takes its axis from the caller's attribute: axis=1 keeps
    the rows apart, axis=0 does not."""
    ref = helper.make_attribute_ref("axis", onnx.AttributeProto.INT)
    sm = node("Softmax", ["a"], ["b"], "inner")
    sm.attribute.append(ref)
    body = helper.make_function("local", "Norm", ["a"], ["b"], [sm], [helper.make_opsetid("", 17)], ["axis"])
    for axis, mixes in ((1, False), (0, True)):
        m = x_to_y(
            node("Norm", ["x"], ["y"], "call", domain="local", axis=axis),
            functions=[body],
            extra_opsets=[helper.make_opsetid("local", 1)],
        )
        assert bool(fastseq.ONNXSequential(m).engine.composed.row_mixing()) is mixes


# --- row-wise pipelines, batched ---------------------------------------------------------------------
def batched(pipe, inputs, **settings):
    """Each input through the batcher from a thread of its own, in one batch."""
    rows = sum(len(x) for x in inputs)
    got: list = [None] * len(inputs)
    errors: list = []
    with pipe.batcher(max_batch_size=rows, max_delay_ms=10_000, **settings) as b:

        def call(k):
            try:
                got[k] = b(inputs[k])
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    return got


def same_as_alone(pipe, inputs, **settings):
    for g, x in zip(batched(pipe, inputs, **settings), inputs):
        alone = pipe(x)
        assert len(g) == len(alone)
        for a, b in zip(g, alone):
            # A batch may take other kernels than one row: float sums in another order.
            if isinstance(b, np.ndarray):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
            else:  # ZipMap's list of dicts, one per row
                assert len(a) == len(b) and all(d.keys() == e.keys() for d, e in zip(a, b))
                for d, e in zip(a, b):
                    np.testing.assert_allclose(list(d.values()), list(e.values()), rtol=1e-4, atol=1e-5)


def rows(shape, k, dtype=np.float32, seed=0):
    return np.random.default_rng(seed + k).random((1 + k % 3, *shape)).astype(dtype)


def test_conv_nets_mlps_and_recurrent_nets_are_batched():
    cnn = fastseq.Pipeline(
        {"backbone": FIXTURES / "torch_cnn_backbone.onnx", "head": FIXTURES / "torch_head.onnx"},
        edges=["backbone.features -> head.features"],
    )
    cnn.check_rows()
    same_as_alone(cnn, [rows((3, 32, 32), k) for k in range(6)])
    mlp = fastseq.ONNXSequential(FIXTURES / "digits_scaler.onnx", FIXTURES / "digits_mlp.onnx")
    mlp.check_rows()
    same_as_alone(mlp, [rows((64,), k) * 16 for k in range(6)])
    lstm = fastseq.ONNXSequential(FIXTURES / "torch_lstm.onnx")  # Transposes, LSTM, states from Shape
    lstm.check_rows()
    same_as_alone(lstm, [rows((12, 16), k) for k in range(5)])
    functions = fastseq.ONNXSequential(FIXTURES / "torch_residual_functions.onnx")  # local functions
    functions.check_rows()
    same_as_alone(functions, [rows((16,), k) for k in range(5)])


def test_torchs_attention_is_followed_through_the_heads_merged_with_the_rows():
    """torch's attention reshapes [L, N, E] to [L, N*heads, E/heads], multiplies per head and
    reshapes back through [L*N, E]: the analysis follows the rows inside the merged axes
    (issue 41; it used to refuse this transformer), and each caller gets its own rows."""
    pipe = fastseq.ONNXSequential(FIXTURES / "torch_transformer.onnx")
    pipe.check_rows()
    same_as_alone(pipe, [rows((12, 16), k) for k in range(4)])


def padding_mask_model(stride=None, seq=6):
    """transformers' BERT padding mask, as torch exports it (``seq``: a sequence length fixed
    at 6, or "L", dynamic): y = x * mask[b, k] read as ``flat[b * L + k]`` (b = Range over the
    batch size, L read with Shape) from ``Flatten(mask, axis=2)``. ``stride``: another stride,
    which reads a neighbour's row."""
    shape = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0)]
    length = [node("Shape", ["m"], ["ms"], "mshape"), node("Gather", ["ms", "one"], ["len"], "len", axis=0)]
    places = [
        node("Range", ["zero", "n", "one"], ["b"], "places"),
        node("Unsqueeze", ["b", "axis1"], ["b1"], "b1"),
        node("Mul", ["b1", "stride" if stride else "len"], ["bs"], "bs"),
        node("Range", ["zero", "len", "one"], ["k"], "offsets"),
        node("Unsqueeze", ["k", "axis0"], ["k1"], "k1"),
        node("Add", ["bs", "k1"], ["idx"], "idx"),
    ]
    picked = [
        node("Flatten", ["m"], ["flat"], axis=2),
        node("Gather", ["flat", "idx"], ["g"], "pick", axis=0),
        node("Squeeze", ["g", "axis2"], ["keep"], "keep"),
        node("Cast", ["keep"], ["kf"], "kf", to=F),
        node("Mul", ["x", "kf"], ["y"], "y"),
    ]
    inits = {"zero": np.int64(0), "one": np.int64(1), "axis0": [0], "axis1": [1], "axis2": [2]}
    if stride:
        inits["stride"] = np.int64(stride)
    return model(
        [node("Cast", ["mask"], ["m"], "m", to=TensorProto.BOOL), *shape, *length, *places, *picked],
        [("x", F, ["N", seq]), ("mask", I64, ["N", seq])],
        [("y", F, ["N", seq])],
        inits,
    )


def _body(nodes, inputs, outputs):
    return helper.make_graph(
        nodes,
        "body",
        # A Loop's iteration and condition are scalars (ONNX Runtime wants their shapes).
        [helper.make_tensor_value_info(n, t, [] if t != F else None) for n, t in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
    )


def test_a_local_function_named_like_a_standard_operator_does_not_hide_it():
    """A model-local function 'Softmax' in the default domain whose body is an Identity: ONNX
    Runtime runs the standard Softmax (over axis 0 here, across the rows), so the analysis
    takes the operator's rule, not the body's, and refuses."""
    body = helper.make_function(
        "", "Softmax", ["a"], ["b"], [node("Identity", ["a"], ["b"], "same")], [helper.make_opsetid("", 17)], ["axis"]
    )
    shadowed = x_to_y(node("Softmax", ["x"], ["y"], "over_rows", axis=0), functions=[body])
    pipe = fastseq.ONNXSequential(shadowed)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert not np.allclose(pipe(x)[0], np.concatenate([pipe(x[:1])[0], pipe(x[1:])[0]]))  # it mixes
    assert "node 'over_rows' (Softmax)" in refusal(pipe)


def test_the_number_of_rows_cast_to_int32_for_a_reshape_is_followed():
    """paddle2onnx (PP-OCR's classifier) casts Shape(x)[0] to INT32 before its Reshapes: a
    joined batch holds fewer than 2**31 rows, so the cast keeps the number. Cast to INT16 it
    might not: refused."""

    def flattened(to):
        return x_to_y(
            *_SHAPE_N,
            node("Cast", ["n"], ["n32"], "n32", to=to),
            node("Unsqueeze", ["n32", "ax"], ["n1"], "n1"),
            node("Concat", ["n1", "minus1"], ["shape32"], "shape32", axis=0),
            node("Cast", ["shape32"], ["shape"], "to_int64", to=I64),
            node("Reshape", ["x", "shape"], ["y"], "flatten"),
            dims=("N", 2, 2),
            out=("N", 4),
            inits={
                "zero": np.array(0),
                "ax": np.array([0]),
                "minus1": np.array([-1], np.int32 if to == TensorProto.INT32 else np.int16),
            },
        )

    pipe = fastseq.ONNXSequential(flattened(TensorProto.INT32))
    pipe.check_rows()
    same_as_alone(pipe, [rows((2, 2), k) for k in range(5)])
    assert "node 'flatten' (Reshape)" in refusal(fastseq.ONNXSequential(flattened(TensorProto.INT16)))


def test_loops_and_scans_whose_steps_keep_the_rows_apart_are_batched():
    """Issue 41: a Loop of a fixed number of steps carrying rows (h = tanh(h @ w) three times,
    each step's h stacked too) and a Scan along the time axis of [N, T, 4] (a running sum per
    row): followed step by step and batched, each caller's answer its rows alone."""
    w = np.random.default_rng(1).random((4, 4)).astype(np.float32)
    step = _body(
        [
            node("MatMul", ["h", "w"], ["m"], "m"),
            node("Tanh", ["m"], ["h2"], "t"),
            node("Identity", ["c"], ["c2"], "c"),
        ],
        [("i", I64), ("c", TensorProto.BOOL), ("h", F)],
        [("c2", TensorProto.BOOL), ("h2", F), ("h2", F)],
    )
    looped = model(
        [node("Loop", ["three", "", "x"], ["y", "steps"], "loop", body=step)],
        [("x", F, ["N", 4])],
        [("y", F, ["N", 4])],
        {"three": np.int64(3), "w": w},
    )
    pipe = fastseq.ONNXSequential(looped)
    pipe.check_rows()
    same_as_alone(pipe, [rows((4,), k) for k in range(6)])
    running = _body(
        [node("Add", ["s", "xt"], ["s2"], "add"), node("Identity", ["s2"], ["each"], "each")],
        [("s", F), ("xt", F)],
        [("s2", F), ("each", F)],
    )
    scanned = model(
        [
            node("ReduceSum", ["x", "ax"], ["zero"], "zero", keepdims=0),
            node("Mul", ["zero", "nought"], ["s0"], "s0"),
            node("Scan", ["s0", "x"], ["y", "all"], "scan", body=running, num_scan_inputs=1, scan_input_axes=[1]),
        ],
        [("x", F, ["N", "T", 4])],
        [("y", F, ["N", 4])],
        {"ax": np.array([1]), "nought": np.float32(0)},
    )
    pipe = fastseq.ONNXSequential(scanned)
    pipe.check_rows()
    inputs = [rows((5, 4), k) for k in range(6)]
    same_as_alone(pipe, inputs)
    np.testing.assert_allclose(pipe(inputs[1])[0], inputs[1].sum(axis=1), rtol=1e-5)


def test_a_loop_stopped_by_its_rows_or_a_scan_along_the_batch_is_refused():
    """A Loop whose body's condition is read from the rows stops for all rows at one row's
    say; a Scan along the batch axis carries each row into the next: refused, named."""
    step = _body(
        [
            node("Add", ["h", "one"], ["h2"], "inc"),
            node("ReduceSum", ["h2", "ax"], ["total"], "total", keepdims=0),
            node("Less", ["total", "ten"], ["c2"], "while_small"),
        ],
        [("i", I64), ("c", TensorProto.BOOL), ("h", F)],
        [("c2", TensorProto.BOOL), ("h2", F)],
    )
    looped = model(
        [node("Loop", ["", "yes", "x"], ["y"], "loop", body=step)],
        [("x", F, ["N", 4])],
        [("y", F, ["N", 4])],
        {"yes": np.array(True), "one": np.float32(1), "ten": np.float32(10), "ax": np.array([0, 1])},
    )
    assert "node 'loop' (Loop)" in refusal(fastseq.ONNXSequential(looped))
    running = _body([node("Add", ["s", "xt"], ["s2"], "add")], [("s", F), ("xt", F)], [("s2", F)])
    scanned = model(
        [node("Scan", ["s0", "x"], ["y"], "scan", body=running, num_scan_inputs=1)],
        [("x", F, ["N", 4])],
        [("y", F, [4])],
        {"s0": np.zeros(4, np.float32)},
    )
    assert "Scan steps along the batch axis" in refusal(fastseq.ONNXSequential(scanned))


@pytest.mark.parametrize("seq", [6, "L"], ids=["fixed-length", "dynamic-length"])
def test_a_padding_mask_read_by_each_rows_place_is_batched_and_each_row_reads_its_own(seq):
    """Issue 41: BERT and DistilBERT (transformers 5) index a flattened mask by each row's
    place in the batch; each row reads only its own entries, so the rows stay apart. The
    analysis follows exactly that pattern, the sequence length fixed or an input's own size;
    every caller gets the mask of its own rows, padded differently row by row (and, dynamic,
    requests of two lengths through one batcher)."""
    pipe = fastseq.ONNXSequential(padding_mask_model(seq=seq))
    pipe.check_rows()
    rng = np.random.default_rng(7)
    inputs = []
    for k in range(8):
        n, length = 1 + k % 3, 6 if seq == 6 or k % 2 else 4
        mask = np.ones((n, length), np.int64)
        for r in range(n):
            mask[r, length - int(rng.integers(0, length - 1)) :] = 0
        inputs.append((rng.random((n, length)).astype(np.float32), mask))
    rows = sum(len(x) for x, _ in inputs)
    got: list = [None] * len(inputs)
    with pipe.batcher(max_batch_size=rows, max_delay_ms=200) as b:
        threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, b(*inputs[k]))) for k in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for (x, mask), answer in zip(inputs, got):
        np.testing.assert_array_equal(answer[0], x * mask)


def test_a_mask_read_at_another_stride_is_refused_and_would_mix_the_rows():
    """The same pattern at a stride of 5 over rows of 6 reads the next row's entries: refused,
    with its node named; run together, the rows do differ from alone."""
    pipe = fastseq.ONNXSequential(padding_mask_model(stride=5))
    assert "node 'idx' (Add)" in refusal(pipe)
    x = np.ones((2, 6), np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], np.int64)
    together = pipe(x, mask)[0]
    alone = np.concatenate([pipe(x[k : k + 1], mask[k : k + 1])[0] for k in range(2)])
    assert not np.array_equal(together, alone)


def _stride_model(stride_nodes, seq):
    """y[b] = flat(x)[b * stride + k], k < the row's length: each row's own entries where the
    stride is the row's length; ``stride_nodes`` compute ``stride`` from ``len`` (x's length)."""
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["n"], axis=0),
        node("Gather", ["s", "one"], ["len"], axis=0),
        *stride_nodes,
        node("Range", ["zero", "n", "one"], ["b"], "places"),
        node("Unsqueeze", ["b", "axis1"], ["b1"]),
        node("Mul", ["b1", "stride"], ["bs"], "bs"),
        node("Range", ["zero", "len", "one"], ["k"], "offsets"),
        node("Unsqueeze", ["k", "axis0"], ["k1"]),
        node("Add", ["bs", "k1"], ["idx"], "idx"),
        node("Reshape", ["x", "minus1"], ["flat"]),
        node("Gather", ["flat", "idx"], ["y"], "pick", axis=0),
    ]
    for k, n in enumerate(nodes):
        n.name = f"{n.name}_{k}"
    return model(
        nodes,
        [("x", F, ["N", seq])],
        [("y", F, ["N", seq])],
        {"zero": np.int64(0), "one": np.int64(1), "axis0": [0], "axis1": [1], "minus1": [-1], "two": [2]},
    )


STRIDES = {
    # A size cast to bool (1) or uint8 (wrapped) is no longer that size, though it is read
    # from the same input axis.
    "cast to bool and back": (
        [node("Cast", ["len"], ["lb"], to=TensorProto.BOOL), node("Cast", ["lb"], ["stride"], to=I64)],
        "L",
    ),
    # Every second entry of [2, L] is [2], not [2, L].
    "a slice with a step of 2": (
        [
            node("Unsqueeze", ["len", "axis0"], ["lv"]),
            node("Concat", ["two", "lv"], ["both"], axis=0),
            node("Slice", ["both", "axis0", "two", "axis0", "two"], ["every2"]),
            node("Gather", ["every2", "minus1"], ["stride"], axis=0),
        ],
        "L",
    ),
    # fmod=1 takes the dividend's sign: Mod(-1, 6) is -1, not 5 (the length): each row reads
    # from the end of the batch.
    "mod with fmod=1": (
        [
            node("Neg", ["one"], ["m1"]),
            node("Add", ["len", "one"], ["len1"]),
            node("Mod", ["m1", "len1"], ["stride"], fmod=1),
        ],
        5,
    ),
}


@pytest.mark.parametrize("case", list(STRIDES), ids=list(STRIDES))
def test_a_stride_that_is_not_the_rows_length_however_computed_is_refused(case):
    """Shape arithmetic read as other numbers than onnxruntime computes (a cast that changes
    the value, a slice's step, Mod's fmod) made a stride look like the row's length: the rows'
    places then read other rows' entries, and the analysis called it row-wise."""
    stride_nodes, seq = STRIDES[case]
    pipe = fastseq.ONNXSequential(_stride_model(stride_nodes, seq))
    assert "place" in refusal(pipe)
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    together = pipe(x)[0]
    alone = np.concatenate([pipe(x[k : k + 1])[0] for k in range(3)])
    assert together.shape == alone.shape and not np.array_equal(together, alone)


def test_each_rows_place_stacked_by_a_loop_or_a_scan_is_refused():
    """A Loop's or Scan's body that outputs each row's place (Unsqueeze of the outer Range)
    had it stacked as a plain value: squeezed back and added to the rows, each row got its
    place in the batch (0 alone). Refused now, at the Loop or Scan."""
    places = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0)]
    places.append(node("Range", ["zero", "n", "one"], ["b"], "places"))
    after = [
        node("Squeeze", ["st", "axis0"], ["p"]),
        node("Cast", ["p"], ["pf"], to=F),
        node("Add", ["x", "pf"], ["y"]),
    ]
    inits = {"zero": np.int64(0), "one": np.int64(1), "axis0": [0], "axis1": [1]}
    step = _body(
        [node("Unsqueeze", ["b", "axis1"], ["u"], "u"), node("Identity", ["c"], ["c2"], "c")],
        [("i", I64), ("c", TensorProto.BOOL)],
        [("c2", TensorProto.BOOL), ("u", I64)],
    )
    looped = model(
        [*places, node("Loop", ["one", ""], ["st"], "loop", body=step), *after],
        [("x", F, ["N", 4])],
        [("y", F, ["N", 4])],
        inits,
    )
    each = helper.make_graph(
        [node("Unsqueeze", ["b", "axis1"], ["u"], "u"), node("Identity", ["xt"], ["xo"], "xo")],
        "each",
        [helper.make_tensor_value_info("xt", F, None)],
        [helper.make_tensor_value_info("u", I64, None), helper.make_tensor_value_info("xo", F, None)],
    )
    scanned = model(
        [
            *places,
            node("Unsqueeze", ["x", "axis0"], ["x0"]),  # [1, N, 4]: one step, along axis 0
            node("Scan", ["x0"], ["st", "xs"], "scan", body=each, num_scan_inputs=1),
            *after,
        ],
        [("x", F, ["N", 4])],
        [("y", F, ["N", 4])],
        inits,
    )
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for m, at in [(looped, "node 'loop' (Loop)"), (scanned, "node 'scan' (Scan)")]:
        pipe = fastseq.ONNXSequential(m)
        assert at in refusal(pipe) and "place" in refusal(pipe)
        np.testing.assert_array_equal(pipe(x)[0], x + np.arange(3, dtype=np.float32)[:, None])
        np.testing.assert_array_equal(np.concatenate([pipe(x[k : k + 1])[0] for k in range(3)]), x)


@pytest.mark.parametrize(
    "name",
    [
        "to_float",
        "layout",
        "rgb_to_bgr",
        "grayscale",
        "resize",
        "resize_antialias",
        "center_crop",
        "normalize",
        "flatten",
        "softmax",
        "argmax",
        "topk",
    ],
)
def test_the_builtin_operators_are_batched(name):
    from fastseq import ops

    built = {
        "resize": lambda: ops.resize(8),
        "resize_antialias": lambda: ops.resize(8, antialias=True),
        "center_crop": lambda: ops.center_crop(8),
        "topk": lambda: ops.topk(3),
    }.get(name, getattr(ops, name, None))
    op = built()
    pipe = fastseq.ONNXSequential(op, auto_ir_version_conversion=name == "resize_antialias")
    pipe.check_rows()
    info = pipe.inputs[0]
    dims = [d if isinstance(d, int) else 12 for d in info.shape[1:]]
    kind = np.uint8 if "uint8" in str(info.dtype) else np.float32
    same_as_alone(pipe, [(rows(dims, k) * 255).astype(kind) for k in range(5)])


def test_non_max_suppression_and_letterbox_outputs_are_refused():
    from fastseq import ops

    assert "NonMaxSuppression selects boxes of the whole batch" in refusal(fastseq.ONNXSequential(ops.nms()))
    text = refusal(fastseq.ONNXSequential(ops.letterbox(8)))
    assert "output 'scale' has no batch axis" in text  # one scale for the whole batch


SKLEARN = [
    "scaler+logistic",
    "forest",
    "svc",
    "pca+boosting",
    "naive bayes",
    "mlp",
    "imputer+normalizer+linear",
    "minmax+binarizer",
    "one-hot",
]


@pytest.mark.parametrize("name", SKLEARN)
@pytest.mark.parametrize("zipmap", [False, True], ids=["arrays", "zipmap"])
def test_scikit_learn_models_are_batched(name, zipmap):
    """skl2onnx's ai.onnx.ml operators (Scaler, LinearClassifier, TreeEnsemble, SVM,
    Normalizer, Imputer, Binarizer, OneHotEncoder, ZipMap, ArrayFeatureExtractor) answer per
    sample: each caller gets what pipe(x) alone gives, ZipMap's dicts included."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_iris
    from sklearn.decomposition import PCA
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Binarizer, MinMaxScaler, Normalizer, OneHotEncoder, StandardScaler
    from sklearn.svm import SVC

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    made = {
        "scaler+logistic": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)),
        "forest": lambda: RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0),
        "svc": lambda: SVC(probability=True, random_state=0),
        "pca+boosting": lambda: make_pipeline(PCA(2), GradientBoostingRegressor(n_estimators=3)),
        "naive bayes": GaussianNB,
        "mlp": lambda: MLPClassifier(hidden_layer_sizes=(8,), max_iter=30, random_state=0),
        "imputer+normalizer+linear": lambda: make_pipeline(SimpleImputer(), Normalizer(), LinearRegression()),
        "minmax+binarizer": lambda: make_pipeline(MinMaxScaler(), Binarizer(threshold=0.5)),
        "one-hot": lambda: OneHotEncoder(),
    }
    estimator = made[name]()
    if name == "one-hot":
        x = (x * 2).round().astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator.fit(x, y)
    classifier = hasattr(estimator, "predict_proba")
    if zipmap and not classifier:
        pytest.skip("no ZipMap without class probabilities")
    options = None if zipmap or not classifier else {id(estimator): {"zipmap": False}}
    onx = skl2onnx.to_onnx(estimator, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    pipe = fastseq.ONNXSequential(onx)
    pipe.check_rows()
    same_as_alone(pipe, [x[k * 5 : k * 5 + 1 + k % 3] for k in range(6)])


def test_k_nearest_neighbours_scan_is_refused_conservatively():
    """KNN's distances run in a Scan over the training rows, the queries carried unchanged:
    followed; its ArrayFeatureExtractor, which picks labels by indices of several entries per
    row, is not, so the classifier stays refused (unsure means refused)."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_iris
    from sklearn.neighbors import KNeighborsClassifier

    x, y = load_iris(return_X_y=True)
    onx = skl2onnx.to_onnx(KNeighborsClassifier(3).fit(x, y), x[:1].astype(np.float32), target_opset=17)
    assert "(ArrayFeatureExtractor): ArrayFeatureExtractor flattens indices" in refusal(fastseq.ONNXSequential(onx))


def test_row_wise_operators_of_each_kind_are_followed():
    """Not refused: a per-row Softmax, a reduction over the features, a MatMul with weights,
    Gemm, a transpose and back, torch's Reshape(x, [Shape(x)[0], -1]), Reshape with 0,
    Flatten, Concat and Split along the features, Slice of the features (and the whole
    batch), Gather and GatherElements of features, an embedding lookup, Pad of the features,
    an If on a constant, Expand with the batch size, Where, Einsum over the rows."""
    n = _SHAPE_N
    consts = {
        "zero": np.array(0),
        "one": np.array([1]),
        "zero1": np.array([0]),
        "minus1": np.array([-1]),
        "w": np.ones((4, 4), np.float32),
        "axes": np.array([1]),
        "idx": np.array([1, 0]),
        "table": np.arange(12, dtype=np.float32).reshape(6, 2),
        "cond": np.array(True),
        "from": np.array([1]),
        "to": np.array([3]),
        "big": np.array([2**62]),
        "pads": np.array([0, 1, 0, 1]),
    }
    nodes = [
        node("Softmax", ["x"], ["a"], axis=1),
        node("ReduceSum", ["a", "axes"], ["b"], keepdims=1),
        node("MatMul", ["x", "w"], ["c"]),
        node("Gemm", ["c", "w"], ["d"], transB=1),
        node("Transpose", ["d"], ["dt"], perm=[1, 0]),
        node("Transpose", ["dt"], ["e0"], perm=[1, 0]),
        *n,
        node("Unsqueeze", ["n", "zero1"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        node("Reshape", ["e0", "shape"], ["f"]),
        node("Reshape", ["f", "zero0"], ["f0"]),
        node("Flatten", ["f0"], ["g"], axis=1),
        node("Concat", ["g", "b"], ["h"], axis=1),
        node("Split", ["h"], ["h1", "h2"], axis=1, num_outputs=2),
        node("Slice", ["h1", "from", "to", "one"], ["i"]),
        node("Slice", ["h2", "zero1", "big", "zero1"], ["i2"]),
        node("Gather", ["h2", "idx"], ["j"], axis=1),
        node("Cast", ["x"], ["xi"], to=I64),
        node("Clip", ["xi", "zeroi", "five"], ["xc"]),
        node("Gather", ["table", "xc"], ["emb"], axis=0),
        node("ReduceMean", ["emb", "two_axes"], ["embm"], keepdims=0),
        node("Pad", ["i", "pads"], ["p"]),
        node("Concat", ["embm", "j", "i2", "p"], ["k"], axis=1),
        node(
            "If",
            ["cond"],
            ["l"],
            then_branch=helper.make_graph(
                [node("Relu", ["k"], ["t"])], "t", [], [helper.make_tensor_value_info("t", F, None)]
            ),
            else_branch=helper.make_graph(
                [node("Neg", ["k"], ["u"])], "u", [], [helper.make_tensor_value_info("u", F, None)]
            ),
        ),
        node("Concat", ["n1", "one"], ["ones_shape"], axis=0),
        node("Expand", ["half", "ones_shape"], ["halves"]),
        node("Mul", ["l", "halves"], ["m"]),
        node("Greater", ["m", "half"], ["big_ones"]),
        node("Where", ["big_ones", "m", "half"], ["o"]),
        node("Einsum", ["o", "o"], ["y"], equation="bi,bi->bi"),
    ]
    consts.update(
        {
            "zero0": np.array([0, 0]),
            "zeroi": np.array(0),
            "five": np.array(5),
            "two_axes": np.array([2]),
            "half": np.array(0.5, np.float32),
        }
    )
    for k, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}_{k}"
    m = model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", None])], consts, opset=18)
    onnx.checker.check_model(m)
    pipe = fastseq.ONNXSequential(m)
    pipe.check_rows()
    same_as_alone(pipe, [rows((4,), k) * 4 for k in range(5)])


def test_an_input_declared_without_a_shape_is_followed_through_element_wise_operators_only():
    relu = model(
        [node("Relu", ["x"], ["h"]), node("Mul", ["h", "two"], ["y"])],
        [("x", F, None)],
        [("y", F, None)],
        {"two": np.array(2.0, np.float32)},
    )
    fastseq.ONNXSequential(relu).check_rows()
    summed = model([node("ReduceSum", ["x"], ["y"], "total", keepdims=0)], [("x", F, None)], [("y", F, None)])
    assert "declared without a shape" in refusal(fastseq.ONNXSequential(summed))


def test_row_independent_is_a_bool():
    pipe = fastseq.ONNXSequential(MIXING["softmax over the batch axis"][0])
    with pytest.raises(fastseq.InputError, match="row_independent must be True or False"):
        pipe.batcher(row_independent=1)


# --- every node model of the onnx package -------------------------------------------------------------
def _node_models():
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_node_model_tests()


def test_every_node_model_gets_a_verdict_and_those_called_row_wise_are():
    """The analysis over the ~1,900 node models that the onnx package ships (every operator,
    opsets 1-28, If/Loop/Scan, functions): it never fails, and wherever it calls a model
    row-wise, the model is, by experiment: each row of its test data run alone gives the
    rows that the whole batch gives (an unsound "row-wise" would show here)."""
    from conftest import session
    from fastseq import _core

    checked = row_wise = 0
    wrong = []
    for case in _node_models():
        verdict = _core.load_model(case.model.SerializeToString(), case.name).row_mixing()
        assert isinstance(verdict, list)
        if verdict:
            continue
        row_wise += 1
        inputs, _ = case.data_sets[0]
        arrays = [np.asarray(x) for x in inputs]
        if not arrays or any(a.ndim == 0 or a.dtype == object for a in arrays):
            continue
        n = arrays[0].shape[0]
        if n < 2 or any(a.shape[0] != n for a in arrays):
            continue
        free = onnx.ModelProto()
        free.CopyFrom(case.model)
        for vi in [*free.graph.input, *free.graph.output]:  # axis 0 dynamic: one row runs too
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.shape.dim:
                vi.type.tensor_type.shape.dim[0].dim_param = "N"
        del free.graph.value_info[:]
        try:
            s = session(free)
            names = [i.name for i in s.get_inputs()]
            if len(names) != len(arrays):
                continue
            whole = s.run(None, dict(zip(names, arrays)))
            alone = [s.run(None, dict(zip(names, [a[k : k + 1] for a in arrays]))) for k in range(n)]
        except Exception:  # noqa: BLE001 - onnxruntime cannot run it (or not one row at a time)
            continue
        checked += 1
        for j, out in enumerate(whole):
            out = np.asarray(out)
            parts = [np.asarray(a[j]) for a in alone]
            if out.ndim == 0 or out.shape[0] != sum(p.shape[0] if p.ndim else 1 for p in parts):
                wrong.append(f"{case.name}: output {j} does not keep the rows")
                break
            joined = np.concatenate(parts)
            if out.dtype.kind in "fc":
                ok = np.allclose(out, joined, rtol=1e-4, atol=1e-5, equal_nan=True)
            else:
                ok = np.array_equal(out, joined)
            if not ok:
                wrong.append(f"{case.name}: output {j} differs row by row")
                break
    assert not wrong, wrong
    print(f"{row_wise} node models called row-wise, {checked} checked by experiment")
    assert row_wise > 300 and checked > 200, (row_wise, checked)  # the experiment covers many operators
