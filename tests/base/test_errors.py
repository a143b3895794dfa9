"""fastseq's exception classes (fastseq.errors): each is ``fastseq.<Name>`` (in tracebacks and
for pickle), crosses a process boundary as itself (pickle, a real ProcessPoolExecutor; Ray in
tests/integrations/test_ray.py), and derives from the standard class kornia or onnx.compose
raise for the same failure, so that code written for them keeps catching it."""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
import sys
import traceback
import urllib.error
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import onnx
import pytest

import fastseq
from conftest import scale_model
from fastseq import _core, errors
from servers import serve_files

PUBLIC = sorted(errors.__all__)


def core_errors(tmp_path: Path) -> dict[str, BaseException]:
    """One error of each class that the Rust core raises, raised by the core."""
    found = {}
    attempts = {
        "LoadError": lambda: fastseq.compose([b"garbage"]),
        "CompositionError": lambda: fastseq.compose([scale_model(1.0), scale_model(2.0)], io_maps=[[("nope", "x")]]),
        "OpsetMismatchError": lambda: fastseq.compose([scale_model(2.0, opset=13), scale_model(3.0, opset=17)]),
        "ExportError": lambda: fastseq.compose_to_file([scale_model(1.0)], tmp_path / "missing" / "m.onnx"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(fastseq.FastseqError) as info:
            attempt()
        found[name] = info.value
    return found


def test_every_class_is_named_fastseq_dot_name_and_pickles_as_itself():
    for name in PUBLIC:
        cls = getattr(fastseq, name)
        assert cls is getattr(errors, name)
        assert f"{cls.__module__}.{cls.__qualname__}" == f"fastseq.{name}"
        assert issubclass(cls, fastseq.FastseqError)
        error = cls(f"a {name}")
        error.add_note("a note")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and str(back) == f"a {name}" and back.args == error.args
        assert back.__notes__ == ["a note"]
        assert traceback.format_exception_only(back)[0].startswith(f"fastseq.{name}: a {name}")


def test_the_core_raises_the_python_classes(tmp_path):
    for name, error in core_errors(tmp_path).items():
        assert type(error) is getattr(fastseq, name), name
        assert getattr(_core, name) is getattr(fastseq, name)  # _core re-exports them
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert traceback.format_exception_only(error)[0].startswith(f"fastseq.{name}: ")


def test_classes_derive_from_what_kornia_and_onnx_compose_raise():
    # kornia raises ValueError for a missing model, an HTTP error or a forbidden download,
    # TimeoutError for a stalled one, urllib's ContentTooShortError for a short one;
    # onnx.compose ValueError for models it cannot join.
    for name in (
        "LoadError",
        "DownloadError",
        "PipelineFileError",
        "OperatorError",
        "CompositionError",
        "OpsetMismatchError",
        "InputError",
        "ProviderError",
    ):
        assert issubclass(getattr(fastseq, name), ValueError), name
    assert issubclass(fastseq.DownloadTimeoutError, (fastseq.DownloadError, TimeoutError))
    assert issubclass(fastseq.RunTimeoutError, TimeoutError)
    truncated = fastseq.TruncatedDownloadError
    assert issubclass(truncated, fastseq.DownloadError) and issubclass(truncated, urllib.error.ContentTooShortError)
    error = truncated("http://h/m.onnx: truncated", received=3, announced=8)
    assert str(error) == "http://h/m.onnx: truncated" and (error.received, error.announced) == (3, 8)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is truncated and (back.received, back.announced, back.content) == (3, 8, b"")
    timeout = pickle.loads(pickle.dumps(fastseq.DownloadTimeoutError("quiet")))
    assert type(timeout) is fastseq.DownloadTimeoutError and str(timeout) == "quiet" and timeout.errno is None


def test_the_cause_travels_when_it_pickles_and_is_described_when_it_does_not():
    try:
        try:
            raise OSError(104, "Connection reset by peer")
        except OSError as e:
            raise fastseq.DownloadError("http://h/m.onnx: download failed") from e
    except fastseq.DownloadError as e:
        back = pickle.loads(pickle.dumps(e))
    assert type(back.__cause__) is ConnectionResetError and back.__cause__.errno == 104
    assert back.__suppress_context__
    # An HTTPError holds the open response and cannot be rebuilt from its args: its class
    # and text travel instead.
    try:
        try:
            raise urllib.error.HTTPError("http://h/m.onnx", 404, "Not Found", {}, None)
        except urllib.error.HTTPError as e:
            raise fastseq.DownloadError("Error in resolving http://h/m.onnx") from e
    except fastseq.DownloadError as e:
        back = pickle.loads(pickle.dumps(e))
    assert type(back) is fastseq.DownloadError
    assert str(back.__cause__) == "urllib.error.HTTPError: HTTP Error 404: Not Found"


# --- across a real process boundary --------------------------------------------------------


def _compose_garbage() -> None:
    fastseq.compose([b"garbage"])


def _download(url: str, target: str) -> None:
    fastseq.ONNXLoader.download(url, target)


def test_errors_raised_in_a_process_pool_arrive_as_themselves(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    server = serve_files(tmp_path)
    server.truncate = True
    try:
        # spawn: a fresh interpreter, as on macOS and Windows; nothing inherited by fork
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            with pytest.raises(fastseq.LoadError, match="not a valid ONNX model") as load:
                pool.submit(_compose_garbage).result()
            with pytest.raises(fastseq.DownloadError, match="Error in resolving") as http:
                pool.submit(_download, f"{server.url}/missing.onnx", str(tmp_path / "out" / "m.onnx")).result()
            with pytest.raises(fastseq.TruncatedDownloadError) as short:
                pool.submit(_download, f"{server.url}/a.onnx", str(tmp_path / "out" / "a.onnx")).result()
    finally:
        server.close()
    assert type(load.value) is fastseq.LoadError
    assert type(http.value) is fastseq.DownloadError and isinstance(http.value, ValueError)
    assert type(short.value) is fastseq.TruncatedDownloadError and short.value.announced > short.value.received
    # The pool puts the worker's traceback, causes included, in __cause__.
    assert "urllib.error.HTTPError: HTTP Error 404" in str(http.value.__cause__)
    assert not (tmp_path / "out" / "m.onnx").exists() and not (tmp_path / "out" / "a.onnx").exists()


def test_import_fastseq_pays_neither_for_pickle_nor_for_urllib():
    code = (
        "import sys, fastseq\n"
        "print(sorted(m for m in ('pickle', 'urllib.error') if m in sys.modules))\n"
        "assert fastseq.TruncatedDownloadError.__mro__[1] is fastseq.DownloadError\n"
        "print('urllib.error' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "True"]
