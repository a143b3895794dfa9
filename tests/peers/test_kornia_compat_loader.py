"""Side by side with kornia 0.9's ``ONNXLoader`` and ``CachedDownloader``: the cases of
test_kornia_parity.py run against both, on the same loopback servers, and must agree (the
class raised, the cause, the path a file lands at, the requests made, the metadata).

kornia imports torch, a multi-GB install: marked ``torch`` and left out of the default run
(``pip install kornia==0.9.0 && python -m pytest -m torch``)."""

from __future__ import annotations

import os
import threading
import urllib.error
import warnings
from pathlib import Path

import onnx
import pytest

import fastseq
from conftest import files_under, scale_model

pytestmark = pytest.mark.torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    kornia_onnx = pytest.importorskip("kornia.onnx")

import kornia  # noqa: E402
from kornia.config import kornia_config  # noqa: E402
from kornia.onnx.download import CachedDownloader  # noqa: E402

SIDES = {"kornia": kornia_onnx.ONNXLoader, "fastseq": fastseq.ONNXLoader}


@pytest.fixture(autouse=True)
def no_settings(monkeypatch):
    for name in ("KORNIA_DOWNLOAD_TIMEOUT", "HF_HUB_OFFLINE", "FASTSEQ_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


def raised(call) -> BaseException:
    try:
        call()
    except BaseException as e:  # noqa: BLE001  (compared below)
        return e
    raise AssertionError("nothing was raised")


def test_kornias_downloader_is_fastseqs_loader():
    assert issubclass(kornia_onnx.ONNXLoader, CachedDownloader)
    for method in ("download", "download_to_cache", "_get_file_path"):
        assert hasattr(fastseq.ONNXLoader, method)


def test_a_missing_model(tmp_path):
    for side, loader in SIDES.items():
        error = raised(lambda: loader.load_model("non_existent_model.onnx"))
        assert isinstance(error, ValueError) and "File non_existent_model.onnx not found" in str(error), side


def test_an_http_error_a_forbidden_download_and_a_short_transfer(www, tmp_path):
    server, _ = www
    for side, loader in SIDES.items():
        folder = tmp_path / side
        error = raised(lambda: loader.download(f"{server.url}/missing.pth", str(folder / "m.pth")))
        assert isinstance(error, ValueError) and "Error in resolving" in str(error), side
        assert isinstance(error.__cause__, urllib.error.HTTPError) and error.__cause__.code == 404, side
        assert list(folder.iterdir()) == [], side
        asked = len(server.requests)
        error = raised(lambda: loader.download(f"{server.url}/a.onnx", str(folder / "off.pth"), False))
        assert isinstance(error, ValueError) and "not found" in str(error) and len(server.requests) == asked, side
        server.truncate = True
        error = raised(
            lambda: loader.download_to_cache(f"{server.url}/a.onnx", "m", cache_dir=str(folder), suffix=".pth")
        )
        server.truncate = False
        assert isinstance(error, urllib.error.ContentTooShortError), side
        assert len(server.requests) == asked + 1 and list(folder.iterdir()) == [], side  # one attempt


def test_kornia_download_timeout(www, tmp_path, monkeypatch):
    server, _ = www
    monkeypatch.setenv("KORNIA_DOWNLOAD_TIMEOUT", "0.2")
    server.stall = True
    for side, loader in SIDES.items():
        errors: list[BaseException] = []
        target = tmp_path / side / "a.onnx"

        def work():
            try:
                loader.download(f"{server.url}/a.onnx", str(target))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(30)  # a hang guard: the variable says 0.2 s, the default would be 30-60 s
        assert not worker.is_alive() and len(errors) == 1 and isinstance(errors[0], TimeoutError), (side, errors)
        assert list(target.parent.iterdir()) == [], side
    for value in ("abc", "0", "inf"):
        monkeypatch.setenv("KORNIA_DOWNLOAD_TIMEOUT", value)
        for side, loader in SIDES.items():
            asked = len(server.requests)
            error = raised(lambda: loader.download(f"{server.url}/a.onnx", str(tmp_path / side / "b.onnx")))
            assert isinstance(error, ValueError) and "KORNIA_DOWNLOAD_TIMEOUT" in str(error), (side, value)
            assert len(server.requests) == asked, (side, value)


def test_the_same_cache_paths(www, tmp_path, monkeypatch):
    server, root = www
    (root / "sub").mkdir()
    onnx.save(scale_model(2.0), root / "sub" / "a.onnx")
    cases = [
        ("some_model", None, ".onnx"),
        (os.path.join("operators", "m"), None, ".onnx"),
        ("m.onnx", "cache", ".onnx"),
        ("a/b", "~/cache", ".json"),
        ("m", "", None),
    ]
    for hub_cache_dir in (".kornia_hub", str(tmp_path / "custom")):
        monkeypatch.setattr(kornia_config, "hub_cache_dir", hub_cache_dir)
        for case in cases:
            assert SIDES["kornia"]._get_file_path(*case) == SIDES["fastseq"]._get_file_path(*case), case
    monkeypatch.setattr(kornia_config, "hub_cache_dir", ".kornia_hub")
    urls = [
        f"{server.url}/a.onnx",
        f"{server.url}/sub/../a.onnx",
        f"{server.url}/a.onnx?v=2",
        f"{server.url}//sub/./a.onnx",
    ]
    for side, loader in SIDES.items():
        (tmp_path / side).mkdir()
        monkeypatch.chdir(tmp_path / side)
        for url in urls:
            loader.load_model(url)
        loader.download_to_cache(f"{server.url}/a.onnx", "configs/a", suffix=".json")
    assert files_under(tmp_path / "kornia") == files_under(tmp_path / "fastseq")
    assert len(files_under(tmp_path / "kornia")) == 4  # "/sub/../a.onnx" is "/a.onnx"


def test_what_kornia_cached_fastseq_finds_and_the_other_way_round(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for hub_onnx_dir in (os.path.join(".kornia_hub", "onnx_models"), str(tmp_path / "elsewhere")):
        monkeypatch.setattr(kornia_config, "hub_onnx_dir", hub_onnx_dir)
        for n, (writer, reader) in enumerate([("kornia", "fastseq"), ("fastseq", "kornia")]):
            name = f"operators/m{n}"
            model = scale_model(float(n + 3))
            path = Path(SIDES[writer]._get_file_path(name, hub_onnx_dir, ".onnx"))
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, path)
            assert SIDES[reader].load_model(f"hf://{name}", download=False) == model, (writer, reader)
            cache = tmp_path / f"explicit{n}"
            cache.mkdir(exist_ok=True)
            onnx.save(model, Path(SIDES[writer]._get_file_path(f"m{n}", str(cache), ".onnx")))
            assert SIDES[reader].load_model(f"hf://{name}", download=False, cache_dir=str(cache)) == model


def test_the_same_metadata():
    pairs = [[("test_key", "test_value")], [("test_key", 2), ("n", 3)], None]
    k, f = scale_model(1.0), scale_model(1.0)
    for entry in ("a", "b"):
        for model in (k, f):
            model.metadata_props.add(key="author", value=entry)
    for extra in pairs:
        kornia_onnx.add_metadata(k, extra)
        fastseq.add_metadata(f, extra)
        assert [(p.key, p.value) for p in f.metadata_props] == [(p.key, p.value) for p in k.metadata_props]
    assert ("version", kornia.__version__) in [(p.key, p.value) for p in f.metadata_props]


def test_hf_hub_offline_does_not_stop_a_plain_url(www, tmp_path, monkeypatch):
    server, _ = www
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for side, loader in SIDES.items():
        assert loader.load_model(f"{server.url}/a.onnx", cache_dir=str(tmp_path / side)) == scale_model(2.0), side
