"""hf:// ids when the Hub is away or says no: the loopback Hub stand-in (tests/servers.py), a
closed port on 127.0.0.1, and a server that hangs up on every connection."""

from __future__ import annotations

import socket

import numpy as np
import onnx
import pytest

import fastseq
from conftest import save_external, scale_model
from servers import HangUp, serve_hub

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    (root / "acme" / "models").mkdir(parents=True)
    onnx.save(scale_model(2.0), root / "acme" / "models" / "double.onnx")
    server = serve_hub(root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server, root
    server.close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_unreachable_hub_fails_at_once_for_an_uncached_id(tmp_path, monkeypatch):
    endpoint = _closed_port()
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(fastseq.DownloadError) as info:
        fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=tmp_path / "c")
    text = str(info.value)
    assert text.startswith("hf://acme/models/double.onnx: the Hub at " + endpoint + " is unreachable (")
    assert text.endswith("and double.onnx of acme/models at main is not in the cache")


def test_an_unreachable_hub_is_asked_once_not_retried(tmp_path, monkeypatch):
    """huggingface_hub retries a dropped connection five times with back-off (~23 s) when
    nothing is cached; fastseq asks once."""
    server = HangUp()
    try:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(fastseq.DownloadError, match="is unreachable"):
            fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=tmp_path / "c")
        assert server.connections == 1
    finally:
        server.close()


def test_cached_id_is_served_from_the_cache_when_the_hub_is_away(hub, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)
    monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    pipe = fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)
    np.testing.assert_allclose(pipe(X)[0], np.maximum(2 * X, 0))


def test_hf_hub_offline_set_at_run_time_is_honoured(hub, tmp_path, monkeypatch):
    server, _ = hub
    cache = tmp_path / "c"
    fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)
    asked = len(server.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # after huggingface_hub was imported
    pipe = fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)
    np.testing.assert_allclose(pipe(X)[0], np.maximum(2 * X, 0))
    with pytest.raises(
        fastseq.DownloadError,
        match=r"hf://acme/models/other.onnx: other.onnx of acme/models at main "
        r"is not in the cache and HF_HUB_OFFLINE is set",
    ):
        fastseq.ONNXSequential("hf://acme/models/other.onnx", cache_dir=cache)
    with pytest.raises(fastseq.DownloadError, match="force_download=True needs the Hub, but HF_HUB_OFFLINE is set"):
        fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache, force_download=True)
    assert len(server.requests) == asked  # offline means not asking


def test_missing_file_revision_and_repository_are_named(hub, tmp_path):
    cache = tmp_path / "c"
    with pytest.raises(
        fastseq.DownloadError, match=r"^hf://acme/models/nope.onnx: nope.onnx not found in acme/models at main$"
    ):
        fastseq.ONNXSequential("hf://acme/models/nope.onnx", cache_dir=cache)
    with pytest.raises(
        fastseq.DownloadError, match=r"^hf://acme/models@v9/double.onnx: revision v9 not found in acme/models$"
    ):
        fastseq.ONNXSequential("hf://acme/models@v9/double.onnx", cache_dir=cache)
    with pytest.raises(
        fastseq.DownloadError, match=r"repository acme/nothing not found at http://127.0.0.1:\d+ \(a private"
    ):
        fastseq.ONNXSequential("hf://acme/nothing/double.onnx", cache_dir=cache)
    # kornia's short form names the same things
    with pytest.raises(fastseq.DownloadError, match="repository kornia/ONNX_models not found"):
        fastseq.ONNXSequential("hf://operators/resize", cache_dir=cache)


def test_missing_external_data_companion_is_named(hub, tmp_path):
    _, root = hub
    model = save_external(root / "acme" / "models" / "ext" / "big.onnx", "big.weights")
    model.with_name("big.weights").unlink()
    with pytest.raises(fastseq.DownloadError, match=r"ext/big.weights not found in acme/models at main"):
        fastseq.ONNXSequential("hf://acme/models/ext/big.onnx", cache_dir=tmp_path / "c")


def test_force_download_failures_carry_the_cause(hub, tmp_path, monkeypatch):
    server, _ = hub
    cache = tmp_path / "c"
    fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)
    server.fail_next = 1
    with pytest.raises(
        fastseq.DownloadError,
        match=r"answered HTTP 503 for double.onnx \(.*503.*\) and force_download=True asks for a fresh copy",
    ):
        fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache, force_download=True)
    monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    with pytest.raises(fastseq.DownloadError) as info:
        fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache, force_download=True)
    assert "is unreachable (" in str(info.value) and str(info.value).endswith(
        "and force_download=True asks for a fresh copy"
    )
    assert isinstance(info.value.__cause__, Exception)  # the network error itself, for tracebacks
    # without force_download the cached copy still serves
    pipe = fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)
    np.testing.assert_allclose(pipe(X)[0], np.maximum(2 * X, 0))
