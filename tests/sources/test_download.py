"""URLs as model sources (fastseq.sources.download), downloaded from a real HTTP server on
127.0.0.1: once, then from the cache; offline; retried with backoff; failures as
DownloadErrors; a corrupt cached file fetched again; the compose functions take URLs too."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest

import fastseq
from conftest import run, scale_model
from fastseq.sources import resolve as loader
from servers import serve_files

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
WANT = np.maximum(np.maximum(X * 2, 0) * 3, 0)


@pytest.fixture
def files(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    onnx.save(scale_model(2.0), root / "a.onnx")
    onnx.save(scale_model(3.0), root / "b.onnx")
    server = serve_files(root)
    yield server, root
    server.close()


def test_urls_download_once_then_reuse_the_cache(files, tmp_path):
    server, _ = files
    cache = tmp_path / "cache"
    pipe = fastseq.ONNXSequential(f"{server.url}/a.onnx", f"{server.url}/b.onnx", cache_dir=cache)
    np.testing.assert_allclose(pipe(X)[0], WANT)
    assert server.count("GET") == 2
    fastseq.ONNXSequential(f"{server.url}/a.onnx", f"{server.url}/b.onnx", cache_dir=cache)
    assert server.count("GET") == 2  # cached
    fastseq.ONNXSequential(f"{server.url}/a.onnx", f"{server.url}/b.onnx", cache_dir=cache, force_download=True)
    assert server.count("GET") == 4
    assert not [p for p in cache.rglob("*") if p.name.endswith(".part")]


def test_url_offline_uses_the_cache_or_says_why(files, tmp_path, monkeypatch):
    server, _ = files
    cache = tmp_path / "cache"
    loader.url_download(f"{server.url}/a.onnx", cache)
    monkeypatch.setenv("FASTSEQ_OFFLINE", "1")
    assert loader.url_download(f"{server.url}/a.onnx", cache).exists()
    with pytest.raises(fastseq.DownloadError, match="offline .* and not cached"):
        loader.url_download(f"{server.url}/b.onnx", cache)


def test_url_retries_with_backoff_then_succeeds(files, tmp_path):
    server, _ = files
    server.fail_next = 2
    path = loader.url_download(f"{server.url}/a.onnx", tmp_path, retries=3)
    assert onnx.load(str(path)).graph.name == "scale"
    assert server.count("GET") == 3


def test_url_failures_are_download_errors(files, tmp_path):
    server, root = files
    with pytest.raises(fastseq.DownloadError, match="HTTP Error 404"):
        loader.url_download(f"{server.url}/missing.onnx", tmp_path)
    assert server.count("GET", "missing") == 1  # a 404 is not retried
    server.truncate = True
    with pytest.raises(fastseq.DownloadError):
        loader.url_download(f"{server.url}/a.onnx", tmp_path / "t", retries=2)
    assert not list((tmp_path / "t").rglob("a.onnx"))  # nothing half-written is kept
    server.truncate = False
    with pytest.raises(fastseq.DownloadError, match="over the download limit"):
        loader.url_download(f"{server.url}/a.onnx", tmp_path / "s", max_bytes=10)
    with pytest.raises(fastseq.DownloadError, match="sha256 mismatch"):
        loader.url_download(f"{server.url}/a.onnx#sha256=" + "0" * 64, tmp_path / "h")
    good = hashlib.sha256((root / "a.onnx").read_bytes()).hexdigest()
    assert loader.url_download(f"{server.url}/a.onnx#sha256={good}", tmp_path / "h").exists()


def test_corrupt_cached_file_is_fetched_again(files, tmp_path):
    server, root = files
    good = hashlib.sha256((root / "a.onnx").read_bytes()).hexdigest()
    path = loader.url_download(f"{server.url}/a.onnx", tmp_path)
    path.write_bytes(b"corrupt")
    again = loader.url_download(f"{server.url}/a.onnx", tmp_path, sha256=good)
    assert again.read_bytes() == (root / "a.onnx").read_bytes()


def test_compose_functions_take_urls_too(files, tmp_path, monkeypatch):
    server, _ = files
    monkeypatch.setenv("FASTSEQ_CACHE", str(tmp_path / "cache"))
    merged = fastseq.compose([f"{server.url}/a.onnx", f"{server.url}/b.onnx"])
    np.testing.assert_allclose(run(merged, {"x": X})["y"], WANT)
