"""The session cache: the model ONNX Runtime leaves after its graph optimisations, stored
under a key, so that a later start of the same pipeline skips them.

An entry is a folder ``<root>/<key>/`` with ``model.onnx``, its weights in ``model.data``,
``manifest.json`` (the key's parts, each file's size and XXH3 digest, the pipeline's stage
labels, when it was made) and ``usage`` (hits; its time is the last use). The key covers
everything that changes the optimised graph: the composed model's digest (computed by the
core from where its weights are, while the kernel writes the session's copy of them), the
onnxruntime version, the machine, the providers with their options and the session options
that steer optimisation.

Trust (docs/security.md has the threat model): the root and its entries are used only when they
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

import json
import os
import re
import stat
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from fastseq.errors import FastseqError, human_size
from fastseq.runtime.cachedir import DATA, MANIFEST, MODEL, USAGE, Refused, Root, check_own, open_dir, read_file

#: The entries' format (their manifest says which)
FORMAT = 2
#: The default limit: room for a few large pipelines on a laptop's disk.
DEFAULT_MAX = 2 << 30
#: the largest manifest read
MANIFEST_LIMIT = 1 << 20


def default_root() -> Path:
    """``$FASTSEQ_CACHE/sessions`` or ``~/.cache/fastseq/sessions``."""
    base = os.environ.get("FASTSEQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastseq"
    )
    return Path(base) / "sessions"


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
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
        # Also ``kind``: "session", or "converted stage" (a stage kept converted to another
        # opset, see graph/convert.py) with the ``onnx`` version that converted it.
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
        limit = (
            self.max_size
            if max_size is None and older_than is None
            else (None if max_size is None else parse_size(max_size, "max_size"))
        )
        age = None if older_than is None else parse_duration(older_than, "older_than")
        with _maintained(self.path) as root:
            if root is None:
                return []
            with root.lock():
                return evict(root, limit, age, dry_run)

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
                removed = evict(root, 0, None, dry_run)
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
        out: dict[str, Any] = {
            "key": key,
            "bytes": sizes,
            "used": max(times, default=None),
            "hits": 0,
            "labels": None,
            "providers": None,
            "onnxruntime": None,
            "created": None,
            "model": None,
            "damaged": False,
            "kind": "session",
        }
        try:
            check_own(os.fstat(fd), "the entry")
            for name, st in files:
                if not stat.S_ISREG(st.st_mode):
                    raise Refused(f"{name} is not a regular file")
                check_own(st, name)
            manifest = json.loads(read_file(fd, MANIFEST, MANIFEST, MANIFEST_LIMIT))
            parts = manifest["key"]
            out.update(labels=manifest.get("labels"), created=manifest.get("created"), model=parts.get("model"))
            if str(parts.get("kind", "")).startswith("converted stage"):  # see graph/convert.py
                goals = ([f"ai.onnx {parts['ai.onnx'][1]}"] if parts.get("ai.onnx") else []) + [
                    f"{d} {v}" for d, v in (parts.get("domains") or {}).items()
                ]
                out.update(
                    kind="converted stage",
                    onnx=parts.get("onnx"),
                    providers=[],
                    labels=[f"{label} (converted to {', '.join(goals)})" for label in out["labels"] or []],
                )
            else:
                out.update(
                    providers=[p if isinstance(p, str) else p[0] for p in parts["providers"]],
                    onnxruntime=parts["onnxruntime"],
                )
        except Refused as e:
            out["refused"] = str(e)
        except (OSError, ValueError, RecursionError, KeyError, TypeError, IndexError):
            out["damaged"] = True
        try:
            out["hits"] = read_hits(read_file(fd, USAGE, USAGE, 64))
        except (OSError, Refused):
            pass
        return out
    finally:
        os.close(fd)


def evict(root: Root, room: int | None, age: float | None, dry_run: bool) -> list[dict[str, Any]]:
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


def read_hits(raw: bytes) -> int:
    text = raw.strip()
    return int(text) if text.isdigit() else 0


def warn(message: str) -> None:
    """A RuntimeWarning attributed to the first caller outside fastseq."""
    frame: FrameType | None = sys._getframe(0)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("fastseq"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)
