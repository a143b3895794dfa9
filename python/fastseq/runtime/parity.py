"""The parity check (``pipe.verify``): the composed pipeline against its stages run one by one
as they were given (before opset conversion, ONNX Runtime's optimisations or a batch-axis
adapter), each in a session of its own, outputs handed on as the core's plan joins them. Each
output's largest absolute and relative difference is set against tolerances; where they part,
the composed graph's own values are read back at each stage's outputs to name the first stage
whose outputs differ."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastseq.errors import CompositionError


@dataclass(frozen=True)
class Difference:
    """One value's largest differences between the pipeline and its stages one by one."""

    name: str
    max_abs: float
    max_rel: float
    ok: bool


@dataclass(frozen=True)
class Parity:
    """What :meth:`fastseq.Pipeline.verify` found: per exposed output, its differences;
    ``first_stage``: the first stage (in the plan's order) whose outputs differ inside the
    composed graph, where the outputs part (None where they agree)."""

    outputs: list[Difference]
    rtol: float
    atol: float
    first_stage: str | None = None
    stages: dict[str, list[Difference]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.outputs)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        lines = [
            f"{'output':<32} {'max abs diff':>14} {'max rel diff':>14}  within rtol={self.rtol:g}, atol={self.atol:g}"
        ]
        lines += [
            f"{d.name:<32} {d.max_abs:>14.3g} {d.max_rel:>14.3g}  {'yes' if d.ok else 'NO'}" for d in self.outputs
        ]
        if self.first_stage is not None:
            lines.append(f"the pipeline parts from its stages at stage '{self.first_stage}'")
        elif not self.ok:
            lines.append(
                "the stages agree inside the composed graph: the difference comes from the pipeline's "
                "session (its optimisations or providers)"
            )
        return "\n".join(lines)


def verify(pipe: Any, inputs: tuple[Any, ...], named: Mapping[str, Any], rtol: float, atol: float) -> Parity:
    """:meth:`fastseq.Pipeline.verify`: ``pipe``'s outputs for these inputs against its stages
    run one by one as given (``pipe.stages_given``, what the core composed before any conversion)."""
    given = pipe.stages_given
    if given is None:
        raise CompositionError(
            "verify needs the stages as they were given, which a pipeline rebuilt from a pickle "
            "or a portable copy no longer has: build it again from its sources"
        )
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            from fastseq.errors import InputError

            raise InputError(f"{name} must be a number >= 0, got {value!r}")
    runner = pipe.runner
    feeds = runner.feeds(inputs, named)
    engine = pipe.engine
    plan = engine.composed.plan()
    reference = stage_by_stage(plan, given, feeds, _session)
    got = runner.run_checked(runner.output_names(None), feeds, None)
    outputs = []
    for (name, label, out), value in zip(plan["outputs"], got):
        outputs.append(difference(name, value, reference[label][out], rtol, atol))
    parity = Parity(outputs, float(rtol), float(atol))
    if parity.ok:
        return parity
    first, per = first_stage(
        plan, engine.composed.to_bytes(), engine.stage_origins(), reference, feeds, _session, rtol, atol
    )
    return Parity(outputs, float(rtol), float(atol), first, per)


def _session(model: Any) -> Any:
    """A plain CPU session of a model as given (bytes, a path, (path, root), a core model)."""
    import onnxruntime as ort

    if isinstance(model, tuple):
        model = model[0]
    elif not isinstance(model, (bytes, str)):
        model = bytes(model.to_bytes())
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def difference(name: str, got: Any, want: Any, rtol: float, atol: float) -> Difference:
    """The largest differences of ``got`` from ``want`` (relative to ``want``'s size)."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return Difference(f"{name} (shape {list(g.shape)}, stages {list(w.shape)})", float("inf"), float("inf"), False)
    if g.dtype.kind not in "biufc" or w.dtype.kind not in "biufc":
        same = bool(np.array_equal(g, w))
        return Difference(name, 0.0 if same else float("inf"), 0.0 if same else float("inf"), same)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    both_nan = np.isnan(g64) & np.isnan(w64)
    gap = np.where(both_nan, 0.0, np.abs(g64 - w64))
    rel = gap / np.maximum(np.abs(w64), np.finfo(np.float64).tiny)
    ok = bool(np.allclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True))
    return Difference(name, float(gap.max(initial=0.0)), float(rel.max(initial=0.0)), ok)


def stage_by_stage(
    plan: Mapping[str, Any], given: Sequence[Any], feeds: Mapping[str, np.ndarray], session: Callable[[Any], Any]
) -> dict[str, dict[str, np.ndarray]]:
    """Every stage's outputs, each stage run alone on what the plan feeds it (``session``
    makes an ONNX Runtime session of a model as given)."""
    fed: dict[tuple[str, str], np.ndarray] = {}
    for name, targets in plan["inputs"]:
        for label, inp in targets:
            if name in feeds:  # not an IR 3 initializer listed among the inputs
                fed[(label, inp)] = feeds[name]
    values: dict[str, dict[str, np.ndarray]] = {}
    incoming: dict[str, list[tuple[str, str, str]]] = {}
    for src, out, dst, inp, *_ in plan["edges"]:
        incoming.setdefault(dst, []).append((src, out, inp))
    for stage in plan["stages"]:
        if stage["pruned"]:
            continue
        label = stage["label"]
        for src, out, inp in incoming.get(label, []):
            fed[(label, inp)] = values[src][out]
        s = session(given[stage["given"]])
        names = [i.name for i in s.get_inputs() if (label, i.name) in fed]  # the rest keep their defaults
        outs = [o.name for o in s.get_outputs()]
        try:
            values[label] = dict(zip(outs, s.run(outs, {n: fed[(label, n)] for n in names})))
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's own error, said for the stage
            raise CompositionError(
                f"cannot verify stage '{label}' run alone on what the pipeline feeds it (an "
                f"adapter between stages is not replayed): {e}"
            ) from None
    return values


def first_stage(
    plan: Mapping[str, Any],
    model: bytes,
    origins: tuple[Any, Any],
    reference: Mapping[str, Mapping[str, np.ndarray]],
    feeds: Mapping[str, np.ndarray],
    session: Callable[[Any], Any],
    rtol: float,
    atol: float,
) -> tuple[str | None, dict[str, list[Difference]]]:
    """The first stage whose outputs, read inside the composed graph, differ from the stages
    run one by one; and each stage's differences."""
    import onnx

    stages, renamed = origins
    index = {label: k for k, (label, _first, _end) in enumerate(stages)}
    inside = {(k, old): new for new, (k, old) in renamed.items()}
    m = onnx.load_from_string(model)
    exposed = {o.name for o in m.graph.output}
    wanted: dict[str, tuple[str, str]] = {}
    for stage in plan["stages"]:
        label = stage["label"]
        for out, *_ in stage["outputs"]:
            if label in reference and out in reference[label]:
                name = inside.get((index.get(label), out), out)
                wanted[name] = (label, out)
                if name not in exposed:
                    m.graph.output.append(onnx.ValueInfoProto(name=name))
    s = session(m.SerializeToString())
    names = [o.name for o in s.get_outputs()]
    got = dict(zip(names, s.run(names, {i.name: feeds[i.name] for i in s.get_inputs()})))
    per: dict[str, list[Difference]] = {}
    for name, (label, out) in wanted.items():
        if name in got:
            per.setdefault(label, []).append(difference(out, got[name], reference[label][out], rtol, atol))
    first = next((st["label"] for st in plan["stages"] if any(not d.ok for d in per.get(st["label"], []))), None)
    return first, per
