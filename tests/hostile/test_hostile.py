"""Hostile and broken input, interrupted exports, full disks, many threads."""

from __future__ import annotations

import hashlib
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import fastseq
from conftest import field, run, run_chain, scale_model, tmpfs, varint
from fastseq import _core
from fastseq.sources import download
from fastseq.sources import resolve as loader


def chain_model_bytes(nodes: int) -> bytes:
    """A valid model of ``nodes`` Relu nodes in a chain, written byte by byte (building it
    through onnx.helper would take minutes)."""
    parts = []
    for k in range(nodes):
        src = b"x" if k == 0 else b"n%d" % (k - 1)
        dst = b"y" if k == nodes - 1 else b"n%d" % k
        parts.append(field(1, field(1, src) + field(2, dst) + field(4, b"Relu")))
    value_info = lambda name: field(1, name) + field(2, field(1, varint(1 << 3) + varint(1)))  # noqa: E731
    graph = b"".join(parts) + field(2, b"long") + field(11, value_info(b"x")) + field(12, value_info(b"y"))
    opset = field(8, field(1, b"") + varint(2 << 3) + varint(17))
    return varint(1 << 3) + varint(8) + opset + field(7, graph)


def test_million_node_graph_composes_without_running_out_of_memory():
    data = chain_model_bytes(1_000_000)
    merged = _core.compose([data, data], ["a", "b"], io_maps=[[]], keep_outputs=True)
    info = merged.summary()
    assert info["nodes"] == 2_000_000
    assert [o[0] for o in info["outputs"]] == ["y", "m1/y"]


def test_small_byte_built_chain_runs():
    m = onnx.ModelProto.FromString(chain_model_bytes(5))
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    np.testing.assert_allclose(run(fastseq.compose([m, m]), {"x": x})["y"], np.maximum(x, 0))


ODD = ["😀", "مرحبا", "e\u0301", "zero\u200bwidth", "a b/c:d", "x" * 5000, "名前", "\u202eevil"]


@pytest.mark.parametrize("name", ODD, ids=["emoji", "rtl", "combining", "zero-width", "punct", "long", "cjk", "bidi"])
def test_odd_unicode_names_survive_clashes_and_run(name):
    a = scale_model(2.0, inp=name, out=name + "_out")
    b = scale_model(3.0, inp=name, out=name + "_out")
    merged = fastseq.compose([a, b])
    assert [i.name for i in merged.graph.input] == [name]
    assert [o.name for o in merged.graph.output] == [name + "_out"]
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(run(merged, {name: x})[name + "_out"], run_chain([a, b], {name: x})[name + "_out"])


def test_invalid_utf8_in_a_name_is_kept_and_runs_as_the_source_does():
    """protobuf and onnx accept any bytes in a string; fastseq keeps them (issue 27), so the
    composed model runs in ONNX Runtime exactly as the source does."""
    import onnxruntime as ort

    data = scale_model(2.0).SerializeToString().replace(b"relu", b"\xff\xfe\x80u")
    composed = fastseq.compose_bytes([data])
    assert b"\xff\xfe\x80u" in composed
    x = np.random.default_rng(0).standard_normal((2, 4), dtype=np.float32)
    (ours,) = ort.InferenceSession(composed).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(data).run(None, {"x": x})
    np.testing.assert_array_equal(ours, theirs)


def test_interrupted_exports_leave_the_old_file_or_the_new_one(tmp_path):
    sources = []
    for i in range(4):
        p = tmp_path / f"s{i}.onnx"
        onnx.save(scale_model(1.0 + i, shape=(1, 4 << 20)), p)  # 16 MB of weights each
        sources.append(str(p))
    target = tmp_path / "out.onnx"
    onnx.save(scale_model(9.0), target)
    old = hashlib.sha256(target.read_bytes()).hexdigest()
    expected = tmp_path / "expected.onnx"
    _core.compose(sources, ["a", "b", "c", "d"]).save(str(expected))  # streamed, as the child writes
    new = hashlib.sha256(expected.read_bytes()).hexdigest()
    expected.unlink()
    script = textwrap.dedent(f"""
        import sys, fastseq
        from fastseq import _core
        composed = _core.compose({sources!r}, ["a", "b", "c", "d"])
        print("ready", flush=True)
        while True:
            composed.save({str(target)!r})
            print("saved", flush=True)
    """)
    rng = random.Random(0)
    seen = set()
    for round in range(8):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        if round == 0:  # one export surely completes, however slow the disk
            assert p.stdout.readline().strip() == "saved"
        time.sleep(rng.uniform(0.0, 0.15))
        p.send_signal(signal.SIGKILL)
        p.wait()
        state = hashlib.sha256(target.read_bytes()).hexdigest()
        assert state in (old, new), "a torn file"
        seen.add(state)
    assert new in seen, "no export finished: the kills came too early to test anything"
    # The temporary files of killed exports are removed by the next export to that path.
    fastseq.compose_to_file(sources, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(Path(s).name for s in sources), "out.onnx"])


def test_full_disk_is_a_clear_error_and_the_old_file_stays(tmp_path):
    target = tmp_path / "out.onnx"
    target.write_bytes(b"old contents")
    onnx.save(scale_model(2.0, shape=(1, 1 << 20)), tmp_path / "big.onnx")
    script = textwrap.dedent(f"""
        import resource, signal, sys, fastseq
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # files over 1 MB cannot grow
        for external in (False, True):
            try:
                fastseq.compose_to_file([{str(tmp_path / "big.onnx")!r}] * 2, {str(target)!r}, external_data=external)
            except fastseq.ExportError as e:
                print("ExportError:", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ExportError")]
    assert len(lines) == 2, r.stdout + r.stderr
    assert all("cannot write" in ln and "too large" in ln for ln in lines)
    assert target.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "out.onnx"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MB tmpfs: a real full disk (ENOSPC)."""
    with tmpfs(tmp_path / "disk", "1m") as mount:
        yield mount


def test_really_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path, tiny_disk):
    onnx.save(scale_model(2.0, shape=(1, 1 << 19)), tmp_path / "big.onnx")  # 2 MB of weights
    target = tiny_disk / "out.onnx"
    target.write_bytes(b"old contents")
    for external in (False, True):
        with pytest.raises(fastseq.ExportError, match="cannot write .*No space left on device"):
            fastseq.compose_to_file([tmp_path / "big.onnx"], target, external_data=external)
        assert target.read_bytes() == b"old contents"
        assert [p.name for p in tiny_disk.iterdir()] == ["out.onnx"]


@pytest.mark.timeout(120)
def test_one_pipeline_many_threads_same_results_as_serial():
    pipe = fastseq.ONNXSequential(scale_model(2.0), scale_model(-1.5), scale_model(0.5))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(64)]
    serial = [pipe(x)[0] for x in inputs]
    calls, threads, errors = 10_000, 8, []
    per_thread = calls // threads

    def work(t: int) -> None:
        try:
            for k in range(per_thread):
                i = (t * 7 + k) % len(inputs)
                (out,) = pipe(inputs[i])
                if not np.array_equal(out, serial[i]):
                    errors.append((t, k))
        except Exception as e:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(e)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert time.perf_counter() - start < 100


def test_download_timeout_is_bounded(tmp_path):
    from servers import serve_files

    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    server = serve_files(tmp_path)
    server.delay = 3.0
    try:
        start = time.perf_counter()
        with pytest.raises(fastseq.DownloadError, match="after 2 attempt"):
            loader.url_download(f"{server.url}/a.onnx", tmp_path / "cache", timeout=0.3, retries=2)
        assert time.perf_counter() - start < 3.0
    finally:
        server.delay = 0
        server.close()


def test_sha256_argument_checks_local_files_and_downloads(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    good = hashlib.sha256((tmp_path / "a.onnx").read_bytes()).hexdigest()
    fastseq.ONNXSequential(tmp_path / "a.onnx", sha256=good)
    with pytest.raises(fastseq.DownloadError, match="sha256 mismatch"):
        fastseq.ONNXSequential(tmp_path / "a.onnx", sha256="0" * 64)
    with pytest.raises(TypeError, match="one digest"):
        fastseq.ONNXSequential(tmp_path / "a.onnx", tmp_path / "a.onnx", sha256=good)
    fastseq.ONNXSequential(tmp_path / "a.onnx", tmp_path / "a.onnx", sha256=[good, None])


def test_corrupt_hub_cache_is_detected_and_fetched_again(tmp_path, monkeypatch):
    from servers import serve_hub

    root = tmp_path / "hub"
    (root / "acme" / "models").mkdir(parents=True)
    onnx.save(scale_model(2.0), root / "acme" / "models" / "m.onnx")
    good = hashlib.sha256((root / "acme" / "models" / "m.onnx").read_bytes()).hexdigest()
    server = serve_hub(root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    try:
        ref = f"hf://acme/models/m.onnx#sha256={good}"
        fastseq.ONNXSequential(ref, cache_dir=tmp_path / "c")
        blob = next(p for p in (tmp_path / "c").rglob("*") if p.is_file() and "blobs" in p.parts)
        blob.write_bytes(b"corrupted on disk")
        gets = server.count("GET")
        pipe = fastseq.ONNXSequential(ref, cache_dir=tmp_path / "c")
        assert server.count("GET") == gets + 1
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(pipe(x)[0], 2.0)
        with pytest.raises(fastseq.DownloadError, match="sha256 mismatch"):
            fastseq.ONNXSequential("hf://acme/models/m.onnx#sha256=" + "1" * 64, cache_dir=tmp_path / "c")
    finally:
        server.close()


def _compose_in_child(depth: int) -> None:
    """Runs in a forked child: composes (its parent already used the thread pool), then
    forks again, down to `depth`."""
    import os

    m = scale_model(2.0)
    merged = fastseq.compose([m, m, m])
    assert len(merged.graph.node) == 6
    if depth > 1:
        pid = os.fork()
        if pid == 0:
            try:
                _compose_in_child(depth - 1)
            except BaseException:  # noqa: BLE001 - the child's exit status says it
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status


def test_composing_in_a_forked_child_after_the_parent_did():
    """multiprocessing forks by default on Linux: a child must not inherit a thread pool
    whose threads stayed in the parent (every parallel step would wait forever)."""
    import multiprocessing

    m = scale_model(2.0)
    fastseq.compose([m, m])  # the parent's pool is running
    child = multiprocessing.get_context("fork").Process(target=_compose_in_child, args=(2,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung composing")
    assert child.exitcode == 0
    assert len(fastseq.compose([m, m]).graph.node) == 4  # the parent's pool still works


def test_a_trickling_server_cannot_outlast_the_download_deadline(tmp_path):
    """One byte every 0.2 s never trips a 1 s per-read timeout; the deadline ends it."""
    from servers import serve_files

    onnx.save(scale_model(2.0, shape=(1, 1 << 16)), tmp_path / "a.onnx")  # 256 KB: ~14 h at that pace
    server = serve_files(tmp_path)
    server.trickle = 0.2
    try:
        start = time.perf_counter()
        with pytest.raises(fastseq.DownloadError, match=r"not done within its deadline of 2 s"):
            loader.url_download(f"{server.url}/a.onnx", tmp_path / "cache", timeout=1.0, retries=3, deadline=2.0)
        assert time.perf_counter() - start < 4.0
        assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*")), "a partial file was left"
        # The same server at full speed: the deadline does not get in the way.
        server.trickle = 0
        path = loader.url_download(f"{server.url}/a.onnx", tmp_path / "cache", timeout=1.0, deadline=30.0)
        assert path.read_bytes() == (tmp_path / "a.onnx").read_bytes()
    finally:
        server.trickle = 0
        server.close()


def test_the_deadline_covers_retries_and_their_pauses(tmp_path, monkeypatch):
    from servers import serve_files

    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    server = serve_files(tmp_path)
    server.fail_next = 100  # 503 each time: retried with backoff 0.5, 1, 2, 4 s...
    monkeypatch.setattr(download, "DOWNLOAD_DEADLINE", 1.2)  # the module default, as the variable sets it
    try:
        start = time.perf_counter()
        with pytest.raises(fastseq.DownloadError, match=r"deadline of 1.2 s .*503"):
            fastseq.ONNXSequential(f"{server.url}/a.onnx", cache_dir=tmp_path / "cache")
        assert time.perf_counter() - start < 2.0
    finally:
        server.close()


MALFORMED = {
    "content-length not a number": b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nxyz",
    "negative content-length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nxyz",
    "content-length with a sign": b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nxyz",
    "conflicting content-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nxyzw",
    "status line garbage": b"HTTP/1.1 abc\r\n\r\n",
    "not http at all": b"\x00\x01\x02 hello\r\n\r\n",
    "header line too long": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    "too many headers": b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 150 + b"\r\n",
    "bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxyz\r\n0\r\n\r\n",
    "redirect to a malformed url": b"HTTP/1.1 302 Found\r\nLocation: http://[::1\r\nContent-Length: 0\r\n\r\n",
    "redirect to a local file": b"HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_every_malformed_answer_is_a_download_error(tmp_path, case):
    from servers import serve_raw

    server = serve_raw(MALFORMED[case])
    try:
        with pytest.raises(fastseq.DownloadError, match=r"/m\.onnx: "):
            fastseq.ONNXSequential(f"{server.url}/m.onnx", cache_dir=tmp_path / "cache")
        assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*")), "a partial file was left"
    finally:
        server.close()


def test_an_initializer_whose_dims_overflow_or_lack_data_is_a_load_error(tmp_path):
    """docs/security.md promises a LoadError for tensor data of the wrong size: dims of
    [2^40, 2^40] with no data used to pass the core and fail later in ONNX Runtime."""
    from onnx import TensorProto, helper

    def model(tensor):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [x],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            [tensor],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    huge = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 40, 1 << 40])
    path = tmp_path / "big.onnx"
    path.write_bytes(model(huge).SerializeToString())
    with pytest.raises(fastseq.LoadError, match=r"big\.onnx: tensor 'w'.*overflow"):
        fastseq.compose_bytes([path])
    empty = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4])
    with pytest.raises(fastseq.LoadError, match=r"tensor 'w' \(float \[4, 4\]\) has no data, but its dims say 16"):
        fastseq.compose_bytes([model(empty)])
