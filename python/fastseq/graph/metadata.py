"""Model metadata (``metadata_props``) as kornia writes it: ``source`` and ``version``
first, then the caller's pairs, one entry per key (the last value wins).

The stamp names the library the program uses: in a program that has imported kornia (code
written for ``kornia.onnx``, whose readers may look for it), kornia's own
``("source", "kornia")`` and ``("version", kornia.__version__)``, as ``kornia.onnx.add_metadata``
writes them; otherwise ``("source", "fastseq")`` and fastseq's version. fastseq never imports
kornia to decide."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fastseq import _core

if TYPE_CHECKING:
    import onnx

__all__ = ["add_metadata", "metadata_pairs", "stamp"]


def stamp() -> list[tuple[str, str]]:
    """``[("source", ...), ("version", ...)]``: kornia's when kornia is imported, else fastseq's."""
    kornia = sys.modules.get("kornia")
    version = getattr(kornia, "__version__", None)
    if isinstance(version, str):
        return [("source", "kornia"), ("version", version)]
    return [("source", "fastseq"), ("version", _core.__version__)]


def metadata_pairs(additional_metadata: Sequence[tuple[str, Any]] | None) -> list[tuple[str, str]]:
    """:func:`stamp` followed by ``additional_metadata``, values as ``str(value)``; anything
    but (str, value) pairs is a TypeError."""
    pairs = stamp()
    for item in additional_metadata or ():
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            raise TypeError(f"add_metadata takes (key, value) pairs, got {item!r}")
        key, value = item
        if not isinstance(key, str):
            raise TypeError(f"add_metadata: a key must be a str, got {type(key).__name__} {key!r}")
        pairs.append((key, str(value)))
    return pairs


def add_metadata(
    onnx_model: onnx.ModelProto, additional_metadata: Sequence[tuple[str, Any]] | None = None
) -> onnx.ModelProto:
    """Adds ``(key, value)`` pairs to ``onnx_model.metadata_props`` in place and returns the
    model: kornia's ``kornia.onnx.add_metadata``. ``source`` and ``version`` are written
    first: kornia's values in a program that has imported kornia, as kornia writes them, else
    ``("source", "fastseq")`` and fastseq's version. A key already present (or repeated)
    keeps its first position and takes the last value, so the model has one entry per key,
    as ``onnx.checker`` requires. Values are stored as ``str(value)``."""
    existing = [(p.key, p.value) for p in onnx_model.metadata_props]
    entries = _core.merge_metadata(existing, metadata_pairs(additional_metadata))  # the core's rule
    del onnx_model.metadata_props[:]
    for key, value in entries:
        entry = onnx_model.metadata_props.add()
        entry.key, entry.value = key, value
    return onnx_model
