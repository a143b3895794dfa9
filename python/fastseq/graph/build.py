"""The one build: resolves every source, converts opsets when asked and hands the
description to the core in one call. The core decides the plan (order, checks, exposure,
pruning) and hands it back: nothing here works it out again."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from fastseq import _core
from fastseq.errors import CompositionError, FastseqError, OpsetMismatchError
from fastseq.graph.parts import META_KEYS
from fastseq.graph.spec import PipelineSpec
from fastseq.sources import resolve as loader

if TYPE_CHECKING:
    from fastseq.graph.convert import Store


@dataclass
class Built:
    """What :func:`build` returns: the composed model, the stage labels in graph order, the
    core's plan (see ``_core.Composed.plan``) and report of clean-ups, and where each stage
    was read from (for drawings)."""

    composed: _core.Composed
    labels: list[str]
    plan: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    #: stage label -> its source, short (a file's name, a URL, a builtin)
    sources: dict[str, str] = field(default_factory=dict)
    #: the loaded stage models (with ``keep_stages``): composed again without reading anything
    stages: list[_core.Composed] | None = None
    #: each stage in graph order with what it was built from (``pre=resize(size=224)``,
    #: ``model.onnx``): what a session-cache entry records, to tell pipelines apart
    described: list[str] = field(default_factory=list)
    #: each stage's model as given (bytes, a path, (path, root) or a loaded model), before any
    #: conversion: what ``verify`` runs stage by stage
    given: list[Any] = field(default_factory=list)


def build(spec: PipelineSpec, converted: Store | None = None) -> Built:
    """Resolves every source (downloading where needed), converts opsets when asked and
    composes the stages in the core. What every entry point runs. ``converted``: where
    converted stages are kept between starts (the session cache's, from an entry point that
    has one; see :func:`fastseq.graph.convert.harmonise`)."""
    if not spec.stages:
        raise CompositionError("no models to compose")
    link = spec.external_data == "reuse"
    try:
        try:
            return _build(spec, link, converted)
        except OpsetMismatchError as e:
            from fastseq.graph import convert  # imports onnx: only on this error path

            raise convert.with_hint(e, spec.entry) from None
    except FastseqError as e:
        if spec.origin and not str(e).startswith(spec.origin):
            raise type(e)(f"{spec.origin}: {e}") from e
        raise


#: What an edge an adapter would fix says to do where the entry point has no ``adapt``
#: option (a chain built by compose*, merge_models or the CLI); the core fills in the adapter.
_NO_ADAPT = {
    "compose": "compose() inserts no adapters: fastseq.ONNXSequential(..., adapt=True) or "
    "fastseq.Pipeline(..., adapt=True) inserts a {}",
    "merge_models": "onnx.compose.merge_models inserts no adapters: "
    "fastseq.ONNXSequential(m1, m2, io_maps=[io_map], adapt=True) inserts a {}",
    "cli": "fastseq merge inserts no adapters for a list of models: a pipeline file with adapt = true inserts a {}",
}


def _build(spec: PipelineSpec, link: bool, converted: Store | None) -> Built:
    resolved, loaded = [], []
    load = spec.opset is not None or spec.keep_stages
    for i, st in enumerate(spec.stages):
        try:
            r = loader.resolve(
                st.source,
                i,
                cache_dir=spec.cache_dir,
                force_download=spec.force_download,
                token=spec.token,
                sha256=st.sha256,
            )
            resolved.append(r)
        except FastseqError as e:
            if st.name is None:
                raise
            # A named stage: say which key of the description the failing source is.
            raise type(e)(f"stages.{st.name}: {e}") from e
    labels = [st.name or r.label for st, r in zip(spec.stages, resolved)]
    sources: list[Any] = [r.data for r in resolved]
    if spec.opset is not None:
        spec = _operators_at_opset(spec, sources, labels, link)
    fitted = _fit_operators(spec, sources, labels, link)
    as_given = list(sources)
    if load:  # all stages in parallel; errors name the stage's label
        loaded = _core.load_models(sources, labels)
    if spec.opset is not None:
        from fastseq.graph import convert

        loaded = convert.harmonise(loaded, labels, None if spec.opset == "highest" else int(spec.opset), converted)
        sources = list(loaded)
    elif load and not link:
        # The core reads the decoded models rather than decoding the sources again. (To
        # link the sources' data files it needs the sources themselves.)
        sources = list(loaded)
    common: dict[str, Any] = dict(
        prefixes=spec.prefixes,
        ir_version=spec.ir_version,
        meta={k: str(v) for k, v in spec.metadata.items() if k in META_KEYS and v is not None} or None,
        model_version=spec.model_version,
        link_external=link,
    )
    if spec.is_graph:
        composed = _compose_graph(spec, sources, labels, common)
    else:
        keep = spec.keep_outputs if isinstance(spec.keep_outputs, bool) else list(spec.keep_outputs)
        composed = _core.compose(
            sources,
            labels,
            io_maps=spec.io_maps,
            keep_outputs=keep,
            inputs=spec.only_inputs,
            outputs=spec.only_outputs,
            rules=spec.rules,
            adapt_remedy=_NO_ADAPT.get(spec.entry),
            **_extra(spec),
            **common,
        )
    plan = composed.plan()
    if spec.is_graph and spec.outputs is not None and plan["unused_outputs"]:
        unused = ", ".join(f"{stage}.{output}" for stage, output in plan["unused_outputs"])
        warnings.warn(
            (f"{spec.origin}: " if spec.origin else "") + f"output(s) {unused} never used and not exported: left out",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )
    # What each stage was built from: an operator as it runs (fitted to what feeds it), a
    # builtin: string as written.
    given = {
        label: st if isinstance(st.source, str) else replace(st, source=fitted.get(i, st.source))
        for i, (label, st) in enumerate(zip(labels, spec.stages))
    }
    order = [st["label"] for st in plan["stages"]]
    return Built(
        composed,
        order,
        plan,
        dict(composed.report()),
        {label: _source_label(st.source) for label, st in given.items()},
        loaded if spec.keep_stages and loaded else None,
        [_described(label, given[label]) if label in given else label for label in order],
        as_given,
    )


def _operators_at_opset(spec: PipelineSpec, sources: list[Any], labels: list[str], link: bool) -> PipelineSpec:
    """Where the models are converted to one opset (``spec.opset``), the operators built
    without ``opset=`` (``fastseq.ops.at_opset``) are built at it instead: at N for
    ``--opset N`` (an operator that cannot be, such as resize with antialias before 18, is
    an error naming it), at the highest among the other stages for ``highest`` (an operator
    that cannot be stays as built, and the models are converted up to it). The models keep
    their own opset where it is the target. ``sources`` is updated in place; returns the
    description with the operators' new sources."""
    from fastseq import ops
    from fastseq.errors import OperatorError

    if not any(ops.follows_opset(st.source) for st in spec.stages):
        return spec
    if spec.opset == "highest":
        found = []
        for k, st in enumerate(spec.stages):
            if ops.follows_opset(st.source):
                continue
            try:
                model = _core.load_model(sources[k], labels[k])
            except FastseqError:
                return spec  # the composition names what is wrong with it
            if not link:
                sources[k] = model  # the core composes this copy
            found += [v for d, v in model.summary()["opsets"] if d in ("", "ai.onnx")]
        if not found:
            return spec
        target = max(found)
    else:
        target = int(spec.opset)  # type: ignore[arg-type]
    stages = list(spec.stages)
    for k, st in enumerate(stages):
        try:
            rebuilt = ops.at_opset(st.source, target)
        except OperatorError as e:
            if spec.opset == "highest":
                continue
            message = str(e) if str(e).startswith(labels[k]) else f"{labels[k]}: {e}"
            raise OperatorError(f"{message} (the models are converted to opset {target})") from None
        if rebuilt is not None:
            stages[k] = replace(st, source=rebuilt)
            sources[k] = bytes(rebuilt) if isinstance(rebuilt, ops.Operator) else loader.resolve(rebuilt, k).data
    return replace(spec, stages=stages)


def _fit_operators(spec: PipelineSpec, sources: list[Any], labels: list[str], link: bool) -> dict[int, Any]:
    """Operators built without ``rank=`` (``fastseq.ops.fitting``) are built again for the
    rank of the output that feeds their ``input``, as the description joins them: an edge,
    an io_map pair or, in a chain without io_maps, the output at the input's position. A
    model's outputs are read from the model (loaded once: the core composes that copy
    unless its data files are to be linked); an operator's from what it declares, after it
    was fitted in turn. Where nothing says the rank (no feed, an output of unknown shape),
    the operator stays as built. ``sources`` is updated in place; returns the operators."""
    from fastseq import ops

    fits = {i: op for i, st in enumerate(spec.stages) if (op := ops.fitting(st.source)) is not None}
    if not fits:
        return fits
    index = {st.name: k for k, st in enumerate(spec.stages)}
    declared: dict[int, dict[str, tuple[Any, ...]]] = {}
    busy: set[int] = set()

    def feed(i: int) -> tuple[int, str] | None:
        if spec.is_graph:
            found = [(index[e.src], e.output) for e in spec.edges or [] if index[e.dst] == i and e.input == "input"]
            return found[0] if len(found) == 1 else None
        if i == 0:
            return None
        joint = spec.io_maps[i - 1] if spec.io_maps is not None else None
        if joint is not None:
            found = [(i - 1, out) for out, inp in joint if inp == "input"]
            return found[0] if len(found) == 1 else None
        outputs = list(outputs_of(i - 1))
        return (i - 1, outputs[0]) if len(outputs) == len(fits[i].inputs) == 1 else None

    def outputs_of(k: int) -> dict[str, tuple[Any, ...]]:
        if k in fits:
            fit(k)
            return {t.name: t.shape for t in fits[k].outputs}
        if k not in declared:
            try:
                model = _core.load_model(sources[k], labels[k])
            except FastseqError:
                return {}  # the composition names what is wrong with it
            if not link:
                sources[k] = model
            declared[k] = {name: tuple(dims) for name, _, dims in model.summary()["outputs"]}
        return declared[k]

    def fit(i: int) -> None:
        if i in busy:  # done, or a cycle that the core reports
            return
        busy.add(i)
        fed = feed(i)
        dims = outputs_of(fed[0]).get(fed[1]) if fed is not None else None
        if dims and fed is not None:  # () is an output of unknown rank (or a scalar, which no operator here reads)
            try:
                fits[i] = ops.refit(fits[i], len(dims))
            except FastseqError as e:
                raise type(e)(f"{labels[i]}: fed {labels[fed[0]]}.{fed[1]} of rank {len(dims)}: {e}") from None
            sources[i] = bytes(fits[i])

    for i in list(fits):
        fit(i)
    return fits


def _extra(spec: PipelineSpec) -> dict[str, Any]:
    """The clean-up options that were set; the core's defaults (on for a graph, off for a
    chain, which keeps what the linear entry points always did) stand for the others."""
    extra: dict[str, Any] = {"prune": spec.prune, "dedupe": spec.dedupe}
    if spec.adapt:
        extra["adapt"] = spec.adapt
    return {k: v for k, v in extra.items() if v is not None}


def _compose_graph(spec: PipelineSpec, sources: list[Any], labels: list[str], common: dict[str, Any]) -> _core.Composed:
    """The graph form in the core: the stages in the given order, the edges, inputs and
    outputs by stage index; the core checks the wiring (its errors name ``edges[i]``,
    ``inputs.name[j]``, ``outputs[i]``), orders the stages and chooses the default outputs."""
    assert spec.edges is not None
    names = [st.name for st in spec.stages]
    if any(n is None for n in names):
        raise TypeError("every stage of a graph needs a name")
    index = {n: k for k, n in enumerate(names)}
    adapt = spec.adapt if isinstance(spec.adapt, bool) else list(spec.adapt)
    return _core.compose(
        sources,
        labels,
        edges=[(index[e.src], e.output, index[e.dst], e.input) for e in spec.edges],
        graph_inputs=[(n, [(index[s], i) for s, i in t]) for n, t in spec.inputs.items()] or None,
        graph_outputs=None if spec.outputs is None else [(o.name, index[o.stage], o.output) for o in spec.outputs],
        **_extra(replace(spec, adapt=adapt)),
        **common,
    )


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside fastseq (warnings point at user code)."""
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fastseq/
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _source_label(source: Any) -> str:
    from fastseq.ops.operator import Operator

    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        return text if "://" in text or text.startswith("builtin:") else os.path.basename(text)
    if isinstance(source, Operator):
        return source.call.removeprefix("fastseq.ops.")
    return type(source).__name__


def _described(label: str, stage: Any) -> str:
    """A stage and what it was built from; a model in memory is known by its label only."""
    from fastseq.ops.operator import Operator

    if not isinstance(stage.source, (str, os.PathLike, Operator)):
        return label
    source = _source_label(stage.source)
    return f"{stage.name}={source}" if stage.name and stage.name != source else source
