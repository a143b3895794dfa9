"""ONNXLoader: kornia's ``kornia.onnx.ONNXLoader`` (load, download and list the models of
the Hub repo ``kornia/ONNX_models``), on fastseq's loader: downloads are atomic, Hub
models go through huggingface_hub (its cache, token, ``HF_ENDPOINT`` and offline mode),
and failures are ``DownloadError``/``LoadError`` naming the model."""

from __future__ import annotations

import json
import os
import pprint
import shutil
import tempfile
import urllib.parse
from pathlib import Path, PurePosixPath
from typing import Any

from fastseq.sources import resolve as loader
from fastseq.errors import DownloadError, LoadError

__all__ = ["ONNXLoader"]


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir:
        return Path(os.fspath(cache_dir)).expanduser()
    return loader._default_cache() / "onnx"


def _path_text(method: str, value: Any) -> tuple[str, bool]:
    """The text of a ``str`` or ``os.PathLike`` argument, and whether it is a PathLike
    (which always names a local file, as in kornia)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value), True
    if isinstance(value, str):
        return value, False
    hint = " For a serialized model, pass onnx.load_model_from_string(data)." if isinstance(value, bytes) else ""
    raise TypeError(f"{method} takes a str or an os.PathLike, got {type(value).__name__}.{hint}")


def _url_name(url: str) -> str:
    """A URL's cache name: ``<scheme>/<host[:port]>/<directories>/<file>`` (kornia's
    layout, with the query folded into a hash folder)."""
    import hashlib

    parts = urllib.parse.urlsplit(url)
    *dirs, file_name = parts.path.split("/")
    if file_name in ("", ".", ".."):
        raise LoadError(f"{url!r} does not end in a file name to cache it under")
    if not parts.hostname:
        raise LoadError(f"{url!r} has no host")
    host = parts.hostname + (f"%3A{parts.port}" if parts.port is not None else "")
    safe = [urllib.parse.quote(d, safe="") for d in dirs if d not in ("", ".", "..")]
    if parts.query:
        safe.append("%3F" + hashlib.sha256(parts.query.encode()).hexdigest()[:16])
    return "/".join([parts.scheme, host, *safe, file_name])


def _umask() -> int:
    """The process's umask, read without changing it (Linux); 0o022 elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


class ONNXLoader:
    """Loads, downloads and lists ONNX models: a drop-in for ``kornia.onnx.ONNXLoader``
    (same class methods and arguments)."""

    #: The Hub repo that ``hf://NAME`` ids and the listings refer to.
    REPO = loader.KORNIA_REPO

    @classmethod
    def _get_file_path(
        cls, model_name: str, cache_dir: str | os.PathLike[str] | None, suffix: str | None = None
    ) -> str:
        """Where ``model_name`` (a relative path such as ``operators/resize``) is cached under
        ``cache_dir``, with ``suffix`` appended to the file name unless it ends with it.
        Absolute names and empty, ``.`` or ``..`` components are a LoadError."""
        components = model_name.replace(os.sep, "/").split("/")
        if any(c in ("", ".", "..") or os.path.basename(c) != c for c in components):
            raise LoadError(
                f"{model_name!r}: a cache name must be a relative path without empty, '.' or '..' components"
            )
        file_name = components[-1]
        if suffix is not None and not file_name.endswith(suffix):
            file_name += suffix
            if os.path.basename(file_name) != file_name:
                raise LoadError(f"suffix {suffix!r} must not add a folder to the file name")
        return str(_cache_root(cache_dir).joinpath(*components[:-1], file_name))

    @classmethod
    def download(
        cls, url: str, file_path: str, download_if_not_exists: bool = True, *, force_download: bool = False
    ) -> None:
        """Downloads ``url`` to ``file_path`` (folders created), atomically: the file appears
        complete or not at all, and a failed ``force_download`` leaves the old one.

        Args:
            url: an ``http(s)://`` URL.
            file_path: where to write it (``~`` expanded).
            download_if_not_exists: when False, a missing file is a DownloadError instead of
                a download.
            force_download: download even when ``file_path`` exists, and replace it.
        """
        cls._fetch(url, Path(file_path).expanduser(), download_if_not_exists, force_download, model=False)

    @classmethod
    def _fetch(cls, url: str, target: Path, download_if_not_exists: bool, force_download: bool, model: bool) -> None:
        """:meth:`download`; with ``model``, the core decodes the file before it is kept."""
        if force_download and not download_if_not_exists:
            raise ValueError("force_download=True needs download_if_not_exists=True")
        if target.exists() and not force_download:
            return
        if not download_if_not_exists:
            raise DownloadError(f"{target} not found; pass download=True to fetch {url}")
        if not url.startswith(("http://", "https://")):
            raise DownloadError(f"{url!r}: expected an http:// or https:// URL")
        target.parent.mkdir(parents=True, exist_ok=True)
        # url_download (retries, size limit, atomic write) into a scratch cache beside the
        # target, then one rename: the target is never half-written.
        scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".download"))
        try:
            fetched = loader.url_download(url, scratch, force_download=True, model=model)
            # The scratch file is private (0600); the file the caller named gets the usual
            # permissions, as a plain download would.
            os.chmod(fetched, 0o666 & ~_umask())
            os.replace(fetched, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @classmethod
    def download_to_cache(
        cls,
        url: str,
        name: str,
        download: bool = True,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        suffix: str | None = None,
        force_download: bool = False,
    ) -> str:
        """Downloads ``url`` into the cache as ``name`` (a relative path, ``suffix`` appended
        to its file name) unless it is there, and returns the local path.

        Args:
            url: an ``http(s)://`` URL.
            name: the relative path under the cache root, e.g. ``operators/resize``.
            download: when False, a file missing from the cache is a DownloadError.
            cache_dir: the cache root (default ``$FASTSEQ_CACHE/onnx``, else
                ``~/.cache/fastseq/onnx``).
            suffix: appended to the file name unless it already ends with it.
            force_download: download again and replace the cached file.
        """
        if not url.startswith(("http://", "https://")):
            raise DownloadError(f"URL must start with 'http:' or 'https:', got {url!r}")
        file_path = cls._get_file_path(name, cache_dir, suffix)
        cls.download(url, file_path, download_if_not_exists=download, force_download=force_download)
        return file_path

    @classmethod
    def load_model(
        cls,
        model_name: str | os.PathLike[str],
        download: bool = True,
        with_data: bool = False,
        *,
        force_download: bool = False,
        **kwargs: Any,
    ):
        """Loads a model as an ``onnx.ModelProto`` (with its external data), downloading it
        when needed.

        Args:
            model_name: ``hf://NAME`` (``NAME.onnx`` in ``kornia/ONNX_models``, e.g.
                ``hf://operators/resize``; ``hf://org/repo[@rev]/file.onnx`` works too), an
                ``http(s)://`` URL, or a local path (an ``os.PathLike`` is always a path).
            download: when False, a model that is not cached is a DownloadError.
            with_data: also fetch the model's ``.onnx_data`` weights beside it. Hub models
                always bring the external-data files they reference; for a URL this fetches
                ``<url without .onnx>.onnx_data``.
            force_download: download again even when cached.
            **kwargs: ``cache_dir`` only (the cache root); any other keyword is a TypeError.
                URLs are cached at ``<cache_dir>/<scheme>/<host>/<directories>/<file>`` as in
                kornia; ``hf://`` models go through huggingface_hub's cache, of which
                ``cache_dir`` is the root (kornia keeps its own layout there).
        """
        import onnx

        cache_dir = cls._cache_dir_kwarg("ONNXLoader.load_model", kwargs)
        text, local = _path_text("ONNXLoader.load_model", model_name)
        if force_download and not download:
            raise ValueError("force_download=True needs download=True")
        if not local and text.startswith("hf://"):
            path = cls._hub_file(text, cache_dir, download, force_download)
        elif not local and text.startswith(("http://", "https://")):
            path = Path(cls._get_file_path(_url_name(text), cache_dir, ".onnx"))
            cls._fetch(text, path, download, force_download, model=True)
            if with_data:
                parts = urllib.parse.urlsplit(text)
                stem = parts.path[: -len(".onnx")] if parts.path.endswith(".onnx") else parts.path
                data_url = urllib.parse.urlunsplit(parts._replace(path=stem + ".onnx_data"))
                data_path = path.parent / (PurePosixPath(stem).name + ".onnx_data")
                cls.download(data_url, str(data_path), download, force_download=force_download)
        else:
            path = Path(text).expanduser()
            if not path.exists():
                raise LoadError(f"File {text} not found")
        try:
            return onnx.load(str(path))
        except Exception as e:  # onnx raises DecodeError, OSError or its own
            raise LoadError(
                f"{text}: the file at {path} does not load ({e}); if it is a damaged cached copy, "
                "pass force_download=True"
            ) from e

    @classmethod
    def load_config(
        cls, url: str | os.PathLike[str], download: bool = True, *, force_download: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        """Loads a JSON config (e.g. a preprocessor's) from an ``http(s)://`` URL, cached,
        or from a local file.

        Args:
            url: the URL or local path (an ``os.PathLike`` is always a path).
            download: when False, a URL that is not cached is a DownloadError.
            force_download: download again even when cached.
            **kwargs: ``cache_dir`` only; any other keyword is a TypeError.
        """
        cache_dir = cls._cache_dir_kwarg("ONNXLoader.load_config", kwargs)
        text, local = _path_text("ONNXLoader.load_config", url)
        if not local and text.startswith(("http://", "https://")):
            path = Path(
                cls.download_to_cache(
                    text, _url_name(text), download, cache_dir=cache_dir, suffix=".json", force_download=force_download
                )
            )
        else:
            path = Path(text).expanduser()
            if not path.is_file():
                raise LoadError(f"{text}: neither an http(s) URL nor an existing local file")
        try:
            with open(path, "rb") as f:
                return json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise LoadError(f"{text}: not valid JSON ({e}); if it is a damaged cached copy, pass force_download=True") from e

    @classmethod
    def list_files(cls, folder: str, *, revision: str | None = None, token: str | bool | None = None) -> list[str]:
        """The paths of the files and folders directly in ``folder`` of the Hub repo
        (``"operators"``, ``"models"``), through huggingface_hub (``HF_ENDPOINT`` honoured).
        Offline (``HF_HUB_OFFLINE``) or with the Hub unreachable, a DownloadError at once."""
        return loader.hub_listing(cls.REPO, folder, revision, token)

    @classmethod
    def list_operators(cls) -> None:
        """Prints the operators in the ``operators`` folder of the Hub repo (as kornia does;
        :meth:`list_files` returns them instead)."""
        pprint.pp(cls.list_files("operators"))

    @classmethod
    def list_models(cls) -> None:
        """Prints the models in the ``models`` folder of the Hub repo (as kornia does;
        :meth:`list_files` returns them instead)."""
        pprint.pp(cls.list_files("models"))

    @staticmethod
    def _cache_dir_kwarg(method: str, kwargs: dict[str, Any]) -> str | os.PathLike[str] | None:
        for key in kwargs:
            if key != "cache_dir":
                raise TypeError(f"{method}() got an unexpected keyword argument {key!r}")
        return kwargs.get("cache_dir") or None

    @classmethod
    def _hub_file(
        cls, ref: str, cache_dir: str | os.PathLike[str] | None, download: bool, force_download: bool
    ) -> Path:
        if download:
            return loader.hub_download(ref, cache_dir, force_download)
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        hub = loader.parse_hub_id(ref)
        try:
            return Path(
                hf_hub_download(
                    hub.repo_id,
                    hub.filename,
                    revision=hub.revision,
                    cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
                    local_files_only=True,
                )
            )
        except LocalEntryNotFoundError as e:
            raise DownloadError(f"{ref}: not in the cache; pass download=True to fetch it") from e
