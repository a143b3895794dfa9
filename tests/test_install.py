"""ONNX Runtime is an extra (``cpu`` or ``gpu``), so that pip never puts onnxruntime beside
onnxruntime-gpu: without it, composing and exporting work and running says what to install.
Each check runs in a fresh process in which ``import onnxruntime`` fails."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import onnx
import pytest

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
    assert "pip install 'fastseq-onnx[cpu]'" in r.stdout and "'fastseq-onnx[gpu]'" in r.stdout
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


# --- the name to install: pyproject.toml's, never the import name --------------------------------
#: where install hints are written: the package's messages and docstrings, the docs, the
#: scripts, the workflows and the tests' skip reasons
HINTED = ["python/**/*.py", "docs/**/*.md", "README.md", "CHANGELOG.md", "SECURITY.md", "tools/*", "benches/*.py",
          ".github/**/*.yml", ".ci/run", "tests/**/*.py"]
#: ``NAME[EXTRAS]`` as a hint writes it: quoted, in backticks, or right after ``pip install``
HINT = re.compile(r"""(?:['"`]|pip install )([A-Za-z][\w.-]*)\[([\w, -]+)\]""")


def test_every_install_hint_names_the_distribution_that_installs_fastseq():
    """``fastseq`` on PyPI is another project (Microsoft's FastSeq 0.0.3, which has no ``cpu``
    extra): every hint that installs fastseq with an extra names pyproject.toml's
    distribution, in the messages (fastseq.errors.install_command) and in the text."""
    from fastseq import errors

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name, extras = project["name"], set(project["optional-dependencies"])
    assert name == errors.DISTRIBUTION != "fastseq"
    assert errors.install_command("serve") == f"pip install '{name}[serve]'" and f"'{name}[cpu]'" in errors.NO_RUNTIME
    # other packages' extras (ray[serve], uvicorn[standard]) are theirs: pyproject's dependencies
    others = {re.split(r"[\[<>=!~ ;]", r)[0].lower() for reqs in [project["dependencies"],
              *project["optional-dependencies"].values()] for r in reqs}
    found, wrong = 0, []
    for pattern in HINTED:
        for path in sorted(REPO.glob(pattern)):
            if not path.is_file() or path == Path(__file__).resolve():
                continue
            for k, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                where = f"{path.relative_to(REPO)}:{k}"
                if re.search(r"pip install\s+['\"]?fastseq(?![-\w])", line):
                    wrong.append(f"{where}: {line.strip()}")  # the import name, which installs another project
                for m in HINT.finditer(line):
                    hinted, wanted = m.group(1), {e.strip() for e in m.group(2).split(",")}
                    if hinted.lower() in others or not wanted <= extras:
                        continue
                    found += 1
                    if hinted != name:
                        wrong.append(f"{where}: {m.group(0)}")
    assert not wrong, wrong
    assert found >= 10  # the README's, the docs', the messages' (the reader sees them)


def test_a_missing_extra_is_a_typed_error_naming_it_and_the_command():
    from fastseq.errors import MissingExtraError, require_extra

    with pytest.raises(MissingExtraError) as info:
        require_extra("fastseq.serve", "serve", ("uvicorn", "fastseq_no_such_module"))
    assert isinstance(info.value, ModuleNotFoundError) and info.value.extra == "serve"
    assert info.value.name == "fastseq_no_such_module"
    assert str(info.value) == ("fastseq.serve needs the serve extra, which is not installed (fastseq_no_such_module "
                               "missing): pip install 'fastseq-onnx[serve]'")
    require_extra("fastseq.serve", "serve", ("json",))  # all there: nothing raised


def without(modules: list[str], code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh process in which importing ``modules`` fails, as without their extra."""
    hide = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run([sys.executable, "-c", hide + code], capture_output=True, text=True, timeout=120)


def test_the_asgi_app_without_its_extra_names_the_extra(tmp_path):
    onnx.save(scale_model(2.0), str(tmp_path / "m.onnx"))
    r = without(["prometheus_client"], f"""
import fastseq
pipe = fastseq.ONNXSequential({str(tmp_path / 'm.onnx')!r})
try:
    fastseq.serving.app(pipe)
except fastseq.MissingExtraError as e:
    assert isinstance(e, ModuleNotFoundError) and e.extra == "serve" and e.name == "prometheus_client"
    print(e)
""")
    assert r.returncode == 0, r.stderr
    assert ("needs the serve extra, which is not installed (prometheus_client missing): "
            "pip install 'fastseq-onnx[serve]'") in r.stdout, r.stdout


def test_fastseq_serve_needs_no_extra(tmp_path):
    """The request path is the core's: without uvicorn, prometheus_client and grpcio, ``fastseq
    serve`` serves HTTP and gRPC, answers an infer request and drains on SIGTERM."""
    import json
    import signal
    import urllib.request

    onnx.save(scale_model(2.0, shape=("N", 2)), str(tmp_path / "m.onnx"))
    hide = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in ("uvicorn", "prometheus_client", "grpc"))
    code = hide + f"from fastseq.cli import main\nsys.exit(main(['serve', {str(tmp_path / 'm.onnx')!r}, '--port', '0', " \
                  "'--grpc-port', '0']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "ready:" in line or len(lines) > 20:
                break
        listening = next(line for line in lines if "listening on http://127.0.0.1:" in line)
        port = int(listening.split("127.0.0.1:")[1].split()[0])
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/m/infer", body.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
        assert answer["outputs"][0]["data"] == [2.0, 4.0], answer
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines) + proc.stderr.read()


def test_ray_without_its_extra_names_the_extra_in_python_and_on_the_command_line(tmp_path):
    onnx.save(scale_model(2.0), str(tmp_path / "m.onnx"))
    (tmp_path / "rows").mkdir()
    r = without(["ray"], "import fastseq.ray")
    assert r.returncode == 1 and "fastseq.MissingExtraError: fastseq.ray needs the ray extra" in r.stderr
    assert "pip install 'fastseq-onnx[ray]'" in r.stderr
    r = without(["ray"], f"""from fastseq.cli import main
sys.exit(main(["run", {str(tmp_path / 'm.onnx')!r}, "--input", {str(tmp_path / 'rows')!r},
               "--output", {str(tmp_path / 'out')!r}, "--ray"]))""")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("fastseq: error: fastseq run --ray needs the ray extra, which is not installed "
                                "(ray missing): pip install 'fastseq-onnx[ray]'")
