"""The one build: resolves every source, converts opsets when asked and hands the
description to the core in one call."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastseq import _core
from fastseq.errors import CompositionError, FastseqError, OpsetMismatchError
from fastseq.graph.parse import _Where
from fastseq.graph.parts import META_KEYS, Edge, Exposed, IoInfo
from fastseq.graph.spec import PipelineSpec
from fastseq.sources import resolve as loader



@dataclass(frozen=True)
class StageView:
    """A stage as drawn: its name, source label, inputs and outputs, whether it was pruned."""

    name: str
    label: str
    inputs: list[IoInfo]
    outputs: list[IoInfo]
    pruned: bool = False


@dataclass(frozen=True)
class Layout:
    """The stage-level picture of a built graph (plain data: pickles, draws)."""

    stages: list[StageView]
    edges: list[Edge]
    #: exposed input name -> the (stage, input) pairs it feeds
    inputs: list[tuple[str, list[tuple[str, str]]]]
    outputs: list[Exposed]


@dataclass
class Built:
    """What :func:`build` returns: the composed model, the stage labels in graph order,
    the layout of a graph (None for a chain) and the core's report of clean-ups."""

    composed: _core.Composed
    labels: list[str]
    layout: Layout | None = None
    report: dict[str, Any] = field(default_factory=dict)
    #: the loaded stage models (with ``keep_stages``): composed again without reading anything
    stages: list[_core.Composed] | None = None


def build(spec: PipelineSpec) -> Built:
    """Resolves every source (downloading where needed), converts opsets when asked and
    composes the stages in the core. What every entry point runs."""
    if not spec.stages:
        raise CompositionError("no models to compose")
    link = spec.external_data == "reuse"
    try:
        try:
            return _build(spec, link)
        except OpsetMismatchError as e:
            from fastseq.graph import convert# imports onnx: only on this error path

            raise convert.with_hint(e, spec.entry) from None
    except FastseqError as e:
        if spec.origin and not str(e).startswith(spec.origin):
            raise type(e)(f"{spec.origin}: {e}") from e
        raise


def _build(spec: PipelineSpec, link: bool) -> Built:
    resolved, loaded = [], []
    load = spec.opset is not None or spec.is_graph or spec.keep_stages
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
    if load:  # all stages in parallel; errors name the stage's label
        loaded = _core.load_models(sources, labels)
    if spec.opset is not None:
        from fastseq.graph import convert

        loaded = convert.harmonise(loaded, labels, None if spec.opset == "highest" else int(spec.opset))
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
        return _build_graph(spec, sources, labels, loaded, common)
    keep = spec.keep_outputs if isinstance(spec.keep_outputs, bool) else list(spec.keep_outputs)
    composed = _core.compose(
        sources,
        labels,
        io_maps=spec.io_maps,
        keep_outputs=keep,
        inputs=spec.only_inputs,
        outputs=spec.only_outputs,
        rules=spec.rules,
        **_extra(spec),
        **common,
    )
    return Built(composed, labels, None, _report(composed), loaded if spec.keep_stages and loaded else None)


def _extra(spec: PipelineSpec) -> dict[str, Any]:
    """The clean-up options that were set; the core's defaults (on for a graph, off for a
    chain, which keeps what the linear entry points always did) stand for the others."""
    extra: dict[str, Any] = {"prune": spec.prune, "dedupe": spec.dedupe}
    if spec.adapt:
        extra["adapt"] = spec.adapt
    return {k: v for k, v in extra.items() if v is not None}


def _report(composed: _core.Composed) -> dict[str, Any]:
    report = getattr(composed, "report", None)
    return dict(report()) if report is not None else {}


def _build_graph(
    spec: PipelineSpec,
    sources: list[Any],
    labels: list[str],
    loaded: list[_core.Composed],
    common: dict[str, Any],
) -> Built:
    assert spec.edges is not None
    at = _Where(spec.origin)
    names = [st.name for st in spec.stages]
    if any(n is None for n in names):
        raise TypeError("every stage of a graph needs a name")
    summaries = [m.summary() for m in loaded]
    ins = {n: {i[0]: i for i in s["inputs"]} for n, s in zip(names, summaries)}
    outs = {n: {o[0]: o for o in s["outputs"]} for n, s in zip(names, summaries)}

    def check_output(stage: str, output: str, where: str) -> None:
        if output not in outs[stage]:
            hint = _core.did_you_mean(output, list(outs[stage]))
            raise CompositionError(where + f"'{stage}.{output}' is not an output of {stage}{hint}")

    def check_input(stage: str, inp: str, where: str) -> None:
        if inp not in ins[stage]:
            hint = _core.did_you_mean(inp, list(ins[stage]))
            raise CompositionError(where + f"'{stage}.{inp}' is not an input of {stage}{hint}")

    fed: dict[tuple[str, str], str] = {}
    for i, e in enumerate(spec.edges):
        where = at.key(f"edges[{i}]")
        check_output(e.src, e.output, where)
        check_input(e.dst, e.input, where)
        if (e.dst, e.input) in fed:
            raise CompositionError(where + f"'{e.dst}.{e.input}' is fed twice: by {fed[e.dst, e.input]} and by {e}")
        fed[e.dst, e.input] = f"edges[{i}] ({e})"
    for name, targets in spec.inputs.items():
        for j, (stage, inp) in enumerate(targets):
            where = at.key(f"inputs.{name}[{j}]")
            check_input(stage, inp, where)
            if (stage, inp) in fed:
                raise CompositionError(
                    where + f"'{stage}.{inp}' is fed twice: by {fed[stage, inp]} and by graph input '{name}'"
                )
            fed[stage, inp] = f"graph input '{name}'"
    order = topological_order(names, spec.edges, at)
    consumed = {(e.src, e.output) for e in spec.edges}

    if spec.outputs is not None:
        for i, o in enumerate(spec.outputs):
            check_output(o.stage, o.output, at.key(f"outputs[{i}]"))
        exposed = list(spec.outputs)
        exported = {(o.stage, o.output) for o in exposed}
        unused = [f"{n}.{o}" for n in names for o in outs[n] if (n, o) not in consumed | exported]
        if unused:
            warnings.warn(
                (f"{spec.origin}: " if spec.origin else "")
                + f"output(s) {', '.join(unused)} never used and not exported: left out",
                UserWarning,
                stacklevel=_user_stacklevel(),
            )
    else:
        sinks = [(n, o) for n in order for o in outs[n] if (n, o) not in consumed]
        own = [o for _, o in sinks]
        exposed = [Exposed(o if own.count(o) == 1 else f"{n}.{o}", n, o) for n, o in sinks]
    taken = {o.name for o in exposed}
    clash = taken & set(spec.inputs)
    if clash:
        raise CompositionError(at.key("inputs") + f"'{sorted(clash)[0]}' is both a graph input and a graph output")

    index = {n: k for k, n in enumerate(order)}
    by_order = sorted(range(len(names)), key=lambda i: index[names[i]])
    adapt = spec.adapt if isinstance(spec.adapt, bool) else list(spec.adapt)
    composed = _core.compose(
        [sources[i] for i in by_order],
        [labels[i] for i in by_order],
        edges=[(index[e.src], e.output, index[e.dst], e.input) for e in spec.edges],
        graph_inputs=[(n, [(index[s], i) for s, i in t]) for n, t in spec.inputs.items()] or None,
        graph_outputs=[(o.name, index[o.stage], o.output) for o in exposed],
        **_extra(replace(spec, adapt=adapt)),
        **common,
    )
    report = _report(composed)
    layout = _layout(spec, order, ins, outs, exposed, composed, report)
    return Built(composed, list(order), layout, report)


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside fastseq (warnings point at user code)."""
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fastseq/
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def topological_order(names: Sequence[str], edges: Sequence[Edge], at: _Where | None = None) -> list[str]:
    """The stages in an order where every edge goes forward, keeping the given order where
    the edges allow. A cycle is a CompositionError naming the loop (``a -> b -> a``)."""
    after: dict[str, list[str]] = {n: [] for n in names}
    for e in edges:
        if e.dst not in after[e.src]:
            after[e.src].append(e.dst)
    cycle = _find_cycle(names, after)
    if cycle:
        where = (at or _Where(None)).key("edges")
        raise CompositionError(where + f"the edges make a cycle: {' -> '.join(cycle)}")
    # Kahn's algorithm, the ready stage that came first in the given order going next.
    import heapq

    position = {n: i for i, n in enumerate(names)}
    waiting = {n: 0 for n in names}
    for n in names:
        for m in after[n]:
            waiting[m] += 1
    ready = [position[n] for n in names if waiting[n] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        n = names[heapq.heappop(ready)]
        order.append(n)
        for m in after[n]:
            waiting[m] -= 1
            if waiting[m] == 0:
                heapq.heappush(ready, position[m])
    return order


def _find_cycle(names: Sequence[str], after: dict[str, list[str]]) -> list[str] | None:
    """A loop among the stages, as the path that closes it, or None. Iterative, so that a
    long pipeline does not meet Python's recursion limit."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in names:
        if root in state:
            continue
        path: list[str] = [root]
        todo = [iter(after[root])]
        state[root] = 1
        while todo:
            m = next(todo[-1], None)
            if m is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(m) == 1:
                return path[path.index(m) :] + [m]
            elif m not in state:
                state[m] = 1
                path.append(m)
                todo.append(iter(after[m]))
    return None


def _layout(
    spec: PipelineSpec,
    order: list[str],
    ins: dict[str, dict[str, IoInfo]],
    outs: dict[str, dict[str, IoInfo]],
    exposed: list[Exposed],
    composed: _core.Composed,
    report: dict[str, Any],
) -> Layout:
    """Which stage inputs the graph inputs feed (the user's, then the unfed ones under their
    own name when unique, else ``stage.input``), and which stages no output needs."""
    assert spec.edges is not None
    fed = {(e.dst, e.input) for e in spec.edges} | {t for ts in spec.inputs.values() for t in ts}
    unfed = [(n, i) for n in order for i in ins[n] if (n, i) not in fed]
    own = [i for _, i in unfed]
    graph_inputs = [(name, list(t)) for name, t in spec.inputs.items()]
    graph_inputs += [(i if own.count(i) == 1 and i not in spec.inputs else f"{n}.{i}", [(n, i)]) for n, i in unfed]
    actual = {name for name, _, _ in composed.summary()["inputs"]}
    graph_inputs = [(name, t) for name, t in graph_inputs if name in actual]
    needed = {o.stage for o in exposed}
    changed = True
    while changed:
        changed = False
        for e in spec.edges:
            if e.dst in needed and e.src not in needed:
                needed.add(e.src)
                changed = True
    # The core says which stages it left out; the stage graph says the same where it is silent.
    pruned = set((report.get("pruned") or {}).get("stages") or ())
    if spec.prune is not False:
        pruned |= set(order) - needed
    label = {st.name: _source_label(st.source) for st in spec.stages}
    views = [
        StageView(n, label[n], list(ins[n].values()), list(outs[n].values()), n in pruned) for n in order
    ]
    return Layout(views, list(spec.edges), graph_inputs, exposed)


def _source_label(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        return text if "://" in text or text.startswith("builtin:") else os.path.basename(text)
    return type(source).__name__
