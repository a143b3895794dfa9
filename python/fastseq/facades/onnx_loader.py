"""ONNXLoader: kornia's ``kornia.onnx.ONNXLoader`` (load, download and list the models of
the Hub repo ``kornia/ONNX_models``; its ``CachedDownloader`` methods too), on fastseq's
downloader: downloads are atomic and checked before they are kept.

It keeps kornia's cache where kornia keeps it: ``kornia_config.hub_cache_dir`` for
:meth:`ONNXLoader.download_to_cache` and ``kornia_config.hub_onnx_dir`` for models, read from
kornia when the program has imported it (fastseq never imports kornia), else kornia's
defaults ``.kornia_hub`` and ``.kornia_hub/onnx_models``; the files sit at kornia's paths, so
a model that kornia cached is found and the other way round. It raises what kornia raises
where code catches it, as fastseq's own classes: a missing model or an HTTP error is a
``LoadError``/``DownloadError`` (a ``ValueError``), a short transfer a
``TruncatedDownloadError`` (``ContentTooShortError``), a stalled one a
``DownloadTimeoutError`` (``TimeoutError``); and it tries a download once, as kornia does."""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import posixpath
import pprint
import shutil
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastseq import _core
from fastseq.errors import DownloadError, LoadError
from fastseq.sources import download as downloads
from fastseq.sources import resolve as loader

if TYPE_CHECKING:
    import onnx

__all__ = ["ONNXLoader"]

#: kornia's defaults for ``kornia_config.hub_cache_dir`` and ``hub_onnx_dir``.
KORNIA_CACHE_DIR = ".kornia_hub"
KORNIA_ONNX_DIR = os.path.join(".kornia_hub", "onnx_models")
#: Characters kornia leaves unquoted in the folders of a URL's cache name.
_SAFE = "!$&'()+,;=@[]~"
#: Set by load_model around its downloads: the file is a model, which the core decodes before
#: it is kept. Not an argument of ``download``: load_model calls ``download`` with kornia's
#: arguments, so that a subclass that overrides it (kornia's way to customise fetching) keeps
#: working.
_MODEL_FILE = contextvars.ContextVar("fastseq_onnx_loader_model_file", default=False)


def kornia_dirs() -> tuple[str, str]:
    """``(hub_cache_dir, hub_onnx_dir)``: ``kornia.config.kornia_config``'s when kornia is
    imported already (a kornia program may have changed them), else kornia's defaults."""
    config = getattr(sys.modules.get("kornia.config"), "kornia_config", None)
    if config is None:
        return KORNIA_CACHE_DIR, KORNIA_ONNX_DIR
    return os.fspath(config.hub_cache_dir), os.fspath(config.hub_onnx_dir)


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
    """A URL's cache name, kornia's: ``<scheme>/<host>[%3A<port>]/<directories>[/%3F<hash>]/<file>``,
    the directories resolved as RFC 3986 resolves ``.`` and ``..``, host and directories
    percent-encoded, a query folded into a folder named after its hash."""
    parts = urllib.parse.urlsplit(url)
    *dirs, file_name = parts.path.split("/")
    if file_name in ("", ".", ".."):
        raise LoadError(f"{url!r} does not end in a file name to cache it under")
    host = parts.hostname
    if not host:
        raise LoadError(f"{url!r} has no host")
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    folder = posixpath.normpath("/" + "/".join(dirs))  # from the root: no ".." climbs out
    names = [parts.scheme, urllib.parse.quote(host, safe=_SAFE)]
    names += [urllib.parse.quote(d, safe=_SAFE) for d in folder.split("/") if d]
    if parts.query:
        names.append("%3F" + hashlib.sha256(parts.query.encode()).hexdigest()[:16])
    return "/".join([*names, file_name])


def _onnx_data_name(name: str) -> str:
    """The name of the ``.onnx_data`` weights beside the model ``name``."""
    return (name[: -len(".onnx")] if name.endswith(".onnx") else name) + ".onnx_data"


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
    """Loads, downloads and lists ONNX models: a drop-in for ``kornia.onnx.ONNXLoader`` and
    its base ``kornia.onnx.download.CachedDownloader`` (same class methods, arguments,
    cache paths and error classes)."""

    #: The Hub repo that ``hf://NAME`` ids and the listings refer to.
    REPO = loader.KORNIA_REPO

    @classmethod
    def _get_file_path(
        cls, model_name: str, cache_dir: str | os.PathLike[str] | None, suffix: str | None = None
    ) -> str:
        """Where ``model_name`` (a relative path such as ``operators/resize``) is cached under
        ``cache_dir`` (``~`` expanded; None: ``kornia_config.hub_cache_dir``, ``.kornia_hub``
        by default; ``""``: the working folder), with ``suffix`` appended to the file name
        unless it ends with it: kornia's path, as a ``str``. Absolute names and empty, ``.``
        or ``..`` components are a LoadError (a ``ValueError``, as in kornia)."""
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
        root = kornia_dirs()[0] if cache_dir is None else os.fspath(cache_dir)
        return os.path.join(os.path.expanduser(root), *components[:-1], file_name)

    @classmethod
    def download(
        cls, url: str, file_path: str, download_if_not_exists: bool = True, *, force_download: bool = False
    ) -> None:
        """Downloads ``url`` to ``file_path`` (folders created), atomically: the file appears
        complete or not at all, and a failed ``force_download`` leaves the old one. One
        attempt, as in kornia; each wait for the server is bounded by
        ``KORNIA_DOWNLOAD_TIMEOUT`` (default 60 s).

        Args:
            url: an ``http(s)://`` URL.
            file_path: where to write it (``~`` expanded).
            download_if_not_exists: when False, a missing file is a DownloadError instead of
                a download.
            force_download: download even when ``file_path`` exists, and replace it.

        Raises:
            DownloadError: the download is forbidden or not an http(s) URL, or the server
                answered an HTTP error (the ``HTTPError`` is the cause) or cannot be reached.
                A ``ValueError``, as kornia raises.
            TruncatedDownloadError: the body was shorter than its ``Content-Length``
                (urllib's ``ContentTooShortError``, as kornia raises).
            DownloadTimeoutError: the server went quiet for longer than the timeout (a
                ``TimeoutError``, as kornia raises).
        """
        model = _MODEL_FILE.get()
        cls._fetch(url, Path(file_path).expanduser(), download_if_not_exists, force_download, model=model)

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
        # url_download (size limit, checks, atomic write) into a scratch cache beside the
        # target, then one rename: the target is never half-written.
        scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".download"))
        try:
            fetched = downloads.url_download(url, scratch, force_download=True, model=model, retries=1)
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
            cache_dir: the cache root (default ``kornia_config.hub_cache_dir``, i.e.
                ``.kornia_hub`` unless a kornia program changed it; ``""`` is the working
                folder).
            suffix: appended to the file name unless it already ends with it.
            force_download: download again and replace the cached file.
        """
        if not url.startswith(("http://", "https://")):
            raise DownloadError(f"URL must start with 'http:' or 'https:', got {url!r}")
        file_path = cls._get_file_path(name, cache_dir, suffix)
        # kornia passes the keyword only when set, for subclasses whose download predates it
        extra = {"force_download": True} if force_download else {}
        cls.download(url, file_path, download_if_not_exists=download, **extra)
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
    ) -> onnx.ModelProto:
        """Loads a model as an ``onnx.ModelProto``, downloading it when needed.

        Args:
            model_name: ``hf://NAME`` (``NAME.onnx`` in ``kornia/ONNX_models``, e.g.
                ``hf://operators/resize``; fetched from ``$HF_ENDPOINT`` or huggingface.co,
                refused offline with ``HF_HUB_OFFLINE``), ``hf://org/repo[@rev]/file.onnx``
                (through huggingface_hub and its cache), an ``http(s)://`` URL, or a local path
                (an ``os.PathLike`` is always a path).
            download: when False, a model that is not cached is a DownloadError.
            with_data: also fetch the model's ``.onnx_data`` weights beside it (for a URL,
                ``<url without .onnx>.onnx_data``).
            force_download: download again even when cached.
            **kwargs: ``cache_dir`` only (the cache root); any other keyword is a TypeError.
                As in kornia, ``hf://folder/a/b`` is cached at ``<cache_dir>/a/b.onnx``, or at
                ``<kornia_config.hub_onnx_dir>/folder/a/b.onnx`` without ``cache_dir``; a URL
                at ``<root>/<scheme>/<host>/<directories>/<file>`` under either root.

        Raises:
            LoadError: a local file that does not exist (a ``ValueError``, as in kornia) or
                does not load.
            DownloadError: see :meth:`download`.
        """
        cache_dir = cls._cache_dir_kwarg("ONNXLoader.load_model", kwargs)
        text, local = _path_text("ONNXLoader.load_model", model_name)
        if force_download and not download:
            raise ValueError("force_download=True needs download=True")
        if local or not text.startswith(("hf://", "http://", "https://")):
            path = os.path.expanduser(text)
            if not os.path.exists(path):
                raise LoadError(f"File {text} not found")
            return cls._load(text, path)
        hub = text.startswith("hf://")
        if hub:
            ref = loader.parse_hub_id(text)  # refuses '..' and empty parts before any request
            if text.partition("#")[0].endswith(".onnx") or ref.sha256 is not None:
                # not a kornia id: through huggingface_hub, its cache, token and revisions
                return cls._load(text, cls._hub_file(text, cache_dir, download, force_download))
            name = text[len("hf://") :]
            endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
            url, data_url = (f"{endpoint}/{cls.REPO}/resolve/main/{name}{ext}" for ext in (".onnx", ".onnx_data"))
            if cache_dir:
                relative = name.partition("/")[2] or name  # under an explicit cache_dir, the path after the folder
            else:
                cache_dir, relative = kornia_dirs()[1], name
            data_name = relative
        else:
            url, relative = text, _url_name(text)
            parts = urllib.parse.urlsplit(text)
            data_url = urllib.parse.urlunsplit(parts._replace(path=_onnx_data_name(parts.path)))
            data_name = _onnx_data_name(relative)
            cache_dir = cache_dir or kornia_dirs()[1]
        files = [(url, relative, ".onnx", True)] + ([(data_url, data_name, ".onnx_data", False)] if with_data else [])
        paths = []
        for file_url, file_name, suffix, model in files:
            if hub and download and loader.hub_offline():
                path = cls._get_file_path(file_name, cache_dir, suffix)
                if force_download or not os.path.exists(path):
                    raise DownloadError(f"{text}: {path} is not cached and HF_HUB_OFFLINE is set")
            token = _MODEL_FILE.set(model)
            try:
                paths.append(
                    cls.download_to_cache(
                        file_url,
                        file_name,
                        download=download,
                        cache_dir=cache_dir,
                        suffix=suffix,
                        force_download=force_download,
                    )
                )
            finally:
                _MODEL_FILE.reset(token)
        return cls._load(text, paths[0])

    @staticmethod
    def _load(source: str, path: str | Path) -> onnx.ModelProto:
        import onnx
        from onnx.external_data_helper import load_external_data_for_model

        try:
            # The core's opens: a FIFO or a device in the cache is refused without blocking
            # (onnx.load's plain open would wait on a FIFO for ever), for the model file and
            # for each external data file onnx will read.
            with os.fdopen(_core.open_input(path), "rb") as f:
                model = onnx.load_model_from_string(f.read())
            locations = _core.external_data_locations(os.fspath(path))
            folder = Path(path).parent
            for location in locations:
                os.close(_core.open_input(folder / location))
            if locations:
                load_external_data_for_model(model, os.fspath(folder))
            return model
        except LoadError as e:
            raise LoadError(f"{source}: {e}") from None
        except Exception as e:  # onnx raises DecodeError, OSError or its own
            raise LoadError(
                f"{source}: the file at {path} does not load ({e}); if it is a damaged cached copy, "
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
            **kwargs: ``cache_dir`` only (the cache root, default ``kornia_config.hub_cache_dir``;
                the file lands at ``<root>/<scheme>/<host>/<directories>/<file>``, as in
                kornia); any other keyword is a TypeError.
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
            with os.fdopen(_core.open_input(path), "rb") as f:  # a FIFO is refused, never waited on
                return json.load(f)
        except LoadError as e:
            raise LoadError(f"{text}: {e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise LoadError(
                f"{text}: not valid JSON ({e}); if it is a damaged cached copy, pass force_download=True"
            ) from e

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
