"""ONNX Runtime is an extra (``cpu`` or ``gpu``), so that pip never puts onnxruntime beside
onnxruntime-gpu: without it, composing and exporting work and running says what to install.
Each check runs in a fresh process in which ``import onnxruntime`` fails."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import onnx

from conftest import scale_model

REPO = Path(__file__).resolve().parents[1]
NO_ORT = "import sys; sys.modules['onnxruntime'] = None  # as if it were not installed\n"


def without_runtime(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_ORT + code], capture_output=True, text=True, timeout=120)


def test_composing_and_exporting_need_no_runtime(tmp_path):
    for k in (2, 3):
        onnx.save(scale_model(float(k)), str(tmp_path / f"m{k}.onnx"))
    r = without_runtime(f"""
import fastseq
fastseq.compose_to_file([{str(tmp_path / 'm2.onnx')!r}, {str(tmp_path / 'm3.onnx')!r}], {str(tmp_path / 'a.onnx')!r})
from fastseq.cli import main
assert main(["merge", {str(tmp_path / 'm2.onnx')!r}, {str(tmp_path / 'm3.onnx')!r}, "-o", {str(tmp_path / 'b.onnx')!r}]) == 0
assert 'onnxruntime' not in sys.modules or sys.modules['onnxruntime'] is None
""")
    assert r.returncode == 0, r.stderr
    assert onnx.load(str(tmp_path / "a.onnx")).graph.node
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_running_says_which_extra_to_install(tmp_path):
    onnx.save(scale_model(2.0), str(tmp_path / "m.onnx"))
    r = without_runtime(f"""
import fastseq
try:
    fastseq.ONNXSequential({str(tmp_path / 'm.onnx')!r})
except ModuleNotFoundError as e:
    assert e.name == "onnxruntime"
    print(e)
""")
    assert r.returncode == 0, r.stderr
    assert "pip install 'fastseq[cpu]'" in r.stdout and "'fastseq[gpu]'" in r.stdout
    r = without_runtime(f"from fastseq.cli import main; sys.exit(main(['run', {str(tmp_path / 'm.onnx')!r}]))")
    assert r.returncode == 1
    assert "fastseq: error: running a pipeline needs ONNX Runtime" in r.stderr and "Traceback" not in r.stderr


def test_the_extras_never_put_both_runtimes_in_one_environment():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    def runtimes(reqs):
        return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in reqs} & {"onnxruntime", "onnxruntime-gpu"}
    assert not runtimes(project["dependencies"])
    extras = project["optional-dependencies"]
    assert runtimes(extras["cpu"]) == {"onnxruntime"} and runtimes(extras["gpu"]) == {"onnxruntime-gpu"}
    assert all(not runtimes(reqs) for name, reqs in extras.items() if name not in ("cpu", "gpu"))
