"""A smoke test of an installed fastseq: the main job end to end, from the package alone.

    python tools/smoke_installed.py [--allow-source-tree]

Run it with the Python of an environment where fastseq was installed from a wheel or an
sdist (with the ``cpu`` extra), from any folder: it needs no source tree, only fastseq, its
dependencies and ONNX Runtime (it works in a temporary folder of its own). It checks:

- fastseq is imported from that environment's site-packages, not from a checkout (unless
  ``--allow-source-tree``, for the test suite's own run of this script);
- what the package must carry: the ``_core`` extension and its stub ``_core.pyi``,
  ``py.typed``, the shipped models and samples, and every public module importing;
- one version everywhere: ``fastseq.__version__``, the core's, the installed metadata and
  ``fastseq --version``;
- the main job: operators and models composed (``ONNXSequential``, ``compose_to_file``,
  ``fastseq.onnx_compose``) and called, compared with plain ONNX Runtime on the same models
  and with numpy, exported and run again from the file;
- the command: ``fastseq demo``, ``merge``, ``inspect``, ``run`` and a bad argument's one-line
  error, through the ``fastseq`` script the install put beside this Python.

Prints one line per check; exits 1 at the first failure (with the reason).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

#: the public modules (README and docs name them); each must import on its own
PUBLIC_MODULES = [
    "fastseq",
    "fastseq.ops",
    "fastseq.ops.shipped",
    "fastseq.onnx_compose",
    "fastseq.quantize",
    "fastseq.ray",
    "fastseq.cli",
    "fastseq.errors",
]
#: public modules that need an extra: without it, importing them names the extra to install
NEEDS_EXTRA = {"fastseq.ray": "ray"}
#: files the wheel must install beside the modules
PACKAGE_DATA = [
    "_core.pyi",
    "py.typed",
    "ops/shipped/digits.onnx",
    "ops/shipped/digits.npz",
    "ops/shipped/sample.npy",
    "ops/shipped/to_float.onnx",
    "ops/shipped/resize.onnx",
    "ops/shipped/normalize.onnx",
    "ops/shipped/color_head.onnx",
]


def check(what: str, ok: bool, detail: object = "", shown: str = "") -> None:
    """One line: ``ok`` (with ``shown``), or ``FAIL`` with ``detail`` and exit 1."""
    if not ok:
        print(f"FAIL {what}: {detail}", file=sys.stderr)
        sys.exit(1)
    print(f"ok   {what}" + (f": {shown}" if shown else ""))


def fastseq_command() -> list[str]:
    """The ``fastseq`` script that pip put beside this interpreter (not one on PATH)."""
    folder = Path(sysconfig.get_path("scripts"))
    for name in ("fastseq", "fastseq.exe"):
        if (folder / name).exists():
            return [str(folder / name)]
    check("the fastseq command is installed", False, f"no fastseq script in {folder}")
    return []


def run_cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(fastseq_command() + list(args), capture_output=True, text=True, timeout=300)
    check(
        f"fastseq {' '.join(args)} exits {expect}", r.returncode == expect, f"exit {r.returncode}: {r.stderr[-2000:]}"
    )
    return r


def installed(allow_source_tree: bool) -> Path:
    import fastseq

    here = Path(fastseq.__file__).resolve().parent
    site = {Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    inside = any(s in here.parents for s in site)
    check(
        "fastseq is the installed package" + ("" if inside else " (or a source tree, as allowed)"),
        inside or allow_source_tree,
        f"imported from {here}, not {sorted(map(str, site))}",
        shown=str(here),
    )
    return here


def carried(here: Path) -> None:
    from fastseq import _core
    from fastseq.errors import install_command

    check("the _core extension is the installed one", Path(_core.__file__).resolve().parent == here, _core.__file__)
    missing = [f for f in PACKAGE_DATA if not (here / f).is_file()]
    check("the package carries its stub, py.typed and shipped models", not missing, f"missing {missing}")
    for name in PUBLIC_MODULES:
        # a fresh process each, so that no module's import rides on another's
        r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
        last = (r.stderr.strip().splitlines() or [""])[-1]
        extra = NEEDS_EXTRA.get(name)
        if r.returncode and extra and "MissingExtraError" in last and install_command(extra) in last:
            check(f"import {name} without its extra names it", True, shown=last)
            continue
        check(f"import {name}", r.returncode == 0, last)
    import fastseq

    unresolved = [n for n in fastseq.__all__ if getattr(fastseq, n, None) is None]
    check("every name in fastseq.__all__ resolves", not unresolved, unresolved)
    check("fastseq.ops.shipped lists the shipped models", {"digits", "resize"} <= set(fastseq.ops.shipped.names()))


def versions() -> None:
    import fastseq
    from fastseq import _core
    from fastseq.errors import DISTRIBUTION

    meta = importlib.metadata.version(DISTRIBUTION)  # the distribution's name, not the import's
    check(
        "one version: fastseq.__version__, the core's and the metadata's",
        fastseq.__version__ == _core.__version__ and meta == pep440(fastseq.__version__),
        f"{fastseq.__version__}, core {_core.__version__}, metadata {meta}",
        shown=meta,
    )
    out = run_cli("--version").stdout
    check(
        "fastseq --version names it and the core's build",
        out.splitlines()[0] == f"fastseq {fastseq.__version__}" and _core.__build__ in out,
        out,
        shown=" | ".join(out.strip().splitlines()),
    )
    check("the installed core is a release build", _core.__build__.endswith(" release"), _core.__build__)


def pep440(version: str) -> str:
    """Cargo's ``0.2.0-rc.1`` is ``0.2.0rc1`` in Python's metadata."""
    for cargo, py in (("-alpha.", "a"), ("-beta.", "b"), ("-rc.", "rc")):
        version = version.replace(cargo, py)
    return version


def models(folder: Path) -> tuple[Path, Path]:
    """Two small models, written as any exporter would: y = x @ W1, then z = relu(y) + 1."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w1 = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    first = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["y"])],
        "first",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w1, "w1")],
    )
    second = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "one"], ["y"])],
        "second",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "one")],
    )
    paths = folder / "first.onnx", folder / "second.onnx"
    for graph, path in zip((first, second), paths):
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return paths


def main_job(folder: Path) -> None:
    import numpy as np
    import onnx
    import onnx.compose
    import onnxruntime as ort

    import fastseq
    from fastseq import ops

    a, b = models(folder)
    x = np.linspace(0, 255, 8, dtype=np.float32).astype(np.uint8).reshape(2, 4)
    plain = (x.astype(np.float32) / 255) @ (np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5)
    expected = np.maximum(plain, 0) + 1

    pipe = fastseq.ONNXSequential(ops.to_float(rank=2), str(a), b)
    (y,) = pipe(x)
    check("ONNXSequential(operator, path, path) computes what numpy does", np.allclose(y, expected, atol=1e-6), y)
    pipe.export(folder / "pipe.onnx")
    (again,) = ort.InferenceSession(str(folder / "pipe.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )
    check("the exported pipeline runs in plain ONNX Runtime alike", np.array_equal(again, y))

    fastseq.compose_to_file([str(a), str(b)], folder / "merged.onnx")
    onnx.checker.check_model(str(folder / "merged.onnx"), full_check=True)
    (merged,) = ort.InferenceSession(str(folder / "merged.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32) / 255}
    )
    check(
        "compose_to_file writes a model onnx.checker accepts, which computes the same",
        np.allclose(merged, expected, atol=1e-6),
    )

    from fastseq import onnx_compose

    m1, m2 = onnx.load(str(a)), onnx.load(str(b))
    ours = onnx_compose.merge_models(m1, m2, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    theirs = onnx.compose.merge_models(m1, m2, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    check(
        "fastseq.onnx_compose.merge_models gives onnx.compose's model",
        [n.op_type for n in ours.graph.node] == [n.op_type for n in theirs.graph.node]
        and [i.name for i in ours.graph.input] == [i.name for i in theirs.graph.input]
        and [o.name for o in ours.graph.output] == [o.name for o in theirs.graph.output],
    )

    try:
        fastseq.ONNXSequential(str(a), str(b), io_maps=[[("why", "x")]])
    except fastseq.CompositionError as e:
        check("a wrong joint is a CompositionError with the near miss", "did you mean 'y'" in str(e), e)
    else:
        check("a wrong joint is refused", False, "no error")


def command(folder: Path) -> None:
    """The CLI, on the files main_job wrote, from the smoke test's folder (the cwd)."""
    import numpy as np

    out = run_cli("demo").stdout
    check("fastseq demo reads its bundled digits", "(4 of 4 right)" in out, out.strip().splitlines()[-1:])
    run_cli("merge", "builtin:to_float?rank=2", "first.onnx", "second.onnx", "-o", "cli.onnx")
    out = run_cli("inspect", "cli.onnx").stdout
    check("fastseq inspect shows the merged model's opset", "ai.onnx 17" in out, out.strip()[:300])
    np.save(folder / "x.npy", np.arange(8, dtype=np.uint8).reshape(2, 4))
    run_cli("run", "cli.onnx", "--input", "x.npy", "-o", "out.npz")
    check("fastseq run writes the outputs", set(np.load(folder / "out.npz").files) == {"y"})
    r = run_cli("merge", "first.onnx", "second.onnx", "--io-map", "why:x", "-o", "bad.onnx", expect=1)
    lines = r.stderr.strip().splitlines()
    check(
        "a bad joint is one `fastseq: error:` line",
        len(lines) == 1 and lines[0].startswith("fastseq: error:"),
        r.stderr,
    )
    check("a failed merge leaves no file", not (folder / "bad.onnx").exists())


def main(argv: list[str]) -> int:
    allow = "--allow-source-tree" in argv
    # ignore_cleanup_errors: Windows cannot remove a file a session still maps
    with tempfile.TemporaryDirectory(prefix="fastseq-smoke-", ignore_cleanup_errors=True) as tmp:
        folder = Path(tmp)
        os.chdir(folder)  # nothing from the caller's folder (a checkout) can be imported
        sys.path[:] = [p for p in sys.path if p != ""]
        here = installed(allow)
        carried(here)
        versions()
        main_job(folder)
        command(folder)
    print(f"smoke test passed: fastseq from {here}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
