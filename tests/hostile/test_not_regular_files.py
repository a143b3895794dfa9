"""Files named by input that are not regular files: a FIFO, a character device (what
/dev/zero is), a socket, a folder. Each is refused without blocking, with an error naming
it, on every entry point that opens what input names: a model's external data (compose,
ONNXSequential, a ``reuse`` export, ``fastseq merge``), the model file itself, a pipeline
file and its stages, a cached download checked against its sha256, kornia's loader, the
quantizer and its calibration files. A FIFO's plain ``open`` waits for a writer for ever:
this held in an earlier round, came back, and is now one open in the core
(``crates/fastseq/src/storage/read.rs::open_input``), which Python asks too
(``_core.open_input``).

Every case runs under :func:`never_blocked`: should a call wait in ``open`` on a FIFO, a
thread opens the FIFO's other end, the call goes on, and the test fails saying it blocked
(rather than hanging the suite)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

import fastseq
from conftest import scale_model
from fastseq.quantize import quantize

N = 1024  # 4 KB of weights: external data
KINDS = ["fifo", "socket", "folder", "char device"]
WHAT = {"fifo": "a FIFO", "socket": "a socket", "folder": "a directory", "char device": "a character device"}


def make_special(path: Path, kind: str) -> contextlib.AbstractContextManager:
    """Puts a ``kind`` at ``path``; returns what keeps it alive (a bound socket)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "char device":
        if os.geteuid() != 0:
            pytest.skip("making a character device (a copy of /dev/zero) needs root")
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s
    return contextlib.nullcontext()


@contextlib.contextmanager
def never_blocked(*fifos: Path, grace: float = 3.0) -> Iterator[None]:
    """Fails the test when the body waits in ``open`` on one of ``fifos``: past ``grace``
    seconds, a thread opens each one's writing end (which succeeds only while a reader is
    there), closes it (the reader sees the end of the file and goes on) and notes it."""
    done, blocked = threading.Event(), []

    def watch() -> None:
        if done.wait(grace):
            return
        while not done.wait(0.05):
            for fifo in fifos:
                try:
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as e:
                    if e.errno not in (errno.ENXIO, errno.ENOENT):
                        raise
                    continue
                blocked.append(fifo)
                os.close(fd)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    assert not blocked, f"blocked opening {blocked[0]}"


def external_model(folder: Path, kind: str) -> tuple[Path, contextlib.AbstractContextManager]:
    """A model whose external data file ``m.bin`` is a ``kind``."""
    folder.mkdir(exist_ok=True)
    onnx.save(
        scale_model(2.0, shape=(2, N)),
        str(folder / "m.onnx"),
        save_as_external_data=True,
        location="m.bin",
        size_threshold=0,
    )
    (folder / "m.bin").unlink()
    return folder / "m.onnx", make_special(folder / "m.bin", kind)


def fifos(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if stat.S_ISFIFO(p.lstat().st_mode)]


ENTRY_POINTS = {
    "compose": lambda m, out: fastseq.compose([m]),
    "compose_to_file": lambda m, out: fastseq.compose_to_file([m], out, external_data=True),
    "reuse export": lambda m, out: fastseq.compose_to_file([m], out, external_data="reuse"),
    "ONNXSequential": lambda m, out: fastseq.ONNXSequential(m, session_cache=False),
    "Pipeline": lambda m, out: fastseq.Pipeline({"s": m}, session_cache=False),
    "quantize": lambda m, out: quantize(m, out),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_external_data_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, entry, kind):
    model, alive = external_model(tmp_path / "src", kind)
    out = tmp_path / "out.onnx"
    with alive, never_blocked(*fifos(tmp_path)), pytest.raises(fastseq.LoadError) as e:
        ENTRY_POINTS[entry](model, out)
    assert "m.bin" in str(e.value) and f"is {WHAT[kind]}" in str(e.value)
    assert not out.exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", [e for e in ENTRY_POINTS if e != "quantize"])
def test_a_model_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, entry, kind):
    model = tmp_path / "m.onnx"
    with make_special(model, kind), never_blocked(*fifos(tmp_path)), pytest.raises(fastseq.LoadError) as e:
        ENTRY_POINTS[entry](model, tmp_path / "out.onnx")
    assert str(model) in str(e.value) and f"is {WHAT[kind]}" in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "char device"])
def test_fastseq_merge_refuses_them_with_one_line_and_leaves_nothing(tmp_path, kind):
    """The CLI in its own process, bounded: before, `fastseq merge` hung on a FIFO."""
    model, alive = external_model(tmp_path / "src", kind)
    plain = tmp_path / "plain.onnx"
    onnx.save(scale_model(3.0, shape=(2, N)), str(plain))
    for args in ([str(model)], [str(plain), str(model)]):
        with alive if args == [str(model)] else contextlib.nullcontext():
            r = subprocess.run(
                [sys.executable, "-m", "fastseq", "merge", *args, "-o", str(tmp_path / "o.onnx")],
                capture_output=True,
                text=True,
                timeout=120,
            )
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("fastseq: error:"), r.stderr
        assert "m.bin" in lines[0] and f"is {WHAT[kind]}" in lines[0]
        assert not (tmp_path / "o.onnx").exists()


def test_a_source_replaced_by_a_fifo_after_load_is_refused_without_blocking(tmp_path):
    """Weights left in their file (ranges) are opened again when a model is written: a
    source swapped for a FIFO by then is refused, never waited on."""
    src = tmp_path / "wide.onnx"
    onnx.save(scale_model(2.0, shape=(2, 1 << 15)), str(src))  # 128 KB: left in the file
    loaded = fastseq._core.load_model(str(src), "wide")
    src.unlink()
    os.mkfifo(src)
    with never_blocked(src), pytest.raises(fastseq.LoadError, match="wide.onnx"):
        loaded.save(str(tmp_path / "out.onnx"), external_data=True)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_pipeline_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "pipeline.toml"
    with make_special(path, kind), never_blocked(*fifos(tmp_path)), pytest.raises(fastseq.PipelineFileError) as e:
        fastseq.Pipeline.from_file(path)
    assert str(path) in str(e.value) and f"is {WHAT[kind]}" in str(e.value)


def test_a_pipeline_files_stage_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    model, alive = external_model(tmp_path, "fifo")
    (tmp_path / "pipeline.toml").write_text('[stages]\nscale = "m.onnx"\n')
    with alive, never_blocked(*fifos(tmp_path)), pytest.raises(fastseq.LoadError, match="m.bin.* is a FIFO"):
        fastseq.Pipeline.from_file(tmp_path / "pipeline.toml", session_cache=False)
    r = subprocess.run(
        [sys.executable, "-m", "fastseq", "inspect", str(tmp_path / "pipeline.toml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "is a FIFO" in r.stderr, r.stderr


def test_a_sha256_checked_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    """A local file checked against ``sha256=``, and a cached download checked against its
    ``#sha256=`` fragment (the cache holding a FIFO under the file's name), are read by
    Python: through the core's open, refused."""
    from fastseq.sources import download

    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    digest = "0" * 64
    with never_blocked(fifo), pytest.raises(fastseq.LoadError, match="is a FIFO"):
        fastseq.ONNXSequential(str(fifo), sha256=digest, session_cache=False)
    url = "http://127.0.0.1:9/m.onnx"
    cached = download.url_cache_path(url, tmp_path / "cache")
    cached.parent.mkdir(parents=True)
    os.mkfifo(cached)
    with never_blocked(cached), pytest.raises(fastseq.LoadError, match="is a FIFO"):
        download.url_download(f"{url}#sha256={digest}", tmp_path / "cache")
    assert stat.S_ISFIFO(cached.lstat().st_mode)  # the cache's file is left for its owner


def test_kornias_loader_refuses_a_fifo_in_its_cache_without_blocking(tmp_path):
    from fastseq.facades.onnx_loader import ONNXLoader

    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    with never_blocked(fifo), pytest.raises(fastseq.LoadError, match="is a FIFO"):
        ONNXLoader._load("hf://operators/m", fifo)
    config = tmp_path / "c.json"
    os.mkfifo(config)
    with never_blocked(config), pytest.raises(fastseq.LoadError):
        ONNXLoader.load_config(config)
    model, alive = external_model(tmp_path / "ext", "fifo")
    with alive, never_blocked(*fifos(tmp_path / "ext")), pytest.raises(fastseq.LoadError, match="is a FIFO"):
        ONNXLoader._load("hf://operators/m", model)


def test_a_fifo_among_calibration_files_is_an_input_error_without_blocking(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(scale_model(2.0, shape=(2, N)), str(model))
    batches = tmp_path / "calibration"
    batches.mkdir()
    np.save(batches / "a.npy", np.ones((2, N), np.float32))
    os.mkfifo(batches / "b.npy")
    with never_blocked(batches / "b.npy"), pytest.raises(fastseq.InputError, match="b.npy.*is a FIFO"):
        quantize(model, tmp_path / "q.onnx", static=True, calibration=batches)
    assert not (tmp_path / "q.onnx").exists()


def test_open_input_gives_python_what_its_open_gives_for_os_errors(tmp_path):
    """``_core.open_input`` raises an ``OSError`` subclass with errno and path where Python's
    ``open`` would (callers keep their handling), and a LoadError for what it refuses."""
    with pytest.raises(FileNotFoundError) as e:
        fastseq._core.open_input(tmp_path / "missing")
    assert e.value.errno == errno.ENOENT and e.value.filename == str(tmp_path / "missing")
    (tmp_path / "f").write_bytes(b"abc")
    with os.fdopen(fastseq._core.open_input(tmp_path / "f"), "rb") as f:
        assert f.read() == b"abc"
    with pytest.raises(fastseq.LoadError, match="is a directory, not a regular file"):
        fastseq._core.open_input(tmp_path)
