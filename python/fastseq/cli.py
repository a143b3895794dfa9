"""The ``fastseq`` command: merge, inspect and run ONNX models in build pipelines.

Exit codes: 0 success, 1 a fastseq error (bad model, bad joint, failed download or write),
2 a usage error. Errors go to stderr as one ``fastseq: error: ...`` line.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fastseq import __version__, loader, operators
from fastseq.compose import save
from fastseq.errors import FastseqError, human_size
from fastseq.spec import PipelineSpec, build


def _is_pipeline_file(arg: str) -> bool:
    return arg.endswith(".toml")


@contextmanager
def progress(what: str, stream=None) -> Iterator[None]:
    """Shows an elapsed-time line on a terminal when the work takes over a second, and a
    one-line summary in logs."""
    stream = stream or sys.stderr
    done = threading.Event()
    start = time.perf_counter()
    tty = stream.isatty()

    def tick() -> None:
        if done.wait(1.0):
            return
        frames = "|/-\\"
        i = 0
        while not done.wait(0.2):
            stream.write(f"\r{frames[i % 4]} {what} {time.perf_counter() - start:5.1f}s")
            stream.flush()
            i += 1

    thread = threading.Thread(target=tick, daemon=True)
    if tty:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if tty:
            thread.join()
            stream.write("\r\033[K")
    elapsed = time.perf_counter() - start
    if elapsed >= 1.0 or not tty:
        stream.write(f"{what}: done in {elapsed:.2f}s\n")
        stream.flush()


def _parse_io_map(text: str) -> list[tuple[str, str]]:
    """'y:x' or 'y:x,z:w' (one joint); '' for a joint with no connection."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        out, sep, inp = part.rpartition(":")
        if not sep or not out or not inp:
            raise argparse.ArgumentTypeError(f"'{part}': expected OUTPUT:INPUT")
        pairs.append((out, inp))
    return pairs


def cmd_merge(args: argparse.Namespace) -> int:
    if len(args.models) == 1 and _is_pipeline_file(args.models[0]):
        from fastseq import pipefile

        if args.io_map is not None or args.keep_outputs:
            raise SystemExit(
                "fastseq merge: error: --io-map and --keep-outputs are for a chain of models; "
                "a pipeline file has edges and outputs"
            )
        spec = pipefile.read(args.models[0])
        what = f"merging {len(spec.stages)} stages"
    else:
        if args.io_map is not None and len(args.io_map) != len(args.models) - 1:
            raise SystemExit(
                f"fastseq merge: error: {len(args.models)} models have {len(args.models) - 1} joint(s) "
                f"but {len(args.io_map)} --io-map were given (one per joint, in order)"
            )
        spec = PipelineSpec.chain(args.models, args.io_map, keep_outputs=args.keep_outputs)
        what = f"merging {len(args.models)} models"
    spec.cache_dir = args.cache_dir or spec.cache_dir
    spec.force_download = args.force_download
    if args.opset is not None:
        spec.opset = args.opset
    if args.external_data is not None:
        spec.external_data = {"auto": None, "yes": True, "no": False, "reuse": "reuse"}[args.external_data]
    with progress(what):
        built = build(spec)
        written = save(built.composed, args.output, spec.external_data)
    info = built.composed.summary()
    print(
        f"wrote {args.output} ({human_size(written['model_bytes'])}"
        + (f" + {written['data_file']} {human_size(written['data_bytes'])}" if written["data_file"] else "")
        + f"): {info['nodes']} nodes, {info['initializers']} weights"
    )
    _print_cleanups(built.report, built.layout)
    return 0


def _print_cleanups(report: dict, layout) -> None:
    """One line per clean-up the build did (what the core reports)."""
    pruned = report.get("pruned") or {}
    stages = pruned.get("stages") or ([s.name for s in layout.stages if s.pruned] if layout is not None else [])
    if stages or pruned.get("nodes") or pruned.get("initializers"):
        print(
            f"pruned: {len(stages)} stage(s){' (' + ', '.join(stages) + ')' if stages else ''}, "
            f"{pruned.get('nodes', 0)} node(s), {pruned.get('initializers', 0)} initializer(s)"
            + (f", inputs {', '.join(pruned['inputs'])}" if pruned.get("inputs") else "")
        )
    elif layout is not None:
        print("pruned: nothing")
    if report.get("deduped_initializers"):
        print(
            f"deduplicated: {report['deduped_initializers']} initializer(s), "
            f"{human_size(report['deduped_bytes'])} saved"
        )
    for edge, description in report.get("adapters") or []:
        print(f"adapter on edges[{edge}]: {description}")
    for stage, output in report.get("unused_outputs") or []:
        print(f"unused output: {stage}.{output}")


def _io(items) -> str:
    return "\n".join(f"  {name}: {dtype}[{', '.join(dims)}]" for name, dtype, dims in items) or "  (none)"


def cmd_inspect(args: argparse.Namespace) -> int:
    from fastseq import _core

    if _is_pipeline_file(args.model):
        return _inspect_pipeline(args)
    if args.svg or args.dot:
        raise SystemExit("fastseq inspect: error: --svg and --dot draw a pipeline file (pipeline.toml)")
    src = loader.resolve(args.model, 0)
    info = _core.load_model(src.data, src.label).summary()
    print(f"{src.label}")
    _print_summary(info)
    return 0


def _print_summary(info: dict) -> None:
    print(f"IR version {info['ir_version']}; producer {info['producer'] or '?'}")
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in info["opsets"]))
    print("inputs:\n" + _io(info["inputs"]))
    print("outputs:\n" + _io(info["outputs"]))
    print(
        f"nodes: {info['nodes']}; initializers: {info['initializers']} ({human_size(info['weight_bytes'])}); "
        f"local functions: {info['functions']}"
    )


def _inspect_pipeline(args: argparse.Namespace) -> int:
    from fastseq import drawing, pipefile

    spec = pipefile.read(args.model)
    built = build(spec)
    layout = built.layout
    print(f"{args.model}: {len(layout.stages)} stages, {len(layout.edges)} edges")
    for st in layout.stages:
        print(f"  {st.name}: {st.label}{' (pruned)' if st.pruned else ''}")
    print("edges:\n" + ("\n".join(f"  {e}" for e in layout.edges) or "  (none)"))
    _print_summary(built.composed.summary())
    _print_cleanups(built.report, layout)
    text = drawing.to_dot(layout, Path(args.model).stem)
    if args.dot:
        Path(args.dot).write_text(text, encoding="utf-8")
        print(f"wrote {args.dot}")
    if args.svg:
        Path(args.svg).write_text(drawing.to_svg(text), encoding="utf-8")
        print(f"wrote {args.svg}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if _is_pipeline_file(args.model):
        from fastseq import pipefile
        from fastseq.pipeline import Pipeline

        spec = pipefile.read(args.model)
        if args.provider:
            spec.providers = list(args.provider)
        pipe = Pipeline.from_spec(spec)
    else:
        from fastseq.sequential import ONNXSequential

        pipe = ONNXSequential(args.model, providers=args.provider or None)
    feeds = {}
    for item in args.input or []:
        name, sep, file = item.partition("=")
        if not sep:
            raise SystemExit(f"fastseq run: error: --input '{item}': expected NAME=FILE.npy")
        feeds[name] = np.load(file, allow_pickle=False)
    with progress("running"):
        outputs = pipe.run(feeds)
    names = [o.name for o in pipe.outputs]
    for name, value in zip(names, outputs):
        print(f"{name}: {value.dtype}{list(value.shape)}")
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs)))
        print(f"wrote {args.output}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fastseq.sequential import ONNXSequential

    chain = ["builtin:to_float", "builtin:resize", "builtin:normalize", "builtin:color_head"]
    pipe = ONNXSequential(*chain)
    image = np.load(operators.sample())
    (probs,) = pipe(image)
    print(pipe)
    best = int(np.argmax(probs[0]))
    print(f"input: sample image {list(image.shape)} {image.dtype}")
    print("probabilities: " + ", ".join(f"{c} {p:.3f}" for c, p in zip(operators.CLASSES, probs[0])))
    print(f"prediction: {operators.CLASSES[best]}")
    if args.output:
        print(f"exported {pipe.export(args.output)}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastseq", description="Compose ONNX models into one graph and run it.")
    p.add_argument("--version", action="version", version=f"fastseq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("merge", help="compose models into one file")
    m.add_argument("models", nargs="+",
                   help="paths, URLs, hf:// ids or builtin:NAME, in order; or one pipeline.toml")
    m.add_argument("--io-map", action="append", type=_parse_io_map, metavar="OUT:IN[,OUT:IN]",
                   help="the connections of one joint; give one per joint, in order (default: by position)")
    m.add_argument("-o", "--output", required=True, type=Path, help="the merged model to write")
    m.add_argument("--external-data", choices=["auto", "yes", "no", "reuse"], default=None, nargs="?", const="yes",
                   help="weights in a data file beside the output (auto: above 2 GB); reuse: link the "
                        "sources' data files instead of copying them")
    m.add_argument("--keep-outputs", action="store_true", help="keep unconsumed outputs of earlier models")
    m.add_argument("--opset", type=int, help="convert every model to this default-domain opset first")
    m.add_argument("--cache-dir", help="where downloads are cached")
    m.add_argument("--force-download", action="store_true")
    m.set_defaults(func=cmd_merge)

    i = sub.add_parser("inspect", help="inputs, outputs, opsets, node and weight counts; a pipeline's "
                                       "stages, edges and what was pruned")
    i.add_argument("model", help="a model, or a pipeline.toml")
    i.add_argument("--svg", help="draw the pipeline's stage graph to this SVG (needs Graphviz)")
    i.add_argument("--dot", help="write the pipeline's stage graph as Graphviz DOT text")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="run a model or a pipeline.toml on .npy inputs")
    r.add_argument("model", help="a model, or a pipeline.toml")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--provider", action="append", help="execution provider, in priority order")
    r.add_argument("-o", "--output", help="write the outputs to this .npz")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="compose the built-in operators and classify a bundled sample")
    d.add_argument("-o", "--output", help="also export the composed pipeline here")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except FastseqError as e:
        print(f"fastseq: error: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"fastseq: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
