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
