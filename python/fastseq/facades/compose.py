"""compose() and merge_models(): chains described as a PipelineSpec and built by the core."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fastseq.sources.resolve import ModelSource
from fastseq.graph.build import build
from fastseq.graph.parts import IoMap, Stage
from fastseq.graph.spec import PipelineSpec

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
        models, io_maps, keep_outputs=_keep(keep_outputs), ir_version=ir_version, external_data=external_data,
        opset=opset,
    )
    save(build(spec).composed, target, spec.external_data)
    return target


def save(composed, target: Path, external_data: bool | Literal["reuse"] | None) -> dict[str, Any]:
    """Writes ``composed`` to ``target`` in the spec's external-data mode ("reuse" was
    decided at build time: the model already refers to the sources' data files)."""
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
    """A drop-in for ``onnx.compose.merge_models`` with the same arguments and result.

    Unlike it, names that clash between the models are made unique instead of refused,
    If/Loop bodies that read outer-scope names stay valid, and models with different IR
    versions merge (the result takes the highest).
    """
    import onnx

    meta: dict[str, Any] = {
        "name": name,
        "doc_string": doc_string,
        "producer_name": producer_name,
        "producer_version": producer_version,
        "domain": domain,
    }
    spec = PipelineSpec(
        [Stage(None, m1), Stage(None, m2)],
        io_maps=[[(str(o), str(i)) for o, i in io_map]],
        prefixes=[prefix1, prefix2],
        only_inputs=list(inputs) if inputs else None,
        only_outputs=list(outputs) if outputs else None,
        metadata={k: v for k, v in meta.items() if v is not None},
        model_version=model_version,
        entry="merge_models",
    )
    return onnx.ModelProto.FromString(build(spec).composed.to_bytes())
