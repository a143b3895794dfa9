"""Model sources: ModelProto, operators, bytes, paths, http(s) URLs and Hugging Face Hub ids.

Everything is resolved to what the Rust core reads: serialized bytes or a local path (which
the core reads into memory of its own). Downloads land in a cache and are written atomically:
URLs through :mod:`fastseq.sources.download`, Hub ids through huggingface_hub (here).
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, Union

from fastseq import _core
from fastseq.errors import DownloadError, LoadError
from fastseq.ops.operator import Operator
from fastseq.sources.download import check_sha256, url_download

if TYPE_CHECKING:
    import onnx

ModelSource = Union["onnx.ModelProto", Operator, bytes, bytearray, memoryview, str, "os.PathLike[str]"]


def is_model_proto(model: object) -> TypeGuard[onnx.ModelProto]:
    """An ``onnx.ModelProto``, without importing onnx (loaded already if one exists)."""
    onnx = sys.modules.get("onnx")
    return onnx is not None and isinstance(model, onnx.ModelProto)


#: kornia's convention: ``hf://operators/resize`` is ``operators/resize.onnx`` in this repo.
KORNIA_REPO = "kornia/ONNX_models"


@dataclass(frozen=True)
class Resolved:
    """What the core reads: ``data`` is serialized bytes or a local path."""

    data: bytes | str | tuple[str, str] | _core.Composed
    label: str


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    filename: str
    revision: str | None
    sha256: str | None


def resolve_local(model: ModelSource, index: int) -> Resolved:
    """Resolves a source that needs no network (anything but a URL or an hf:// id)."""
    if is_model_proto(model):
        name = model.graph.name or f"model #{index}"
        return Resolved(model.SerializeToString(), f"{name} (#{index})")
    if isinstance(model, Operator):
        return Resolved(bytes(model), f"{model.name} (#{index})")
    if isinstance(model, (bytes, bytearray, memoryview)):
        return Resolved(bytes(model), f"model #{index} (bytes)")
    if isinstance(model, str) and model.startswith("builtin:"):
        return resolve_builtin(model)
    if isinstance(model, _core.Composed):
        # A model the core holds keeps the label it was loaded under (a pipeline's stages,
        # composed again by combine(): the same stages, the same names for their nodes).
        labels = [st["label"] for st in model.plan()["stages"]]
        return Resolved(model, labels[0] if len(labels) == 1 and labels[0] else f"model #{index}")
    if isinstance(model, (str, os.PathLike)):
        path = Path(os.fspath(model)).expanduser()
        try:
            path.stat()
        except (FileNotFoundError, NotADirectoryError):
            pass
        except (OSError, ValueError) as e:  # a name too long, a NUL byte, a loop of links
            raise LoadError(f"{os.fspath(model)[:200]}: cannot be read: {getattr(e, 'strerror', None) or e}") from None
        if not path.exists():
            hint = near_path(path)
            if not hint and not path.suffix:
                hint = f" (a Hub id is written 'hf://{model}')"
            raise LoadError(f"{path}: no such file{hint}")
        return Resolved(str(path), path.name)
    raise TypeError(
        f"model #{index}: expected an onnx.ModelProto, a fastseq.ops operator, bytes, a path, a URL, "
        f"an hf:// id or builtin:NAME, got {type(model).__name__}"
    )


#: A folder with more entries than this is not listed for a near miss (a typo costs no scan
#: of a huge folder).
NEAR_LISTING = 10_000


def near_path(path: Path) -> str:
    """`` (did you mean 'models/model.onnx'?)`` for a path that does not exist: the first part
    of it that is missing, matched against the entries of the folder above it (the path
    with that part replaced, as the user wrote the rest); an empty string when nothing there
    is close."""
    parts = path.parts
    for k in range(len(parts)):
        here = Path(*parts[: k + 1])
        try:
            if here.exists():
                continue
            with os.scandir(here.parent) as entries:
                names = [e.name for _, e in zip(range(NEAR_LISTING + 1), entries)]
        except (OSError, ValueError):  # an unreadable folder, a name too long: no hint
            return ""
        if len(names) > NEAR_LISTING:
            return ""
        hint = _core.did_you_mean(parts[k], names)
        if not hint:
            return ""
        # Each near miss as the whole path, so that it can be pasted.
        for near in _core.did_you_mean(parts[k], names)[len(" (did you mean ") : -2].split(" or "):
            whole = str(Path(*parts[:k], near.strip("'"), *parts[k + 1 :]))
            hint = hint.replace(near, f"'{whole}'", 1)
        return hint
    return ""


def no_such_file(path: str | os.PathLike[str]) -> str:
    """``PATH: no such file``, with the near miss in its folder if there is one."""
    return f"{os.fspath(path)}: no such file{near_path(Path(os.fspath(path)).expanduser())}"


def resolve_builtin(model: str) -> Resolved:
    """``builtin:NAME?KEY=VALUE&...`` (or a bare ``NAME``) is an operator built by
    :mod:`fastseq.ops`; ``builtin:shipped/NAME`` a model shipped in ``fastseq/ops/shipped``,
    byte for byte (which a name means: ``fastseq.ops.shipped.named``)."""
    from fastseq import ops
    from fastseq.ops import shipped as operators

    spec = model[len("builtin:") :]
    file = operators.named(spec)
    if file is not None:
        return Resolved(str(file), model)
    return Resolved(bytes(ops.from_string(spec, others=operators.builtin_names())), model)


def resolve(
    model: ModelSource,
    index: int,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force_download: bool = False,
    token: str | bool | None = None,
    sha256: str | None = None,
) -> Resolved:
    """Resolves any source, downloading URLs and Hub ids into the cache. ``sha256`` (or a
    ``#sha256=`` fragment) is checked before a download is used; a local file is checked too."""
    if sha256 is not None and not (
        isinstance(sha256, str) and len(sha256) == 64 and all(c in "0123456789abcdefABCDEF" for c in sha256)
    ):
        raise LoadError(
            f"{model if isinstance(model, str) else f'model #{index}'}: sha256 must be 64 hex digits, got {sha256!r}"
        )
    if isinstance(model, str) and model.startswith("hf://"):
        path = hub_download(model, cache_dir, force_download, token, sha256=sha256)
        # The Hub cache links snapshot files into blobs/: external data may resolve anywhere
        # in the repo's cache folder, and nowhere else.
        # (path = <repo folder>/snapshots/<revision>/<filename>)
        repo_folder = path.parents[len(Path(parse_hub_id(model).filename).parts) + 1]
        return Resolved((str(path), str(repo_folder)), model)
    if isinstance(model, str) and model.startswith(("http://", "https://")):
        path = url_download(model, cache_dir, force_download, sha256=sha256, model=True)
        return Resolved(str(path), model.partition("#")[0].rsplit("/", 1)[-1] or model)
    resolved = resolve_local(model, index)
    if sha256 is not None:
        if isinstance(resolved.data, str):
            check_sha256(Path(resolved.data), sha256, resolved.label)
        elif isinstance(resolved.data, bytes) and hashlib.sha256(resolved.data).hexdigest() != sha256.lower():
            raise DownloadError(f"{resolved.label}: sha256 mismatch: expected {sha256}")
    return resolved


def parse_hub_id(ref: str) -> HubRef:
    """``hf://operators/resize`` (kornia), ``hf://org/repo/dir/file.onnx``,
    ``hf://org/repo@rev/file.onnx``; any of them may end in ``#sha256=<hex>``."""
    body = ref[len("hf://") :]
    body, _, fragment = body.partition("#")
    sha = None
    if fragment:
        key, _, value = fragment.partition("=")
        if key != "sha256" or len(value) != 64:
            raise LoadError(f"{ref}: the only fragment understood is #sha256=<64 hex digits>")
        sha = value.lower()
    if body.endswith(".onnx"):
        parts = body.split("/")
        if len(parts) < 3:
            raise LoadError(f"{ref}: expected hf://org/repo/path/file.onnx")
        repo, at, revision = "/".join(parts[:2]).partition("@")
        hub = HubRef(repo, "/".join(parts[2:]), revision if at else None, sha)
    elif not body or body.startswith("/"):
        raise LoadError(f"{ref}: empty Hub id")
    else:
        hub = HubRef(KORNIA_REPO, body + ".onnx", None, sha)
    # Checked before any request: each part becomes a URL path and a path in the cache.
    for what, text in (("repository", hub.repo_id), ("revision", hub.revision), ("file", hub.filename)):
        if text is None:
            continue
        bad = [s for s in text.split("/") if s in ("", ".", "..") or "\\" in s or "\0" in s]
        if bad:
            raise DownloadError(
                f"{ref}: the {what} {text!r} has an empty, '.' or '..' part (or a backslash); "
                "a Hub id is hf://org/repo[@revision]/path/file.onnx with plain names"
            )
    return hub


def hub_download(
    ref: str,
    cache_dir: str | os.PathLike[str] | None = None,
    force_download: bool = False,
    token: str | bool | None = None,
    *,
    sha256: str | None = None,
) -> Path:
    """Downloads an hf:// model through huggingface_hub (its cache, token and offline mode),
    with the external-data files it references. With an expected sha256 (argument or
    ``#sha256=`` fragment), a cached copy that does not match is fetched again.

    A file that is not cached fails at once when the Hub is unreachable or ``HF_HUB_OFFLINE``
    is set (huggingface_hub alone would retry for about 20 s), and a missing file, revision
    or repository is named as such."""
    hub = parse_hub_id(ref)
    repo = _HubRepo(
        ref=ref,
        repo_id=hub.repo_id,
        revision=hub.revision,
        # Read at call time, so that HF_ENDPOINT set after import is honoured too.
        endpoint=os.environ.get("HF_ENDPOINT") or None,
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        token=token,
    )
    expected = sha256 or hub.sha256
    path, fetched = repo.download(hub.filename, force_download)
    if expected is not None:
        try:
            check_sha256(path, expected, ref)
        except DownloadError:
            if force_download:
                _discard_fetched(path, fetched)
                raise
            path, fetched = repo.download(hub.filename, True)  # a corrupt cached copy: once more from the server
            try:
                check_sha256(path, expected, ref)
            except DownloadError:
                _discard_fetched(path, fetched)
                raise
    try:
        locations = _core.external_data_locations(str(path))  # decodes the model: every check but its data
    except LoadError as e:
        _discard_fetched(path, fetched)
        detail = str(e).removeprefix(f"{path}: ")
        if fetched:
            raise DownloadError(
                f"{ref}: the download is not a whole ONNX model, so it was not kept: {detail}"
            ) from None
        raise DownloadError(
            f"{ref}: the cached copy at {path} is not a whole ONNX model ({detail}); pass "
            "force_download=True to fetch it again"
        ) from None
    folder = os.path.dirname(hub.filename)
    for location in locations:
        # Untrusted: checked by the core's rule before it becomes a download (and a path in
        # the cache).
        try:
            _core.LAYOUT.check_location(location)
        except LoadError as e:
            raise LoadError(f"{ref}: {e}") from None
        repo.download(f"{folder}/{location}" if folder else location, force_download)
    return path


def _discard_fetched(path: Path, fetched: bool) -> None:
    """Removes a file that this call fetched into huggingface_hub's cache and that failed its
    checks (the snapshot's link and the blob it points to), so that no later load finds it.
    A file that was cached before the call is not this call's to remove."""
    if not fetched:
        return
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path and blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)


def hub_listing(repo_id: str, folder: str, revision: str | None = None, token: str | bool | None = None) -> list[str]:
    """The paths directly in ``folder`` of the Hub repository ``repo_id``. Like a download
    of a file that is not cached, it fails at once with a DownloadError when
    ``HF_HUB_OFFLINE`` is set or the Hub is unreachable (one request, no retries first:
    huggingface_hub alone would retry for about 20 s)."""
    import urllib.parse

    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import build_hf_headers, get_session

    where = f"{repo_id}/{folder}"
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    if hub_offline():
        raise DownloadError(f"cannot list {where}: listing the Hub needs the network, and HF_HUB_OFFLINE is set")
    url = (
        f"{endpoint}/api/models/{repo_id}/tree/{urllib.parse.quote(revision or 'main', safe='')}/"
        f"{urllib.parse.quote(folder)}"
    )
    try:
        get_session().get(url, headers=build_hf_headers(token=token), timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as e:  # connection refused, DNS, timeouts: whatever the HTTP client raises
        raise DownloadError(f"cannot list {where}: the Hub at {endpoint} is unreachable ({_causes(e)})") from e
    try:
        return [
            entry.path
            for entry in HfApi(endpoint=endpoint).list_repo_tree(repo_id, folder, revision=revision, token=token)
        ]
    except Exception as e:  # huggingface_hub raises many kinds; all are a failed listing
        raise DownloadError(f"cannot list {where}: {_causes(e)}") from e


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (read now, not only when huggingface_hub was imported) or FASTSEQ_OFFLINE."""
    from huggingface_hub import constants

    truthy = ("1", "on", "yes", "true")
    return (
        constants.is_offline_mode()
        or os.environ.get("HF_HUB_OFFLINE", "").lower() in truthy
        or os.environ.get("FASTSEQ_OFFLINE", "").lower() in truthy
    )


@dataclass(frozen=True)
class _HubRepo:
    """One repository at one revision, as an hf:// id names it."""

    ref: str
    repo_id: str
    revision: str | None
    endpoint: str | None
    cache_dir: str | None
    token: str | bool | None

    @property
    def where(self) -> str:
        return f"{self.repo_id} at {self.revision or 'main'}"

    def download(self, filename: str, force: bool) -> tuple[Path, bool]:
        """``filename`` from the cache or the Hub, and whether it was fetched now (rather
        than found in the cache). Errors say which of file, revision, repository, access or
        network is at fault, with the cause."""
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import LocalEntryNotFoundError

        kwargs: dict[str, Any] = dict(
            repo_id=self.repo_id,
            filename=filename,
            revision=self.revision,
            endpoint=self.endpoint,
            cache_dir=self.cache_dir,
            token=self.token,
        )
        if hub_offline():
            if force:
                raise DownloadError(f"{self.ref}: force_download=True needs the Hub, but HF_HUB_OFFLINE is set")
            try:
                return Path(hf_hub_download(**kwargs, local_files_only=True)), False
            except LocalEntryNotFoundError:
                raise DownloadError(
                    f"{self.ref}: {filename} of {self.where} is not in the cache and HF_HUB_OFFLINE is set"
                ) from None
        cached = (
            None
            if force
            else try_to_load_from_cache(self.repo_id, filename, cache_dir=self.cache_dir, revision=self.revision)
        )
        if not isinstance(cached, str):
            # Not cached: huggingface_hub would retry an unreachable Hub for ~20 s before
            # giving up, so ask once, without retries, and say what is wrong.
            self._probe(filename, force)
        try:
            path = Path(hf_hub_download(**kwargs, force_download=force))
        except Exception as e:  # huggingface_hub raises many kinds; all are a failed download
            raise DownloadError(f"{self.ref}: download of {filename} from {self.where} failed: {_causes(e)}") from e
        # huggingface_hub fetches again when the Hub has a newer file: then the blob differs.
        return path, force or not isinstance(cached, str) or os.path.realpath(cached) != os.path.realpath(path)

    def _probe(self, filename: str, force: bool) -> None:
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        url = hf_hub_url(self.repo_id, filename, revision=self.revision, endpoint=self.endpoint)
        endpoint = self.endpoint or constants.ENDPOINT
        need = (
            "force_download=True asks for a fresh copy" if force else f"{filename} of {self.where} is not in the cache"
        )
        try:
            get_hf_file_metadata(url, token=self.token, timeout=constants.HF_HUB_ETAG_TIMEOUT)
        except GatedRepoError as e:
            raise DownloadError(
                f"{self.ref}: {self.repo_id} is gated: accept its terms on the Hub and pass "
                f"token= (or log in with `hf auth login`)"
            ) from e
        except RepositoryNotFoundError as e:
            raise DownloadError(
                f"{self.ref}: repository {self.repo_id} not found at {endpoint} (a private repository needs token=)"
            ) from e
        except RevisionNotFoundError as e:
            raise DownloadError(f"{self.ref}: revision {self.revision or 'main'} not found in {self.repo_id}") from e
        except EntryNotFoundError as e:
            raise DownloadError(f"{self.ref}: {filename} not found in {self.where}") from e
        except HfHubHTTPError as e:
            status = getattr(e.response, "status_code", None)
            if status == 404:
                raise DownloadError(f"{self.ref}: {filename} not found in {self.where}") from e
            if status in (401, 403):
                raise DownloadError(
                    f"{self.ref}: access to {self.repo_id} refused (HTTP {status}): pass token= "
                    f"(or log in with `hf auth login`)"
                ) from e
            raise DownloadError(
                f"{self.ref}: the Hub at {endpoint} answered HTTP {status} for {filename} ({_causes(e)}) and {need}"
            ) from e
        except Exception as e:  # connection refused, DNS, timeouts: httpx or requests
            raise DownloadError(f"{self.ref}: the Hub at {endpoint} is unreachable ({_causes(e)}) and {need}") from e


def _causes(e: BaseException) -> str:
    """``e`` and what caused it, in one line: huggingface_hub's force-download failure says
    only "failed due to the above error", the cause being the useful part."""
    parts: list[str] = []
    seen: BaseException | None = e
    while seen is not None and len(parts) < 4:
        text = " ".join(str(seen).split()) or type(seen).__name__
        if text not in parts:
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    return ": ".join(parts)
