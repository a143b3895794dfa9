"""ONNXSequential: calls, sessions and providers, export, conversion, pickling."""

from __future__ import annotations

import json
import pickle
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import fastseq
from conftest import FIXTURES, run_chain, scale_model

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


def two_input_model():
    g = helper.make_graph(
        [helper.make_node("Sub", ["a", "b"], ["d"])],
        "sub",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 4]),
        ],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_calls_by_position_and_by_name_return_every_output():
    pipe = fastseq.ONNXSequential(scale_model(2.0), two_input_model(), io_maps=[[("y", "a")]])
    assert [i.name for i in pipe.inputs] == ["x", "b"]
    assert pipe.inputs[0].dtype == np.float32 and pipe.inputs[0].shape == (2, 4)
    by_pos = pipe(X, X)
    by_name = pipe(b=X, x=X)
    assert isinstance(by_pos, list) and len(by_pos) == 1
    np.testing.assert_allclose(by_pos[0], np.maximum(2 * X, 0) - X)
    np.testing.assert_allclose(by_name[0], by_pos[0])


def test_run_selects_outputs():
    pipe = fastseq.ONNXSequential(scale_model(2.0, out="h"), scale_model(3.0, inp="h"), keep_outputs=["h"])
    names = [o.name for o in pipe.outputs]
    assert len(names) == 2
    (only,) = pipe.run({"x": X}, output_names=[names[1]])
    np.testing.assert_allclose(only, np.maximum(np.maximum(2 * X, 0) * 3, 0))
    with pytest.raises(fastseq.InputError, match="is not an output"):
        pipe.run({"x": X}, output_names=["nope"])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda p: p(X, X), r"expected 1 input \(x: float32\[2, 4\]\), got 2"),
        (lambda p: p(), "expected 1 input"),
        (lambda p: p(X.astype(np.float64)), "input 'x' expects float32, got float64"),
        (lambda p: p(X[None]), r"input 'x' expects rank 2 \[2, 4\], got shape \[1, 2, 4\]"),
        (lambda p: p(np.ones((3, 4), np.float32)), "expects size 2 on axis 0"),
        (lambda p: p(xx=X), r"'xx' is not an input \(did you mean 'x'\?\)"),
        (lambda p: p(X, x=X), "either by position or by name"),
    ],
)
def test_bad_calls_are_input_errors_naming_the_input(call, match):
    pipe = fastseq.ONNXSequential(scale_model(2.0), scale_model(3.0))
    with pytest.raises(fastseq.InputError, match=match):
        call(pipe)
    assert issubclass(fastseq.InputError, ValueError)


def test_sessions_providers_and_options():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    pipe = fastseq.ONNXSequential(scale_model(2.0), providers=["CPUExecutionProvider"], session_options=options)
    assert pipe.get_session().get_session_options().intra_op_num_threads == 1
    assert pipe.providers == ["CPUExecutionProvider"]
    other = pipe.create_session()
    assert other is not pipe.get_session()
    pipe.set_session(other)
    assert pipe.get_session() is other
    assert pipe.as_cpu() is pipe and pipe.providers == ["CPUExecutionProvider"]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is available here")
def test_missing_provider_is_a_warning_naming_it_and_what_is_available():
    pipe = fastseq.ONNXSequential(scale_model(2.0))
    for switch, name in [
        (pipe.as_cuda, "CUDAExecutionProvider"),
        (pipe.as_tensorrt, "TensorrtExecutionProvider"),
        (pipe.as_openvino, "OpenVINOExecutionProvider"),
    ]:
        with pytest.warns(RuntimeWarning, match=f"{name} is not available .*available: .*CPUExecutionProvider"):
            switch()
        assert pipe.providers == ["CPUExecutionProvider"]
        np.testing.assert_allclose(pipe(X)[0], np.maximum(2 * X, 0))
    with pytest.warns(RuntimeWarning, match="falling back to CPUExecutionProvider"):
        fastseq.ONNXSequential(scale_model(2.0), providers=["CoreMLExecutionProvider"])
    # A name that no onnxruntime build knows is a typo, not a missing provider.
    with pytest.raises(fastseq.ProviderError, match=r"'CPUExecutionProviderr' \(did you mean 'CPUExecutionProvider'"):
        fastseq.ONNXSequential(scale_model(2.0), providers=["CPUExecutionProviderr"])


def test_len_repr_and_summary():
    pipe = fastseq.ONNXSequential(
        "builtin:shipped/to_float", "builtin:shipped/resize", "builtin:shipped/normalize", "builtin:color_head"
    )
    assert len(pipe) == 4
    text = repr(pipe)
    assert (
        "builtin:shipped/to_float -> builtin:shipped/resize -> builtin:shipped/normalize -> builtin:color_head" in text
    )
    assert "input: uint8[N, H, W, 3]" in text and "opset ai.onnx 17" in text and "12 nodes" in text
    assert pipe.summary()["nodes"] == 12


def test_export_is_atomic_does_not_mutate_and_supports_external_data(tmp_path):
    pipe = fastseq.ONNXSequential(scale_model(2.0, shape=(2, 512)), scale_model(3.0, shape=(2, 512)))
    before = pipe.model_bytes
    inline = pipe.export(tmp_path / "inline.onnx")
    # The file is the model with its stage map in its metadata (which stage each node is).
    written = onnx.load(str(inline))
    assert [(e.key, json.loads(e.value)["stages"]) for e in written.metadata_props] == [
        ("fastseq.stages", [["scale (#0)", 0, 2, 0], ["scale (#1)", 2, 4, 0]])
    ]
    del written.metadata_props[:]
    assert written.SerializeToString() == before
    ext = pipe.export(tmp_path / "ext.onnx", external_data=True)
    data_files = [p for p in tmp_path.iterdir() if p.name.startswith("ext.onnx.") and p.name.endswith(".data")]
    assert len(data_files) == 1
    loaded = onnx.load(str(ext))
    loaded = onnx.load(str(ext), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in loaded.graph.initializer)
    onnx.checker.check_model(str(ext))
    s = ort.InferenceSession(str(ext), providers=["CPUExecutionProvider"])
    x = np.ones((2, 512), np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], np.full((2, 512), 6.0))
    # The pipeline is unchanged and still works; exporting again replaces the pair.
    assert pipe.model_bytes == before
    pipe.export(tmp_path / "ext.onnx", external_data=True)
    assert len([p for p in tmp_path.iterdir() if p.name.endswith(".data")]) == 1
    np.testing.assert_allclose(pipe(x)[0], np.full((2, 512), 6.0))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_session_goes_through_external_data_above_the_protobuf_limit(monkeypatch):
    from fastseq import _core

    monkeypatch.setattr(_core, "PROTOBUF_LIMIT", 100)  # treat anything as "over 2 GB"
    pipe = fastseq.ONNXSequential(scale_model(2.0), scale_model(3.0))
    np.testing.assert_allclose(pipe(X)[0], np.maximum(np.maximum(2 * X, 0) * 3, 0))


def test_pickling_rebuilds_the_session():
    pipe = fastseq.ONNXSequential(scale_model(2.0), scale_model(3.0))
    clone = pickle.loads(pickle.dumps(pipe))
    np.testing.assert_allclose(clone(X)[0], pipe(X)[0])
    assert len(clone) == 2


def test_auto_conversion_brings_models_to_the_highest_opset_with_weights_intact():
    a = scale_model(2.0, opset=13, ir=7, shape=(2, 512))
    b = scale_model(3.0, opset=17, ir=8, shape=(2, 512))
    with pytest.raises(fastseq.OpsetMismatchError):
        fastseq.ONNXSequential(a, b)
    pipe = fastseq.ONNXSequential(a, b, auto_ir_version_conversion=True)
    info = pipe.summary()
    assert ("", 17) in [tuple(o) for o in info["opsets"]] and info["ir_version"] == 8
    x = np.ones((2, 512), np.float32)
    np.testing.assert_allclose(pipe(x)[0], np.full((2, 512), 6.0))
    stamped = fastseq.ONNXSequential(a, b, target_opset_version=18, target_ir_version=9)
    assert stamped.summary()["ir_version"] == 9
    assert ("", 18) in [tuple(o) for o in stamped.summary()["opsets"]]


def test_torch_fixtures_convert_up_and_match():
    backbone, head = onnx.load(str(FIXTURES / "torch_cnn_backbone.onnx")), onnx.load(str(FIXTURES / "torch_head.onnx"))
    pipe = fastseq.ONNXSequential(backbone, head, target_opset_version=18)
    assert ("", 18) in [tuple(o) for o in pipe.summary()["opsets"]]
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(pipe(x)[0], run_chain([backbone, head], {"image": x})["logits"], rtol=1e-4, atol=1e-5)


def test_conversion_that_cannot_be_done_names_model_and_operator():
    g = helper.make_graph(
        [helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")],
        "up",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
    )
    old = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
    with pytest.raises(
        fastseq.ConversionError, match=r"up \(#0\): cannot convert from opset 9 to 4 \(blocked by operator Upsample\)"
    ):
        fastseq.ONNXSequential(old, target_opset_version=4)


def test_torch_tensors_and_lists_are_accepted_like_kornia():
    pipe = fastseq.ONNXSequential(scale_model(2.0))
    np.testing.assert_allclose(pipe(X.tolist())[0], np.maximum(2 * X, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch = pytest.importorskip("torch")
    np.testing.assert_allclose(pipe(torch.from_numpy(X))[0], np.maximum(2 * X, 0))
