"""A picture of a pipeline at the stage level, drawn from the core's plan: Graphviz DOT
text always, SVG through the ``dot`` binary where it is installed. A merged graph of 30,000 nodes is unreadable; its
handful of stages and the tensors between them is what people want to see."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from html import escape
from typing import Any

from fastseq.errors import ExportError
from fastseq.graph.parts import IoInfo

_GREY = "#9e9e9e"
_HOT = "#c62828"


def _q(s: str) -> str:
    """A DOT quoted id."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tensor(info: IoInfo | None) -> str:
    if info is None:
        return "?"
    _, dtype, dims = info
    return f"{dtype}[{', '.join('?' if d is None else str(d) for d in dims)}]"


def to_dot(
    plan: Mapping[str, Any],
    title: str = "pipeline",
    sources: Mapping[str, str] | None = None,
    times: Mapping[str, str] | None = None,
    hottest: str | None = None,
) -> str:
    """DOT text of the core's plan (``_core.Composed.plan()``): stages as boxes listing
    their inputs and outputs (name, dtype, shape) under their source (``sources``: stage
    label -> where it was read from), edges labelled with the tensors they carry, the merged
    model's graph inputs and outputs as ovals, pruned stages grey and dashed. Node ids:
    stages by label, graph inputs ``in:NAME``, outputs ``out:NAME``; ports ``i<k>`` /
    ``o<k>`` by position. ``times``: a label per stage (a profile's times) shown under its
    name; the ``hottest`` stage is drawn in red."""
    sources = sources or {}
    lines = [
        f"digraph {_q(title)} {{",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    ports: dict[tuple[str, str, str], str] = {}
    infos: dict[tuple[str, str], IoInfo] = {}
    pruned = set(plan["pruned"])
    for st in plan["stages"]:
        name, is_pruned = st["label"], st["pruned"]
        hot = name == hottest
        colour = _GREY if is_pruned else _HOT if hot else "black"
        fill = "#eeeeee" if is_pruned else "#f8d3c8" if hot else "#dde8f5"
        time = (times or {}).get(name)
        timed = f"<BR/><B>{escape(time)}{' (hottest)' if hot else ''}</B>" if time else ""
        rows = [
            f'<TR><TD COLSPAN="2" BGCOLOR="{fill}"><B>{escape(name)}</B>'
            f'<BR/><FONT POINT-SIZE="8">{escape(sources.get(name, ""))}{" (pruned)" if is_pruned else ""}</FONT>'
            f"{timed}</TD></TR>"
        ]
        for k in range(max(len(st["inputs"]), len(st["outputs"]))):
            cells = []
            for kind, items in (("i", st["inputs"]), ("o", st["outputs"])):
                if k < len(items):
                    info = items[k]
                    ports[kind, name, info[0]] = f"{kind}{k}"
                    infos[name, info[0]] = info
                    cells.append(
                        f'<TD PORT="{kind}{k}" ALIGN="{"LEFT" if kind == "i" else "RIGHT"}">'
                        f"{escape(info[0])}: {escape(_tensor(info))}</TD>"
                    )
                else:
                    cells.append("<TD></TD>")
            rows.append("<TR>" + "".join(cells) + "</TR>")
        table = f'<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" COLOR="{colour}">' + "".join(rows) + "</TABLE>"
        style = ', style="dashed"' if is_pruned else ""
        lines.append(f'  {_q(name)} [shape=plain, fontcolor="{colour}"{style}, label=<{table}>];')

    def port(kind: str, stage: str, name: str) -> str:
        p = ports.get((kind, stage, name))
        return f"{_q(stage)}:{p}" if p else _q(stage)

    for src, output, dst, inp, _ in plan["edges"]:
        grey = src in pruned or dst in pruned
        label = f"{output}: {_tensor(infos.get((src, output)))}"
        tooltip = f"{src}.{output} -> {dst}.{inp}"
        attrs = f"label={_q(label)}, tooltip={_q(tooltip)}" + (
            f', color="{_GREY}", fontcolor="{_GREY}"' if grey else ""
        )
        lines.append(f"  {port('o', src, output)} -> {port('i', dst, inp)} [{attrs}];")
    for name, targets in plan["inputs"]:
        node = _q(f"in:{name}")
        lines.append(f'  {node} [shape=oval, style=filled, fillcolor="#e8f5e9", label={_q(name)}];')
        for stage, inp in targets:
            lines.append(f"  {node} -> {port('i', stage, inp)};")
    for name, stage, output in plan["outputs"]:
        node = _q(f"out:{name}")
        lines.append(f'  {node} [shape=oval, style=filled, fillcolor="#fff3e0", label={_q(name)}];')
        label = _tensor(infos.get((stage, output)))
        lines.append(f"  {port('o', stage, output)} -> {node} [label={_q(label)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def have_dot() -> bool:
    """Whether Graphviz's ``dot`` is on the PATH."""
    return shutil.which("dot") is not None


def to_svg(dot_text: str) -> str:
    """SVG from DOT text through Graphviz's ``dot``; ExportError when it is missing or fails."""
    exe = shutil.which("dot")
    if exe is None:
        raise ExportError("drawing SVG needs Graphviz's 'dot' (apt-get install graphviz); to_dot() needs nothing")
    r = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ExportError(f"dot failed: {r.stderr.strip()}")
    return r.stdout
