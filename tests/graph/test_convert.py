"""Versions in every domain: ai.onnx through onnx.version_converter, ai.onnx.ml and the other
domains onnx knows by their schemas, custom domains (com.microsoft) only when they agree.
Real skl2onnx exports, onnx's own ai.onnx.ml test cases, ONNX Runtime contrib operators."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq
from conftest import run

pytest.importorskip("skl2onnx")
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import MinMaxScaler
from sklearn.tree import DecisionTreeClassifier

OPSETS = {"": 17, "ai.onnx.ml": 3}  # what skl2onnx is asked for; it imports ml 1 where that suffices


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    scaler = MinMaxScaler().fit(X)
    return X, y, scaler, scaler.transform(X).astype(np.float32)


def _imports(model: onnx.ModelProto) -> dict[str, int]:
    return {o.domain or "": o.version for o in model.opset_import}


def _joint(a: onnx.ModelProto, b: onnx.ModelProto) -> list[list[tuple[str, str]]]:
    return [[(a.graph.output[0].name, b.graph.input[0].name)]]


def test_skl2onnx_ml_3_and_ml_1_merge_at_ml_3_and_match_sklearn(iris):
    X, y, scaler, Xs = iris
    clf = LogisticRegression(max_iter=500).fit(Xs, y)
    a = to_onnx(scaler, X[:1], target_opset=OPSETS)  # imports ai.onnx.ml 3, uses no ml operator
    b = to_onnx(clf, Xs[:1], target_opset=OPSETS, options={"zipmap": False})  # LinearClassifier, ml 1
    assert _imports(a)["ai.onnx.ml"] == 3 and _imports(b)["ai.onnx.ml"] == 1

    with pytest.raises(
        fastseq.OpsetMismatchError, match=r"'ai.onnx.ml': 1 in .*; 3 in .*auto_ir_version_conversion=True"
    ):
        fastseq.ONNXSequential(a, b, io_maps=_joint(a, b))
    pipe = fastseq.ONNXSequential(a, b, io_maps=_joint(a, b), auto_ir_version_conversion=True)
    assert dict(map(tuple, pipe.summary()["opsets"]))["ai.onnx.ml"] == 3
    label, probs = pipe(X)
    np.testing.assert_array_equal(label, clf.predict(Xs))
    np.testing.assert_allclose(probs, clf.predict_proba(Xs), rtol=1e-4, atol=1e-5)

    merged = fastseq.compose([a, b], io_maps=_joint(a, b), opset="highest")
    onnx.checker.check_model(merged, full_check=True)
    assert _imports(merged)["ai.onnx.ml"] == 3
    assert any(n.op_type == "LinearClassifier" for n in merged.graph.node)


def test_an_operator_that_changed_keeps_its_version_and_the_other_model_moves(iris):
    """TreeEnsembleClassifier changed in ai.onnx.ml 3, so the tree (ml 1) cannot go to 3;
    the scaler uses no ml operator and can go down: both land on ml 2."""
    X, y, scaler, Xs = iris
    tree = DecisionTreeClassifier(max_depth=3, random_state=0).fit(Xs, y)
    a = to_onnx(scaler, X[:1], target_opset=OPSETS)
    b = to_onnx(tree, Xs[:1], target_opset=OPSETS, options={"zipmap": False})
    assert _imports(b)["ai.onnx.ml"] == 1
    merged = fastseq.compose([a, b], io_maps=_joint(a, b), opset="highest")
    assert _imports(merged)["ai.onnx.ml"] == 2
    got = run(merged, {a.graph.input[0].name: X})
    np.testing.assert_array_equal(got["label"], tree.predict(Xs))
    np.testing.assert_allclose(got["probabilities"], tree.predict_proba(Xs), rtol=1e-5, atol=1e-6)


def test_no_common_version_names_the_operator_the_models_and_the_versions(iris):
    _, y, _, Xs = iris
    tree = DecisionTreeClassifier(max_depth=2, random_state=0).fit(Xs, y)
    old = to_onnx(tree, Xs[:1], target_opset=OPSETS, options={"zipmap": False})
    old.graph.name = "tree_v1"
    new = onnx.ModelProto()
    new.CopyFrom(old)
    new.graph.name = "tree_v3"
    for o in new.opset_import:
        if o.domain == "ai.onnx.ml":
            o.version = 3
    with pytest.raises(fastseq.ConversionError) as info:
        fastseq.ONNXSequential(old, new, io_maps=[[]], auto_ir_version_conversion=True)
    text = str(info.value)
    assert "'ai.onnx.ml'" in text and "1 in tree_v1 (#0); 3 in tree_v3 (#1)" in text
    assert "to 3: tree_v1 (#0) (ai.onnx.ml 1): TreeEnsembleClassifier changed in ai.onnx.ml 3" in text
    assert "to 1: tree_v3 (#1) (ai.onnx.ml 3): TreeEnsembleClassifier changed in ai.onnx.ml 3" in text


def test_onnx_test_cases_binarizer_ml_1_and_tree_ensemble_ml_5():
    """onnx's own ai.onnx.ml test cases: Binarizer (ml 1, unchanged since) goes to ml 5, the
    version TreeEnsemble (new in ml 5) needs; the outputs are onnx's expected ones."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case import node as cases
        from onnx.backend.test.case.node.ai_onnx_ml import binarizer, tree_ensemble  # noqa: F401  (registers)
    by_name = {c.name: c for c in cases._NodeTestCases}
    binar = by_name["test_ai_onnx_ml_binarizer"]
    tree = by_name["test_ai_onnx_ml_tree_ensemble_set_membership"]
    assert _imports(binar.model)["ai.onnx.ml"] == 1 and _imports(tree.model)["ai.onnx.ml"] == 5
    (x_tree,), _ = tree.data_sets[0]
    x_tree = np.nan_to_num(x_tree)  # Binarizer refuses NaN, which the tree case feeds
    # Binarizer is elementwise: declared on the tree's input shape, it feeds the tree.
    model = binar.model
    for value in (model.graph.input[0], model.graph.output[0]):
        del value.type.tensor_type.shape.dim[:]
        for d in x_tree.shape:
            value.type.tensor_type.shape.dim.add().dim_value = d
    threshold = next(a.f for a in model.graph.node[0].attribute if a.name == "threshold")
    with pytest.raises(fastseq.OpsetMismatchError, match=r"opset='highest'"):
        fastseq.compose([model, tree.model], io_maps=[[("Y", "X")]])
    merged = fastseq.compose([model, tree.model], io_maps=[[("Y", "X")]], opset="highest")
    assert _imports(merged)["ai.onnx.ml"] == 5
    got = run(merged, {"X": x_tree})
    want = run(tree.model, {"X": (x_tree > threshold).astype(np.float32)})
    np.testing.assert_allclose(got["Y"], want["Y"])


def _gelu_model(name: str, ms_version: int, op: str = "Gelu", domain: str = "com.microsoft") -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], domain=domain if op == "Gelu" else "")
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, ms_version)], ir_version=8
    )


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_custom_domain_merges_when_versions_agree_and_runs_in_onnx_runtime():
    a, b = _gelu_model("gelu_a", 1), _gelu_model("gelu_b", 1)
    pipe = fastseq.ONNXSequential(a, b)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(pipe(x)[0], _gelu(_gelu(x)), rtol=1e-5, atol=1e-6)
    converted = fastseq.ONNXSequential(a, b, auto_ir_version_conversion=True)
    np.testing.assert_allclose(converted(x)[0], _gelu(_gelu(x)), rtol=1e-5, atol=1e-6)


def test_custom_domain_with_different_versions_is_refused_clearly():
    a, b = _gelu_model("gelu_a", 1), _gelu_model("gelu_b", 2)
    with pytest.raises(fastseq.OpsetMismatchError, match="'com.microsoft': 1 in gelu_a .*; 2 in gelu_b"):
        fastseq.ONNXSequential(a, b)
    with pytest.raises(fastseq.ConversionError) as info:
        fastseq.ONNXSequential(a, b, auto_ir_version_conversion=True)
    text = str(info.value)
    assert "cannot bring domain 'com.microsoft' to one version (1 in gelu_a (#0); 2 in gelu_b (#1))" in text
    assert "onnx knows no schema for Gelu" in text
    assert text.endswith("Export the models with one com.microsoft version")


def test_a_model_importing_a_custom_domain_it_does_not_use_follows_the_other():
    a = _gelu_model("gelu_a", 1)
    relu = _gelu_model("relu", 2, op="Relu")  # imports com.microsoft 2, uses only ai.onnx
    pipe = fastseq.ONNXSequential(a, relu, auto_ir_version_conversion=True)
    assert ("com.microsoft", 1) in [tuple(o) for o in pipe.summary()["opsets"]]
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(pipe(x)[0], np.maximum(_gelu(x), 0), rtol=1e-5, atol=1e-6)


def test_local_functions_do_not_tie_their_domain_version():
    """A call of the model's own local function does not depend on its domain's version."""

    def with_function(name: str, version: int, scale: float) -> onnx.ModelProto:
        body = [
            helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", TensorProto.FLOAT, [], [scale])),
            helper.make_node("Mul", ["a", "s"], ["b"]),
        ]
        fn = helper.make_function("local.fns", "Scale", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
        graph = helper.make_graph(
            [helper.make_node("Scale", ["x"], ["y"], domain="local.fns")],
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
        return helper.make_model(
            graph,
            functions=[fn],
            ir_version=8,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local.fns", version)],
        )

    a, b = with_function("a", 1, 2.0), with_function("b", 4, 3.0)
    with pytest.raises(fastseq.OpsetMismatchError):
        fastseq.ONNXSequential(a, b)
    pipe = fastseq.ONNXSequential(a, b, auto_ir_version_conversion=True)
    np.testing.assert_allclose(pipe(np.array([1.0, -1.0], np.float32))[0], [6.0, -6.0])


def test_merge_models_hint_does_not_offer_a_parameter_it_lacks(iris):
    X, y, scaler, Xs = iris
    a = to_onnx(scaler, X[:1], target_opset=OPSETS)
    b = to_onnx(LogisticRegression(max_iter=500).fit(Xs, y), Xs[:1], target_opset=OPSETS, options={"zipmap": False})
    with pytest.raises(fastseq.OpsetMismatchError) as info:
        fastseq.merge_models(a, b, io_map=_joint(a, b)[0])
    text = str(info.value)
    assert "auto_ir_version_conversion" not in text and "target_opset_version" not in text
    assert "opset='highest'" in text  # which fastseq.compose takes


def test_cli_hint_names_the_flag_and_the_flag_works(iris, tmp_path):
    X, y, scaler, Xs = iris
    a = to_onnx(scaler, X[:1], target_opset=OPSETS)
    b = to_onnx(LogisticRegression(max_iter=500).fit(Xs, y), Xs[:1], target_opset=OPSETS, options={"zipmap": False})
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    io_map = f"{a.graph.output[0].name}:{b.graph.input[0].name}"
    cmd = [
        sys.executable,
        "-m",
        "fastseq",
        "merge",
        str(tmp_path / "a.onnx"),
        str(tmp_path / "b.onnx"),
        "--io-map",
        io_map,
        "-o",
        str(tmp_path / "m.onnx"),
    ]
    refused = subprocess.run(cmd, capture_output=True, text=True)
    assert refused.returncode == 1
    assert "--opset highest" in refused.stderr and "auto_ir_version_conversion" not in refused.stderr
    done = subprocess.run(cmd + ["--opset", "highest"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _imports(onnx.load(tmp_path / "m.onnx"))["ai.onnx.ml"] == 3


def test_function_bodies_move_with_the_model_and_are_checked(iris):
    """A local function whose body uses ai.onnx.ml at the model's version moves with it."""
    X, _, scaler, _ = iris
    body = [helper.make_node("Binarizer", ["a"], ["b"], domain="ai.onnx.ml", threshold=0.5)]
    fn = helper.make_function(
        "local.fns",
        "Threshold",
        ["a"],
        ["b"],
        body,
        [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
    )
    graph = helper.make_graph(
        [helper.make_node("Threshold", ["x"], ["y"], domain="local.fns")],
        "thresholds",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )
    thresholds = helper.make_model(
        graph,
        functions=[fn],
        ir_version=8,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("ai.onnx.ml", 1),
            helper.make_opsetid("local.fns", 1),
        ],
    )
    a = to_onnx(scaler, X[:1], target_opset=OPSETS)  # ml 3
    merged = fastseq.compose([a, thresholds], io_maps=[[(a.graph.output[0].name, "x")]], opset="highest")
    assert _imports(merged)["ai.onnx.ml"] == 3
    assert {o.domain: o.version for o in merged.functions[0].opset_import}["ai.onnx.ml"] == 3
    got = run(merged, {a.graph.input[0].name: X})["y"]
    np.testing.assert_array_equal(got, (scaler.transform(X) > 0.5).astype(np.float32))


def test_ai_onnx_conversion_and_ml_settling_in_one_pass(iris):
    """One model needs both: ai.onnx 15 -> 18 through the converter, ai.onnx.ml 1 -> 3."""
    X, y, scaler, Xs = iris
    clf = LogisticRegression(max_iter=500).fit(Xs, y)
    a = to_onnx(scaler, X[:1], target_opset=OPSETS)
    b = to_onnx(clf, Xs[:1], target_opset={"": 15, "ai.onnx.ml": 3}, options={"zipmap": False})
    assert _imports(b)[""] == 15 and _imports(b)["ai.onnx.ml"] == 1
    pipe = fastseq.ONNXSequential(a, b, io_maps=_joint(a, b), target_opset_version=18)
    assert sorted(map(tuple, pipe.summary()["opsets"])) == [("", 18), ("ai.onnx.ml", 3)]
    label, probs = pipe(X)
    np.testing.assert_array_equal(label, clf.predict(Xs))
    np.testing.assert_allclose(probs, clf.predict_proba(Xs), rtol=1e-4, atol=1e-5)


def test_a_model_importing_a_domain_twice_is_named_once():
    """skl2onnx writes the default domain twice in some models (the digits scaler imports
    "" 17 twice): the opset error names it once."""
    from conftest import FIXTURES, scale_model

    scaler = onnx.load(FIXTURES / "digits_scaler.onnx")
    assert [o.version for o in scaler.opset_import if o.domain == ""] == [17, 17]
    old = scale_model(2.0)
    old.opset_import[0].version = 13
    with pytest.raises(fastseq.OpsetMismatchError) as info:
        fastseq.compose([scaler, old])
    assert "17 in digits_scaler (#0)" in str(info.value)
    assert str(info.value).count("digits_scaler (#0)") == 1, str(info.value)
