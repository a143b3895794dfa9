"""compose() and merge_models(): the Rust core behind a Python signature."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from typing import TYPE_CHECKING

from fastseq import _core, loader
from fastseq.errors import OpsetMismatchError
from fastseq.loader import ModelSource, is_model_proto

if TYPE_CHECKING:
    import onnx

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
    entry: str = "compose",
) -> tuple[_core.Composed, list[str]]:
    """Resolves every source (downloading where needed), converts opsets when asked
    (``opset``: an ai.onnx version, or ``"highest"`` among the models; other domains go to
    one version either way) and composes them in the core. Returns the composed model and
    the models' labels. What every entry point runs; ``entry`` (a key of
    ``convert.HINTS``) says which, so that an opset mismatch names its own remedy."""
    if is_model_proto(models) or isinstance(models, (bytes, str, os.PathLike)):
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
        from fastseq import convert

        loaded = [_core.load_model(s, label) for s, label in zip(sources, labels)]
        sources = convert.harmonise(loaded, labels, None if opset == "highest" else opset)
    keep = keep_outputs if isinstance(keep_outputs, bool) else list(keep_outputs)
    try:
        composed = _core.compose(
            sources,
            labels,
            io_maps=None if io_maps is None else [[(str(o), str(i)) for o, i in joint] for joint in io_maps],
            keep_outputs=keep,
            ir_version=ir_version,
            link_external=link_external,
        )
    except OpsetMismatchError as e:
        raise _hinted(e, entry) from None
    return composed, labels


def _hinted(error: OpsetMismatchError, entry: str) -> OpsetMismatchError:
    from fastseq import convert  # imports onnx: only on this error path

    return convert.with_hint(error, entry)


def compose_bytes(
    models: Sequence[ModelSource],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
    opset: int | Literal["highest"] | None = None,
) -> bytes:
    """Composes ``models`` in order and returns the merged model, serialized.

    ``io_maps[i]`` lists the ``(output, input)`` pairs that join model ``i`` to model
    ``i + 1``, in the models' own names; without it outputs join inputs by position.
    Inputs that no joint feeds become graph inputs. The merged outputs are the last model's,
    plus every unconsumed output with ``keep_outputs=True``, or the named ones. Models may
    be anything :class:`fastseq.ONNXSequential` takes. Models importing different versions
    of a domain are refused unless ``opset`` is given: ``"highest"`` (or an ai.onnx version
    N) converts them first, every other domain to the highest version they can share.
    """
    return build(models, io_maps, keep_outputs, ir_version=ir_version, opset=opset)[0].to_bytes()


def compose(
    models: Sequence[ModelSource],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
    opset: int | Literal["highest"] | None = None,
) -> onnx.ModelProto:
    """Like :func:`compose_bytes`, returning an ``onnx.ModelProto`` (below 2 GB)."""
    import onnx

    return onnx.ModelProto.FromString(compose_bytes(models, io_maps, keep_outputs, ir_version=ir_version, opset=opset))


def compose_to_file(
    models: Sequence[ModelSource],
    path: str | os.PathLike[str],
    io_maps: Sequence[IoMap] | None = None,
    keep_outputs: bool | Sequence[str] = False,
    *,
    ir_version: int | None = None,
    external_data: bool | Literal["reuse"] | None = None,
    opset: int | Literal["highest"] | None = None,
) -> Path:
    """Like :func:`compose_bytes`, streaming the result into ``path`` atomically. The
    weights go to one data file beside it with ``external_data=True``, or by default when
    the model is over the 2 GB protobuf limit. With ``external_data="reuse"`` the data files
    of the sources are linked beside it instead of copied: the cost is in the number of
    nodes, not bytes."""
    target = Path(path).expanduser()
    reuse = external_data == "reuse"
    composed, _ = build(models, io_maps, keep_outputs, ir_version=ir_version, link_external=reuse, opset=opset)
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
    try:
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
    except OpsetMismatchError as e:
        raise _hinted(e, "merge_models") from None
    import onnx

    return onnx.ModelProto.FromString(composed.to_bytes())
