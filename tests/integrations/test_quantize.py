"""Quantized exports: the composed digits classifier (skl2onnx fixtures, real sklearn digits
images) and the torch CNN fixtures, quantized by onnxruntime.quantization through
pipe.quantize, fastseq.quantize.quantize and `fastseq quantize`, compared with the float
pipeline."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

import fastseq
from conftest import FIXTURES
from fastseq.quantize import quantize

pytest.importorskip("onnxruntime.quantization")
TRAIN = 1200  # the fixtures were trained on the images before this one


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def pipe():
    scaler, mlp = FIXTURES / "digits_scaler.onnx", FIXTURES / "digits_mlp.onnx"
    # The scaler imports ai.onnx.ml 3, the MLP 1: conversion brings both to 3.
    return fastseq.ONNXSequential(scaler, mlp, io_maps=[[("variable", "X")]], auto_ir_version_conversion=True)


def _compare(quantized_path, pipe, X, y):
    """Top-1 agreement with the float pipeline, accuracy of both, largest probability error."""
    label, probs = pipe(X)
    q_label, q_probs = fastseq.ONNXSequential(quantized_path)(X)
    return (q_label == label).mean(), (q_label == y).mean(), (label == y).mean(), np.abs(q_probs - probs).max()


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_dynamic_quantization_of_a_pipeline_agrees_and_shrinks(pipe, digits, tmp_path, monkeypatch):
    X, y = digits
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = pipe.quantize(tmp_path / "q.onnx")
    # onnxruntime's symbolic shape inference gives up on ai.onnx.ml and saves a file in the
    # current folder; none is left there.
    assert list(cwd.iterdir()) == []
    cwd.rmdir()
    assert result.path == tmp_path / "q.onnx" and result.data_file is None
    float_size = pipe.export(tmp_path / "f.onnx").stat().st_size
    assert result.size_before == float_size and result.size_after == result.path.stat().st_size
    assert result.size_after < 0.4 * float_size  # the 64x256 and 256x10 weights are int8 now
    assert "MatMulInteger" in _ops(result.path) and "DynamicQuantizeLinear" in _ops(result.path)
    agree, q_acc, f_acc, err = _compare(result.path, pipe, X[TRAIN:], y[TRAIN:])
    assert agree >= 0.98 and q_acc >= f_acc - 0.01 and err < 0.25, (agree, q_acc, f_acc, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.onnx", "q.onnx"]  # nothing temporary left


def test_static_qdq_from_a_folder_of_npy_through_the_cli(pipe, digits, tmp_path):
    X, y = digits
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(8):
        np.save(calib / f"batch{i}.npy", X[i * 64 : (i + 1) * 64])
    pipe.export(tmp_path / "f.onnx")
    cmd = [
        sys.executable,
        "-m",
        "fastseq",
        "quantize",
        str(tmp_path / "f.onnx"),
        "-o",
        str(tmp_path / "q.onnx"),
        "--static",
        "--calibration",
        str(calib),
        "--per-channel",
        "--format",
        "qdq",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "wrote " + str(tmp_path / "q.onnx") in done.stdout
    ops = _ops(tmp_path / "q.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert (tmp_path / "q.onnx").stat().st_size < 0.4 * (tmp_path / "f.onnx").stat().st_size
    agree, q_acc, f_acc, err = _compare(tmp_path / "q.onnx", pipe, X[TRAIN:], y[TRAIN:])
    assert agree >= 0.98 and q_acc >= f_acc - 0.01 and err < 0.15, (agree, q_acc, f_acc, err)


def test_static_qoperator_from_batches_with_a_progress_bar(pipe, digits, tmp_path, capsys):
    X, y = digits
    batches = [X[i : i + 100] for i in range(0, 600, 100)]
    result = pipe.quantize(tmp_path / "q.onnx", static=True, calibration=batches, format="qoperator", progress=True)
    err_out = capsys.readouterr().err
    assert "calibrating" in err_out and "6/6" in err_out
    ops = _ops(result.path)
    assert any(op.startswith("QLinear") or op == "QGemm" for op in ops), ops
    agree, q_acc, f_acc, err = _compare(result.path, pipe, X[TRAIN:], y[TRAIN:])
    assert agree >= 0.98 and q_acc >= f_acc - 0.01 and err < 0.15, (agree, q_acc, f_acc, err)


def test_torch_cnn_pipeline_static_per_channel_stays_close(tmp_path):
    """Convolutions, batch norm and linear layers (the torch fixtures), per-channel QDQ."""
    pipe = fastseq.ONNXSequential(FIXTURES / "torch_cnn_backbone.onnx", FIXTURES / "torch_head.onnx")
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((8, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    result = pipe.quantize(tmp_path / "q.onnx", static=True, calibration=batches, per_channel=True)
    assert "QuantizeLinear" in _ops(result.path)
    x = rng.standard_normal((16, 3, 32, 32)).astype(np.float32)
    (want,) = pipe(x)
    (got,) = fastseq.ONNXSequential(result.path)(x)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.75


def test_weights_go_to_a_data_file_above_the_limit(pipe, digits, tmp_path, monkeypatch):
    """Above 2 GB (here a lowered limit) every step keeps the weights external."""
    from fastseq import quantize as module

    monkeypatch.setattr(module, "_LIMIT", 10_000)
    result = pipe.quantize(tmp_path / "q.onnx")
    assert result.data_file is not None and result.data_file.parent == tmp_path and result.data_file.is_file()
    assert result.size_after == result.path.stat().st_size + result.data_file.stat().st_size
    X, y = digits
    agree, *_ = _compare(result.path, pipe, X[TRAIN:], y[TRAIN:])
    assert agree >= 0.98
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["q.onnx", result.data_file.name])


def test_models_and_bytes_are_accepted_too(digits, tmp_path):
    X, _ = digits
    mlp = onnx.load(str(FIXTURES / "digits_mlp.onnx"))
    from_proto = quantize(mlp, tmp_path / "a.onnx")
    from_bytes = quantize(mlp.SerializeToString(), tmp_path / "b.onnx")
    assert from_proto.path.read_bytes() == from_bytes.path.read_bytes()
    assert from_proto.size_after < 0.4 * from_proto.size_before
    assert str(from_proto).startswith(f"{tmp_path / 'a.onnx'} (") and "0.3" in str(from_proto)


def test_bad_requests_are_typed_and_leave_nothing_behind(tmp_path):
    mlp = FIXTURES / "digits_mlp.onnx"
    with pytest.raises(fastseq.InputError, match="format='qdq' needs static=True"):
        quantize(mlp, tmp_path / "q.onnx", format="qdq")
    with pytest.raises(fastseq.InputError, match="static=True needs calibration data"):
        quantize(mlp, tmp_path / "q.onnx", static=True)
    with pytest.raises(fastseq.InputError, match="only used with static=True"):
        quantize(mlp, tmp_path / "q.onnx", calibration=[np.zeros((1, 64), np.float32)])
    with pytest.raises(fastseq.InputError, match="format must be 'qdq' or 'qoperator'"):
        quantize(mlp, tmp_path / "q.onnx", format="int4")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(fastseq.InputError, match="holds no .npy or .npz file"):
        quantize(mlp, tmp_path / "q.onnx", static=True, calibration=empty)
    with pytest.raises(fastseq.InputError, match=r"calibration batch has inputs \['x'\], the model .* takes \['X'\]"):
        quantize(mlp, tmp_path / "q.onnx", static=True, calibration=[{"x": np.zeros((1, 64), np.float32)}])
    with pytest.raises(fastseq.InputError, match="the folder .*nowhere does not exist"):
        quantize(mlp, tmp_path / "nowhere" / "q.onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"not a model")
    with pytest.raises(fastseq.LoadError, match="garbage.onnx: not a valid ONNX model"):
        quantize(tmp_path / "garbage.onnx", tmp_path / "q.onnx")
    # A well-formed file whose graph reads a tensor nothing defines: ONNX Runtime refuses it.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "nowhere"], ["y"])],
        "dangling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "broken.onnx")
    with pytest.raises(fastseq.ConversionError, match=r"^broken.onnx: .*'nowhere'"):
        quantize(tmp_path / "broken.onnx", tmp_path / "q.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.onnx", "empty", "garbage.onnx"]


def test_cli_errors_are_one_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastseq",
            "quantize",
            str(FIXTURES / "digits_mlp.onnx"),
            "-o",
            str(tmp_path / "q.onnx"),
            "--static",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("fastseq: error: static=True needs calibration data")
    assert not (tmp_path / "q.onnx").exists()


def test_hub_models_are_quantized_from_the_cache(tmp_path, monkeypatch, digits):
    from servers import serve_hub

    root = tmp_path / "hub" / "acme" / "digits"
    root.mkdir(parents=True)
    (root / "mlp.onnx").write_bytes((FIXTURES / "digits_mlp.onnx").read_bytes())
    server = serve_hub(tmp_path / "hub")
    try:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # read per call
        out = tmp_path / "out"
        out.mkdir()
        result = quantize("hf://acme/digits/mlp.onnx", out / "q.onnx")
    finally:
        server.close()
    assert result.size_after < 0.4 * result.size_before
    assert list((tmp_path / "hf-cache").rglob("mlp.onnx"))
    X, _ = digits
    Xs = ((X - X[:TRAIN].mean(0)) / np.where(X[:TRAIN].std(0) == 0, 1, X[:TRAIN].std(0))).astype(np.float32)
    want = fastseq.ONNXSequential(FIXTURES / "digits_mlp.onnx")(Xs[TRAIN:])[0]
    got = fastseq.ONNXSequential(result.path)(Xs[TRAIN:])[0]
    assert (got == want).mean() >= 0.98
