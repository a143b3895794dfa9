"""Where a pipeline spends its time, in the stages' own names.

ONNX Runtime's profiler runs on a profiling session of the composed model (the pipeline's
own session is untouched) and reports every kernel under its merged node name and its node
index. The core attributes every node of the composed model to its stage by position (its
origins, or the stage map of a file it wrote), and gives every node that had no name one
that says its stage (``heavy/MatMul_3``), so a kernel is found by its node index where ONNX
Runtime loaded the node as it is, else by its name (fused kernels keep the first node's).
Time that no stage's node spent (the executor between nodes, copies, adapters the merge
inserted) is the ``unassigned`` rest: stage times plus the rest make up the run."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from fastseq import _core
from fastseq.errors import InputError, RunError
from fastseq.runtime.session import on_copy

if TYPE_CHECKING:
    from fastseq.runtime.engine import Engine

#: ONNX Runtime's profiler stops recording after this many events (``max_num_events_``).
MAX_EVENTS = 1_000_000
#: Slowest nodes listed per stage.
SLOWEST = 5


@dataclass(frozen=True)
class NodeTime:
    """One node's time: its name in its own model, ONNX Runtime's kernel (``FusedConv``
    where it fused nodes), and milliseconds per run."""

    name: str
    op_type: str
    ms: float


@dataclass(frozen=True)
class StageTime:
    """One stage: its name, milliseconds per run, share of the run, its node count in the
    merged graph and its slowest nodes."""

    name: str
    ms: float
    share: float
    nodes: int
    slowest: tuple[NodeTime, ...]


@dataclass(frozen=True)
class Profile:
    """A pipeline's profile (see :meth:`fastseq.ONNXSequential.profile`). Times are medians
    over the runs of ONNX Runtime's own measurements (a stall in one run moves none of them):
    ``run_ms`` is its ``model_run``, each stage the sum of its nodes' kernel times in a run,
    ``unassigned_ms`` the rest of the run (the executor between nodes, copies, adapters
    inserted between stages: ``unassigned_nodes``); the stages and the rest add up to
    ``run_ms``.
    Under the parallel execution mode kernels overlap, and shares are of their sum instead.
    ``session_s``: the seconds the profiling session took to create."""

    stages: tuple[StageTime, ...]
    run_ms: float
    unassigned_ms: float
    unassigned_share: float
    unassigned_nodes: tuple[NodeTime, ...]
    runs: int
    session_s: float
    providers: tuple[str, ...]
    #: why the stages could not be told apart (a file whose stage map does not fit its
    #: nodes), set by the profiler
    note: str | None = field(default=None, init=False)

    @property
    def hottest(self) -> StageTime | None:
        """The stage with the most time (None for a pipeline without nodes)."""
        # The largest share, and none when no stage took any time (nothing to point at).
        best = max(self.stages, key=lambda s: s.share, default=None)
        return best if best is not None and best.share > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data (JSON-ready)."""

        def nodes(items: tuple[NodeTime, ...]) -> list[dict[str, Any]]:
            return [{"name": n.name, "op_type": n.op_type, "ms": n.ms} for n in items]

        hottest = self.hottest
        return {
            "runs": self.runs,
            "run_ms": self.run_ms,
            "session_s": self.session_s,
            "providers": list(self.providers),
            "hottest": hottest.name if hottest is not None else None,
            "stages": [
                {"name": s.name, "ms": s.ms, "share": s.share, "nodes": s.nodes, "slowest": nodes(s.slowest)}
                for s in self.stages
            ],
            "unassigned": {
                "ms": self.unassigned_ms,
                "share": self.unassigned_share,
                "nodes": nodes(self.unassigned_nodes),
            },
            "note": self.note,
        }

    def stage_labels(self) -> dict[str, str]:
        """Per stage, its time as a short label for a drawing (``"0.95 ms, 77%"``)."""
        return {s.name: f"{s.ms:.3g} ms, {s.share:.0%}" for s in self.stages}

    def __str__(self) -> str:
        hottest = self.hottest
        width = max([len("(between stages)"), *(len(s.name) + 10 for s in self.stages)])
        lines = [
            f"{self.run_ms:.3f} ms per run (median of {self.runs} profiled runs, ONNX Runtime's model_run) "
            f"on {', '.join(self.providers)}",
            f"{'stage':<{width}}  {'ms/run':>9}  {'share':>6}  {'nodes':>6}",
        ]
        if self.note:
            lines.insert(1, f"note: {self.note}")

        def node_lines(items: tuple[NodeTime, ...]) -> None:
            for n in items:
                lines.append(f"    {n.ms:9.4f} ms  {n.name} ({n.op_type})")

        for s in self.stages:
            name = f"{s.name} (hottest)" if s is hottest and len(self.stages) > 1 else s.name
            lines.append(f"{name:<{width}}  {s.ms:9.4f}  {s.share:6.1%}  {s.nodes:6d}")
            node_lines(s.slowest)
        lines.append(f"{'(between stages)':<{width}}  {self.unassigned_ms:9.4f}  {self.unassigned_share:6.1%}")
        node_lines(self.unassigned_nodes)
        return "\n".join(lines)


def measure(engine: Engine, feeds: Mapping[str, np.ndarray], runs: int, warmup: int) -> Profile:
    """Profiles ``runs`` runs on ``feeds`` (after ``warmup`` ones) on a session that the
    ``engine`` opens on a copy of its session options with profiling on; the engine's
    composed model maps the nodes back (read once the session exists: it may be spilled)."""
    check_runs(runs, warmup)
    folder = tempfile.mkdtemp(prefix="fastseq-profile-")
    # Profiling is switched on in a copy of the pipeline's options: the caller's are theirs,
    # and profiles from several threads never share a file prefix.
    options = engine.session_options()
    options.enable_profiling, options.profile_file_prefix = True, os.path.join(folder, "profile")
    try:
        start = time.perf_counter()
        session = on_copy(lambda: engine.open_session(options))
        session_s = time.perf_counter() - start
        graph = _Graph(engine.composed)
        # Past ONNX Runtime's event limit the last runs would go unrecorded: fewer runs.
        per_run = graph.size + 2
        runs = max(1, min(runs, MAX_EVENTS // per_run - warmup - 1))
        names = [o.name for o in session.get_outputs()]
        try:
            for _ in range(warmup + runs):
                session.run(names, dict(feeds))
        except Exception as e:
            if type(e).__module__.startswith("onnxruntime"):
                raise engine.runner.explain(e) from e
            raise
        events = _read_events(session.end_profiling())
        providers = tuple(session.get_providers())
        del session
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _summarise(events, graph, warmup, runs, session_s, providers)


def check_runs(runs: Any, warmup: Any) -> None:
    """``runs`` is an int >= 1 and ``warmup`` an int >= 0 (an InputError naming the one
    that is not)."""
    for name, value, least in (("runs", runs, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InputError(f"profile needs {name} >= {least} (an int), got {name}={value!r}")


class _Graph:
    """The composed model's top-level nodes, each with its stage (the core's attribution)
    and its own name."""

    def __init__(self, composed: _core.Composed) -> None:
        stages, renamed = composed.origins()
        nodes = composed.nodes()
        self.labels = [label for label, _, _ in stages]
        self.names = [name for name, _, _, _ in nodes]
        self.ops = [op for _, op, _, _ in nodes]
        self.stage = [stage for _, _, _, stage in nodes]  # -1: inserted between stages (an adapter)
        self.size = len(nodes)
        self.counts = [0] * len(stages)
        for k in self.stage:
            if k >= 0:
                self.counts[k] += 1
        self.note = composed.stage_map_note()
        self.renamed = renamed
        self.by_name: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name:
                self.by_name.setdefault(name, i)
        # ONNX Runtime numbers the nodes it loads in order, but turns Constant nodes into
        # initializers: its node_index k is the k-th other node.
        self.loaded = [
            i for i, (_, op, domain, _) in enumerate(nodes) if not (op == "Constant" and domain in ("", "ai.onnx"))
        ]
        self._found: dict[tuple[str, int | None, str | None], tuple[int, str, str]] = {}

    def resolve(self, name: str, node_index: int | None, op: str | None) -> tuple[int, str, str]:
        """(stage or -1, name in the stage's own names, op type) of a profiled node."""
        key = (name, node_index, op)
        found = self._found.get(key)
        if found is None:
            hit = self._locate(name, node_index, op)
            if hit is None:  # a node ONNX Runtime made that no merged node's name leads to
                found = (-1, name, op or "?")
            else:
                i, merged = hit
                found = (self.stage[i], self.own_name(merged, name) if merged else name, op or self.ops[i])
            self._found[key] = found
        return found

    def _locate(self, name: str, node_index: int | None, op: str | None) -> tuple[int, str] | None:
        # The node as loaded: its index, where its name agrees (a node without a name gets
        # one from ONNX Runtime, "<op_type>_<n>"; a fused node gets an index of its own).
        if node_index is not None and node_index < len(self.loaded):
            i = self.loaded[node_index]
            if self.names[i] == name or (
                not self.names[i] and (op or self.ops[i]) == self.ops[i] and name.startswith(self.ops[i])
            ):
                return i, self.names[i]
        hit = self.by_name.get(name)
        if hit is not None:
            return hit, name
        # Fused nodes keep the first node's name, decorated: "fused X", "X/MatMulAddFusion",
        # "X_token_3", ...
        candidate = name.split(" ", 1)[1] if " " in name else name
        for _ in range(4):
            hit = self.by_name.get(candidate)
            if hit is not None:
                return hit, candidate
            cut = max(candidate.rfind("_"), candidate.rfind("/"))
            if cut <= 0:
                return None
            candidate = candidate[:cut]
        return None

    def own_name(self, merged: str, shown: str) -> str:
        """``shown`` (the profiled name, which holds ``merged``) in its stage's own names."""
        hit = self.renamed.get(merged)
        return shown.replace(merged, hit[1]) if hit is not None else shown


class _Event(NamedTuple):
    """What a profile needs of one of ONNX Runtime's events (times in µs)."""

    cat: str
    name: str
    tid: int
    ts: int
    dur: int
    op: str | None
    node_index: int | None


# ONNX Runtime writes one event per line, its fields in this order; the regular expressions
# read what a profile needs without parsing each node's arguments (thread statistics,
# shapes), which made json.load most of a profile's time. A line they do not match is
# parsed as JSON.
_HEAD = re.compile(
    r'\{"cat" : "(\w+)","pid" :\d+,"tid" :(\d+),"dur" :(\d+),"ts" :(\d+),"ph" : "X","name" :"(.*?)","args" : \{'
)
_OP = re.compile(r'"op_name" : "([^"]*)"')
_INDEX = re.compile(r'"node_index" : "(\d+)"')


def _read_events(path: str) -> list[_Event]:
    """The runs' and the kernels' events of a profile file."""
    events = []
    kernels: dict[str, tuple[str | None, int | None]] = {}  # name -> (op, node index): read once
    cut = False  # a line that does not parse may only be the last: a file cut short
    with open(path, encoding="utf-8") as f:
        for line in f:
            if cut:
                raise RunError(f"cannot read ONNX Runtime's profile {path}: an event does not parse")
            if "_kernel_time" not in line and '"model_run"' not in line:
                continue
            m = _HEAD.match(line)
            if m is not None:
                cat, tid, dur, ts, name = m.groups()
                kernel = kernels.get(name)
                if kernel is None:
                    op, index = _OP.search(line, m.end()), _INDEX.search(line, m.end())
                    kernel = kernels[name] = (op and op.group(1), int(index.group(1)) if index else None)
                events.append(_Event(cat, name, int(tid), int(ts), int(dur), *kernel))
                continue
            try:
                e = json.loads(line.strip().rstrip(","))
            except ValueError:
                cut = True
                continue
            args = e.get("args") or {}
            node_index = args.get("node_index")
            events.append(
                _Event(
                    e.get("cat", ""),
                    e.get("name", ""),
                    int(e.get("tid", 0)),
                    int(e["ts"]),
                    int(e["dur"]),
                    args.get("op_name"),
                    int(str(node_index)) if str(node_index).isdigit() else None,
                )
            )
    return events


def _summarise(
    events: list[_Event], graph: _Graph, warmup: int, runs: int, session_s: float, providers: tuple[str, ...]
) -> Profile:
    windows = sorted((e.ts, e.ts + e.dur) for e in events if e.cat == "Session" and e.name == "model_run")
    windows = windows[warmup : warmup + runs]
    if len(windows) < runs:  # ONNX Runtime writes the file without checking the writes
        raise RunError(
            f"ONNX Runtime's profile holds {len(windows)} of the {runs} runs measured: its file was cut short "
            f"(is the temporary folder {tempfile.gettempdir()} full?)"
        )
    kernels = sorted((e for e in events if e.cat == "Node" and e.name.endswith("_kernel_time")), key=lambda e: e.ts)
    n = len(windows)
    # Per run: each stage's time and each node's (stage or -1, own name, op) -> µs. Medians
    # over the runs, not means: on a busy machine one run's stall would make any stage look
    # like the hot one.
    per_stage = [[0.0] * len(graph.labels) for _ in range(n)]
    per_node: dict[tuple[int, str, str], list[float]] = {}
    busy = [0.0] * n
    w = 0
    ends: dict[int, int] = {}  # per thread: where the last top-level kernel ended
    for e in kernels:
        while w < n and e.ts >= windows[w][1]:
            w += 1
        if w == n:
            break
        if e.ts < windows[w][0]:
            continue  # a warm-up run's
        if e.ts < ends.get(e.tid, -1):
            continue  # a subgraph's node, inside its If or Loop node's time
        ends[e.tid] = e.ts + e.dur
        stage, shown, op = graph.resolve(e.name[: -len("_kernel_time")], e.node_index, e.op)
        per_node.setdefault((stage, shown, op), [0.0] * n)[w] += e.dur
        busy[w] += e.dur
        if stage >= 0:
            per_stage[w][stage] += e.dur
    # kernels overlap only under the parallel execution mode: then the run is their sum
    totals = [max(b - a, busy[k]) for k, (a, b) in enumerate(windows)]
    stage_us = [median(run[k] for run in per_stage) for k in range(len(graph.labels))]
    # The stages' medians and the rest make up the run's median (never less than their sum).
    total = max(median(totals), sum(stage_us))
    node_us = {key: median(times) for key, times in per_node.items()}

    def slowest(stage: int) -> tuple[NodeTime, ...]:
        items = sorted(((us, name, op) for (s, name, op), us in node_us.items() if s == stage), reverse=True)
        return tuple(NodeTime(name, op, us / 1000) for us, name, op in items[:SLOWEST])

    stages = tuple(
        StageTime(label, stage_us[k] / 1000, stage_us[k] / total if total else 0.0, graph.counts[k], slowest(k))
        for k, label in enumerate(graph.labels)
        if graph.counts[k]
    )
    rest = total - sum(stage_us)
    profile = Profile(
        stages, total / 1000, rest / 1000, rest / total if total else 0.0, slowest(-1), n, session_s, providers
    )
    object.__setattr__(profile, "note", graph.note)  # frozen: set once, here
    return profile
