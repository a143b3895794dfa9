"""What exporters write, batched (issue 41): torch's attention with a class token broadcast
over the batch, transformers' ViT (torch's expand as Where/Equal/ConstantOfShape), paddle2onnx's
differently named batch axes, batch-1 exports made batchable (``dynamic_batch``), a declared
row independence, the parity check (``verify``) and the command line's controls. Real
sessions, each caller's rows against the rows run alone."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import FIXTURES, ONNX_DATA, scale_model, session
from runtime.test_rows import node, refusal, rows, same_as_alone, x_to_y

F = TensorProto.FLOAT
LIGHT = ONNX_DATA / "light"


def over_rows() -> onnx.ModelProto:
    """x [N, 4] -> Softmax over the batch axis (node 'over_rows'): rows that mix."""
    return x_to_y(node("Softmax", ["x"], ["y"], "over_rows", axis=0))


def test_torchs_attention_after_a_class_token_is_batched():
    """cat([cls.expand(N, -1, -1), x], 1), then nn.TransformerEncoderLayer: Expand by the
    batch size, Concat beside the rows, heads merged with the rows and back."""
    pipe = fastseq.ONNXSequential(FIXTURES / "torch_class_token.onnx")
    pipe.check_rows()
    same_as_alone(pipe, [rows((6, 16), k) for k in range(4)])


def test_transformers_vit_is_batched():
    """transformers' ViTModel (random weights): its class token goes through torch's expand
    (Where(Equal(shape, -1), ConstantOfShape(ones), shape)), its attention through heads."""
    pipe = fastseq.ONNXSequential(FIXTURES / "hf_vit_tiny.onnx")
    pipe.check_rows()
    same_as_alone(pipe, [rows((3, 32, 32), k) for k in range(4)])


def p2o(names=("p2o.DynamicDimension.0", "p2o.DynamicDimension.3"), second: str | None = None) -> onnx.ModelProto:
    """A paddle2onnx-like model: each dynamic axis named apart, the batch too."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    ins = [helper.make_tensor_value_info("x", F, [names[0], 3, 8, 8])]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["c"], ["y"], axis=1),
    ]
    if second is not None:
        ins.append(helper.make_tensor_value_info("z", F, [second, 4, 8, 8]))
        nodes[-1] = helper.make_node("Softmax", ["c"], ["s"], axis=1)
        nodes.append(helper.make_node("Add", ["s", "z"], ["y"]))
    g = helper.make_graph(nodes, "p2o", ins, [helper.make_tensor_value_info("y", F, [names[1], 4, 8, 8])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


def test_paddle2onnx_axes_named_apart_are_one_batch_axis_once_the_rows_are_followed():
    pipe = fastseq.ONNXSequential(p2o())
    same_as_alone(pipe, [rows((3, 8, 8), k) for k in range(4)])


def test_inputs_named_apart_are_taken_as_one_batch_axis_only_when_declared():
    pipe = fastseq.ONNXSequential(p2o(second="other"))
    text = refusal(pipe)
    assert "inputs' first axes have different names" in text and "--row-independent" in text, text
    xs = [[rows((3, 8, 8), k), rows((4, 8, 8), k, seed=9)] for k in range(3)]
    with pipe.batcher(row_independent=True) as b:
        for x, z in xs:
            np.testing.assert_allclose(b(x, z)[0], pipe(x, z)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["squeezenet", "bvlc_alexnet", "shufflenet"])
def test_a_batch_one_export_is_made_batchable_and_computes_what_it_did(name):
    """The onnx wheel's light models are exported with a batch of 1 (their Reshapes say 1):
    dynamic_batch copies the rows' axis instead; each row gives what the export gives, and
    rows batched give what each gives alone."""
    path = LIGHT / f"light_{name}.onnx"
    assert "fixed first axis" in refusal(fastseq.ONNXSequential(path)) or name != "squeezenet"
    pipe = fastseq.ONNXSequential(path, dynamic_batch=True)
    pipe.check_rows()
    assert pipe.inputs[0].shape[0] == "batch"
    original = session(path)
    shape = pipe.inputs[0].shape[1:]
    x = np.random.default_rng(0).random((3, *shape)).astype(np.float32)
    first = original.run(None, {original.get_inputs()[0].name: x[:1]})[0]
    np.testing.assert_allclose(pipe(x[:1])[0], first, rtol=1e-4, atol=1e-5)
    same_as_alone(pipe, [x[:1], x[1:3]])


def test_what_the_adapter_cannot_prove_is_refused_naming_the_node():
    """A token of the export's one row joined beside the patches: Concat cannot take N rows."""
    token = numpy_helper.from_array(np.ones((1, 1, 4), np.float32), "token")
    g = helper.make_graph(
        [helper.make_node("Concat", ["token", "x"], ["y"], "with_token", axis=1)],
        "t",
        [helper.make_tensor_value_info("x", F, [1, 5, 4])],
        [helper.make_tensor_value_info("y", F, [1, 6, 4])],
        [token],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(fastseq.CompositionError) as info:
        fastseq.ONNXSequential(m, dynamic_batch=True)
    text = str(info.value)
    assert "dynamic batch axis" in text and "node 'with_token' (Concat)" in text, text
    with pytest.raises(fastseq.CompositionError, match="no input has a fixed first axis of 1"):
        fastseq.ONNXSequential(scale_model(2.0, shape=("N", 4)), dynamic_batch=True)
    with pytest.raises(fastseq.InputError, match="dynamic_batch must be True or False"):
        fastseq.ONNXSequential(m, dynamic_batch=1)


def test_a_pipeline_file_declares_row_independence_and_a_dynamic_batch(tmp_path):
    mixing = over_rows()
    onnx.save(mixing, tmp_path / "m.onnx")
    (tmp_path / "p.toml").write_text('chain = ["m"]\nrow_independent = true\n[stages]\nm = "m.onnx"\n')
    pipe = fastseq.Pipeline.from_file(tmp_path / "p.toml")
    assert pipe.row_independent
    pipe.batcher().close()  # declared: not refused
    assert "row_independent = true" in pipe.to_file(tmp_path / "w.toml").read_text()
    (tmp_path / "d.toml").write_text(
        f'chain = ["net"]\ndynamic_batch = true\n[stages]\nnet = "{LIGHT / "light_squeezenet.onnx"}"\n'
    )
    assert fastseq.Pipeline.from_file(tmp_path / "d.toml").inputs[0].shape[0] == "batch"
    (tmp_path / "bad.toml").write_text('chain = ["m"]\nrow_independent = "yes"\n[stages]\nm = "m.onnx"\n')
    with pytest.raises(fastseq.PipelineFileError, match="row_independent: expected true or false"):
        fastseq.Pipeline.from_file(tmp_path / "bad.toml")


def test_the_served_request_by_request_line_gives_the_whole_reason_and_the_flag(caplog):
    from fastseq.serving.model import ServedModel

    mixing = over_rows()
    with caplog.at_level(logging.WARNING, logger="fastseq.serve"):
        served = ServedModel("mix", fastseq.ONNXSequential(mixing))
    assert served.batcher is None
    line = caplog.records[-1].getMessage()
    assert "\n" not in line and "node 'over_rows' (Softmax)" in line and "--row-independent" in line, line


# --- the parity check ------------------------------------------------------------------------------------
def test_verify_reports_each_output_and_names_the_first_stage_that_parts():
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    pipe = fastseq.Pipeline(
        {"a": scale_model(2.0, shape=("N", 4)), "b": scale_model(3.0, shape=("N", 4))}, edges=["a.y -> b.x"], opset=18
    )
    parity = pipe.verify(x, rtol=0, atol=0)
    assert parity.ok and [d.name for d in parity.outputs] == ["y"] and parity.outputs[0].max_abs == 0
    # The stage as given differs from what was composed (as a conversion gone wrong would):
    # the outputs part, and the first stage whose values differ inside the graph is named.
    pipe._given[0] = scale_model(2.5, shape=("N", 4)).SerializeToString()
    parity = pipe.verify(x)
    assert not parity and parity.first_stage == "a", str(parity)
    assert parity.outputs[0].max_abs == pytest.approx(3 * 0.5 * 1.0, rel=1e-6)  # 3 * (2.5 - 2) * x, x up to 1
    assert "parts from its stages at stage 'a'" in str(parity)
    with pytest.raises(fastseq.InputError, match="rtol must be a number >= 0"):
        pipe.verify(x, rtol=-1)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=240
    )


def test_the_command_line_verifies_and_converts_opsets(tmp_path):
    onnx.save(scale_model(2.0, shape=("N", 4), opset=13), tmp_path / "old.onnx")
    onnx.save(scale_model(3.0, shape=("N", 4), opset=17, inp="y", out="z"), tmp_path / "new.onnx")
    np.save(tmp_path / "x.npy", np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    mixed = _cli("run", "old.onnx", "new.onnx", "--input", "x.npy", cwd=tmp_path)
    assert mixed.returncode != 0 and "--opset highest" in mixed.stderr and "auto_ir" not in mixed.stderr, mixed.stderr
    done = _cli("run", "old.onnx", "new.onnx", "--input", "x.npy", "--opset", "highest", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ok = _cli("verify", "old.onnx", "new.onnx", "--input", "x.npy", "--opset", "highest", cwd=tmp_path)
    assert ok.returncode == 0 and "z " in ok.stdout and " yes" in ok.stdout, ok.stdout + ok.stderr
    light = _cli("run", str(LIGHT / "light_squeezenet.onnx"), "--dynamic-batch", "--input", "img.npy", cwd=tmp_path)
    assert "img.npy: no such file" in light.stderr  # the flag is taken; the input is checked next
