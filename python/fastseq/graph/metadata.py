"""Model metadata (``metadata_props``) as kornia writes it: ``source`` and ``version``
first, then the caller's pairs, one entry per key (the last value wins)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastseq import _core

__all__ = ["add_metadata", "metadata_pairs"]


def metadata_pairs(additional_metadata: Sequence[tuple[str, Any]] | None) -> list[tuple[str, str]]:
    """``[("source", "fastseq"), ("version", <fastseq version>), *additional_metadata]``
    with values as ``str(value)``; anything but (str, value) pairs is a TypeError."""
    pairs: list[tuple[str, str]] = [("source", "fastseq"), ("version", _core.__version__)]
    for item in additional_metadata or ():
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            raise TypeError(f"add_metadata takes (key, value) pairs, got {item!r}")
        key, value = item
        if not isinstance(key, str):
            raise TypeError(f"add_metadata: a key must be a str, got {type(key).__name__} {key!r}")
        pairs.append((key, str(value)))
    return pairs


def add_metadata(onnx_model, additional_metadata: Sequence[tuple[str, Any]] | None = None):
    """Adds ``(key, value)`` pairs to ``onnx_model.metadata_props`` in place and returns the
    model: kornia's ``kornia.onnx.add_metadata``. ``("source", "fastseq")`` and
    ``("version", <fastseq version>)`` are written first; a key already present (or repeated)
    keeps its first position and takes the last value, so the model has one entry per key,
    as ``onnx.checker`` requires. Values are stored as ``str(value)``."""
    existing = [(p.key, p.value) for p in onnx_model.metadata_props]
    entries = _core.merge_metadata(existing, metadata_pairs(additional_metadata))  # the core's rule
    del onnx_model.metadata_props[:]
    for key, value in entries:
        entry = onnx_model.metadata_props.add()
        entry.key, entry.value = key, value
    return onnx_model
