"""compose() and merge_models(): the Rust core behind a Python signature."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import onnx

from fastseq import _core, convert, loader
from fastseq.errors import CompositionError
from fastseq.loader import ModelSource

IoMap = Sequence[tuple[str, str]]


def build(
    models: Sequence[ModelSource],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
    opset: int | Literal["highest"] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    force_download: bool = False,
    token: str | bool | None = None,
    sha256: str | Sequence[str | None] | None = None,
    link_external: bool = False,
) -> tuple[_core.Composed, list[str]]:
    """Resolves every source (downloading where needed), converts opsets when asked
    (``opset``: a version, or ``"highest"`` among the models) and composes them in the core.
    Returns the composed model and the models' labels. What every entry point runs."""
    sources, labels = resolve_models(
        models, opset=opset, cache_dir=cache_dir, force_download=force_download, token=token, sha256=sha256
    )
    return compose_stages(sources, labels, io_maps, keep_outputs, ir_version=ir_version, link_external=link_external), labels


def resolve_models(
    models: Sequence[ModelSource],
    *,
    opset: int | Literal["highest"] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    force_download: bool = False,
    token: str | bool | None = None,
    sha256: str | Sequence[str | None] | None = None,
) -> tuple[list, list[str]]:
    """The first half of :func:`build`: what the core reads for each model (bytes, a path
    or a loaded model, converted when ``opset`` asks), and the models' labels."""
    if isinstance(models, (onnx.ModelProto, bytes, str, os.PathLike)):
        raise TypeError("models must be a sequence of models, e.g. [m1, m2]")
    if isinstance(sha256, str) and len(models) > 1:
        raise TypeError("with several models, pass sha256 as a list: one digest (or None) per model")
    digests = [sha256] * len(models) if sha256 is None or isinstance(sha256, str) else list(sha256)
    if len(digests) != len(models):
        raise TypeError(f"sha256 has {len(digests)} entries for {len(models)} models")
    resolved = [
        loader.resolve(m, i, cache_dir=cache_dir, force_download=force_download, token=token, sha256=digest)
        for i, (m, digest) in enumerate(zip(models, digests))
    ]
    labels = [r.label for r in resolved]
    sources: list = [r.data for r in resolved]
    if opset is not None:
        loaded = [_core.load_model(s, label) for s, label in zip(sources, labels)]
        sources = convert.harmonise(loaded, labels, None if opset == "highest" else opset)
    return sources, labels


def compose_stages(
    sources: Sequence,
    labels: Sequence[str],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
    link_external: bool = False,
) -> _core.Composed:
    """The second half of :func:`build`: composes resolved sources (or loaded stages)."""
    keep = keep_outputs if isinstance(keep_outputs, bool) else list(keep_outputs)
    return _core.compose(
        list(sources),
        list(labels),
        io_maps=normalize_io_maps(io_maps, len(sources)),
        keep_outputs=keep,
        ir_version=ir_version,
        link_external=link_external,
    )


_NESTED = "io_maps=[[('out', 'in')], [('out2', 'in2')]]: one list of (output, input) pairs per joint"


def normalize_io_maps(io_maps: Any, n_models: int) -> list[list[tuple[str, str]]] | None:
    """``io_maps`` as one list of ``(output, input)`` pairs per joint.

    Besides the nested form, takes the flat form ``[("a", "b"), ...]`` for a single joint
    (two models), and kornia's mapping from joint index to pairs (``{0: [("a", "b")]}``).
    Any other shape (a ``{"a": "b"}`` dict, a bare pair, a string) is a CompositionError
    that shows the nested form."""
    if io_maps is None:
        return None
    joints = n_models - 1
    if isinstance(io_maps, Mapping):
        if io_maps and all(isinstance(k, int) and not isinstance(k, bool) for k in io_maps):
            missing = [j for j in range(joints) if j not in io_maps]
            if missing:
                raise CompositionError(
                    f"io_maps has no entry for joint {missing[0]} ({n_models} models have {joints} joints); "
                    f"expected {_NESTED}"
                )
            io_maps = [io_maps[j] for j in range(joints)]
        else:
            example = _as_pairs(list(io_maps.items())) if io_maps else None
            shown = f"io_maps=[{example!r}]" if example else _NESTED
            raise CompositionError(f"io_maps is a dict; pass {shown} (one list of (output, input) pairs per joint)")
    if isinstance(io_maps, (str, bytes)) or not isinstance(io_maps, Iterable):
        raise CompositionError(f"io_maps must be a list, got {type(io_maps).__name__}; expected {_NESTED}")
    entries = list(io_maps)
    flat = _as_pairs(entries)
    if flat is not None and entries:
        if joints != 1:
            raise CompositionError(
                f"io_maps={entries!r} is a flat list of pairs, which only describes one joint; "
                f"{n_models} models have {joints} joints: expected {_NESTED}"
            )
        return [flat]
    out = []
    for j, entry in enumerate(entries):
        pairs = _as_pairs(list(entry)) if isinstance(entry, Iterable) and not isinstance(entry, (str, bytes, Mapping)) else None
        if pairs is None:
            hint = f" (for one pair: [{entry!r}])" if isinstance(entry, tuple) and len(entry) == 2 else ""
            raise CompositionError(
                f"io_maps[{j}] must be a list of (output, input) name pairs, got {entry!r}{hint}; expected {_NESTED}"
            )
        out.append(pairs)
    return out


def _as_pairs(items: list) -> list[tuple[str, str]] | None:
    """``items`` as (str, str) pairs, or None if any item is not a pair of names."""
    pairs = []
    for item in items:
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            return None
        if not all(isinstance(n, str) for n in item):
            return None
        pairs.append((item[0], item[1]))
    return pairs


def compose_bytes(
    models: Sequence[ModelSource],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
) -> bytes:
    """Composes ``models`` in order and returns the merged model, serialized.

    ``io_maps[i]`` lists the ``(output, input)`` pairs that join model ``i`` to model
    ``i + 1``, in the models' own names; without it outputs join inputs by position.
    Inputs that no joint feeds become graph inputs. The merged outputs are the last model's,
    plus every unconsumed output with ``keep_outputs=True``, or the named ones. Models may
    be anything :class:`fastseq.ONNXSequential` takes. ``ir_version`` sets the merged
    model's IR version (default: the highest of the models').
    """
    return build(models, io_maps, keep_outputs, ir_version=ir_version)[0].to_bytes()


def compose(
    models: Sequence[ModelSource],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
) -> onnx.ModelProto:
    """Like :func:`compose_bytes`, returning an ``onnx.ModelProto`` (below 2 GB)."""
    return onnx.ModelProto.FromString(compose_bytes(models, io_maps, keep_outputs, ir_version=ir_version))


def compose_to_file(
    models: Sequence[ModelSource],
    path: str | os.PathLike[str],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
    external_data: bool | Literal["reuse"] | None = None,
) -> Path:
    """Like :func:`compose_bytes`, streaming the result into ``path`` atomically. The
    weights go to one data file beside it with ``external_data=True``, or by default when
    the model is over the 2 GB protobuf limit. With ``external_data="reuse"`` the data files
    of the sources are linked beside it instead of copied: the cost is in the number of
    nodes, not bytes."""
    target = Path(path).expanduser()
    reuse = external_data == "reuse"
    composed, _ = build(models, io_maps, keep_outputs, ir_version=ir_version, link_external=reuse)
    composed.save(str(target), external_data=True if reuse else external_data)
    return target


def merge_models(
    m1: ModelSource,
    m2: ModelSource,
    io_map: IoMap,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    prefix1: str | None = None,
    prefix2: str | None = None,
    name: str | None = None,
    doc_string: str | None = None,
    producer_name: str | None = "onnx.compose.merge_models",
    producer_version: str | None = "1.0",
    domain: str | None = "",
    model_version: int | None = 1,
) -> onnx.ModelProto:
    """A drop-in for ``onnx.compose.merge_models`` with the same arguments and result.

    Unlike it, names that clash between the models are made unique instead of refused,
    If/Loop bodies that read outer-scope names stay valid, and models with different IR
    versions merge (the result takes the highest).
    """
    resolved = [loader.resolve(m, i) for i, m in enumerate((m1, m2))]
    meta: dict[str, Any] = {
        "name": name,
        "doc_string": doc_string,
        "producer_name": producer_name,
        "producer_version": producer_version,
        "domain": domain,
    }
    composed = _core.compose(
        [r.data for r in resolved],
        [r.label for r in resolved],
        io_maps=[[(str(o), str(i)) for o, i in io_map]],
        prefixes=[prefix1, prefix2],
        inputs=list(inputs) if inputs else None,
        outputs=list(outputs) if outputs else None,
        meta={k: v for k, v in meta.items() if v is not None},
        model_version=model_version,
    )
    return onnx.ModelProto.FromString(composed.to_bytes())
