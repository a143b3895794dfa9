"""The session cache: the model ONNX Runtime leaves after its graph optimisations, stored
under a key, so that a later start of the same pipeline skips them.

An entry is a folder ``<root>/<key>/`` with ``model.onnx``, its weights in ``model.data``
and ``manifest.json`` (the key's parts, each file's size and XXH3 digest). The key covers
everything that changes the optimised graph: the composed model's digest (computed by the
core while it writes the model for the session), the onnxruntime version, the machine, the
providers with their options and the session options that steer optimisation. Entries are
written into a private folder and renamed into place, so readers see a whole entry or none;
one whose files do not match its manifest is removed and rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastseq import _core

MODEL, DATA, MANIFEST = "model.onnx", "model.data", "manifest.json"
FORMAT = 1

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


def root_from(setting: str | os.PathLike[str] | bool | None) -> Path | None:
    """The cache folder for a ``session_cache=`` argument: a folder, True for the default
    one, False for none; None reads ``FASTSEQ_SESSION_CACHE`` (a folder, or 1/true)."""
    if setting is None:
        env = os.environ.get("FASTSEQ_SESSION_CACHE", "").strip()
        if not env or env.lower() in ("0", "false", "no", "off"):
            return None
        setting = True if env.lower() in ("1", "true", "yes", "on") else env
    if setting is False:
        return None
    if setting is True:
        return default_root()
    return Path(os.fspath(setting)).expanduser()


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


@dataclass(frozen=True)
class Entry:
    folder: Path

    @property
    def model(self) -> Path:
        return self.folder / MODEL


def lookup(root: Path, key: str, parts: dict[str, Any]) -> Entry | None:
    """The entry for ``key`` when it is whole and its files match its manifest. A damaged or
    foreign entry is removed (a later store rebuilds it)."""
    folder = root / key
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return None
    if _valid(folder, parts):
        try:
            os.utime(manifest)  # last use, for `fastseq cache list`
        except OSError:
            pass
        return Entry(folder)
    _discard(folder)
    return None


def _valid(folder: Path, parts: dict[str, Any]) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("key") != parts:
            return False
        for name, (size, digest) in manifest["files"].items():
            path = folder / name
            if path.stat().st_size != size or _core.file_digest(str(path)) != digest:
                return False
        return MODEL in manifest["files"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def staging(root: Path) -> Path | None:
    """A private folder to build an entry in, or None when the cache cannot be written
    (a warning says so once per call; the session is still made)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        folder = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        folder.mkdir()
        return folder
    except OSError as e:
        warnings.warn(f"session cache {root} is not writable ({e.strerror or e}); not caching", RuntimeWarning,
                      stacklevel=4)
        return None


def commit(root: Path, key: str, parts: dict[str, Any], folder: Path) -> Entry | None:
    """Adds the manifest to a staged entry and renames it into place. Another process that
    stored the same key first wins; ours is dropped."""
    try:
        files = {}
        for path in sorted(folder.iterdir()):
            files[path.name] = (path.stat().st_size, _core.file_digest(str(path)))
        if MODEL not in files:
            raise OSError(f"onnxruntime wrote no {MODEL}")
        manifest = {"format": FORMAT, "key": parts, "files": files, "created": time.time()}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
        for path in folder.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        target = root / key
        try:
            os.rename(folder, target)
        except OSError:
            # Taken: by a whole entry (keep it) or a damaged one (replace it).
            if lookup(root, key, parts) is not None:
                shutil.rmtree(folder, ignore_errors=True)
                return Entry(target)
            os.rename(folder, target)
        return Entry(target)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        warnings.warn(f"session cache {root}: could not store an entry ({e}); not caching", RuntimeWarning,
                      stacklevel=4)
        return None


def _discard(folder: Path) -> None:
    """Removes an entry: renamed aside first, so no reader sees it half-deleted."""
    aside = folder.with_name(f".del-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(folder, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def entries(root: Path) -> list[dict[str, Any]]:
    """The whole entries under ``root``: key, size, when made and last used, what for."""
    out = []
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        manifest = folder / MANIFEST
        if folder.name.startswith(".") or not manifest.is_file():
            continue
        try:
            info = json.loads(manifest.read_text())
            size = sum(s for s, _ in info["files"].values())
            out.append({
                "key": folder.name,
                "bytes": size,
                "created": info.get("created"),
                "used": manifest.stat().st_mtime,
                "providers": info["key"].get("providers"),
                "onnxruntime": info["key"].get("onnxruntime"),
            })
        except (OSError, ValueError, KeyError, TypeError):
            out.append({"key": folder.name, "bytes": 0, "created": None, "used": None, "providers": None,
                        "onnxruntime": None, "damaged": True})
    return out


def clear(root: Path) -> int:
    """Removes every entry (and leftovers of interrupted stores); returns how many entries."""
    if not root.is_dir():
        return 0
    n = 0
    for folder in list(root.iterdir()):
        if folder.is_dir():
            n += not folder.name.startswith(".")
            _discard(folder)
    return n
