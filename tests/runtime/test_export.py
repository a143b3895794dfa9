"""The one writer: every path that writes a model file (the core's export, ``onnx.save``'s
keywords with a text format, the optimised export, quantize, ``fastseq merge --optimize``)
commits through the core: the user's files beside the target are never overwritten or
removed, a folder or a read-only target is an ExportError naming the path, and neither
writers racing each other nor writers killed midway leave a file that the next write keeps.
Real files, real subprocesses, real ONNX Runtime sessions."""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import fastseq
from conftest import TESTS, tmpfs

X = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
USER = b"the user's own file"


def matmul_model(scale: float) -> onnx.ModelProto:
    """y = relu(x @ W): 16 KB of weights (external at onnx.save's threshold; quantizable)."""
    w = (np.random.default_rng(1).standard_normal((64, 64)) * scale).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 64])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


FORMATS = {"textproto": "textproto", "json_external": "json"}


def write(kind: str, scale: float, target: Path) -> None:
    """One write of ``kind`` to ``target`` (also run in subprocesses, see LOOP)."""
    if kind == "merge_optimize":
        from fastseq import cli

        source = target.parent.parent / "src" / f"s{scale:g}.onnx"
        said = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(said):
            code = cli.main(["merge", str(source), "-o", str(target), "--optimize"])
        if code != 0:
            raise fastseq.ExportError(said.getvalue().strip().removeprefix("fastseq: error: "))
        return
    pipe = fastseq.ONNXSequential(matmul_model(scale))
    if kind == "external":
        pipe.export(target, external_data=True)
    elif kind == "location":
        pipe.export(target, save_as_external_data=True, location=f"{target.name}.data")
    elif kind == "per_tensor":
        pipe.export(target, save_as_external_data=True, all_tensors_to_one_file=False)
    elif kind == "textproto":
        pipe.export(target, format="textproto")
    elif kind == "json_external":
        pipe.export(target, format="json", save_as_external_data=True)
    elif kind == "optimized":
        pipe.export(target, optimized=True)
    elif kind == "quantize":
        pipe.quantize(target, preprocess=False)
    else:
        raise ValueError(kind)


KINDS = ["external", "location", "per_tensor", "textproto", "json_external", "optimized", "quantize", "merge_optimize"]


def load(kind: str, target: Path, external_data: bool = True) -> onnx.ModelProto:
    return onnx.load(str(target), format=FORMATS.get(kind), load_external_data=external_data)


def outputs(kind: str, target: Path) -> np.ndarray:
    """What ONNX Runtime computes with the written model (text formats through onnx)."""
    if kind in FORMATS:
        session = ort.InferenceSession(load(kind, target).SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


def expected(kind: str, scale: float, folder: Path) -> np.ndarray:
    """The reference: the float pipeline, or ONNX Runtime's own quantizer on the same model."""
    if kind != "quantize":
        return fastseq.ONNXSequential(matmul_model(scale))(X)[0]
    from onnxruntime.quantization import quantize_dynamic

    folder.mkdir(exist_ok=True)
    onnx.save(matmul_model(scale), folder / "f.onnx")
    quantize_dynamic(str(folder / "f.onnx"), str(folder / "q.onnx"))
    return ort.InferenceSession(str(folder / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def referenced(model: onnx.ModelProto) -> set[str]:
    """The external-data locations of every tensor of the model, subgraphs and attributes too."""
    found: set[str] = set()

    def tensor(t: onnx.TensorProto) -> None:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in t.external_data if e.key == "location")

    def graph(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            tensor(t)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("t"):
                    tensor(a.t)
                for t in a.tensors:
                    tensor(t)
                if a.HasField("g"):
                    graph(a.g)
                for sub in a.graphs:
                    graph(sub)

    graph(model.graph)
    return found


def folder_holds_the_model_its_data_and(folder: Path, kind: str, target: Path, extra: set[str]) -> set[str]:
    """Asserts the folder holds the model, exactly the data files it references, and `extra`."""
    data = referenced(load(kind, target, external_data=False)) if target.exists() else set()
    assert {p.name for p in folder.iterdir()} == {target.name, *data, *extra}
    return data


@pytest.fixture
def out(tmp_path):
    """The folder written into, with the user's files a careless writer would clobber, and
    the sources that `fastseq merge` reads."""
    folder = tmp_path / "out"
    folder.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    for scale in (1.0, 2.0, 3.0):
        onnx.save(matmul_model(scale), src / f"s{scale:g}.onnx")
    return folder


def users_files(folder: Path, name: str) -> dict[str, bytes]:
    """A user's data file of the target's plain name, and one named as onnx.save names one
    tensor's file: neither may be touched."""
    files = {f"{name}.data": USER, "w": USER}
    for f, data in files.items():
        (folder / f).write_bytes(data)
    return files


# --- the user's files beside the target ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_writer_leaves_the_users_data_file_untouched(kind, out, tmp_path):
    target = out / "m.onnx" if kind != "textproto" else out / "m.txtpb"
    if kind == "json_external":
        target = out / "m.json"
    mine = users_files(out, target.name)
    inodes = {f: (out / f).stat().st_ino for f in mine}
    for scale in (1.0, 2.0):  # the second write replaces the first
        write(kind, scale, target)
        assert {f: (out / f).read_bytes() for f in mine} == mine
        assert {f: (out / f).stat().st_ino for f in mine} == inodes
        data = folder_holds_the_model_its_data_and(out, kind, target, set(mine))
        assert not data & set(mine)
        np.testing.assert_allclose(outputs(kind, target), expected(kind, scale, tmp_path / "ref"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_as_target_is_an_export_error_and_leaves_nothing(kind, out):
    target = out / "m.onnx"
    target.mkdir()
    (target / "inside").write_bytes(USER)
    mine = users_files(out, target.name)
    with pytest.raises(fastseq.ExportError, match=re.escape(f"cannot write {target}: it is a directory")):
        write(kind, 1.0, target)
    assert sorted(p.name for p in out.iterdir()) == sorted(["m.onnx", *mine])
    assert [p.name for p in target.iterdir()] == ["inside"]


@contextmanager
def read_only_folder(tmp_path: Path, files: dict[str, bytes]):
    """A real tmpfs holding `files`, remounted read-only (root cannot write there either)."""
    with tmpfs(tmp_path / "ro", "4m") as mount:
        for f, data in files.items():
            (mount / f).write_bytes(data)
        r = subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.decode().strip()}")
        yield mount


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_only_folder_is_an_export_error_naming_the_target(kind, out, tmp_path):
    with read_only_folder(tmp_path, {"m.onnx": b"old model", "m.onnx.data": USER}) as ro:
        target = ro / "m.onnx"
        with pytest.raises(
            fastseq.ExportError, match=re.escape(f"cannot write {target}: ") + ".*Read-only file system"
        ):
            write(kind, 1.0, target)
        assert {p.name: p.read_bytes() for p in ro.iterdir()} == {"m.onnx": b"old model", "m.onnx.data": USER}


def test_merge_optimize_errors_are_one_line_naming_the_target(out, tmp_path):
    target = out / "m.onnx"
    target.mkdir()
    source = tmp_path / "src" / "s1.onnx"
    r = subprocess.run(
        [sys.executable, "-m", "fastseq", "merge", str(source), "-o", str(target), "--optimize"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and r.stderr.strip() == f"fastseq: error: cannot write {target}: it is a directory"
    assert [p.name for p in out.iterdir()] == ["m.onnx"]


# --- data files' names (plain when free or the writer's own) ----------------------------------------


def test_data_files_get_the_plain_name_when_it_is_free_and_keep_it(tmp_path):
    pipe = fastseq.ONNXSequential(matmul_model(1.0))
    target = tmp_path / "e2.onnx"
    for _ in range(3):
        pipe.export(target, external_data=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["e2.onnx", "e2.onnx.data"]
        assert referenced(onnx.load(str(target), load_external_data=False)) == {"e2.onnx.data"}
    # An inline export removes the data file the writer made.
    pipe.export(target, external_data=False)
    assert [p.name for p in tmp_path.iterdir()] == ["e2.onnx"]


def test_a_users_file_of_the_plain_name_gets_a_token_name_beside_it(tmp_path):
    pipe = fastseq.ONNXSequential(matmul_model(1.0))
    target = tmp_path / "e2.onnx"
    (tmp_path / "e2.onnx.data").write_bytes(USER)
    seen = set()
    for _ in range(3):
        pipe.export(target, external_data=True)
        (data,) = folder_holds_the_model_its_data_and(tmp_path, "external", target, {"e2.onnx.data"})
        assert data.startswith("e2.onnx.fastseq-") and data.endswith(".data") and data not in seen
        seen.add(data)
    assert (tmp_path / "e2.onnx.data").read_bytes() == USER


def test_a_data_file_the_user_renamed_rewrote_or_copied_is_theirs(tmp_path):
    pipe = fastseq.ONNXSequential(matmul_model(1.0))
    target = tmp_path / "m.onnx"
    pipe.export(target, external_data=True)
    os.rename(tmp_path / "m.onnx.data", tmp_path / "backup.data")  # renamed: no longer ours
    pipe.export(target, external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.data", "m.onnx", "m.onnx.data"]
    with open(tmp_path / "m.onnx.data", "ab") as f:  # rewritten in place: the user's now
        f.write(b"!")
    edited = (tmp_path / "m.onnx.data").read_bytes()
    pipe.export(target, external_data=True)
    (data,) = folder_holds_the_model_its_data_and(tmp_path, "external", target, {"backup.data", "m.onnx.data"})
    assert data.startswith("m.onnx.fastseq-") and (tmp_path / "m.onnx.data").read_bytes() == edited
    # A copy of a pair, extended attributes and times included, is the user's in its new place.
    other = tmp_path / "other"
    other.mkdir()
    pipe.export(tmp_path / "fresh.onnx", external_data=True)
    for f in ("fresh.onnx", "fresh.onnx.data"):
        shutil.copy2(tmp_path / f, other / f)
    pipe.export(other / "fresh.onnx", external_data=True)
    (data,) = folder_holds_the_model_its_data_and(other, "external", other / "fresh.onnx", {"fresh.onnx.data"})
    assert data.startswith("fresh.onnx.fastseq-")
    np.testing.assert_allclose(outputs("external", other / "fresh.onnx"), pipe(X)[0], rtol=1e-6)


def test_a_location_with_a_folder_and_an_onnx_save_output_keep_their_names(tmp_path):
    pipe = fastseq.ONNXSequential(matmul_model(1.0))
    target = tmp_path / "m.onnx"
    for _ in range(2):
        pipe.export(target, save_as_external_data=True, location="weights/w.bin")
        assert referenced(onnx.load(str(target), load_external_data=False)) == {"weights/w.bin"}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "weights"]
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["w.bin"]
        np.testing.assert_allclose(outputs("external", target), pipe(X)[0], rtol=1e-6)


def test_optimized_exports_keep_their_weights_in_a_data_file(out):
    write("optimized", 1.0, out / "m.onnx")
    model = onnx.load(str(out / "m.onnx"), load_external_data=False)
    assert referenced(model) == {"m.onnx.data"}
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert "fastseq.optimized_for" in {p.key for p in model.metadata_props}


# --- writers racing each other, writers killed -----------------------------------------------------

LOOP = """
import sys
from pathlib import Path
from runtime.test_export import write
kind, scale, target, count = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
print("ready", flush=True)
for _ in range(count):
    write(kind, scale, target)
    print("saved", flush=True)
"""


def loop(kind: str, scale: float, target: Path, count: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-c", LOOP, kind, str(scale), str(target), str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def target_for(kind: str, out: Path) -> Path:
    return out / {"textproto": "m.txtpb", "json_external": "m.json"}.get(kind, "m.onnx")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_writing_one_target_leave_one_whole_model(kind, out, tmp_path):
    target = target_for(kind, out)
    mine = users_files(out, target.name)
    procs = [loop(kind, scale, target, 4) for scale in (1.0, 2.0)]
    for p in procs:
        stdout, stderr = p.communicate(timeout=500)
        assert p.returncode == 0 and stdout.count("saved") == 4, stderr
    folder_holds_the_model_its_data_and(out, kind, target, set(mine))
    assert {f: (out / f).read_bytes() for f in mine} == mine
    got = outputs(kind, target)
    assert any(np.allclose(got, expected(kind, s, tmp_path / f"ref{s:g}"), rtol=1e-5, atol=1e-5) for s in (1.0, 2.0))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_writers_killed_midway_leave_nothing_the_next_write_keeps(kind, out, tmp_path):
    """SIGKILL at random points of two writers racing; whatever is left, the model in place
    (if any) is whole and its data is there, the user's files are untouched, and the next
    write leaves the model, its data and the user's files only."""
    target = target_for(kind, out)
    mine = users_files(out, target.name)
    refs = {s: expected(kind, s, tmp_path / f"ref{s:g}") for s in (1.0, 2.0, 3.0)}
    rng = random.Random(0)
    for _ in range(3):
        procs = [loop(kind, scale, target, 1000) for scale in (1.0, 2.0)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        assert procs[0].stdout.readline().strip() == "saved"  # one write surely finished
        time.sleep(rng.uniform(0.0, 0.5))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
        got = outputs(kind, target)
        assert any(np.allclose(got, refs[s], rtol=1e-5, atol=1e-5) for s in (1.0, 2.0))
        assert {f: (out / f).read_bytes() for f in mine} == mine
    write(kind, 3.0, target)
    folder_holds_the_model_its_data_and(out, kind, target, set(mine))
    np.testing.assert_allclose(outputs(kind, target), refs[3.0], rtol=1e-5, atol=1e-5)


def test_a_killed_writers_staging_folder_goes_with_the_next_write(out):
    """A staging folder is held while its writer lives: another write into the folder leaves
    a live one alone and removes a dead one."""
    from fastseq import _core

    live = _core.stage(str(out / "a.onnx"))
    dead = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys\nfrom fastseq import _core\ns = _core.stage(sys.argv[1])\n"
            "print(s.folder(), flush=True)\nos._exit(0)",
            str(out / "b.onnx"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(dead).is_dir()
    write("external", 1.0, out / "c.onnx")
    assert live.folder().is_dir() and not Path(dead).exists()
    live.close()
    assert sorted(p.name for p in out.iterdir()) == ["c.onnx", "c.onnx.data"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_only_target_is_an_export_error_for_an_ordinary_user(kind):
    """As onnx.save fails on it (EACCES), on every writer path: run as nobody in a folder
    anyone may write in, where a rename over the file would go through."""
    import unprivileged

    shared = unprivileged.shared_folder()
    try:
        for sub in ("out", "src", "warm"):
            unprivileged.writable_folder(shared / sub)
        for scale in (1.0, 2.0):
            onnx.save(matmul_model(scale), shared / "src" / f"s{scale:g}.onnx")
        target = target_for(kind, shared / "out")
        target.write_bytes(b"old model")
        target.chmod(0o444)
        warm = (
            f"from pathlib import Path\nfrom runtime.test_export import write\nwrite({kind!r}, 1.0, "
            f"Path({str(target_for(kind, shared / 'warm'))!r}))\nimport fastseq\n"
        )
        code = unprivileged.printing_export_error(f"write({kind!r}, 2.0, Path({str(target)!r}))")
        r = unprivileged.run(code, warm)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().startswith(f"cannot write {target}: it is read-only (Permission denied"), r.stdout
        assert [p.name for p in (shared / "out").iterdir()] == [target.name] and target.read_bytes() == b"old model"
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)
