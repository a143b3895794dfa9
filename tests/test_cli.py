"""The fastseq command, run as a real subprocess: outputs, files and exit codes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

from conftest import scale_model


def fastseq(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_demo_classifies_the_bundled_digits_without_network(tmp_path):
    r = fastseq("demo", "-o", str(tmp_path / "demo.onnx"))
    assert r.returncode == 0, r.stderr
    assert "prediction: 3 0 7 4 (4 of 4 right)" in r.stdout
    assert "builtin:resize?size=8,8&mode=linear -> builtin:normalize?mean=0.5&std=0.5 -> builtin:flatten -> builtin:digits" in r.stdout
    onnx.checker.check_model(str(tmp_path / "demo.onnx"))


def test_merge_inspect_and_run(tmp_path):
    onnx.save(scale_model(2.0, out="h"), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0, inp="in"), tmp_path / "b.onnx")
    r = fastseq("merge", "a.onnx", "b.onnx", "--io-map", "h:in", "-o", "m.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote m.onnx" in r.stdout and "merging 2 models: done" in r.stderr
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    got = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, np.maximum(np.maximum(2 * x, 0) * 3, 0))

    r = fastseq("inspect", "m.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "  x: float32[2, 4]" in r.stdout and "  y: float32[2, 4]" in r.stdout
    assert "opsets: ai.onnx 17" in r.stdout and "nodes: 4; initializers: 2 (32 B)" in r.stdout

    np.save(tmp_path / "x.npy", x)
    r = fastseq("run", "m.onnx", "--input", "x=x.npy", "-o", "out.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "y: float32[2, 4]" in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], got)


def test_merge_with_external_data(tmp_path):
    onnx.save(scale_model(2.0, shape=(2, 512)), tmp_path / "a.onnx")
    r = fastseq("merge", "a.onnx", "a.onnx", "-o", "m.onnx", "--external-data", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ".data" in r.stdout
    s = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"x": np.ones((2, 512), np.float32)})[0], 4.0)


def test_errors_have_exit_codes_and_one_line_messages(tmp_path):
    onnx.save(scale_model(2.0, out="logits"), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0), tmp_path / "b.onnx")
    r = fastseq("merge", "a.onnx", "b.onnx", "--io-map", "logit:x", "-o", "m.onnx", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("fastseq: error: joint 0 (a.onnx -> b.onnx): 'logit'")
    assert "did you mean 'logits'?" in r.stderr
    assert not (tmp_path / "m.onnx").exists()
    r = fastseq("inspect", "missing.onnx", cwd=tmp_path)
    assert r.returncode == 1 and "no such file" in r.stderr
    r = fastseq("merge", "a.onnx", "b.onnx", "--io-map", "nocolon", "-o", "m.onnx", cwd=tmp_path)
    assert r.returncode == 2 and "expected OUTPUT:INPUT" in r.stderr
    r = fastseq("run", "a.onnx", "--input", "x=nope.npy", cwd=tmp_path)
    assert r.returncode == 1 and "nope.npy" in r.stderr
    r = fastseq("bogus")
    assert r.returncode == 2


# --- habits: one spelling of --providers, summaries, one-input files, exact conversions ----


def int64_model(path) -> None:
    """ids int64 [N, 3] -> doubled int64 [N, 3], and as float32."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "ids"], ["twice"]), helper.make_node("Cast", ["twice"], ["f"], to=1)],
        "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 3])],
        [helper.make_tensor_value_info("twice", TensorProto.INT64, ["N", 3]),
         helper.make_tensor_value_info("f", TensorProto.FLOAT, ["N", 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_providers_is_one_spelling_and_provider_is_still_taken(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    for flags in (["--providers", "CPUExecutionProvider"], ["--provider", "CPUExecutionProvider"]):
        r = fastseq("run", "a.onnx", *flags, "--input", "x=x.npy", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = fastseq("merge", "a.onnx", "--optimize", *flags, "-o", "opt.onnx", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    for command in ("run", "merge"):
        assert "--providers PROVIDER" in fastseq(command, "--help").stdout
    r = fastseq("run", "a.onnx", "--providers", "CPUExecutionProviderr", "--input", "x=x.npy", cwd=tmp_path)
    assert r.returncode == 1 and "did you mean 'CPUExecutionProvider'" in r.stderr


def test_run_without_output_file_summarises_each_output(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    r = fastseq("run", "a.onnx", "--input", "x.npy", cwd=tmp_path)  # one input: the file alone
    assert r.returncode == 0, r.stderr
    y = np.maximum(2 * x, 0)
    assert f"y: float32[2, 4]  min 0 max 2 mean {y.mean():.6g}, first [0, 0, 0, 0, 0.2857, ...]\n" in r.stdout
    int64_model(tmp_path / "ids.onnx")
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3]], np.int64))
    r = fastseq("run", "ids.onnx", "--input", "ids=ids.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "twice: int64[1, 3]  min 2 max 6 mean 4, first [2, 4, 6]" in r.stdout
    assert "f: float32[1, 3]  min 2 max 6 mean 4, first [2, 4, 6]" in r.stdout
    r = fastseq("run", "ids.onnx", "--input", "ids=ids.npy", "-o", "o.npz", cwd=tmp_path)  # a file: no summary
    assert "twice: int64[1, 3]\n" in r.stdout and "mean" not in r.stdout


def test_run_converts_inputs_exactly_and_refuses_lossy_ones_without_cast(tmp_path):
    int64_model(tmp_path / "ids.onnx")
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    for dtype in (np.int64, np.int32, np.uint8, np.bool_):
        np.save(tmp_path / "ids.npy", ids.astype(dtype))
        r = fastseq("run", "ids.onnx", "--input", "ids.npy", "-o", "o.npz", cwd=tmp_path)
        assert r.returncode == 0, (dtype, r.stderr)
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["twice"], 2 * ids.astype(dtype).astype(np.int64))
    x = np.linspace(-1, 1, 8).reshape(2, 4) / 3
    np.save(tmp_path / "half.npy", x.astype(np.float16))
    r = fastseq("run", "a.onnx", "--input", "x=half.npy", "-o", "o.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(2 * x.astype(np.float16), 0))
    np.save(tmp_path / "x64.npy", x)
    r = fastseq("run", "a.onnx", "--input", "x=x64.npy", cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.strip() == (
        "fastseq run: error: --input x=x64.npy holds float64, input 'x' expects float32, and converting loses "
        "values; pass --cast to convert it anyway (as array.astype(numpy.float32) does)"
    )
    r = fastseq("run", "a.onnx", "--input", "x=x64.npy", "--cast", "-o", "o.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(2 * x.astype(np.float32), 0))
    np.save(tmp_path / "floats.npy", ids.astype(np.float32))  # float ids: refused, even if whole
    r = fastseq("run", "ids.onnx", "--input", "floats.npy", cwd=tmp_path)
    assert r.returncode != 0 and "holds float32, input 'ids' expects int64" in r.stderr


def test_run_input_names_are_checked(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    r = fastseq("run", "a.onnx", "--input", "xx=x.npy", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == "fastseq: error: 'xx' is not an input (did you mean 'x'?); inputs: x"
    onnx.save(scale_model(3.0, inp="in"), tmp_path / "b.onnx")
    two = ["a.onnx", "b.onnx", "--io-map", ""]  # a joint without connections: two graph inputs
    r = fastseq("run", *two, "--input", "x.npy", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == (
        "fastseq run: error: --input 'x.npy': expected NAME=FILE.npy; the inputs are x: float32[2, 4], "
        "in: float32[2, 4]"
    )
