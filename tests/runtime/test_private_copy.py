"""The cold path: weights copied once, by the kernel, from the sources into the session's
private data file, and a live pipeline independent of its sources from then on.

Sources rewritten, truncated, replaced and deleted during and after a build; a pipeline
above 2 GB; sources on another file system than the temporary folder (both copy paths);
many pipelines in one process, released when dropped; deduplication of weights still in
their files; what a hostile source says under fastseq's own keys."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import field, tmpfs, varint
from fastseq import _core
from fastseq.runtime import session

DIM = 512  # 1 MiB float32 weights: well above the size left in the file (64 KiB)


def matmul_by(w: np.ndarray, rows: str | int = "N", name: str = "mm") -> onnx.ModelProto:
    """y = x @ w, x [rows, dim] for w [dim, dim]."""
    dim = w.shape[0]
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, dim])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def matmul_model(seed: int, dim: int = DIM, name: str = "mm") -> onnx.ModelProto:
    w = (np.random.default_rng(seed).standard_normal((dim, dim)) / dim).astype(np.float32)
    return matmul_by(w, name=name)


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> str:
    """Saves a copy of ``model`` (onnx.save moves the weights of the one it is given out)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".bin", size_threshold=0)
    else:
        onnx.save(model, str(path))
    return str(path)


def reference(models: list[onnx.ModelProto], x: np.ndarray) -> np.ndarray:
    for m in models:
        x = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return x


X = np.random.default_rng(9).standard_normal((3, DIM)).astype(np.float32)


def rewrite_in_place(path: Path, data: bytes) -> None:
    """What ``onnx.save`` does to an existing file: truncate it and write anew, same inode."""
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


CHANGES = {
    "rewritten same size": lambda p: rewrite_in_place(p, bytes(reversed(p.read_bytes()))),
    "truncated": lambda p: rewrite_in_place(p, b""),
    "replaced": lambda p: (p.with_name("new").write_bytes(p.read_bytes()[:100]), os.replace(p.with_name("new"), p)),
    "deleted": lambda p: p.unlink(),
}


# --- copied once, by the kernel --------------------------------------------------------------
def test_weights_are_copied_once_by_the_kernel_and_the_pipeline_maps_them(tmp_path, monkeypatch):
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))
    models = [matmul_model(k) for k in range(3)]
    paths = [
        save(models[0], tmp_path / "a.onnx"),
        save(models[1], tmp_path / "b.onnx", external=True),
        save(models[2], tmp_path / "c.onnx"),
    ]
    pipe = fastseq.ONNXSequential(*paths, session_cache=False)
    weights = 3 * DIM * DIM * 4
    assert pipe.session_info["copied"] == weights, "every weight byte copied once, by the kernel"
    assert pipe.session_info["spilled"] == weights, "and counted once where the pipeline maps them"
    assert not os.listdir(private), "the private copy's folder is gone; its data file lives on, unlinked"
    np.testing.assert_allclose(pipe(X)[0], reference(models, X), rtol=1e-5, atol=1e-6)
    # What the pipeline holds reads as the sources did, in every form.
    assert [m.SerializeToString() for m in pipe.operators] == [m.SerializeToString() for m in models]
    pipe.as_cpu()  # a second session is copied from the first copy's file, in the kernel too
    assert pipe.session_info["copied"] == weights
    np.testing.assert_allclose(pipe(X)[0], reference(models, X), rtol=1e-5, atol=1e-6)


def test_weights_only_in_memory_are_written_once(tmp_path, monkeypatch):
    monkeypatch.setattr("fastseq.runtime.engine.SPILL_MIN", 1 << 20)
    models = [matmul_model(k) for k in range(2)]
    pipe = fastseq.ONNXSequential(*models, session_cache=False)
    assert pipe.session_info["copied"] == 0
    assert pipe.session_info["spilled"] == 2 * DIM * DIM * 4
    np.testing.assert_allclose(pipe(X)[0], reference(models, X), rtol=1e-5, atol=1e-6)


def test_a_hit_loads_the_entry_beside_the_copy_unless_weights_in_memory_are_let_go_first(tmp_path, monkeypatch):
    """A start from the session cache writes the pipeline's copy beside ONNX Runtime's load of
    the entry, except when the models hold weights in memory that the copy lets go of: then
    the copy comes first, so that they do not count twice while ONNX Runtime loads. (The
    copy is slowed down, so that which came first shows.)"""
    import threading
    import time

    monkeypatch.setattr("fastseq.runtime.engine.SPILL_MIN", 1 << 20)
    real_session, real_of, seen = session.new_session, session.PrivateCopy.of, []

    def recorded(path, options, providers, optimise=True, *args):
        if not optimise:  # the entry
            seen.append(any(t.name == "fastseq-copy" and t.is_alive() for t in threading.enumerate()))
        return real_session(path, options, providers, optimise, *args)

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return real_of(*args, **kwargs)

    monkeypatch.setattr(session, "new_session", recorded)
    monkeypatch.setattr(session.PrivateCopy, "of", slow)
    models = [matmul_model(k) for k in range(2)]
    files = [save(m, tmp_path / f"m{k}.onnx") for k, m in enumerate(models)]  # weights left in the files
    for sources, beside in ((files, True), (models, False)):
        cache = tmp_path / f"cache-{beside}"
        assert fastseq.ONNXSequential(*sources, session_cache=cache).session_info["cache"] == "stored"
        seen.clear()
        pipe = fastseq.ONNXSequential(*sources, session_cache=cache)
        assert pipe.session_info["cache"] == "hit" and pipe.session_info["spilled"] == 2 * DIM * DIM * 4
        assert seen == [beside]
        assert _core.memory_bytes([pipe.engine.composed]) < 1 << 16  # the weights are the copy's, mapped
        np.testing.assert_allclose(pipe(X)[0], reference(models, X), rtol=1e-5, atol=1e-6)


# --- sources that change ---------------------------------------------------------------------
@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("external", [False, True], ids=["inline", "external data"])
def test_sources_changed_after_a_build_change_nothing(tmp_path, change, external):
    models = [matmul_model(1), matmul_model(2)]
    paths = [save(m, tmp_path / f"m{k}.onnx", external) for k, m in enumerate(models)]
    pipe = fastseq.ONNXSequential(*paths, session_cache=False)
    expected, before = pipe(X)[0], pipe.model_bytes
    for p in paths:
        CHANGES[change](Path(p + ".bin") if external else Path(p))
    np.testing.assert_array_equal(pipe(X)[0], expected)
    assert pipe.model_bytes == before
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(pipe))(X)[0], expected)
    pipe.export(tmp_path / "out.onnx", external_data=True)
    out = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(out.run(None, {"x": X})[0], expected)
    np.testing.assert_array_equal(pipe.as_cpu()(X)[0], expected)
    assert onnx.ModelProto.FromString(pipe.combine().SerializeToString()) == onnx.ModelProto.FromString(before)
    pipe.engine.composed.check_sources()  # it refers to no source file any more


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("external", [False, True], ids=["inline", "external data"])
def test_a_source_changed_between_load_and_copy_is_refused_by_name(tmp_path, change, external):
    """The nodes are read at load, the weights copied later: a source that is no longer the
    file loaded is a LoadError naming it, from every path that would copy or read it, and
    leaves nothing behind."""
    path = Path(save(matmul_model(1), tmp_path / "m.onnx", external))
    composed = _core.compose([str(path)], ["m.onnx"])
    changed = Path(str(path) + ".bin") if external else path
    CHANGES[change](changed)
    private = tmp_path / "tmp"
    private.mkdir()
    name = str(changed.name).replace(".", r"\.")
    with pytest.raises(fastseq.LoadError, match=name):
        composed.check_sources()
    with pytest.raises(fastseq.LoadError, match=name):
        _core.write_private_copy([composed], str(private / "model.onnx"), None)
    with pytest.raises(fastseq.LoadError, match=name):
        _core.model_digest(composed)  # the session cache's key
    assert not [f for f in os.listdir(private) if not f.startswith(".")], os.listdir(private)
    with pytest.raises(fastseq.LoadError, match=name):
        composed.to_bytes()
    out = tmp_path / "out"
    out.mkdir()
    for external_out in (True, False):
        with pytest.raises(fastseq.LoadError, match=name):
            composed.save(str(out / "x.onnx"), external_data=external_out)
        assert os.listdir(out) == []


WRITER = textwrap.dedent("""
    import os, sys, time
    path, a, b = sys.argv[1], open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
    deadline = time.time() + float(sys.argv[4])
    n = 0
    while time.time() < deadline:
        with open(path, "r+b") as f:   # same inode, as onnx.save rewrites a file
            f.truncate(0)
            f.write(a if n % 2 else b)
        n += 1
""")

BUILDER = textwrap.dedent("""
    import sys, json
    import numpy as np
    import fastseq
    path, rounds = sys.argv[1], int(sys.argv[2])
    x = np.ones((1, 1024), np.float32)
    seen = {"ok": [], "errors": []}
    for _ in range(rounds):
        try:
            pipe = fastseq.ONNXSequential(path, session_cache=False)
            seen["ok"].append(float(pipe(x)[0].sum()))
        except fastseq.LoadError as e:
            seen["errors"].append(str(e))
    print(json.dumps(seen))
""")


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external data"])
def test_a_source_rewritten_in_a_loop_during_builds_never_mixes_or_crashes(tmp_path, external):
    """Another process truncates and rewrites a source (two versions of the same size) as
    fast as it can while pipelines are built from it: each build gives exactly one version's
    result or a LoadError naming the file, and nothing crashes (no SIGBUS)."""
    versions = []
    for k in (1, 2):
        m = matmul_by(np.full((1024, 1024), float(k), np.float32), rows=1)  # 4 MiB: the copy takes a while
        folder = tmp_path / f"v{k}"
        folder.mkdir()
        versions.append(Path(save(m, folder / "m.onnx", external)))
    src = tmp_path / "m.onnx"
    target = src.with_name("m.onnx.bin") if external else src
    for name in ["m.onnx"] + (["m.onnx.bin"] if external else []):
        (tmp_path / name).write_bytes((versions[0].parent / name).read_bytes())
    changing = [str(v.parent / target.name) for v in versions]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target), *changing, "20"])
    try:
        build = subprocess.run(
            [sys.executable, "-c", BUILDER, str(src), "40"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    finally:
        writer.kill()
        writer.wait()
    assert build.returncode == 0, (build.returncode, build.stderr[-2000:])
    assert build.returncode != -signal.SIGBUS
    import json

    seen = json.loads(build.stdout.strip().splitlines()[-1])
    assert set(seen["ok"]) <= {1024.0 * 1024, 2048.0 * 1024}, seen["ok"]  # one version, never a mix
    assert all(target.name in e or "m.onnx" in e for e in seen["errors"]), seen["errors"][:3]
    assert seen["ok"] or seen["errors"]


# --- a pipeline above 2 GB --------------------------------------------------------------------
ROWS = (1100 << 20) // 4096  # 1.1 GB of float32 rows of 1024, per model


def sparse_inline_gather(path: Path, name: str, mark: float) -> None:
    """A model of about 1.1 GB, its weight inline but mostly a hole (no disk): y = table[i],
    with row 7 holding ``mark`` and the rest zeros. Written field by field (onnx would
    build the whole table in memory)."""
    table = name + "_table"
    g = helper.make_graph(
        [helper.make_node("Gather", [table, name + "_i"], [name + "_y"])],
        name,
        [helper.make_tensor_value_info(name + "_i", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info(name + "_y", TensorProto.FLOAT, [2, 1024])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    n = ROWS * 4096
    head = varint(1 << 3) + varint(ROWS) + varint(1 << 3) + varint(1024)  # dims
    head += varint(2 << 3) + varint(TensorProto.FLOAT)  # data_type
    head += field(8, table.encode())  # name
    tensor_len = len(head) + len(varint(9 << 3 | 2)) + len(varint(n)) + n
    initializer = varint(5 << 3 | 2) + varint(tensor_len) + head + varint(9 << 3 | 2) + varint(n)
    graph = g.SerializeToString()
    graph_len = len(graph) + len(initializer) + n
    prefix = model.SerializeToString().replace(field(7, graph), b"")
    with open(path, "wb") as f:
        f.write(prefix + varint(7 << 3 | 2) + varint(graph_len) + graph + initializer)
        start = f.tell()
        f.seek(start + 7 * 4096)
        f.write(np.full(1024, mark, np.float32).tobytes())
        f.truncate(start + n)


def test_a_pipeline_above_2gb_from_sparse_inline_sources(tmp_path, monkeypatch):
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    sparse_inline_gather(a, "a", 1.5)
    sparse_inline_gather(b, "b", 2.5)
    assert a.stat().st_blocks * 512 < 1 << 20, "the source costs no disk"
    pipe = fastseq.ONNXSequential(a, b, io_maps=[[]], keep_outputs=True, session_cache=False)
    assert pipe.summary()["weight_bytes"] > 2 << 30
    assert pipe.session_info["copied"] < 1 << 20, "the holes are not copied"
    ya, yb = pipe(a_i=np.array([7, 0]), b_i=np.array([0, 7]))
    np.testing.assert_array_equal(ya[0], np.full(1024, 1.5, np.float32))
    np.testing.assert_array_equal(yb[1], np.full(1024, 2.5, np.float32))
    assert not ya[1].any() and not yb[0].any()
    for p in (a, b):
        p.unlink()
    (ya2, yb2) = pipe(a_i=np.array([7, 0]), b_i=np.array([0, 7]))
    np.testing.assert_array_equal(ya2, ya)


# --- sources on another file system: both copy paths -------------------------------------------
@pytest.mark.parametrize("where", ["sources on a tmpfs", "temporary folder on a tmpfs"])
def test_across_file_systems_sendfile_copies(tmp_path, monkeypatch, where):
    with tmpfs(tmp_path / "mem", "64m") as mem:
        disk = tmp_path / "disk"
        disk.mkdir()
        sources, private = (mem, disk) if where == "sources on a tmpfs" else (disk, mem)
        monkeypatch.setattr("tempfile.tempdir", str(private))
        models = [matmul_model(k) for k in range(2)]
        paths = [save(models[0], sources / "a.onnx"), save(models[1], sources / "b.onnx", external=True)]
        pipe = fastseq.ONNXSequential(*paths, session_cache=False)
        weights = 2 * DIM * DIM * 4
        assert pipe.session_info["copied"] == weights
        np.testing.assert_allclose(pipe(X)[0], reference(models, X), rtol=1e-5, atol=1e-6)
        for p in paths:
            Path(p).unlink()
        Path(paths[1] + ".bin").unlink()
        np.testing.assert_allclose(pipe(X)[0], reference(models, X), rtol=1e-5, atol=1e-6)
        del pipe
        gc.collect()
        assert not os.listdir(private)


def test_within_one_file_system_copy_file_range_copies(tmp_path, monkeypatch):
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))
    composed = _core.compose([save(matmul_model(1), tmp_path / "a.onnx")], ["a"])
    with session.PrivateCopy.of(composed) as copy:
        assert copy.info.copied == DIM * DIM * 4
        assert copy.info.by_sendfile == 0, "copy_file_range within one file system"
    with tmpfs(tmp_path / "mem", "16m") as mem:
        composed = _core.compose([save(matmul_model(1), mem / "a.onnx")], ["a"])
        with session.PrivateCopy.of(composed) as copy:
            assert copy.info.copied == copy.info.by_sendfile == DIM * DIM * 4


# --- many pipelines in one process -----------------------------------------------------------
MANY = textwrap.dedent("""
    import gc, json, os, sys, tempfile, time
    import numpy as np
    import fastseq

    def state():
        gc.collect()
        time.sleep(0.5)  # the core frees models on a worker thread
        maps = open("/proc/self/maps").read()
        status = dict(l.split(":", 1) for l in open("/proc/self/status"))
        return {"fds": len(os.listdir("/proc/self/fd")),
                "mapped": sum("fastseq-session-" in l for l in maps.splitlines()),
                "rss": int(status["VmRSS"].split()[0]) << 10,
                "private": sorted(f for f in os.listdir(tempfile.gettempdir()) if f.startswith("fastseq-"))}

    paths = sys.argv[1:]
    x = np.ones((1, 1024), np.float32)
    rounds = []
    for _ in range(3):
        pipes = [fastseq.ONNXSequential(*paths, session_cache=False) for _ in range(12)]
        for p in pipes:
            p(x)
        during = state()
        del pipes, p
        rounds.append({"during": during, "after": state()})
    print(json.dumps(rounds))
""")


def test_many_pipelines_release_their_memory_and_files_when_dropped(tmp_path):
    """Rounds of 12 pipelines built, called and dropped in one process: each maps its
    session's copy while it lives, and none leaves a mapping, a file descriptor, a private
    folder or memory behind (the allocators keep what sessions freed for reuse, ONNX
    Runtime's alone too, so the measure is that later rounds need no more than the first)."""
    paths = []
    for k in range(2):
        w = np.random.default_rng(k).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB each
        paths.append(save(matmul_by(w, rows=1), tmp_path / f"m{k}.onnx"))
    private = tmp_path / "tmp"
    private.mkdir()
    env = {**os.environ, "TMPDIR": str(private), "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", MANY, *paths], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    rounds = json.loads(out.stdout.strip().splitlines()[-1])
    for r in rounds:
        assert r["during"]["mapped"] >= 12, "each pipeline maps its session's copy"
        assert r["during"]["private"] == [], "no private folder outlives its session's creation"
        assert r["after"]["mapped"] == 0, "every mapping went with its pipeline"
        assert r["after"]["private"] == []
        assert r["after"]["fds"] <= rounds[0]["after"]["fds"]
    # 12 pipelines x 8 MiB of weights each round: nothing accumulates past the first round's peak.
    assert rounds[2]["during"]["rss"] - rounds[0]["during"]["rss"] < 16 << 20, rounds
    assert rounds[2]["after"]["rss"] <= rounds[0]["during"]["rss"] + (16 << 20), rounds


# --- deduplication of weights still in their files ------------------------------------------
def test_identical_weights_in_files_and_memory_are_stored_once(tmp_path):
    shared = matmul_model(5)
    a = save(shared, tmp_path / "a.onnx")
    b = save(shared, tmp_path / "b.onnx", external=True)
    other = matmul_model(6)
    stages = {"a": a, "b": b, "c": shared, "d": other}
    pipe = fastseq.Pipeline(stages, ["a.y -> b.x", "b.y -> c.x", "c.y -> d.x"], session_cache=False)
    assert pipe.report()["deduped_initializers"] == 2, pipe.report()
    assert pipe.report()["deduped_bytes"] == 2 * DIM * DIM * 4
    np.testing.assert_allclose(pipe(X)[0], reference([shared, shared, shared, other], X), rtol=1e-4, atol=1e-5)


# --- hostile sources ------------------------------------------------------------------------
def test_fastseqs_own_keys_in_a_source_are_not_trusted(tmp_path):
    """A source cannot make fastseq copy another file by writing its keys: they are dropped
    from external data (which is checked as always) and mean nothing elsewhere."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"S" * (DIM * DIM * 4))
    st = secret.stat()
    model = matmul_model(3)
    path = tmp_path / "m.onnx"
    save(model, path, external=True)
    m = onnx.load(str(path), load_external_data=False)
    w = m.graph.initializer[0]
    identity = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    for key, value in (("fastseq:range", identity), ("fastseq:identity", identity)):
        e = w.external_data.add()
        e.key, e.value = key, value
    onnx.save(m, str(path))
    pipe = fastseq.ONNXSequential(str(path), session_cache=False)
    np.testing.assert_allclose(pipe(X)[0], reference([model], X), rtol=1e-5, atol=1e-6)
    # Inline data with the keys (and an absolute location) beside it: the data is inline.
    m = onnx.load(str(path))
    w = m.graph.initializer[0]
    for key, value in (
        ("location", str(secret)),
        ("offset", "0"),
        ("length", str(st.st_size)),
        ("fastseq:range", identity),
    ):
        e = w.external_data.add()
        e.key, e.value = key, value
    assert w.data_location != TensorProto.EXTERNAL
    onnx.save(m, str(tmp_path / "inline.onnx"))
    pipe = fastseq.ONNXSequential(str(tmp_path / "inline.onnx"), session_cache=False)
    np.testing.assert_allclose(pipe(X)[0], reference([model], X), rtol=1e-5, atol=1e-6)
    assert b"SSSS" not in pipe.model_bytes
