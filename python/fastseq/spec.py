"""The one pipeline description, and the one build that consumes it.

Every entry point describes what to compose as a :class:`PipelineSpec`: ``compose*`` and
``merge_models`` and ``ONNXSequential`` a chain (kornia's ``io_maps``), ``Pipeline`` and
pipeline files a graph of named stages joined by edges. :func:`build` resolves the
sources (loader), converts opsets where asked (convert) and hands the core one call.
The names the user wrote are checked here, where the user's own keys are known, so that
an error can say ``pipeline.toml: edges[2]: ...``; types, shapes and dims are the core's.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fastseq import _core, loader
from fastseq.errors import CompositionError, FastseqError, OpsetMismatchError

IoMap = Sequence[tuple[str, str]]
# (name, dtype, dims) as the core's summary gives them
IoInfo = tuple[str, str, list[str]]

# Model fields that `metadata` may set (onnx.compose.merge_models' keyword arguments).
META_KEYS = ("name", "doc_string", "producer_name", "producer_version", "domain")


@dataclass(frozen=True)
class Stage:
    """One model of a pipeline: its ``name`` (None in a chain, where the source names it),
    any source ``ONNXSequential`` takes, and an optional expected sha256 digest."""

    name: str | None
    source: Any
    sha256: str | None = None


@dataclass(frozen=True)
class Edge:
    """``src.output -> dst.input``: an output of one stage feeding an input of another."""

    src: str
    output: str
    dst: str
    input: str

    def __str__(self) -> str:
        return f"{self.src}.{self.output} -> {self.dst}.{self.input}"


@dataclass(frozen=True)
class Exposed:
    """A graph output: ``stage.output`` exposed under ``name``."""

    name: str
    stage: str
    output: str

    def __str__(self) -> str:
        return f"{self.stage}.{self.output}" if self.name == self.output else f"{self.name}={self.stage}.{self.output}"


@dataclass
class PipelineSpec:
    """What to compose and how to run it. A graph when ``edges`` is a list (stages named,
    any order: they are sorted topologically), else a chain joined by ``io_maps``
    (``io_maps[i]`` joins model ``i`` to ``i + 1``; None joins by position)."""

    stages: list[Stage]
    edges: list[Edge] | None = None
    io_maps: list[list[tuple[str, str]]] | None = None
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
    #: keep the loaded stage models in the result (ONNXSequential.combine re-wires them)
    keep_stages: bool = False

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
        if loader.is_model_proto(models) or isinstance(models, (bytes, str, os.PathLike)):
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
        edges: Sequence[str | Edge | tuple] = (),
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
        names = [s.name for s in parsed_stages]
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


class _Where:
    """Where a name was written: ``pipeline.toml: edges[2]: `` for messages."""

    def __init__(self, origin: str | None) -> None:
        self.origin = origin

    def key(self, key: str) -> str:
        return f"{self.origin}: {key}: " if self.origin else f"{key}: "


def _stage(name: Any, value: Any, at: _Where) -> Stage:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise CompositionError(at.key("stages") + f"{name!r} is not a stage name (a non-empty string)")
    for bad in ("->", "=", " ", ","):
        if bad in name:
            raise CompositionError(at.key(f"stages.{name}") + f"a stage name may not contain {bad!r}")
    if isinstance(value, Stage):
        return replace(value, name=name)
    if isinstance(value, Mapping):
        unknown = set(value) - {"source", "sha256"}
        if unknown or "source" not in value:
            extra = sorted(unknown)[0] if unknown else "source"
            hint = _core.did_you_mean(extra, ["source", "sha256"]) if unknown else ""
            what = f"'{extra}' is not a stage key{hint}" if unknown else "needs a 'source'"
            raise CompositionError(at.key(f"stages.{name}") + what + " (keys: source, sha256)")
        return Stage(name, value["source"], value.get("sha256"))
    return Stage(name, value)


def parse_port(text: Any, stages: Sequence[str], where: str) -> tuple[str, str]:
    """``"stage.name"`` -> (stage, name). Tensor names may contain dots: the stage is the
    longest known stage name followed by a dot."""
    if isinstance(text, tuple) and len(text) == 2:
        stage, name = map(str, text)
        if stage not in stages:
            raise CompositionError(where + f"no stage named '{stage}'{_core.did_you_mean(stage, list(stages))}")
        return stage, name
    if not isinstance(text, str):
        raise CompositionError(where + f"expected 'stage.name', got {type(text).__name__}")
    text = text.strip()
    known = [s for s in stages if text.startswith(s + ".") and len(text) > len(s) + 1]
    if known:
        stage = max(known, key=len)
        return stage, text[len(stage) + 1 :]
    head = text.split(".", 1)[0]
    if "." not in text or not head:
        raise CompositionError(where + f"'{text}': expected 'stage.name' (stages: {', '.join(stages)})")
    return_hint = _core.did_you_mean(head, list(stages))
    raise CompositionError(where + f"'{text}': no stage named '{head}'{return_hint}")


def parse_edge(text: Any, stages: Sequence[str], where: str) -> Edge:
    """``"a.out -> b.in"`` (or an Edge, or ((a, out), (b, in))) -> Edge."""
    if isinstance(text, Edge):
        parse_port((text.src, text.output), stages, where)
        parse_port((text.dst, text.input), stages, where)
        return text
    if isinstance(text, tuple) and len(text) == 2:
        (src, out), (dst, inp) = (parse_port(p, stages, where) for p in text)
        return Edge(src, out, dst, inp)
    if not isinstance(text, str) or text.count("->") != 1:
        raise CompositionError(where + f"{text!r}: expected 'stage.output -> stage.input'")
    left, right = text.split("->")
    src, out = parse_port(left, stages, where)
    dst, inp = parse_port(right, stages, where)
    return Edge(src, out, dst, inp)


def parse_outputs(outputs: Sequence[Any], stages: Sequence[str], at: _Where) -> list[Exposed]:
    """``"b.out"`` exposes under the output's own name (``b.out`` where two clash);
    ``"name=b.out"`` under ``name``."""
    raw: list[tuple[str | None, str, str]] = []
    for i, text in enumerate(outputs):
        where = at.key(f"outputs[{i}]")
        if isinstance(text, Exposed):
            raw.append((text.name, text.stage, text.output))
            continue
        name: str | None = None
        if isinstance(text, str) and "=" in text:
            left, right = (p.strip() for p in text.split("=", 1))
            # "name=stage.out" renames; a tensor name with "=" in it is a plain "stage.out".
            if any(right.startswith(s + ".") for s in stages) or not any(left.startswith(s + ".") for s in stages):
                name, text = left, right
                if not name:
                    raise CompositionError(where + "an empty name before '='")
        raw.append((name, *parse_port(text, stages, where)))
    own = [out for name, _, out in raw if name is None]
    exposed = [
        Exposed(name if name is not None else (out if own.count(out) == 1 else f"{stage}.{out}"), stage, out)
        for name, stage, out in raw
    ]
    seen: dict[str, int] = {}
    for i, e in enumerate(exposed):
        if e.name in seen:
            raise CompositionError(
                at.key(f"outputs[{i}]") + f"the output name '{e.name}' is taken by outputs[{seen[e.name]}]"
            )
        seen[e.name] = i
    return exposed


def _edge_index(a: int | str, edges: list[Edge], where: str) -> int:
    if isinstance(a, bool) or not isinstance(a, (int, str)):
        raise CompositionError(where + "expected an edge index or an edge string")
    if isinstance(a, int):
        if not 0 <= a < len(edges):
            raise CompositionError(where + f"there is no edge {a} ({len(edges)} edges)")
        return a
    wanted = " ".join(a.split())
    for i, e in enumerate(edges):
        if str(e) == wanted:
            return i
    raise CompositionError(where + f"'{a}' is not one of the edges{_core.did_you_mean(wanted, [str(e) for e in edges])}")


# --- build ------------------------------------------------------------------------------


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
            from fastseq import convert  # imports onnx: only on this error path

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
        from fastseq import convert

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

    package = os.path.dirname(os.path.abspath(__file__))
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


# --- session settings -------------------------------------------------------------------

# SessionOptions attributes a pipeline file may set; enums are written by name.
# Config entries ONNX Runtime lets us read back by key (it has no way to list them).
_CONFIG_KEYS = (
    "session.disable_prepacking",
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.set_denormal_as_zero",
    "session.use_env_allocators",
    "session.disable_cpu_ep_fallback",
    "session.use_device_allocator_for_initializers",
    "session.disable_quant_qdq",
    "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "optimization.enable_gelu_approximation",
    "optimization.minimal_build_optimizations",
    "session.dynamic_block_base",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
)

_ATTRIBUTES = (
    "intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
    "execution_order",
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling",
    "profile_file_prefix", "optimized_model_filepath", "use_deterministic_compute",
    "log_severity_level", "log_verbosity_level", "logid",
)


def _enums() -> dict[str, dict[str, Any]]:
    import onnxruntime as ort

    level, mode = ort.GraphOptimizationLevel, ort.ExecutionMode
    return {
        "graph_optimization_level": {
            "disabled": level.ORT_DISABLE_ALL, "basic": level.ORT_ENABLE_BASIC,
            "extended": level.ORT_ENABLE_EXTENDED, "all": level.ORT_ENABLE_ALL,
        },
        "execution_mode": {"sequential": mode.ORT_SEQUENTIAL, "parallel": mode.ORT_PARALLEL},
        "execution_order": {
            "default": ort.ExecutionOrder.DEFAULT, "priority_based": ort.ExecutionOrder.PRIORITY_BASED,
            "memory_efficient": ort.ExecutionOrder.MEMORY_EFFICIENT,
        },
    }


def session_options(options: Any) -> Any:
    """An ``ort.SessionOptions`` from a dict of attributes (enums by name: ``"all"``,
    ``"parallel"``) and dotted config entries (``"session.disable_prepacking" = "1"``); an
    ``ort.SessionOptions`` or None is returned as it is."""
    if options is None or not isinstance(options, Mapping):
        return options
    import onnxruntime as ort

    result = ort.SessionOptions()
    enums = _enums()
    for key, value in options.items():
        if "." in key:
            result.add_session_config_entry(key, str(value).lower() if isinstance(value, bool) else str(value))
        elif key in enums:
            if value not in enums[key]:
                raise ValueError(f"{key}: '{value}' is not one of {', '.join(enums[key])}")
            setattr(result, key, enums[key][value])
        elif key in _ATTRIBUTES:
            try:
                setattr(result, key, value)
            except TypeError as e:
                raise ValueError(f"{key}: {value!r} has the wrong type ({e})") from None
        else:
            raise ValueError(f"'{key}' is not a session option{_core.did_you_mean(key, list(_ATTRIBUTES))}")
    return result


def session_options_dict(options: Any) -> dict[str, Any]:
    """The attributes of an ``ort.SessionOptions`` that differ from the defaults, and the
    config entries among ``_CONFIG_KEYS`` that are set, as :func:`session_options` reads
    them (ONNX Runtime cannot list config entries: only known keys travel)."""
    if options is None or isinstance(options, Mapping):
        return dict(options or {})
    import onnxruntime as ort

    default = ort.SessionOptions()
    names = {kind: {v: k for k, v in values.items()} for kind, values in _enums().items()}
    out: dict[str, Any] = {}
    for key in _ATTRIBUTES:
        value = getattr(options, key)
        if value != getattr(default, key):
            out[key] = names[key][value] if key in names else value
    for key in _CONFIG_KEYS:
        try:
            out[key] = options.get_session_config_entry(key)
        except RuntimeError:  # not set
            pass
    return out


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
        is_list = isinstance(entry, Iterable) and not isinstance(entry, (str, bytes, Mapping))
        pairs = _as_pairs(list(entry)) if is_list else None
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
