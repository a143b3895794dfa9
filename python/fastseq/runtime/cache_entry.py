"""A session through the session cache (see :mod:`fastseq.runtime.cache` for the design and
the trust model): the key, an entry found and verified where ONNX Runtime loads it, and a new
entry sealed into place."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import platform
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fastseq import _core
from fastseq.errors import human_size
from fastseq.runtime.cache import FORMAT, MANIFEST_LIMIT, SessionCache, evict, read_hits, warn
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
    read_file,
    write_file,
)

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


def key_parts(digest: str, providers: list[Any], options: Any) -> dict[str, Any]:
    """What the key is made of: readable, and stored in the entry's manifest."""
    import onnxruntime as ort

    config = {}
    for name in _OPTIMISATION_CONFIG:
        try:
            value = options.get_session_config_entry(name)
        except Exception:  # noqa: BLE001 - onnxruntime raises when the entry was never set
            continue
        config[name] = value
    return {
        "model": digest,
        "onnxruntime": ort.__version__,
        "machine": platform.machine(),
        "providers": [
            p if isinstance(p, str) else [p[0], {str(k): str(v) for k, v in sorted(p[1].items())}] for p in providers
        ],
        "graph_optimization_level": int(options.graph_optimization_level),
        "config": config,
    }


def key_of(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
            warn(
                f"{e}; not using the session cache (remove the entry by hand if it is not yours)"
                if isinstance(e, Refused)
                else f"session cache {root.path}: could not read an entry ({e}); not caching"
            )
            return make(source(), True, None)
        if found is not None:
            made = None
            with found:
                try:
                    made = make(found.model, False, None)
                except Exception as e:  # noqa: BLE001 - what ONNX Runtime refuses is rebuilt below
                    if found.verified():
                        warn(
                            f"session cache {root.path}: ONNX Runtime refused the entry {key} "
                            f"({_first_line(e)}); rebuilding it"
                        )
                if not found.verified():
                    made = None  # damaged weights: never used, rebuilt below
                elif made is not None:
                    found.count_hit()
            if made is not None:
                info.update(cache="hit", entry=str(root.path / key))
                return made
            root.remove_entry(key)
        return _store(root, cache, key, parts, labels, info, make, source)


def _store(
    root: Root,
    cache: SessionCache,
    key: str,
    parts: dict[str, Any],
    labels: Sequence[str],
    info: dict[str, Any],
    make: Callable[[str, bool, str | None], S],
    source: Callable[[], str],
) -> S:
    path = source()  # a copy that cannot be written fails the start here, not as a store's failure
    try:
        root.sweep()  # what killed writers left
        temp = root.temp()
    except OSError as e:
        warn(f"session cache {root.path} is not writable ({e.strerror or e}); not caching")
        return make(path, True, None)
    with temp:
        try:
            made = make(path, True, temp.name(MODEL))
        except Exception as e:  # noqa: BLE001 - tried once more below, without storing
            # ONNX Runtime fails the whole session when it cannot write the optimised model
            # (a full disk): start without storing. A fault of the model fails again there.
            made = make(path, True, None)
            warn(f"session cache {root.path}: could not store an entry ({_first_line(e)}); not caching")
            return made
        try:
            entry = _seal(root, temp, key, parts, labels, cache.max_size)
        except (OSError, Refused) as e:
            warn(f"session cache {root.path}: could not store an entry ({e}); not caching")
            entry = None
    if entry is not None:
        info.update(cache="stored", entry=str(entry))
    return made


def _open_root(path: Path) -> Root | None:
    try:
        return Root.open(path, create=True)
    except Refused as e:
        warn(f"{e}; not using it (the pipeline starts without the session cache)")
    except OSError as first:
        try:  # a cache that cannot be written may still be read
            return Root.open(path, create=False)
        except Refused as e:
            warn(f"{e}; not using it (the pipeline starts without the session cache)")
        except OSError:
            warn(f"session cache {path} is not writable ({first.strerror or first}); not caching")
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
            fd = os.open(
                USAGE,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
                dir_fd=self.entry_fd,
            )
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                fcntl.flock(fd, fcntl.LOCK_EX)
                text = f"{read_hits(os.pread(fd, 32, 0)) + 1}\n".encode()
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
        manifest = json.loads(read_file(entry_fd, MANIFEST, f"{what}: {MANIFEST}", MANIFEST_LIMIT))
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
        if not (
            isinstance(value, list) and len(value) == 2 and isinstance(value[0], int) and isinstance(value[1], str)
        ):
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
        # What killed readers and writers left (a reader's links would keep an evicted
        # entry's bytes on disk): a cache that is only ever hit sweeps here.
        root.sweep()
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
        warn(
            f"session cache {root.path}: this pipeline's entry ({human_size(size)}) is larger than the cache's "
            f"limit ({human_size(max_size)}; FASTSEQ_SESSION_CACHE_MAX or SessionCache(max_size=)); not stored"
        )
        return None
    manifest = {"format": FORMAT, "key": parts, "files": files, "labels": list(labels), "created": time.time()}
    write_file(temp.fd, MANIFEST, json.dumps(manifest, indent=1).encode())
    os.fsync(temp.fd)
    with root.lock():
        evict(root, max_size - size, None, False)
        try:
            os.rename(temp.path.name, key, src_dir_fd=root.fd, dst_dir_fd=root.fd)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return root.path / key  # stored by another process first: ours is dropped
        temp.close()  # the folder is the entry now: nothing to remove
    os.fsync(root.fd)
    return root.path / key


class ConvertedStages:
    """Stages converted to other opsets (:func:`fastseq.graph.convert.harmonise`) kept in the
    session cache, so that a later start of the same pipeline neither converts them again
    nor imports onnx. Each is an entry like a session's, held and verified the same way
    (:func:`_lookup`): its ``model.onnx`` is the converted stage without its large weights,
    its key what the conversion read and did (see ``harmonise``), its labels the stage's.
    Reading or writing failures are warnings, and the stage is converted as without a cache.
    Use it as a context manager: the root is opened once, on first use."""

    #: the largest converted stage read (a stage without its weights: graphs, small tensors)
    LIMIT = 2 << 30

    def __init__(self, cache: SessionCache) -> None:
        self.cache = cache
        self._root: Root | None = None
        self._opened = False

    def _open(self) -> Root | None:
        if not self._opened:
            self._opened = True
            self._root = _open_root(self.cache.path)
        return self._root

    def get(self, parts: dict[str, Any]) -> bytes | None:
        """The converted stage kept under ``parts``, verified, or None."""
        root = self._open()
        if root is None:
            return None
        key = key_of(parts)
        try:
            found = _lookup(root, key, parts)
            if found is None:
                return None
            with found:
                data = read_file(found.folder.fd, MODEL, f"session cache entry {root.path / key}", self.LIMIT)
                if not found.verified():
                    return None
                found.count_hit()
            return data
        except (Refused, OSError) as e:
            warn(
                f"{e}; not using the session cache for a converted stage (remove the entry by hand if it is not yours)"
                if isinstance(e, Refused)
                else f"session cache {root.path}: could not read a converted stage ({e}); converting it"
            )
            return None

    def put(self, parts: dict[str, Any], label: str, data: bytes) -> None:
        """Keeps ``data``, the stage ``label`` converted, under ``parts``."""
        root = self._open()
        if root is None:
            return
        try:
            root.sweep()  # what killed writers left
            with root.temp() as temp:
                write_file(temp.fd, MODEL, data)
                _seal(root, temp, key_of(parts), parts, [label], self.cache.max_size)
        except (OSError, Refused) as e:
            warn(f"session cache {root.path}: could not keep a converted stage ({e}); not caching it")

    def __enter__(self) -> ConvertedStages:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._root is not None:
            self._root.close()
            self._root = None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
