"""The session cache: the model ONNX Runtime leaves after its graph optimisations, stored
under a key, so that a later start of the same pipeline skips them.

An entry is a folder ``<root>/<key>/`` with ``model.onnx``, its weights in ``model.data``,
``manifest.json`` (the key's parts, each file's size and XXH3 digest, the pipeline's stage
labels, when it was made) and ``usage`` (hits; its time is the last use). The key covers
everything that changes the optimised graph: the composed model's digest (computed by the
core from where its weights are, while the kernel writes the session's copy of them), the
onnxruntime version, the machine, the providers with their options and the session options
that steer optimisation.

Trust (SECURITY.md has the threat model): the root and its entries are used only when they
are the user's own and nobody else can write to them (:mod:`.cachedir`); entries are made
private, written into a private folder and renamed into place, so readers see a whole entry
or none. What is verified is what ONNX Runtime loads: the entry's files are hard-linked into
a private folder, checked there (regular files of ours, sizes and digests as the manifest
says) and loaded from there, so that swapping a file in the entry after the check changes
nothing. A damaged entry is removed and rebuilt; a foreign one (a link, another user's, a
manifest naming other files) is left alone and not used. Any failure to read or write the
cache is a warning and a start without it, never a failed start.

The cache is bounded (:class:`SessionCache`'s ``max_size``): storing an entry first removes
the least recently used ones beyond the limit, never one that another process is loading.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import platform
import re
import stat
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from fastseq import _core
from fastseq.errors import FastseqError, human_size
from fastseq.runtime.cachedir import (
    DATA,
    MANIFEST,
    MODEL,
    USAGE,
    Folder,
    Refused,
    Root,
    Temp,
    check_own,
    open_dir,
    read_file,
    write_file,
)

FORMAT = 2
#: The default limit: room for a few large pipelines on a laptop's disk.
DEFAULT_MAX = 2 << 30
_MANIFEST_LIMIT = 1 << 20

# Session config entries that change what the optimisers do (the others, threads and
# logging among them, do not change the optimised graph).
_OPTIMISATION_CONFIG = (
    "session.disable_quant_qdq",
    "session.enable_quant_qdq_cleanup",
    "session.disable_double_qdq_remover",
    "session.disable_aot_function_inlining",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "session.qdq_matmulnbits_accuracy_level",
    "optimization.enable_gelu_approximation",
    "optimization.disable_specified_optimizers",
    "optimization.minimal_build_optimizations",
    "optimization.enable_cast_chain_elimination",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
    "session.use_device_allocator_for_initializers",
)


def default_root() -> Path:
    """``$FASTSEQ_CACHE/sessions`` or ``~/.cache/fastseq/sessions``."""
    base = os.environ.get("FASTSEQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastseq"
    )
    return Path(base) / "sessions"


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({f"{u}ib": _UNITS[u] for u in "kmgt"})
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(value: int | str, what: str = "size") -> int:
    """Bytes from an int or a string such as ``"2G"``, ``"512MiB"``, ``"1.5GB"`` (K, M, G,
    T and KiB... are powers of 1024; KB, MB... powers of 1000)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(value))
    if m is None or m.group(2).lower() not in _UNITS:
        raise FastseqError(f"{what} {value!r}: expected a size such as 2G, 512M or 1500000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_duration(value: float | str, what: str = "duration") -> float:
    """Seconds from a number or a string such as ``"30d"``, ``"12h"``, ``"90m"``, ``"2w"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([smhdw]?)\s*", str(value))
    if m is None:
        raise FastseqError(f"{what} {value!r}: expected a duration such as 30d, 12h, 90m or 45s")
    return float(m.group(1)) * _SECONDS[m.group(2) or "s"]


class SessionCache:
    """Where ONNX Runtime's optimised models are kept between starts: pass one as
    ``session_cache=`` (a folder or True makes one with the defaults).

    Args:
        path: the folder (default ``$FASTSEQ_CACHE/sessions``, else
            ``~/.cache/fastseq/sessions``). fastseq makes it private (0700) and marks it
            with a ``CACHEDIR.TAG``; a folder that another user owns or that others can write
            to is not used (a warning; the pipeline starts without the cache).
        max_size: the most bytes its entries may take, an int or a string such as ``"2G"``
            or ``"500MB"`` (default: ``FASTSEQ_SESSION_CACHE_MAX``, else 2 GiB). Storing an
            entry removes the least recently used ones beyond it (never one that another
            process is loading); an entry larger than the limit is not stored.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, max_size: int | str | None = None) -> None:
        self.path = default_root() if path is None else Path(os.fspath(path)).expanduser()
        if max_size is None:
            env = os.environ.get("FASTSEQ_SESSION_CACHE_MAX", "").strip()
            self.max_size = parse_size(env, "FASTSEQ_SESSION_CACHE_MAX") if env else DEFAULT_MAX
        else:
            self.max_size = parse_size(max_size, "max_size")

    def __repr__(self) -> str:
        return f"SessionCache({str(self.path)!r}, max_size={human_size(self.max_size)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionCache) and (self.path, self.max_size) == (other.path, other.max_size)

    def __hash__(self) -> int:
        return hash((self.path, self.max_size))

    def entries(self) -> list[dict[str, Any]]:
        """The entries, least recently used first: ``key``, ``labels`` (the pipeline's
        stages), ``providers``, ``onnxruntime``, ``bytes``, ``created``, ``used`` (times in
        seconds since the epoch), ``hits``, ``damaged`` (True for an entry whose manifest
        cannot be read) and, for an entry that is not used (a link, another user's),
        ``refused`` (why). Raises FastseqError if the folder is not a fastseq session cache."""
        with _maintained(self.path) as root:
            return [] if root is None else _listing(root)

    def prune(
        self, max_size: int | str | None = None, older_than: float | str | None = None, *, dry_run: bool = False
    ) -> list[dict[str, Any]]:
        """Removes entries last used more than ``older_than`` ago (seconds, or a string such
        as ``"30d"``), then the least recently used ones until the rest fit in ``max_size``
        (with neither: this cache's own limit). Entries that another process is loading are
        kept. Returns the entries removed (with ``dry_run``, those that would be), as
        :meth:`entries` describes them."""
        limit = self.max_size if max_size is None and older_than is None else (
            None if max_size is None else parse_size(max_size, "max_size"))
        age = None if older_than is None else parse_duration(older_than, "older_than")
        with _maintained(self.path) as root:
            if root is None:
                return []
            with root.lock():
                return _evict(root, limit, age, dry_run)

    def clear(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """Removes every entry (but those another process is loading) and what killed
        processes left. Only what fastseq made is removed: entries by their name and
        contents, never a link or another file in the folder; a folder that is not a
        fastseq session cache is refused (FastseqError). Returns what was removed (with
        ``dry_run``, what would be), leftovers with ``"leftover": True``."""
        with _maintained(self.path) as root:
            if root is None:
                return []
            with root.lock():
                removed = _evict(root, 0, None, dry_run)
            return removed + [{"key": name, "bytes": 0, "leftover": True} for name in root.sweep(dry_run=dry_run)]


def root_from(setting: SessionCache | str | os.PathLike[str] | bool | None) -> SessionCache | None:
    """The cache for a ``session_cache=`` argument: a SessionCache, a folder, True for the
    default one, False for none; None reads ``FASTSEQ_SESSION_CACHE`` (a folder, or 1/true)."""
    if setting is None:
        env = os.environ.get("FASTSEQ_SESSION_CACHE", "").strip()
        if not env or env.lower() in ("0", "false", "no", "off"):
            return None
        setting = True if env.lower() in ("1", "true", "yes", "on") else env
    if setting is False:
        return None
    if isinstance(setting, SessionCache):
        return setting
    return SessionCache(None if setting is True else setting)


def key_parts(digest: str, providers: list[Any], options: Any) -> dict[str, Any]:
    """What the key is made of: readable, and stored in the entry's manifest."""
    import onnxruntime as ort

    config = {}
    for name in _OPTIMISATION_CONFIG:
        try:
            value = options.get_session_config_entry(name)
        except Exception:  # onnxruntime raises when the entry was never set
            continue
        config[name] = value
    return {
        "model": digest,
        "onnxruntime": ort.__version__,
        "machine": platform.machine(),
        "providers": [p if isinstance(p, str) else [p[0], {str(k): str(v) for k, v in sorted(p[1].items())}]
                      for p in providers],
        "graph_optimization_level": int(options.graph_optimization_level),
        "config": config,
    }


def key_of(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- a session through the cache -----------------------------------------------------------------
S = TypeVar("S")


def start(
    cache: SessionCache,
    parts: dict[str, Any],
    labels: Sequence[str],
    info: dict[str, Any],
    make: Callable[[str, bool, str | None], S],
    source: Callable[[], str],
) -> S:
    """A session through the cache. ``make(path, optimise, save_to)`` makes one from a model
    file (optimised or not, saving the optimised model at ``save_to``); ``source()`` gives
    the pipeline's private copy, waiting until it is written: only a start that does not
    use an entry asks for it. ``info`` receives ``cache`` ("hit", "stored" or None), ``key``
    and ``entry``."""
    key = key_of(parts)
    info.update(cache=None, key=key, entry=None)
    root = _open_root(cache.path)
    if root is None:
        return make(source(), True, None)
    with root:
        try:
            found = _lookup(root, key, parts)
        except (Refused, OSError) as e:
            _warn(f"{e}; not using the session cache (remove the entry by hand if it is not yours)"
                  if isinstance(e, Refused) else f"session cache {root.path}: could not read an entry ({e}); not caching")
            return make(source(), True, None)
        if found is not None:
            made = None
            with found:
                try:
                    made = make(found.model, False, None)
                except Exception as e:  # what ONNX Runtime refuses is rebuilt below
                    if found.verified():
                        _warn(f"session cache {root.path}: ONNX Runtime refused the entry {key} "
                              f"({_first_line(e)}); rebuilding it")
                if not found.verified():
                    made = None  # damaged weights: never used, rebuilt below
                elif made is not None:
                    found.count_hit()
            if made is not None:
                info.update(cache="hit", entry=str(root.path / key))
                return made
            root.remove_entry(key)
        return _store(root, cache, key, parts, labels, info, make, source)


def _store(root: Root, cache: SessionCache, key: str, parts: dict[str, Any], labels: Sequence[str],
           info: dict[str, Any], make: Callable[[str, bool, str | None], S], source: Callable[[], str]) -> S:
    path = source()  # a copy that cannot be written fails the start here, not as a store's failure
    try:
        root.sweep()  # what killed writers left
        temp = root.temp()
    except OSError as e:
        _warn(f"session cache {root.path} is not writable ({e.strerror or e}); not caching")
        return make(path, True, None)
    with temp:
        try:
            made = make(path, True, temp.name(MODEL))
        except Exception as e:
            # ONNX Runtime fails the whole session when it cannot write the optimised model
            # (a full disk): start without storing. A fault of the model fails again there.
            made = make(path, True, None)
            _warn(f"session cache {root.path}: could not store an entry ({_first_line(e)}); not caching")
            return made
        try:
            entry = _seal(root, temp, key, parts, labels, cache.max_size)
        except (OSError, Refused) as e:
            _warn(f"session cache {root.path}: could not store an entry ({e}); not caching")
            entry = None
    if entry is not None:
        info.update(cache="stored", entry=str(entry))
    return made


def _open_root(path: Path) -> Root | None:
    try:
        return Root.open(path, create=True)
    except Refused as e:
        _warn(f"{e}; not using it (the pipeline starts without the session cache)")
    except OSError as first:
        try:  # a cache that cannot be written may still be read
            return Root.open(path, create=False)
        except Refused as e:
            _warn(f"{e}; not using it (the pipeline starts without the session cache)")
        except OSError:
            _warn(f"session cache {path} is not writable ({first.strerror or first}); not caching")
    return None


class _Found:
    """An entry held where nobody can swap its files, checked (regular files of ours, their
    sizes, the model's digest) before ONNX Runtime reads the model. The data file's digest is
    computed beside ONNX Runtime's load of the same file (both read one inode, through the
    page cache: the disk is read once), and the session is used only once :meth:`verified`
    says it matched; weights are bytes ONNX Runtime does not interpret while it loads them."""

    def __init__(self, entry_fd: int, folder: Folder, temp: Temp | None, data: tuple[str, str] | None) -> None:
        self.entry_fd, self.folder, self.temp = entry_fd, folder, temp
        self.model = folder.name(MODEL)
        self._matches = data is None
        self._check = threading.Thread(target=self._digest, args=(data,), daemon=True) if data else None
        if self._check is not None:
            self._check.start()

    def _digest(self, data: tuple[str, str]) -> None:
        try:
            self._matches = _core.file_digest(self.folder.name(data[0])) == data[1]
        except OSError:
            self._matches = False

    def verified(self) -> bool:
        if self._check is not None:
            self._check.join()
        return self._matches

    def count_hit(self) -> None:
        """One more hit; the file's time is the last use. Cheap (a few bytes under a lock on
        their own file), safe with concurrent users, and skipped where it cannot be written."""
        try:
            fd = os.open(USAGE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                         dir_fd=self.entry_fd)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                fcntl.flock(fd, fcntl.LOCK_EX)
                text = f"{_hits(os.pread(fd, 32, 0)) + 1}\n".encode()
                os.pwrite(fd, text, 0)
                os.ftruncate(fd, len(text))
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> _Found:
        return self

    def __exit__(self, *exc: object) -> None:
        self.verified()  # the digest reads through the folder removed here
        if self.temp is not None:
            self.temp.remove()
        os.close(self.entry_fd)


def _lookup(root: Root, key: str, parts: dict[str, Any]) -> _Found | None:
    """The entry for ``key`` when it is whole, verified where it is loaded from. A damaged
    entry is removed (the store that follows rebuilds it); a foreign one is Refused."""
    entry_fd = root.open_entry(key)
    if entry_fd is None:
        return None
    what = f"session cache entry {root.path / key}"
    temp = None
    try:
        check_own(os.fstat(entry_fd), what)
        files = _manifest_files(entry_fd, parts, what)
        if files is not None:
            temp = _hold(root, entry_fd, files)
            folder = temp if temp is not None else Folder(root.path / key, entry_fd)
            if _checked(folder, files, what):
                return _Found(entry_fd, folder, temp, (DATA, files[DATA][1]) if DATA in files else None)
    except FileNotFoundError:
        pass  # a file the manifest names is missing: damaged
    except BaseException:
        if temp is not None:
            temp.remove()
        os.close(entry_fd)
        raise
    if temp is not None:
        temp.remove()
    os.close(entry_fd)
    root.remove_entry(key)
    return None


def _manifest_files(entry_fd: int, parts: dict[str, Any], what: str) -> dict[str, tuple[int, str]] | None:
    """The files the manifest lists with their sizes and digests, or None when it is not a
    whole manifest of this key (damaged, stale, another key's). A manifest naming anything
    but an entry's own files is Refused."""
    try:
        manifest = json.loads(read_file(entry_fd, MANIFEST, f"{what}: {MANIFEST}", _MANIFEST_LIMIT))
    except (ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("key") != parts:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or MODEL not in files:
        return None
    out = {}
    for name, value in files.items():
        if name not in (MODEL, DATA):
            raise Refused(f"{what}: its manifest names {name!r}, which is not a file of an entry")
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
                and isinstance(value[1], str)):
            return None
        out[name] = (value[0], value[1])
    return out


def _hold(root: Root, entry_fd: int, files: dict[str, tuple[int, str]]) -> Temp | None:
    """Hard links to the entry's files in a private folder of ours: checked and loaded there,
    they stay the files checked whatever is renamed in the entry afterwards. Handing ONNX
    Runtime the verified bytes instead (a private mapping or a read of the data file, as
    OrtValues through ``add_external_initializers``) was measured and is worse: it keeps
    them beside the pre-packed copies it makes, where from a file it maps the originals and
    lets them go (512 MB of MatMul weights: 1,162 MB peak RSS against 266 MB, 2.3-8.2 s
    against 0.9-1.0 s to a session). So the data file is verified and mapped as one inode.

    None for a cache that cannot be written (a read-only file system, where nothing in the
    entry can be renamed either): the entry's folder, held open, is used as it is."""
    try:
        temp = root.temp()
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return None
        raise
    try:
        for name in files:
            os.link(name, name, src_dir_fd=entry_fd, dst_dir_fd=temp.fd, follow_symlinks=False)
    except BaseException:
        temp.remove()
        raise
    return temp


def _checked(folder: Folder, files: dict[str, tuple[int, str]], what: str) -> bool:
    """Whether the files are regular files of ours of the manifest's sizes, and the model
    has the manifest's digest (the data file's is checked by :class:`_Found`)."""
    for name, (size, _) in files.items():
        st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{what}: {name} is not a regular file (a link, a pipe or a device)")
        check_own(st, f"{what}: {name}")
        if st.st_size != size:
            return False
    return _core.file_digest(folder.name(MODEL)) == files[MODEL][1]


def _seal(root: Root, temp: Temp, key: str, parts: dict[str, Any], labels: Sequence[str], max_size: int) -> Path | None:
    """Makes the files ONNX Runtime wrote into ``temp`` private, adds the manifest and
    renames the folder into place as the entry ``key``, after removing the least recently
    used entries beyond ``max_size``. Another process that stored the same key first wins."""
    files: dict[str, list[Any]] = {}
    for name in sorted(os.listdir(temp.fd)):
        if name not in (MODEL, DATA):
            raise OSError(f"onnxruntime wrote an unexpected file {name!r}")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=temp.fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"onnxruntime wrote {name!r} as something other than a file")
            os.fchmod(fd, 0o600)
            os.fsync(fd)
        finally:
            os.close(fd)
        files[name] = [st.st_size, _core.file_digest(temp.name(name))]
    if MODEL not in files:
        raise OSError(f"onnxruntime wrote no {MODEL}")
    size = sum(s for s, _ in files.values())
    if size > max_size:
        _warn(f"session cache {root.path}: this pipeline's entry ({human_size(size)}) is larger than the cache's "
              f"limit ({human_size(max_size)}; FASTSEQ_SESSION_CACHE_MAX or SessionCache(max_size=)); not stored")
        return None
    manifest = {"format": FORMAT, "key": parts, "files": files, "labels": list(labels), "created": time.time()}
    write_file(temp.fd, MANIFEST, json.dumps(manifest, indent=1).encode())
    os.fsync(temp.fd)
    with root.lock():
        _evict(root, max_size - size, None, False)
        try:
            os.rename(temp.path.name, key, src_dir_fd=root.fd, dst_dir_fd=root.fd)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return root.path / key  # stored by another process first: ours is dropped
        temp.close()  # the folder is the entry now: nothing to remove
    os.fsync(root.fd)
    return root.path / key


# --- what the cache holds --------------------------------------------------------------------------
def _listing(root: Root) -> list[dict[str, Any]]:
    found = [_describe(root, key) for key in root.entry_names()]
    return sorted((e for e in found if e is not None), key=lambda e: (e["used"] or 0, e["key"]))


def _describe(root: Root, key: str) -> dict[str, Any] | None:
    """An entry as :meth:`SessionCache.entries` shows it; None for what is not an entry."""
    try:
        fd = open_dir(key, key, dir_fd=root.fd)
    except (OSError, Refused):
        return None
    try:
        sizes, times, files = 0, [], []
        for name in (MODEL, DATA, MANIFEST, USAGE):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            sizes += st.st_size
            files.append((name, st))
            if name in (MANIFEST, USAGE):
                times.append(st.st_mtime)
        out: dict[str, Any] = {"key": key, "bytes": sizes, "used": max(times, default=None), "hits": 0,
                               "labels": None, "providers": None, "onnxruntime": None, "created": None,
                               "model": None, "damaged": False}
        try:
            check_own(os.fstat(fd), "the entry")
            for name, st in files:
                if not stat.S_ISREG(st.st_mode):
                    raise Refused(f"{name} is not a regular file")
                check_own(st, name)
            manifest = json.loads(read_file(fd, MANIFEST, MANIFEST, _MANIFEST_LIMIT))
            parts = manifest["key"]
            out.update(labels=manifest.get("labels"), created=manifest.get("created"),
                       providers=[p if isinstance(p, str) else p[0] for p in parts["providers"]],
                       onnxruntime=parts["onnxruntime"], model=parts.get("model"))
        except Refused as e:
            out["refused"] = str(e)
        except (OSError, ValueError, RecursionError, KeyError, TypeError, IndexError):
            out["damaged"] = True
        try:
            out["hits"] = _hits(read_file(fd, USAGE, USAGE, 64))
        except (OSError, Refused):
            pass
        return out
    finally:
        os.close(fd)


def _evict(root: Root, room: int | None, age: float | None, dry_run: bool) -> list[dict[str, Any]]:
    """Removes entries last used more than ``age`` seconds ago, then the least recently used
    until the rest take at most ``room`` bytes. Entries being loaded are skipped."""
    listing = _listing(root)
    total = sum(e["bytes"] for e in listing)
    now = time.time()
    removed = []
    for e in listing:  # least recently used first
        old = age is not None and (e["used"] or 0) < now - age
        over = room is not None and total > room
        if (old or over) and root.remove_entry(e["key"], dry_run):
            removed.append(e)
            total -= e["bytes"]
    return removed


@contextmanager
def _maintained(path: Path) -> Iterator[Root | None]:
    """The root for listing and removing: it must be a marked fastseq cache already (never
    marked here), else FastseqError; None when there is no folder."""
    try:
        root = Root.open(path, create=False, adopt=False)
    except FileNotFoundError:
        yield None
        return
    except Refused as e:
        raise FastseqError(f"{e}; nothing done") from None
    with root:
        try:
            yield root
        except Refused as e:
            raise FastseqError(f"{e}; stopped") from None


def _hits(raw: bytes) -> int:
    text = raw.strip()
    return int(text) if text.isdigit() else 0


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _warn(message: str) -> None:
    """A RuntimeWarning attributed to the first caller outside fastseq."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("fastseq"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)
