"""The one pipeline description.

Every entry point describes what to compose as a :class:`PipelineSpec`: ``compose*`` and
``merge_models`` and ``ONNXSequential`` a chain (kornia's ``io_maps``), ``Pipeline`` and
pipeline files a graph of named stages joined by edges. :func:`fastseq.graph.build.build`
hands it to the core, which decides the plan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from fastseq.errors import CompositionError
from fastseq.graph.parse import (
    _edge_index,
    _stage,
    _Where,
    groups,
    normalize_io_maps,
    parse_edge,
    parse_outputs,
    parse_port,
)
from fastseq.graph.parts import META_KEYS, Edge, Exposed, IoInfo, IoMap, Stage
from fastseq.ops.operator import Operator
from fastseq.sources import resolve as loader

__all__ = ["META_KEYS", "Edge", "Exposed", "IoInfo", "IoMap", "PipelineSpec", "Stage"]


@dataclass
class PipelineSpec:
    """What to compose and how to run it. A graph when ``edges`` is a list (stages named,
    any order: the core sorts them topologically), else a chain joined by ``io_maps``
    (``io_maps[i]`` joins model ``i`` to ``i + 1``; None, for all of them or one joint,
    joins by position)."""

    stages: list[Stage]
    edges: list[Edge] | None = None
    io_maps: list[list[tuple[str, str]] | None] | None = None
    #: graph: exposed input name -> the (stage, input) pairs it feeds
    inputs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: graph: the exposed outputs; None: every output that no edge consumes
    outputs: list[Exposed] | None = None
    #: chain: keep unconsumed outputs of earlier models (True) or these named ones
    keep_outputs: bool | list[str] = False
    #: chain (merge_models): restrict the merged graph's inputs / outputs to these names
    only_inputs: list[str] | None = None
    only_outputs: list[str] | None = None
    prefixes: list[str | None] | None = None
    #: convert every model's default-domain opset to this version, or the "highest"
    opset: int | Literal["highest"] | None = None
    ir_version: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    model_version: int | None = None
    #: export: True, False, None (by size) or "reuse" (link the sources' data files)
    external_data: bool | Literal["reuse"] | None = None
    providers: list[Any] | None = None
    #: a dict (attributes and "session.*" config entries) or an ort.SessionOptions
    session_options: Any = None
    cache_dir: str | None = None
    force_download: bool = False
    token: str | bool | None = None
    #: clean-ups: prune, dedupe weights (None: on for a graph, off for a chain), adapters
    prune: bool | None = None
    dedupe: bool | None = None
    adapt: bool | list[int] = False
    #: the pipeline file this came from, named in messages
    origin: str | None = None
    #: the entry point that built it (a key of convert.HINTS): an opset mismatch names its remedy
    entry: str = "compose"
    #: declared by the user: each row's outputs depend on that row alone (the batcher and
    #: fastseq serve batch it without the core's analysis)
    row_independent: bool = False
    #: stages whose inputs have a fixed first axis of 1 (a batch-1 export) get a dynamic one,
    #: where the core's analysis shows the graph keeps each row apart
    dynamic_batch: bool = False
    #: keep the loaded stage models in the result (ONNXSequential.combine re-wires them)
    keep_stages: bool = False
    #: chain of two: "onnx.compose" merges them as onnx.compose.merge_models does (the
    #: core's rules: outputs kept, cutting down to inputs/outputs, model fields, metadata)
    rules: Literal["fastseq", "onnx.compose"] = "fastseq"

    @property
    def is_graph(self) -> bool:
        """True for named stages joined by edges, False for a chain joined by io_maps."""
        return self.edges is not None

    # --- constructors ---------------------------------------------------------------
    @classmethod
    def chain(
        cls,
        models: Sequence[Any],
        io_maps: Sequence[IoMap] | None = None,
        *,
        sha256: str | Sequence[str | None] | None = None,
        **options: Any,
    ) -> PipelineSpec:
        """A chain of models, kornia's and onnx.compose's form."""
        if loader.is_model_proto(models) or isinstance(models, (Operator, bytes, str, os.PathLike)):
            raise TypeError("models must be a sequence of models, e.g. [m1, m2]")
        if isinstance(sha256, str) and len(models) > 1:
            raise TypeError("with several models, pass sha256 as a list: one digest (or None) per model")
        digests = [sha256] * len(models) if sha256 is None or isinstance(sha256, str) else list(sha256)
        if len(digests) != len(models):
            raise TypeError(f"sha256 has {len(digests)} entries for {len(models)} models")
        maps = normalize_io_maps(io_maps, len(models))
        stages = [Stage(None, m, d) for m, d in zip(models, digests)]
        return cls(stages, io_maps=maps, **options)

    @classmethod
    def graph(
        cls,
        stages: Mapping[str, Any],
        edges: Sequence[str | Edge | tuple[Any, ...]] = (),
        inputs: Mapping[str, str | Sequence[str]] | None = None,
        outputs: Sequence[str] | None = None,
        *,
        adapt: bool | Sequence[int | str] = False,
        origin: str | None = None,
        **options: Any,
    ) -> PipelineSpec:
        """A graph of named stages from the user's strings: edges ``"a.out -> b.in"``,
        inputs ``{"image": ["a.in", "b.skip"]}``, outputs ``"b.out"`` or ``"name=b.out"``."""
        at = _Where(origin)
        if not isinstance(stages, Mapping) or not stages:
            raise TypeError("stages must be a non-empty dict: stage name -> model")
        parsed_stages = [_stage(name, value, at) for name, value in stages.items()]
        names = [cast(str, s.name) for s in parsed_stages]  # named stages, all of them
        if isinstance(edges, str):
            raise TypeError('edges must be a list of "stage.output -> stage.input" strings')
        parsed_edges = [parse_edge(e, names, at.key(f"edges[{i}]")) for i, e in enumerate(edges)]
        parsed_inputs: dict[str, list[tuple[str, str]]] = {}
        for name, targets in (inputs or {}).items():
            targets = [targets] if isinstance(targets, str) else list(targets)
            if not targets:
                raise CompositionError(at.key(f"inputs.{name}") + "feeds no stage input")
            parsed_inputs[str(name)] = [
                parse_port(t, names, at.key(f"inputs.{name}[{j}]")) for j, t in enumerate(targets)
            ]
        parsed_outputs = None
        if outputs is not None:
            if isinstance(outputs, str):
                raise TypeError('outputs must be a list of "stage.output" or "name=stage.output" strings')
            parsed_outputs = parse_outputs(outputs, names, at)
            if not parsed_outputs:
                raise CompositionError(
                    at.key("outputs") + "empty: the pipeline would compute nothing; name the outputs to expose "
                    "('stage.output'), or leave outputs out to expose every output that no edge consumes"
                )
        apart = groups(names, parsed_edges, parsed_inputs)
        # Stages side by side are meant only where the outputs say so: without outputs each
        # group's own outputs would be exposed, and a group none of whose outputs is exposed
        # would be pruned whole. Either is what forgotten edges look like.
        if len(apart) > 1 and (
            parsed_outputs is None or any(not any(o.stage in g for o in parsed_outputs) for g in apart)
        ):
            unexposed = (
                None
                if parsed_outputs is None
                else [s for g in apart if not any(o.stage in g for o in parsed_outputs) for s in g]
            )
            raise CompositionError(_unconnected(apart, at, unexposed))
        adapt_edges: bool | list[int]
        if isinstance(adapt, bool):
            adapt_edges = adapt
        else:
            adapt_edges = [_edge_index(a, parsed_edges, at.key(f"adapt[{i}]")) for i, a in enumerate(adapt)]
        return cls(
            parsed_stages,
            edges=parsed_edges,
            inputs=parsed_inputs,
            outputs=parsed_outputs,
            adapt=adapt_edges,
            origin=origin,
            **options,
        )


def _unconnected(apart: list[list[str]], at: _Where, unexposed: list[str] | None) -> str:
    """Stages that nothing connects, with the forms that connect them: edges forgotten
    would build each stage on its own, with its own inputs and outputs. ``unexposed``: the
    stages of groups that the outputs given name nothing of."""
    if all(len(g) == 1 for g in apart):
        names = [g[0] for g in apart]
        what = f"stages {', '.join(names[:-1])} and {names[-1]} are not connected"
    else:
        what = "the stages form groups that nothing connects: " + "; ".join(", ".join(g) for g in apart)
    if unexposed:
        what += f", and outputs names no output of {', '.join(unexposed)} (it would be left out)"
    order = [s for g in apart for s in g]
    if at.origin:
        chain = ", ".join(f'"{s}"' for s in order)
        return (
            f"{at.origin}: {what} (no edge joins them): chain = [{chain}] runs them one after another, "
            f'edges = ["{order[0]}.OUTPUT -> {order[1]}.INPUT", ...] names each connection, and outputs = [...] '
            "exposes the outputs named if they are meant to run side by side"
        )
    return (
        f'{what} (no edge joins them): pass edges=["{order[0]}.OUTPUT -> {order[1]}.INPUT", ...] (or use '
        "fastseq.ONNXSequential for stages that run one after another), or outputs=[...] naming the outputs to "
        "expose if they are meant to run side by side"
    )
