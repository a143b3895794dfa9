"""Differential tests on real models: the merged model against the stages run one after
another in ONNX Runtime, and against onnx.compose where onnx.compose can do the job."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.compose
import pytest

import fastseq
from conftest import FIXTURES, ONNX_DATA, input_pb, pytorch_converted, run, run_chain, scale_model

# Shape-preserving models exported from torch.nn by others, all IR 3 / opset 6, all with
# the numeric names ('0', '1', ...) of the legacy exporter: every joint clashes.
SAME_SHAPE_CHAIN = [
    "test_ReLU",
    "test_Sigmoid",
    "test_Tanh",
    "test_softmax_functional_dim3",
    "test_log_softmax_dim3",
]


def onnx_compose_chain(models, io_maps):
    """The peer: onnx.compose.merge_models folded pairwise, with prefixes to avoid clashes."""
    merged = onnx.compose.add_prefix(models[0], "s0/")
    for j, model in enumerate(models[1:], start=1):
        pairs = [(f"s{j - 1}/{o}", f"s{j}/{i}") for o, i in io_maps[j - 1]]
        merged = onnx.compose.merge_models(merged, onnx.compose.add_prefix(model, f"s{j}/"), io_map=pairs)
    return merged


def positional_io_maps(models):
    maps = []
    for a, b in zip(models, models[1:]):
        inits = {t.name for t in b.graph.initializer}
        ins = [i.name for i in b.graph.input if i.name not in inits]
        maps.append(list(zip([o.name for o in a.graph.output], ins)))
    return maps


def test_pytorch_converted_chain_matches_sequential_runs_and_onnx_compose():
    models = [pytorch_converted(n) for n in SAME_SHAPE_CHAIN]
    x = input_pb("test_ReLU")
    merged = fastseq.compose(models)
    onnx.checker.check_model(merged)
    weights = {t.name for t in merged.graph.initializer}
    assert [i.name for i in merged.graph.input if i.name not in weights] == ["0"]
    assert [o.name for o in merged.graph.output] == [models[-1].graph.output[0].name]

    expected = run_chain(models, {"0": x})
    got = run(merged, {"0": x})
    np.testing.assert_allclose(list(got.values())[0], list(expected.values())[0], rtol=1e-5, atol=1e-6)

    peer = onnx_compose_chain(models, positional_io_maps(models))
    peer_out = list(run(peer, {"s0/0": x}).values())[0]
    np.testing.assert_allclose(list(got.values())[0], peer_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "first,second",
    [("test_ReLU", "test_Tanh"), ("test_Softmax", "test_LogSoftmax"), ("test_ELU", "test_SELU")],
)
def test_merge_models_is_a_drop_in_for_onnx_compose(first, second):
    m1, m2 = pytorch_converted(first), pytorch_converted(second)
    io_map = [(m1.graph.output[0].name, m2.graph.input[0].name)]
    ref = onnx.compose.merge_models(m1, m2, io_map=io_map, prefix1="a/", prefix2="b/")
    ours = fastseq.merge_models(m1, m2, io_map=io_map, prefix1="a/", prefix2="b/")
    onnx.checker.check_model(ours)
    assert [i.name for i in ours.graph.input] == [i.name for i in ref.graph.input]
    assert [o.name for o in ours.graph.output] == [o.name for o in ref.graph.output]
    assert ours.producer_name == ref.producer_name == "onnx.compose.merge_models"
    x = input_pb(first)
    feed = {ref.graph.input[0].name: x}
    np.testing.assert_allclose(
        list(run(ours, feed).values())[0], list(run(ref, feed).values())[0], rtol=1e-6, atol=1e-7
    )


def test_merge_models_outputs_and_inputs_selection_matches_onnx_compose():
    m1, m2 = scale_model(2.0, out="y", name="a"), scale_model(3.0, inp="y", out="z", name="b")
    m1.graph.output.append(onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2, 4]))
    kwargs = dict(io_map=[("y", "y")], prefix1="p/", prefix2="q/", outputs=["p/t", "q/z"])
    ref = onnx.compose.merge_models(m1, m2, **kwargs)
    ours = fastseq.merge_models(m1, m2, **kwargs)
    assert [o.name for o in ours.graph.output] == [o.name for o in ref.graph.output] == ["p/t", "q/z"]
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    got, want = run(ours, {"p/x": x}), run(ref, {"p/x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name])


def test_merge_models_without_prefixes_resolves_clashes_where_onnx_compose_refuses():
    m1, m2 = scale_model(2.0, out="y"), scale_model(3.0, inp="y", out="z")
    with pytest.raises(Exception, match="overlapping names"):
        onnx.compose.merge_models(m1, m2, io_map=[("y", "y")])
    merged = fastseq.merge_models(m1, m2, io_map=[("y", "y")])
    onnx.checker.check_model(merged)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(run(merged, {"x": x})["z"], np.maximum(np.maximum(x * 2, 0) * 3, 0))


def fixture(name: str) -> onnx.ModelProto:
    return onnx.load(str(FIXTURES / name))


@pytest.mark.parametrize(
    "chain,shape",
    [
        (["torch_cnn_backbone.onnx", "torch_head.onnx"], (2, 3, 32, 32)),
        (
            ["torch_transformer.onnx", "torch_lstm.onnx", "torch_residual_functions.onnx", "torch_head.onnx"],
            (3, 12, 16),
        ),
        (["torch_transformer.onnx", "torch_transformer.onnx", "torch_lstm.onnx"], (1, 12, 16)),
    ],
)
def test_torch_exports_compose_like_sequential_runs(chain, shape):
    models = [fixture(n) for n in chain]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    first_input = models[0].graph.input[0].name
    merged = fastseq.compose(models)
    onnx.checker.check_model(merged, full_check=True)
    assert [i.name for i in merged.graph.input] == [first_input]
    assert [o.name for o in merged.graph.output] == [o.name for o in models[-1].graph.output]
    got = list(run(merged, {first_input: x}).values())[0]
    want = list(run_chain(models, {first_input: x}).values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_torch_local_functions_in_two_models_are_kept_once_or_renamed():
    residual = fixture("torch_residual_functions.onnx")
    other = onnx.load(str(FIXTURES / "torch_residual_functions.onnx"))
    # Same (domain, name) but a different body: must be renamed, callers included.
    body = other.functions[0]
    tanh = next(n for n in body.node if n.op_type == "Tanh")
    tanh.op_type = "Sigmoid"
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)

    same = fastseq.compose([residual, residual])
    assert len(same.functions) == 1  # identical bodies are shared
    different = fastseq.compose([residual, other])
    assert sorted(f.name for f in different.functions) == ["Block", "Block__m1"]
    called = {n.op_type for n in different.graph.node if n.domain == "__main__"}
    assert called == {"Block", "Block__m1"}
    onnx.checker.check_model(different, full_check=True)
    got = list(run(different, {"x": x}).values())[0]
    want = list(run_chain([residual, other], {"x": x}).values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sklearn_pipeline_stages_compose_like_the_whole_pipeline():
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)
    opsets = {"": 17, "ai.onnx.ml": 3}
    scaler = to_onnx(pipe[0], X[:1], target_opset=opsets)
    clf = to_onnx(pipe[1], pipe[0].transform(X[:1]).astype(np.float32), target_opset=opsets, options={"zipmap": False})
    whole = to_onnx(pipe, X[:1], target_opset=opsets, options={"zipmap": False})
    assert any(o.domain == "ai.onnx.ml" for o in scaler.opset_import)

    merged = fastseq.compose([scaler, clf], io_maps=[[(scaler.graph.output[0].name, clf.graph.input[0].name)]])
    onnx.checker.check_model(merged, full_check=True)
    got = run(merged, {scaler.graph.input[0].name: X})
    want = run(whole, {whole.graph.input[0].name: X})
    np.testing.assert_array_equal(got["label"], want["label"])
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["probabilities"], pipe.predict_proba(X), rtol=1e-4, atol=1e-5)


def test_light_model_with_initializers_listed_as_inputs():
    """light/ models are IR 3 and list their weights as graph inputs: only the real input
    joins by position, and the weights stay weights."""
    light = onnx.load(str(ONNX_DATA / "light" / "light_squeezenet.onnx"))
    inits = {t.name for t in light.graph.initializer}
    real = [i for i in light.graph.input if i.name not in inits]
    assert len(real) == 1 and len(light.graph.input) > 1
    pre = scale_model(
        1.0,
        inp="image",
        out="scaled",
        shape=tuple(d.dim_value for d in real[0].type.tensor_type.shape.dim),
        opset=light.opset_import[0].version,
        ir=3,
    )
    pre.graph.node[1].op_type = "Identity"  # y = x * 1
    merged = fastseq.compose([pre, light])
    assert [i.name for i in merged.graph.input if i.name not in inits] == ["image"]
    x = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)
    got = list(run(merged, {"image": x}).values())[0]
    want = list(run(light, {real[0].name: x}).values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_mixed_ir_versions_merge_to_the_highest(x24):
    a, b = scale_model(2.0, ir=7), scale_model(3.0, ir=10)
    with pytest.raises(Exception, match="IR version mismatch"):
        onnx.compose.merge_models(a, b, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    merged = fastseq.compose([a, b])
    assert merged.ir_version == 10
    np.testing.assert_allclose(run(merged, {"x": x24})["y"], np.maximum(np.maximum(x24 * 2, 0) * 3, 0))
