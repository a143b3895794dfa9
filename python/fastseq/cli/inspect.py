"""``fastseq inspect``: a model's inputs, outputs, opsets and sizes; a pipeline file's
stages, edges and clean-ups, drawn on request."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fastseq.cli.console import Quiet, check_output, fail, verbose_option
from fastseq.cli.models import is_pipeline_file
from fastseq.errors import human_size


def add(sub: Any) -> None:
    i = sub.add_parser(
        "inspect",
        help="inputs, outputs, opsets, node and weight counts; a pipeline's stages, edges and what was pruned",
    )
    i.add_argument("model", help="a model, or a pipeline.toml")
    i.add_argument("--svg", help="draw the pipeline's stage graph to this SVG (needs Graphviz)")
    i.add_argument("--dot", help="write the pipeline's stage graph as Graphviz DOT text")
    verbose_option(i)
    i.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace, quiet: Quiet) -> int:
    from fastseq import _core
    from fastseq.sources import resolve as loader

    if is_pipeline_file(args.model):
        return _inspect_pipeline(args)
    if args.svg or args.dot:
        raise fail("--svg and --dot draw a pipeline file (pipeline.toml)")
    src = loader.resolve(args.model, 0)
    model = _core.load_model(src.data, src.label)
    print(f"{src.label}")
    print_summary(model.summary())
    _print_stages(model)
    return 0


def _print_stages(model: Any) -> None:
    """The stages of a model that fastseq composed and wrote (its stage map), or why its map
    was ignored."""
    stages, _ = model.origins()
    if len(stages) > 1:
        print("stages (from its stage map):")
        for label, first, end in stages:
            count = end - first
            where = "" if not count else f" (#{first})" if count == 1 else f" (#{first}-#{end - 1})"
            print(f"  {label}: {count} node{'' if count == 1 else 's'}{where}")
    note = model.stage_map_note()
    if note:
        print(f"note: {note}")


def _io(items: Any) -> str:
    def dims_text(dims: Any) -> str:
        return ", ".join("?" if d is None else str(d) for d in dims)

    return "\n".join(f"  {name}: {dtype}[{dims_text(dims)}]" for name, dtype, dims in items) or "  (none)"


def print_summary(info: dict[str, Any]) -> None:
    print(f"IR version {info['ir_version']}; producer {info['producer'] or '?'}")
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in info["opsets"]))
    print("inputs:\n" + _io(info["inputs"]))
    print("outputs:\n" + _io(info["outputs"]))
    print(
        f"nodes: {info['nodes']}; initializers: {info['initializers']} ({human_size(info['weight_bytes'])}); "
        f"local functions: {info['functions']}"
    )


def print_cleanups(report: dict[str, Any], plan: dict[str, Any]) -> None:
    """One line per clean-up the build did, as the core reports and plans it."""
    pruned = report.get("pruned") or {}
    stages = plan.get("pruned") or []
    if stages or pruned.get("nodes") or pruned.get("initializers"):
        print(
            f"pruned: {len(stages)} stage(s){' (' + ', '.join(stages) + ')' if stages else ''}, "
            f"{pruned.get('nodes', 0)} node(s), {pruned.get('initializers', 0)} initializer(s)"
            + (f", inputs {', '.join(pruned['inputs'])}" if pruned.get("inputs") else "")
        )
    elif plan.get("form") == "graph":
        print("pruned: nothing")
    if report.get("deduped_initializers"):
        print(
            f"deduplicated: {report['deduped_initializers']} initializer(s), "
            f"{human_size(report['deduped_bytes'])} saved"
        )
    for edge, description in plan.get("adapters") or []:
        print(f"adapter on edges[{edge}]: {description}")
    for stage, output in plan.get("unused_outputs") or []:
        print(f"unused output: {stage}.{output}")


def _inspect_pipeline(args: argparse.Namespace) -> int:
    from fastseq import _core
    from fastseq.graph import drawing, pipefile
    from fastseq.graph.build import build

    spec = pipefile.read(args.model)
    for drawn in (args.dot, args.svg):
        if drawn:
            check_output(drawn)
    built = build(spec)
    plan = built.plan
    print(f"{args.model}: {len(plan['stages'])} stages, {len(plan['edges'])} edges")
    for st in plan["stages"]:
        print(f"  {st['label']}: {built.sources.get(st['label'], '')}{' (pruned)' if st['pruned'] else ''}")
    edges = [f"  {src}.{output} -> {dst}.{inp}" for src, output, dst, inp, _ in plan["edges"]]
    print("edges:\n" + ("\n".join(edges) or "  (none)"))
    print_summary(built.composed.summary())
    print_cleanups(built.report, plan)
    text = drawing.to_dot(plan, Path(args.model).stem, built.sources)
    if args.dot:
        _core.commit_bytes(text.encode("utf-8"), args.dot)
        print(f"wrote {args.dot}")
    if args.svg:
        _core.commit_bytes(drawing.to_svg(text).encode("utf-8"), args.svg)
        print(f"wrote {args.svg}")
    return 0
