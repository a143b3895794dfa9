"""Every way to name a model (fastseq.sources.resolve): ModelProto, bytes and paths, and hf://
ids from a Hub stand-in on 127.0.0.1 (huggingface_hub pointed at it through HF_ENDPOINT); URLs
are test_download.py's, the Hub when it is away test_resolve_hub.py's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import fastseq
from conftest import save_external, scale_model, set_external_location
from fastseq.sources import resolve as loader
from servers import serve_hub

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
WANT = np.maximum(np.maximum(X * 2, 0) * 3, 0)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    (root / "kornia" / "ONNX_models" / "operators").mkdir(parents=True)
    onnx.save(scale_model(2.0), root / "kornia" / "ONNX_models" / "operators" / "double.onnx")
    (root / "acme" / "models" / "heads").mkdir(parents=True)
    onnx.save(scale_model(3.0), root / "acme" / "models" / "heads" / "triple.onnx")
    (root / "acme" / "models@v2").mkdir(parents=True)
    onnx.save(scale_model(5.0), root / "acme" / "models@v2" / "triple.onnx")
    server = serve_hub(root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield server, root
    server.close()


def test_protos_bytes_paths_and_home_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    onnx.save(scale_model(3.0), tmp_path / "b.onnx")
    for second in [
        scale_model(3.0).SerializeToString(),
        str(tmp_path / "b.onnx"),
        tmp_path / "b.onnx",
        "~/b.onnx",
        bytearray(scale_model(3.0).SerializeToString()),
    ]:
        pipe = fastseq.ONNXSequential(scale_model(2.0), second)
        np.testing.assert_allclose(pipe(X)[0], WANT)


def test_hub_ids_resolve_like_kornia_and_with_org_repo_revision(hub, tmp_path):
    server, _ = hub
    cache = tmp_path / "hf-cache"
    pipe = fastseq.ONNXSequential("hf://operators/double", "hf://acme/models/heads/triple.onnx", cache_dir=cache)
    np.testing.assert_allclose(pipe(X)[0], WANT)
    assert any("/kornia/ONNX_models/resolve/main/operators/double.onnx" in p for _, p, _ in server.requests)
    assert list(cache.rglob("double.onnx")) and list(cache.rglob("triple.onnx"))
    pinned = fastseq.ONNXSequential("hf://operators/double", "hf://acme/models@v2/triple.onnx", cache_dir=cache)
    np.testing.assert_allclose(pinned(X)[0], np.maximum(np.maximum(X * 2, 0) * 5, 0))


def test_hub_cache_offline_mode_force_download_and_token(hub, tmp_path, monkeypatch):
    server, _ = hub
    cache = tmp_path / "hf-cache"
    fastseq.ONNXSequential("hf://operators/double", cache_dir=cache, token="secret-token")
    assert any(h.get("authorization", h.get("Authorization")) == "Bearer secret-token" for _, _, h in server.requests)
    gets = server.count("GET")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fastseq.ONNXSequential("hf://operators/double", cache_dir=cache)
    assert server.count("GET") == gets  # served from the cache without asking
    with pytest.raises(fastseq.DownloadError, match="hf://operators/never_downloaded"):
        fastseq.ONNXSequential("hf://operators/never_downloaded", cache_dir=cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    fastseq.ONNXSequential("hf://operators/double", cache_dir=cache, force_download=True)
    assert server.count("GET") == gets + 1


def test_hub_model_with_external_data_brings_its_companion(hub, tmp_path):
    server, root = hub
    folder = save_external(root / "acme" / "models" / "ext" / "big.onnx", "big.weights").parent
    assert (folder / "big.weights").exists()
    pipe = fastseq.ONNXSequential("hf://acme/models/ext/big.onnx", cache_dir=tmp_path / "c")
    x = np.ones((2, 512), np.float32)
    np.testing.assert_allclose(pipe(x)[0], np.full((2, 512), 2.0, np.float32))
    assert any(p.endswith("/ext/big.weights") for _, p, _ in server.requests)


@pytest.mark.parametrize("location", ["../../../escape.bin", "/etc/passwd"])
def test_hub_external_data_locations_are_checked_before_any_download(hub, tmp_path, location):
    server, root = hub
    set_external_location(save_external(root / "acme" / "models" / "evil" / "m.onnx", "m.bin"), location)
    with pytest.raises(fastseq.LoadError, match="external data location .* is refused"):
        fastseq.ONNXSequential("hf://acme/models/evil/m.onnx", cache_dir=tmp_path / "c")
    assert not any("escape" in p or "passwd" in p for _, p, _ in server.requests)
    assert not list(tmp_path.rglob("escape.bin"))


def test_hub_errors_name_the_id(hub, tmp_path):
    with pytest.raises(fastseq.DownloadError, match="hf://acme/models/nope.onnx"):
        fastseq.ONNXSequential("hf://acme/models/nope.onnx", cache_dir=tmp_path)
    with pytest.raises(fastseq.LoadError, match="expected hf://org/repo/path/file.onnx"):
        loader.parse_hub_id("hf://repo/file.onnx")
    ref = loader.parse_hub_id("hf://org/repo@abc/d/f.onnx#sha256=" + "a" * 64)
    assert (ref.repo_id, ref.filename, ref.revision, ref.sha256) == ("org/repo", "d/f.onnx", "abc", "a" * 64)
