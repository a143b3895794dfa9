"""compose() and merge_models(): chains described as a PipelineSpec and built by the core."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fastseq import _core
from fastseq.errors import CompositionError, human_size
from fastseq.graph.build import build
from fastseq.graph.parts import IoMap, Stage
from fastseq.graph.spec import PipelineSpec
from fastseq.sources.resolve import ModelSource, is_model_proto

if TYPE_CHECKING:
    import onnx


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
    spec = PipelineSpec.chain(models, io_maps, keep_outputs=_keep(keep_outputs), ir_version=ir_version, opset=opset)
    return build(spec).composed.to_bytes()


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
    spec = PipelineSpec.chain(
        models,
        io_maps,
        keep_outputs=_keep(keep_outputs),
        ir_version=ir_version,
        external_data=external_data,
        opset=opset,
    )
    save(build(spec).composed, target, spec.external_data)
    return target


def save(composed: _core.Composed, target: Path, external_data: bool | Literal["reuse"] | None) -> _core.Saved:
    """Writes ``composed`` to ``target`` in the spec's external-data mode ("reuse" was
    decided at build time: the model already refers to the sources' data files); returns
    what the core's writer wrote."""
    return composed.save(str(target), external_data=True if external_data == "reuse" else external_data)


def _keep(keep_outputs: bool | Sequence[str]) -> bool | list[str]:
    return keep_outputs if isinstance(keep_outputs, bool) else list(keep_outputs)


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
    """A drop-in for ``onnx.compose.merge_models``: the same arguments, and wherever
    onnx.compose succeeds the same model: inputs and outputs in the same order (the first
    model's outputs that the io_map does not consume, then the second's), the same nodes in
    the same order, cut down as onnx.compose cuts them when ``inputs``/``outputs`` are given,
    the same names (prefixes as ``add_prefix`` gives them), value_info, initializers,
    metadata (a key both models set to different values is refused), functions and model
    fields. Its ``ValueError`` cases raise :class:`fastseq.CompositionError` or
    :class:`fastseq.OpsetMismatchError`, both subclasses of ``ValueError``.

    It differs only where onnx.compose fails or returns a broken model:

    - names that clash between the models (without prefixes) are renamed (``m1/x``)
      instead of refused, and so are node names both graphs use, which onnx.compose keeps
      twice and ONNX Runtime refuses; same-named local functions are kept once when
      identical and renamed otherwise;
    - models of different IR versions merge (the result takes the highest);
    - If/Loop/Scan bodies that read outer-scope names stay valid (onnx.compose's
      ``add_prefix`` misses outer initializers, its pruning what bodies read);
    - with ``inputs``/``outputs``, models with sparse initializers or quantization
      annotations merge (onnx's Extractor refuses them); an input left out that a kept node
      reads, a name in ``inputs``/``outputs`` that no model has, and an io_map input listed
      in ``inputs`` are refused (onnx.compose returns a model reading an undefined tensor,
      drops the name silently, or keeps an input nothing reads); the weights an IR < 4
      model lists as inputs stay inputs (onnx.compose drops them, and its checker fails);
    - an element type or shape mismatch across the io_map is refused;
    - a result over 2 GB, which an ``onnx.ModelProto`` cannot hold, is refused with a pointer
      to :func:`compose_to_file` (onnx.compose's checker fails on it);
    - ``m1``/``m2`` may be any source :class:`fastseq.ONNXSequential` takes (paths, bytes;
      an ``onnx.ModelProto`` whose tensors refer to external data keeps the references, as
      with onnx.compose).
    """
    import onnx

    spec = merge_spec(m1, m2, io_map, inputs, outputs, prefix1, prefix2, name, doc_string)
    composed = merged(spec, producer_name, producer_version, domain, model_version)
    # The core merges a joint whose sides disagree under onnx.compose's rules (onnx's
    # checker decides in fastseq.onnx_compose); this merge_models refuses it, naming both.
    mismatch = [u for u in composed.report()["unproven"] if "type mismatch" in u or "shape mismatch" in u]
    if mismatch:
        raise CompositionError(mismatch[0])
    check_fits_proto(composed)
    return onnx.ModelProto.FromString(composed.to_bytes())


def merged(
    spec: PipelineSpec,
    producer_name: str | None,
    producer_version: str | None,
    domain: str | None,
    model_version: int | None,
) -> _core.Composed:
    """The model of a :func:`merge_spec` with ``merge_models``' model fields: the producer
    and domain given (None: the sources' own) and ``model_version``."""
    given = {"producer_name": producer_name, "producer_version": producer_version, "domain": domain}
    spec.metadata = {k: v for k, v in {**spec.metadata, **given}.items() if v is not None}
    spec.model_version = model_version
    return build(spec).composed


def check_fits_proto(composed: _core.Composed) -> None:
    """A :class:`~fastseq.CompositionError` where ``composed`` is too large for the
    ``onnx.ModelProto`` that ``merge_models`` returns (2 GB)."""
    if composed.encoded_len() >= _core.PROTOBUF_LIMIT:
        raise CompositionError(
            f"the merged model is {human_size(composed.encoded_len())}, more than an onnx.ModelProto can "
            "hold (2 GB): fastseq.compose_to_file writes it with its weights in a data file"
        )


def _stage(model: ModelSource | Stage | _core.Composed, index: int) -> Stage:
    """A stage of merge_models. An ``onnx.ModelProto`` is decoded as it is: tensors in
    external data stay references (there is no folder to read them from), as onnx.compose
    keeps them. A ``Stage`` (a model held by the core, labelled) is taken as it is."""
    if isinstance(model, Stage):
        return model
    if not is_model_proto(model):
        return Stage(None, model)
    label = f"{model.graph.name or 'model'} (#{index})"
    return Stage(label, _core.decode(model.SerializeToString(), label))


def name_of(name: object) -> str:
    """A name as the core writes it: a ``str`` as it is, ``bytes`` (protobuf's ``str`` of a
    name that is not UTF-8: onnx.compose takes the io_map read off a model) as the core's
    text of those bytes, anything else through ``str``."""
    if isinstance(name, bytes):
        return _core.name_text(name)
    return str(name)


def merge_spec(
    m1: ModelSource | Stage | _core.Composed,
    m2: ModelSource | Stage | _core.Composed,
    io_map: IoMap,
    inputs: Sequence[str] | None,
    outputs: Sequence[str] | None,
    prefix1: str | None,
    prefix2: str | None,
    name: str | None,
    doc_string: str | None,
) -> PipelineSpec:
    """The description of ``onnx.compose.merge_models``/``merge_graphs``: two models joined
    by ``io_map`` under onnx.compose's rules (which the core applies)."""
    meta = {"name": name, "doc_string": doc_string}
    return PipelineSpec(
        [_stage(m1, 0), _stage(m2, 1)],
        io_maps=[[(name_of(o), name_of(i)) for o, i in io_map]],
        prefixes=[prefix1, prefix2],
        only_inputs=[name_of(n) for n in inputs] if inputs else None,
        only_outputs=[name_of(n) for n in outputs] if outputs else None,
        metadata={k: v for k, v in meta.items() if v is not None},
        entry="merge_models",
        rules="onnx.compose",
    )
