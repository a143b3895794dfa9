"""What code written for kornia 0.9's ``kornia.onnx`` relies on, on fastseq: the error classes
it catches, ``KORNIA_DOWNLOAD_TIMEOUT``, kornia's cache paths and ``kornia_config``, the
metadata stamp, and ``HF_HUB_OFFLINE`` being about the Hub only. Each case follows kornia's
source (0.9.0: ``kornia/onnx/utils.py`` ``ONNXLoader``, ``kornia/onnx/download.py``
``CachedDownloader``, ``kornia/core/download.py`` ``_download_url_to_file``,
``kornia/config.py``); kornia is not installed in the default run, so the same cases run
side by side with the real kornia in tests/peers/test_kornia_compat.py (``-m torch``). Real HTTP
servers on 127.0.0.1 throughout."""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
import urllib.error
from pathlib import Path

import numpy as np
import onnx
import pytest

import fastseq
from conftest import files_under, scale_model
from fastseq.sources import resolve as loader
from servers import serve_files, serve_hub

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
Loader = fastseq.ONNXLoader


@pytest.fixture(autouse=True)
def no_kornia_settings(monkeypatch):
    """Each test starts without the variables it reads (and, as every test of the default
    run, as a program that has not imported kornia: see conftest.py)."""
    for name in ("KORNIA_DOWNLOAD_TIMEOUT", "HF_HUB_OFFLINE", "FASTSEQ_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    (root / "kornia" / "ONNX_models" / "operators").mkdir(parents=True)
    onnx.save(scale_model(2.0), root / "kornia" / "ONNX_models" / "operators" / "double.onnx")
    server = serve_hub(root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield server, root
    server.close()


# --- the classes kornia's callers catch --------------------------------------------------------


def test_a_missing_model_is_a_value_error_as_in_kornia(tmp_path):
    # kornia: ONNXLoader.load_model ends in `raise ValueError(f"File {model_name} not found")`
    with pytest.raises(ValueError, match="File non_existent_model.onnx not found") as e:
        Loader.load_model("non_existent_model.onnx")
    assert isinstance(e.value, fastseq.LoadError)
    with pytest.raises(ValueError, match="not found"):
        Loader.load_model(tmp_path / "missing.onnx")
    for make in (fastseq.ONNXSequential, fastseq.ONNXModule, fastseq.load):
        with pytest.raises(ValueError) as e:
            make(str(tmp_path / "missing.onnx"))
        assert isinstance(e.value, fastseq.LoadError)


def test_an_http_error_is_a_value_error_with_the_http_error_as_its_cause(www, tmp_path):
    # kornia: CachedDownloader.download wraps urllib's HTTPError in
    # `ValueError(f"Error in resolving `{url}`.") from exc`, and tries once (a 503 too)
    server, _ = www
    target = tmp_path / "cache" / "missing.pth"
    with pytest.raises(ValueError, match="Error in resolving") as e:
        Loader.download(f"{server.url}/missing.pth", str(target))
    assert isinstance(e.value, fastseq.DownloadError)
    assert isinstance(e.value.__cause__, urllib.error.HTTPError) and e.value.__cause__.code == 404
    assert list(target.parent.iterdir()) == []
    server.fail_next = 1
    with pytest.raises(fastseq.DownloadError, match="Error in resolving .*503") as e:
        Loader.download(f"{server.url}/a.onnx", str(target))
    assert e.value.__cause__.code == 503 and server.count("GET", "a.onnx") == 1
    # fastseq's own sources raise the same class, from the same cause.
    with pytest.raises(ValueError, match="Error in resolving") as e:
        fastseq.ONNXSequential(f"{server.url}/missing.onnx", cache_dir=tmp_path / "own")
    assert isinstance(e.value.__cause__, urllib.error.HTTPError)


def test_a_forbidden_download_is_a_value_error_and_asks_nothing(www, tmp_path):
    # kornia: `raise ValueError(f"`{file_path}` not found. You may set `download=True`.")`
    server, _ = www
    with pytest.raises(ValueError, match="not found") as e:
        Loader.download(f"{server.url}/a.onnx", str(tmp_path / "missing.pth"), False)
    assert isinstance(e.value, fastseq.DownloadError)
    with pytest.raises(ValueError, match="not found"):
        Loader.load_model(f"{server.url}/a.onnx", download=False, cache_dir=tmp_path / "cache")
    assert server.requests == []


def test_a_short_transfer_is_a_content_too_short_error_at_once(www, tmp_path, monkeypatch):
    # kornia: a body shorter than its Content-Length raises urllib's ContentTooShortError,
    # after one attempt, and nothing is cached
    server, root = www
    monkeypatch.chdir(tmp_path)
    server.truncate = True
    url = f"{server.url}/a.onnx"
    with pytest.raises(urllib.error.ContentTooShortError) as e:
        Loader.download_to_cache(url, "model", cache_dir="cache", suffix=".pth")
    assert isinstance(e.value, fastseq.TruncatedDownloadError) and isinstance(e.value, ValueError)
    assert e.value.announced == (root / "a.onnx").stat().st_size > e.value.received
    assert list((tmp_path / "cache").iterdir()) == []
    assert server.count("GET") == 1
    server.truncate = False
    path = Loader.download_to_cache(url, "model", cache_dir="cache", suffix=".pth")
    assert path == os.path.join("cache", "model.pth") and Path(path).read_bytes() == (root / "a.onnx").read_bytes()
    assert Loader.download_to_cache(url, "model", cache_dir="cache", suffix=".pth") == path
    assert server.count("GET") == 2


def test_fastseqs_own_sources_retry_a_short_transfer_then_raise_the_same_class(www, tmp_path):
    """A deliberate difference: a URL given to ONNXSequential, compose or a pipeline file is
    tried three times (with back-off) before the same TruncatedDownloadError; ONNXLoader,
    kornia's class, tries once as kornia does."""
    server, _ = www
    server.truncate = True
    with pytest.raises(urllib.error.ContentTooShortError, match="after 3 attempts"):
        fastseq.ONNXSequential(f"{server.url}/a.onnx", cache_dir=tmp_path / "cache")
    assert server.count("GET") == 3
    assert not (tmp_path / "cache").exists() or files_under(tmp_path / "cache") == []


# --- KORNIA_DOWNLOAD_TIMEOUT -------------------------------------------------------------------


def download_in_a_thread(call) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def work():
        try:
            call()
        except BaseException as e:  # noqa: BLE001  (reported to the test)
            errors.append(e)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    return worker, errors


def test_kornia_download_timeout_bounds_each_wait(www, tmp_path, monkeypatch):
    # kornia: KORNIA_DOWNLOAD_TIMEOUT, read at each download, bounds connecting and each
    # read; a server that goes quiet longer is a TimeoutError, and no file is left
    server, _ = www
    monkeypatch.setenv("KORNIA_DOWNLOAD_TIMEOUT", "0.2")
    server.stall = True  # 10 bytes, then silence for up to 60 s (the default timeout)
    target = tmp_path / "cache" / "a.onnx"
    worker, errors = download_in_a_thread(lambda: Loader.download(f"{server.url}/a.onnx", str(target)))
    worker.join(30)  # a hang guard, far above 0.2 s and far below the 60 s default
    assert not worker.is_alive(), "the download stayed blocked past KORNIA_DOWNLOAD_TIMEOUT"
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError), errors
    assert isinstance(errors[0], fastseq.DownloadTimeoutError)
    assert "0.2 s" in str(errors[0]) and "KORNIA_DOWNLOAD_TIMEOUT" in str(errors[0])
    assert list(target.parent.iterdir()) == []
    # fastseq's own sources honour it too (three tries, each cut at 0.2 s)
    worker, errors = download_in_a_thread(
        lambda: fastseq.ONNXSequential(f"{server.url}/a.onnx", cache_dir=tmp_path / "own")
    )
    worker.join(30)
    assert not worker.is_alive() and len(errors) == 1 and isinstance(errors[0], fastseq.DownloadTimeoutError)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e400"])
def test_a_bad_kornia_download_timeout_is_a_value_error_before_any_request(www, tmp_path, monkeypatch, value):
    # kornia: anything but a number of seconds above 0 and at most threading.TIMEOUT_MAX is
    # a ValueError naming the variable
    server, _ = www
    monkeypatch.setenv("KORNIA_DOWNLOAD_TIMEOUT", value)
    with pytest.raises(ValueError, match="KORNIA_DOWNLOAD_TIMEOUT must be a number of seconds"):
        Loader.download(f"{server.url}/a.onnx", str(tmp_path / "a.onnx"))
    assert server.requests == []
    monkeypatch.setenv("KORNIA_DOWNLOAD_TIMEOUT", " ")  # blank is unset
    Loader.download(f"{server.url}/a.onnx", str(tmp_path / "a.onnx"))
    assert (tmp_path / "a.onnx").is_file()


def test_an_interrupted_download_leaves_no_file(www, tmp_path):
    # kornia: a KeyboardInterrupt mid-transfer leaves nothing at the path, nor a partial file
    server, _ = www
    server.stall = True
    target = tmp_path / "cache" / "a.onnx"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            Loader.download(f"{server.url}/a.onnx", str(target))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert server.count("GET") == 1 and list(target.parent.iterdir()) == []


# --- kornia's cache: kornia_config and its layout ----------------------------------------------


def test_without_kornia_the_cache_is_at_kornias_default_paths(www, hub, tmp_path, monkeypatch):
    # kornia/config.py: hub_cache_dir ".kornia_hub", hub_onnx_dir ".kornia_hub/onnx_models",
    # relative to the working folder; a URL model under <hub_onnx_dir>/<scheme>/<host>/...,
    # hf://folder/name at <hub_onnx_dir>/folder/name.onnx, or <cache_dir>/name.onnx
    server, _ = www
    hub_server, _ = hub
    monkeypatch.chdir(tmp_path)
    assert Loader._get_file_path("some_model", None, suffix=".onnx") == os.path.join(".kornia_hub", "some_model.onnx")
    assert Loader._get_file_path("ops/m", "", suffix=".onnx") == os.path.join("ops", "m.onnx")
    path = Loader.download_to_cache(f"{server.url}/a.onnx", "operators/a", suffix=".onnx")
    assert path == os.path.join(".kornia_hub", "operators", "a.onnx")
    Loader.load_model(f"{server.url}/a.onnx")
    Loader.load_model("hf://operators/double")
    Loader.load_model("hf://operators/double", cache_dir="mine")
    port = server.url.rsplit(":", 1)[1]
    assert files_under(tmp_path / ".kornia_hub") == [
        f"onnx_models/http/127.0.0.1%3A{port}/a.onnx",
        "onnx_models/operators/double.onnx",
        "operators/a.onnx",
    ]
    assert files_under(tmp_path / "mine") == ["double.onnx"]
    assert hub_server.count("GET", "/kornia/ONNX_models/resolve/main/operators/double.onnx") == 2


def test_a_model_kornia_cached_is_found_without_a_request(www, hub, tmp_path, monkeypatch):
    server, root = www
    hub_server, _ = hub
    monkeypatch.chdir(tmp_path)
    port = server.url.rsplit(":", 1)[1]
    # what kornia left in its cache (these files are not what the servers hold)
    cached = {
        f".kornia_hub/onnx_models/http/127.0.0.1%3A{port}/a.onnx": scale_model(7.0),
        ".kornia_hub/onnx_models/operators/double.onnx": scale_model(5.0),
    }
    for name, model in cached.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, tmp_path / name)
    url_model = Loader.load_model(f"{server.url}/a.onnx", download=False)
    hub_model = Loader.load_model("hf://operators/double")
    assert url_model == scale_model(7.0) and hub_model == scale_model(5.0)
    assert server.requests == [] and hub_server.requests == []


def test_kornia_config_is_read_when_kornia_is_imported(www, hub, tmp_path, monkeypatch):
    # kornia reads kornia_config.hub_cache_dir / hub_onnx_dir at each call; fastseq reads them
    # from the kornia.config module a kornia program has imported (it never imports kornia)
    server, _ = www
    config = types.SimpleNamespace(hub_cache_dir=str(tmp_path / "c"), hub_onnx_dir=str(tmp_path / "o"))
    monkeypatch.setitem(sys.modules, "kornia.config", types.SimpleNamespace(kornia_config=config))
    assert Loader._get_file_path("ops/m", None, ".onnx") == os.path.join(str(tmp_path / "c"), "ops", "m.onnx")
    Loader.load_model(f"{server.url}/a.onnx")
    Loader.load_model("hf://operators/double")
    config.hub_onnx_dir = str(tmp_path / "later")  # changed between calls, as kornia allows
    Loader.load_model("hf://operators/double")
    port = server.url.rsplit(":", 1)[1]
    assert files_under(tmp_path / "o") == [f"http/127.0.0.1%3A{port}/a.onnx", "operators/double.onnx"]
    assert files_under(tmp_path / "later") == ["operators/double.onnx"]


def test_load_model_fetches_through_download_as_kornia_does(hub, tmp_path):
    """kornia's load_model goes through ``cls.download_to_cache`` and ``cls.download`` with
    these arguments: a subclass that overrides ``download`` (to add a header, a mirror...)
    is used for every model it loads."""
    calls = []

    class Recording(fastseq.ONNXLoader):
        @classmethod
        def download(cls, url, file_path, download_if_not_exists=True, **kwargs):
            calls.append((url, file_path, download_if_not_exists, kwargs))
            super().download(url, file_path, download_if_not_exists, **kwargs)

    server, _ = hub
    cache = str(tmp_path / "cache")
    model = Recording.load_model("hf://operators/double", cache_dir=cache)
    Recording.load_model("hf://operators/double", cache_dir=cache, force_download=True)
    url = f"{server.url}/kornia/ONNX_models/resolve/main/operators/double.onnx"
    path = os.path.join(cache, "double.onnx")
    assert calls == [(url, path, True, {}), (url, path, True, {"force_download": True})]
    assert model == scale_model(2.0)


def test_a_garbage_model_still_never_enters_kornias_cache(tmp_path, monkeypatch):
    """kornia keeps whatever arrives; fastseq decodes a model before keeping it (its rule
    for every download), on kornia's paths too. Other files are kept as they are."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "m.onnx").write_bytes(bytes(range(256)) * 4)
    server = serve_files(www)
    monkeypatch.chdir(tmp_path)
    try:
        with pytest.raises(fastseq.DownloadError, match="not a whole ONNX model"):
            Loader.load_model(f"{server.url}/m.onnx")
        assert files_under(tmp_path / ".kornia_hub") == []
        path = Loader.download_to_cache(f"{server.url}/m.onnx", "raw", suffix=".bin")
        assert Path(path).read_bytes() == (www / "m.onnx").read_bytes()
    finally:
        server.close()


# --- the metadata stamp ------------------------------------------------------------------------


def test_add_metadata_stamps_kornias_source_and_version_in_a_kornia_program(monkeypatch):
    # kornia: ("source", "kornia"), ("version", kornia.__version__), then the pairs, one
    # entry per key (first position, last value), values as str
    model = fastseq.add_metadata(scale_model(1.0), [("test_key", "test_value")])
    assert [(p.key, p.value) for p in model.metadata_props] == [
        ("source", "fastseq"),
        ("version", fastseq.__version__),
        ("test_key", "test_value"),
    ]
    monkeypatch.setitem(sys.modules, "kornia", types.SimpleNamespace(__version__="0.9.0"))
    model = fastseq.add_metadata(scale_model(1.0), [("test_key", "test_value")])
    model = fastseq.add_metadata(model, [("test_key", 2)])
    assert [(p.key, p.value) for p in model.metadata_props] == [
        ("source", "kornia"),
        ("version", "0.9.0"),
        ("test_key", "2"),
    ]
    onnx.checker.check_model(model)
    repeated = scale_model(1.0)
    for key, value in [("source", "kornia"), ("version", "0.8.0"), ("author", "a"), ("author", "b")]:
        entry = repeated.metadata_props.add()
        entry.key, entry.value = key, value
    assert [(p.key, p.value) for p in fastseq.add_metadata(repeated, [("date", "20261001")]).metadata_props] == [
        ("source", "kornia"),
        ("version", "0.9.0"),
        ("author", "b"),
        ("date", "20261001"),
    ]
    pipe = fastseq.ONNXSequential(scale_model(2.0))
    assert pipe.add_metadata() and pipe.metadata == {"source": "kornia", "version": "0.9.0"}


# --- HF_HUB_OFFLINE ----------------------------------------------------------------------------


def test_hf_hub_offline_is_about_the_hub_only(www, hub, tmp_path, monkeypatch):
    # kornia downloads any http(s) URL whatever HF_HUB_OFFLINE says; fastseq's offline
    # switch for every URL is FASTSEQ_OFFLINE
    server, _ = www
    hub_server, _ = hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    url = f"{server.url}/a.onnx"
    assert Loader.load_model(url, cache_dir=tmp_path / "loader") == scale_model(2.0)
    np.testing.assert_allclose(fastseq.ONNXSequential(url, cache_dir=tmp_path / "own")(X)[0], np.maximum(2 * X, 0))
    assert loader.url_download(url, tmp_path / "direct").is_file()
    # the Hub itself is not asked
    with pytest.raises(fastseq.DownloadError, match="not cached and HF_HUB_OFFLINE is set"):
        Loader.load_model("hf://operators/double", cache_dir=tmp_path / "hf")
    assert hub_server.requests == []
    monkeypatch.setenv("FASTSEQ_OFFLINE", "1")
    with pytest.raises(fastseq.DownloadError, match="offline"):
        fastseq.ONNXSequential(f"{server.url}/a.onnx", cache_dir=tmp_path / "fresh")
