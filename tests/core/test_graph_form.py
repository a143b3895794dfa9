"""The core's graph form, `_core.compose(edges=..., graph_inputs=..., graph_outputs=...)`, on
real models: every merged pipeline is checked against its stages run in their own ONNX Runtime
sessions with the results wired by hand."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq
from conftest import (
    FIXTURES,
    if_model_reading_outer_initializer,
    input_pb,
    pytorch_converted,
    run,
    run_chain,
    scale_model,
)
from fastseq import _core

BACKBONE, HEAD = str(FIXTURES / "torch_cnn_backbone.onnx"), str(FIXTURES / "torch_head.onnx")
TRANSFORMER, LSTM = str(FIXTURES / "torch_transformer.onnx"), str(FIXTURES / "torch_lstm.onnx")


def model(composed: _core.Composed) -> onnx.ModelProto:
    m = onnx.ModelProto.FromString(composed.to_bytes())
    onnx.checker.check_model(m)
    return m


def image(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def two_heads(**kw) -> _core.Composed:
    """A backbone whose features feed two copies of one head (the same file twice)."""
    return _core.compose(
        [BACKBONE, HEAD, HEAD],
        ["backbone", "cls", "aux"],
        edges=[(0, "features", 1, "features"), (0, "features", 2, "features")],
        **kw,
    )


def test_backbone_feeding_two_heads_matches_stage_by_stage_runs():
    composed = two_heads(graph_outputs=[("logits", 1, "logits"), ("aux_logits", 2, "logits")])
    merged = model(composed)
    assert [i.name for i in merged.graph.input] == ["image"]
    assert [o.name for o in merged.graph.output] == ["logits", "aux_logits"]
    x = image()
    got = run(merged, {"image": x})
    features = run(BACKBONE, {"image": x})["features"]
    want = run(HEAD, {"features": features})["logits"]
    np.testing.assert_allclose(got["logits"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["aux_logits"], want, rtol=1e-5, atol=1e-6)
    # The second head's weights are the first one's: stored once, by default in the graph form.
    head, backbone = onnx.load(HEAD), onnx.load(BACKBONE)
    report = composed.report()
    assert report["deduped_initializers"] == len(head.graph.initializer) == 4
    assert report["deduped_bytes"] == sum(len(t.raw_data) for t in head.graph.initializer) == 3496
    assert len(merged.graph.initializer) == len(backbone.graph.initializer) + len(head.graph.initializer)
    assert report["unused_outputs"] == [] and report["pruned"]["nodes"] == 0
    # Without deduplication the weights are there twice and the results the same.
    copies = model(two_heads(graph_outputs=[("logits", 1, "logits"), ("aux_logits", 2, "logits")], dedupe=False))
    assert len(copies.graph.initializer) == len(merged.graph.initializer) + 4
    np.testing.assert_allclose(run(copies, {"image": x})["aux_logits"], want, rtol=1e-5, atol=1e-6)


def test_pruning_leaves_out_a_head_no_output_needs():
    composed = two_heads(graph_outputs=[("logits", 1, "logits")])
    merged = model(composed)
    report = composed.report()
    assert report["pruned"]["stages"] == ["aux"]
    head = onnx.load(HEAD)
    assert report["pruned"]["nodes"] == len(head.graph.node)
    assert report["unused_outputs"] == [(2, "logits")]
    assert len(merged.graph.node) == len(onnx.load(BACKBONE).graph.node) + len(head.graph.node)
    stages, _ = composed.origins()
    assert [s[0] for s in stages] == ["backbone", "cls", "aux"] and stages[2][1] == stages[2][2]
    x = image()
    want = run(HEAD, {"features": run(BACKBONE, {"image": x})["features"]})["logits"]
    np.testing.assert_allclose(run(merged, {"image": x})["logits"], want, rtol=1e-5, atol=1e-6)
    # prune=False keeps the unused head (and exposes nothing more).
    kept = model(two_heads(graph_outputs=[("logits", 1, "logits")], prune=False))
    assert len(kept.graph.node) == len(merged.graph.node) + len(head.graph.node)


def test_shared_input_and_an_exposed_intermediate_output():
    """The transformer and the LSTM read the same graph input; the LSTM's features feed the
    head; the transformer's output is exposed (renamed) besides the head's."""
    composed = _core.compose(
        [TRANSFORMER, LSTM, HEAD],
        ["encoder", "lstm", "head"],
        edges=[(1, "features", 2, "features")],
        graph_inputs=[("tokens", [(0, "x"), (1, "x")])],
        graph_outputs=[("encoded", 0, "y"), ("logits", 2, "logits")],
    )
    merged = model(composed)
    assert [i.name for i in merged.graph.input] == ["tokens"]
    x = np.random.default_rng(1).standard_normal((3, 12, 16)).astype(np.float32)
    got = run(merged, {"tokens": x})
    np.testing.assert_allclose(got["encoded"], run(TRANSFORMER, {"x": x})["y"], rtol=1e-4, atol=1e-5)
    want = run(HEAD, {"features": run(LSTM, {"x": x})["features"]})["logits"]
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)
    _, names = composed.origins()
    assert names["tokens"] == (0, "x") and names["encoded"] == (0, "y")


def test_skip_and_fan_in_over_the_onnx_test_models():
    """relu feeds sigmoid and tanh; a Sum joins both and relu's own output (a skip). Every
    stage uses the same names ('0' in, '1' out), so all of them are renamed apart."""
    relu, sigmoid, tanh = (pytorch_converted(n) for n in ("test_ReLU", "test_Sigmoid", "test_Tanh"))
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 4, 5])  # noqa: E731
    total = helper.make_model(
        helper.make_graph(
            [helper.make_node("Sum", ["a", "b", "s"], ["1"])], "sum", [vi("a"), vi("b"), vi("s")], [vi("1")]
        ),
        opset_imports=[helper.make_opsetid("", 6)],
        ir_version=3,
    )
    composed = _core.compose(
        [m.SerializeToString() for m in (relu, sigmoid, tanh, total)],
        ["relu", "sigmoid", "tanh", "sum"],
        edges=[(0, "1", 1, "0"), (0, "1", 2, "0"), (1, "1", 3, "a"), (2, "1", 3, "b"), (0, "1", 3, "s")],
        graph_inputs=[("x", [(0, "0")])],
        graph_outputs=[("y", 3, "1")],
    )
    merged = model(composed)
    x = input_pb("test_ReLU")
    r = run(relu, {"0": x})["1"]
    want = run(sigmoid, {"0": r})["1"] + run(tanh, {"0": r})["1"] + r
    np.testing.assert_allclose(run(merged, {"x": x})["y"], want, rtol=1e-6)


def test_sklearn_scaler_feeding_two_classifiers():
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    scaler = StandardScaler().fit(X)
    Xs = scaler.transform(X).astype(np.float32)
    lr, tree = LogisticRegression(max_iter=500).fit(Xs, y), DecisionTreeClassifier(max_depth=3).fit(Xs, y)
    opsets = {"": 17, "ai.onnx.ml": 3}
    stages = [to_onnx(scaler, X[:1], target_opset=opsets)] + [
        to_onnx(c, Xs[:1], target_opset=opsets, options={"zipmap": False}) for c in (lr, tree)
    ]
    out, inp = stages[0].graph.output[0].name, stages[1].graph.input[0].name
    composed = _core.compose(
        [s.SerializeToString() for s in stages],
        ["scaler", "lr", "tree"],
        edges=[(0, out, 1, inp), (0, out, 2, inp)],
        graph_outputs=[("lr_probs", 1, "probabilities"), ("tree_probs", 2, "probabilities")],
    )
    merged = model(composed)
    got = run(merged, {stages[0].graph.input[0].name: X})
    np.testing.assert_allclose(got["lr_probs"], lr.predict_proba(Xs), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["tree_probs"], tree.predict_proba(Xs), rtol=1e-5, atol=1e-6)
    # The labels are neither consumed nor exposed: reported, and pruned away.
    assert composed.report()["unused_outputs"] == [(1, "label"), (2, "label")]
    assert [o.name for o in merged.graph.output] == ["lr_probs", "tree_probs"]


def test_adapters_cast_and_add_the_batch_axis_only_when_asked():
    """A stage gives double features without a batch axis; the head wants float [batch, 16]."""
    pre = helper.make_model(
        helper.make_graph(
            [helper.make_node("Neg", ["v"], ["w"])],
            "pre",
            [helper.make_tensor_value_info("v", TensorProto.DOUBLE, [16])],
            [helper.make_tensor_value_info("w", TensorProto.DOUBLE, [16])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    args = ([pre.SerializeToString(), HEAD], ["pre", "head"])
    with pytest.raises(fastseq.CompositionError) as e:
        _core.compose(*args, edges=[(0, "w", 1, "features")])
    assert "edge 0 (pre.w -> head.features): element type mismatch: output 'w' is double" in str(e.value)
    assert str(e.value).endswith(
        "pass adapt=True (or this edge's index in adapt) to insert a Cast to float, Unsqueeze of axis 0"
    )
    for adapt in (True, [0]):
        composed = _core.compose(*args, edges=[(0, "w", 1, "features")], adapt=adapt)
        merged = model(composed)
        assert composed.report()["adapters"] == [(0, "Cast to float, Unsqueeze of axis 0")]
        v = np.linspace(-1, 1, 16)
        want = run(HEAD, {"features": (-v).astype(np.float32)[None]})["logits"]
        np.testing.assert_allclose(run(merged, {"v": v})["logits"], want, rtol=1e-5, atol=1e-6)


def test_symbolic_dims_joined_by_an_edge_share_one_name():
    a = scale_model(2.0, shape=("batch", 4))
    b = scale_model(3.0, shape=("N", 4))
    merged = model(_core.compose([a.SerializeToString(), b.SerializeToString()], ["a", "b"], edges=[(0, "y", 1, "x")]))
    dims = lambda vi: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(merged.graph.input[0]) == dims(merged.graph.output[0]) == ["batch", 4]
    x = np.abs(np.random.default_rng(2).standard_normal((5, 4))).astype(np.float32)
    np.testing.assert_allclose(run(merged, {"x": x})["y"], 6 * x, rtol=1e-6)
    with pytest.raises(fastseq.CompositionError, match=r"output 'y' has shape \[2, 4\] but input 'x' expects \[3, 4\]"):
        _core.compose(
            [scale_model(1.0).SerializeToString(), scale_model(1.0, shape=(3, 4)).SerializeToString()],
            ["a", "b"],
            edges=[(0, "y", 1, "x")],
        )


def reshaper(name: str) -> onnx.ModelProto:
    """y = Reshape(x, shape), a node named 'reshape' in every copy."""
    return helper.make_model(
        helper.make_graph(
            [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
            name,
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )


def test_origins_translate_a_runtime_error_back_to_the_stage_and_node():
    composed = _core.compose(
        [reshaper("first").SerializeToString(), reshaper("second").SerializeToString()],
        ["first", "second"],
        edges=[(0, "y", 1, "x")],
        graph_outputs=[("out", 1, "y")],
    )
    merged = model(composed)
    # Both stages read an input called 'shape': exposed as 'first.shape' and 'second.shape'.
    assert [i.name for i in merged.graph.input] == ["x", "first.shape", "second.shape"]
    feeds = {"x": np.ones((2, 6), np.float32), "first.shape": np.array([3, 4]), "second.shape": np.array([5, 5])}
    with pytest.raises(Exception) as e:
        run(merged, feeds)
    node = re.search(r"Name:'([^']+)'", str(e.value)).group(1)
    stages, names = composed.origins()
    assert names[node] == (1, "reshape")
    label, first, end = stages[names[node][0]]
    assert label == "second" and [n.name for n in merged.graph.node[first:end]] == [node]


def test_graph_errors_are_composition_errors_in_the_users_names():
    srcs = [scale_model(1.0).SerializeToString()] * 3
    labels = ["pre", "mid", "post"]
    with pytest.raises(fastseq.CompositionError, match="^edges: the edges make a cycle: mid -> post -> mid$"):
        _core.compose(srcs, labels, edges=[(1, "y", 2, "x"), (2, "y", 1, "x")])
    with pytest.raises(
        fastseq.CompositionError, match=r"^edges\[0\]: 'pre\.Y' is not an output of pre \(did you mean 'y'\?\)$"
    ):
        _core.compose(srcs, labels, edges=[(0, "Y", 1, "x")])
    with pytest.raises(
        fastseq.CompositionError,
        match=r"^edges\[1\]: 'post\.x' is fed twice: by edges\[0\] \(pre\.y -> post\.x\) and by mid\.y -> post\.x$",
    ):
        _core.compose(srcs, labels, edges=[(0, "y", 2, "x"), (1, "y", 2, "x")])
    with pytest.raises(fastseq.CompositionError, match="pass either io_maps"):
        _core.compose(srcs, labels, io_maps=[[], []], edges=[])


def test_the_linear_form_is_unchanged_and_reports_nothing(x24):
    a, b = scale_model(2.0), scale_model(2.0)
    composed = _core.compose([a.SerializeToString(), b.SerializeToString()], ["a", "b"])
    merged = model(composed)
    # Identical weights stay apart unless asked: the linear form keeps its old output.
    assert [t.name for t in merged.graph.initializer] == ["c", "m1/c"]
    assert composed.report()["deduped_bytes"] == 0
    np.testing.assert_allclose(run(merged, {"x": x24})["y"], np.maximum(np.maximum(x24 * 2, 0) * 2, 0), rtol=1e-6)
    asked = _core.compose([a.SerializeToString(), b.SerializeToString()], ["a", "b"], dedupe=True)
    assert [t.name for t in model(asked).graph.initializer] == ["c"] and asked.report()["deduped_bytes"] == 16


def test_pruning_keeps_what_subgraphs_read_from_outer_scopes(x24):
    """Both If branches read the outer initializer 'c': pruning must see through them."""
    m = if_model_reading_outer_initializer()
    composed = _core.compose(
        [m.SerializeToString()] * 3,
        ["a", "b", "c"],
        edges=[(0, "y", 1, "x"), (0, "y", 2, "x")],
        graph_outputs=[("out", 1, "y")],
    )
    merged = model(composed)
    assert composed.report()["pruned"]["stages"] == ["c"]
    # The pruned copy's weights go with it; the second copy's are the first one's (deduplicated).
    assert sorted(t.name for t in merged.graph.initializer) == ["c", "zero"]
    for sign in (1, -1):
        x = np.abs(x24) * sign
        np.testing.assert_allclose(run(merged, {"x": x})["out"], run_chain([m, m], {"x": x})["y"], rtol=1e-6)
