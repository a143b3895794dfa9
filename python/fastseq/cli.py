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
from contextlib import contextmanager, nullcontext
from pathlib import Path

from fastseq import __version__
from fastseq.facades.compose import save
from fastseq.errors import FastseqError, human_size
from fastseq.graph.build import build
from fastseq.graph.spec import PipelineSpec


def _is_pipeline_file(arg: str) -> bool:
    return arg.endswith(".toml")

# Each command imports what it uses (numpy, onnxruntime, the loader) itself: `fastseq --help`
# and `fastseq inspect` stay fast.


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


def _parse_opset(text: str) -> int | str:
    """'17' or 'highest'."""
    if text == "highest":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected an opset version or 'highest'") from None


def _check_io_maps(command: str, args: argparse.Namespace) -> None:
    if args.io_map is not None and len(args.io_map) != len(args.models) - 1:
        raise SystemExit(
            f"fastseq {command}: error: {len(args.models)} models have {len(args.models) - 1} joint(s) "
            f"but {len(args.io_map)} --io-map were given (one per joint, in order)"
        )


def _load_npy(name: str, file: str):
    """One --input array; anything but a readable .npy file is a one-line error."""
    path = Path(file).expanduser()
    if not path.is_file():
        raise SystemExit(f"fastseq run: error: --input {name}={file}: no such file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        kind = " (an .npz archive: save one array per input with numpy.save)" if magic[:2] == b"PK" else ""
        raise SystemExit(
            f"fastseq run: error: --input {name}={file}: not a .npy file{kind}; "
            "write each input with numpy.save(path, array)"
        )
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise SystemExit(f"fastseq run: error: --input {name}={file}: {e}") from None


def cmd_merge(args: argparse.Namespace) -> int:
    if len(args.models) == 1 and _is_pipeline_file(args.models[0]):
        from fastseq.graph import pipefile

        if args.io_map is not None or args.keep_outputs:
            raise SystemExit(
                "fastseq merge: error: --io-map and --keep-outputs are for a chain of models; "
                "a pipeline file has edges and outputs"
            )
        spec = pipefile.read(args.models[0])
        what = f"merging {len(spec.stages)} stages"
    else:
        _check_io_maps("merge", args)
        spec = PipelineSpec.chain(args.models, args.io_map, keep_outputs=args.keep_outputs)
        what = f"merging {len(args.models)} models"
    spec.cache_dir = args.cache_dir or spec.cache_dir
    spec.force_download = args.force_download
    if args.opset is not None:
        spec.opset = args.opset
    if args.external_data is not None:
        spec.external_data = {"auto": None, "yes": True, "no": False, "reuse": "reuse"}[args.external_data]
    spec.entry = "cli"
    args.output.parent.mkdir(parents=True, exist_ok=True)  # -o new_folder/out.onnx
    with progress(what):
        built = build(spec)
        if args.optimize:
            from fastseq.runtime import session

            written = session.export_optimized(built.composed, args.output, args.providers, None)
            data_files = written["data_files"]
        else:
            written = save(built.composed, args.output, spec.external_data)
            data_files = [written["data_file"]] if written["data_file"] else []
    info = built.composed.summary()
    print(
        f"wrote {args.output} ({human_size(written['model_bytes'])}"
        + (f" + {', '.join(data_files)} {human_size(written['data_bytes'])}" if data_files else "")
        + f"): {info['nodes']} nodes, {info['initializers']} weights"
    )
    _print_cleanups(built.report, built.layout, built.labels)
    return 0


def _print_cleanups(report: dict, layout, labels: list[str]) -> None:
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
        name = labels[stage] if isinstance(stage, int) and stage < len(labels) else stage
        print(f"unused output: {name}.{output}")


def _io(items) -> str:
    def dims_text(dims):
        return ", ".join("?" if d is None else str(d) for d in dims)

    return "\n".join(f"  {name}: {dtype}[{dims_text(dims)}]" for name, dtype, dims in items) or "  (none)"


def cmd_inspect(args: argparse.Namespace) -> int:
    from fastseq import _core
    from fastseq.sources import resolve as loader

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
    from fastseq.graph import drawing
    from fastseq.graph import pipefile

    spec = pipefile.read(args.model)
    built = build(spec)
    layout = built.layout
    print(f"{args.model}: {len(layout.stages)} stages, {len(layout.edges)} edges")
    for st in layout.stages:
        print(f"  {st.name}: {st.label}{' (pruned)' if st.pruned else ''}")
    print("edges:\n" + ("\n".join(f"  {e}" for e in layout.edges) or "  (none)"))
    _print_summary(built.composed.summary())
    _print_cleanups(built.report, layout, built.labels)
    text = drawing.to_dot(layout, Path(args.model).stem)
    if args.dot:
        Path(args.dot).write_text(text, encoding="utf-8")
        print(f"wrote {args.dot}")
    if args.svg:
        Path(args.svg).write_text(drawing.to_svg(text), encoding="utf-8")
        print(f"wrote {args.svg}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    if args.ray is not None:  # a dataset on a Ray cluster (extra: ray)
        if not args.input or len(args.input) != 1 or not args.output:
            raise SystemExit("fastseq run: error: --ray needs one --input (a folder of .npy files or a Parquet "
                             "dataset) and --output (a folder for Parquet files)")
        try:
            from fastseq.integrations.ray import run_dataset
        except ImportError as e:
            raise SystemExit(f"fastseq run: error: {e}") from None
    if len(args.models) == 1 and _is_pipeline_file(args.models[0]):
        from fastseq.graph import pipefile
        from fastseq.facades.pipeline import Pipeline

        if args.io_map is not None:
            raise SystemExit("fastseq run: error: --io-map is for a chain of models; a pipeline file has edges")
        spec = pipefile.read(args.models[0])
        if args.provider:
            spec.providers = list(args.provider)
        pipe = Pipeline.from_spec(spec)
    else:
        from fastseq.facades.sequential import ONNXSequential

        _check_io_maps("run", args)
        pipe = ONNXSequential(*args.models, io_maps=args.io_map, providers=args.provider or None)
    if args.ray is not None:
        run_dataset(pipe, args.input[0], args.output, args.ray or None, args.concurrency, args.batch_size)
        return 0
    feeds = {}
    for item in args.input or []:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise SystemExit(f"fastseq run: error: --input '{item}': expected NAME=FILE.npy")
        feeds[name] = _load_npy(name, file)
    with progress("running"):
        outputs = pipe.run(feeds)
    names = [o.name for o in pipe.outputs]
    for name, value in zip(names, outputs):
        print(f"{name}: {value.dtype}{list(value.shape)}")
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs)))
        print(f"wrote {args.output}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from fastseq.runtime import cache

    root = cache.root_from(args.dir) if args.dir else (cache.root_from(None) or cache.default_root())
    if args.action == "clear":
        n = cache.clear(root)
        print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {root}")
        return 0
    found = cache.entries(root)
    total = sum(e["bytes"] for e in found)
    print(f"{root}: {len(found)} entr{'y' if len(found) == 1 else 'ies'}, {human_size(total)}")
    for e in found:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["used"])) if e["used"] else "?"
        what = "damaged" if e.get("damaged") else (
            f"onnxruntime {e['onnxruntime']}, "
            + ", ".join(p if isinstance(p, str) else p[0] for p in e["providers"] or [])
        )
        print(f"  {e['key']}  {human_size(e['bytes']):>9}  used {used}  {what}")
    return 0


#: The demo: photos of digits through operators built to order (``builtin:NAME?...``, the
#: strings the CLI and pipeline files take), the shipped scikit-learn classifier, and a head.
DEMO = [
    "builtin:to_float?scale=1/255",  # uint8 [N, H, W, 3] -> float in [0, 1]
    "builtin:layout?src=NHWC&dst=NCHW",  # channels first
    "builtin:grayscale",  # RGB -> luma [N, 1, H, W]
    "builtin:resize?size=8,8&mode=linear",  # the classifier's 8x8 pixels
    "builtin:normalize?mean=0.5&std=0.5",  # as it was trained
    "builtin:flatten",  # [N, 64] feature rows
    "builtin:digits",  # logistic regression exported by skl2onnx: label, logits
    "builtin:softmax",  # logits -> probabilities
    "builtin:argmax",  # probabilities -> class indices
]


def cmd_demo(args: argparse.Namespace) -> int:
    import numpy as np

    from fastseq.ops import shipped as operators
    from fastseq.facades.sequential import ONNXSequential

    # Every joint is positional but the classifier's: its second output feeds softmax.
    io_maps = [[("output", "input")]] * 6 + [[("logits", "input")], [("probabilities", "input")]]
    pipe = ONNXSequential(*DEMO, io_maps=io_maps, keep_outputs=["probabilities"])
    sample = np.load(operators.digits_sample())
    images, labels = sample["images"], sample["labels"]
    outputs = dict(zip((o.name for o in pipe.outputs), pipe(images)))
    probs, predicted = outputs["probabilities"], outputs["indices"]
    print(pipe)
    print(f"input: {len(images)} photos of handwritten digits {list(images.shape)} {images.dtype}")
    for i, (label, guess) in enumerate(zip(labels, predicted)):
        print(f"  photo {i}: predicted {guess} (probability {probs[i, guess]:.3f}), labelled {label}")
    right = int((predicted == labels).sum())
    print(f"prediction: {' '.join(map(str, predicted))} ({right} of {len(labels)} right)")
    if args.output:
        print(f"exported {pipe.export(args.output)}")
    return 0 if right == len(labels) else 1


def cmd_quantize(args: argparse.Namespace) -> int:
    from fastseq.integrations.quantize import quantize

    # Static quantization draws its own bar over the calibration batches.
    with nullcontext() if args.static else progress(f"quantizing {args.model}"):
        result = quantize(args.model, args.output, static=args.static, calibration=args.calibration,
                          per_channel=args.per_channel, format=args.format, preprocess=not args.no_preprocess)
    print(f"wrote {result}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastseq", description="Compose ONNX models into one graph and run it.")
    p.add_argument("--version", action="version", version=f"fastseq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("merge", help="compose models into one file")
    m.add_argument("models", nargs="+",
                   help="paths, URLs, hf:// ids, builtin:NAME or builtin:NAME?KEY=VALUE&... (quoted), in order; "
                        "or one pipeline.toml")
    m.add_argument("--io-map", action="append", type=_parse_io_map, metavar="OUT:IN[,OUT:IN]",
                   help="the connections of one joint; give one per joint, in order (default: by position)")
    m.add_argument("-o", "--output", required=True, type=Path, help="the merged model to write")
    m.add_argument("--external-data", choices=["auto", "yes", "no", "reuse"], default=None, nargs="?", const="yes",
                   help="weights in a data file beside the output (auto: above 2 GB); reuse: link the "
                        "sources' data files instead of copying them")
    m.add_argument("--keep-outputs", action="store_true", help="keep unconsumed outputs of earlier models")
    m.add_argument("--opset", type=_parse_opset, metavar="N|highest",
                   help="convert the models first: ai.onnx to opset N (or the highest among them), "
                        "other domains to the highest version they can share")
    m.add_argument("--optimize", action="store_true",
                   help="write the model as ONNX Runtime leaves it after its graph optimisations (weights "
                        "in a data file), so that deployments start sessions with optimisation off")
    m.add_argument("--providers", nargs="+", metavar="PROVIDER",
                   help="with --optimize: the execution providers to optimise for, in priority order")
    m.add_argument("--cache-dir", help="where downloads are cached")
    m.add_argument("--force-download", action="store_true")
    m.set_defaults(func=cmd_merge)

    i = sub.add_parser("inspect", help="inputs, outputs, opsets, node and weight counts; a pipeline's "
                                       "stages, edges and what was pruned")
    i.add_argument("model", help="a model, or a pipeline.toml")
    i.add_argument("--svg", help="draw the pipeline's stage graph to this SVG (needs Graphviz)")
    i.add_argument("--dot", help="write the pipeline's stage graph as Graphviz DOT text")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="run a model, several composed in order, or a pipeline.toml on .npy inputs, "
                                   "or over a dataset on Ray")
    r.add_argument("models", nargs="+", help="paths, URLs, hf:// ids or builtin:NAME, composed in order; "
                                            "or one pipeline.toml")
    r.add_argument("--io-map", action="append", type=_parse_io_map, metavar="OUT:IN[,OUT:IN]",
                   help="the connections of one joint; give one per joint, in order (default: by position)")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="a graph input and the .npy file (numpy.save) holding its array; repeat for each input; "
                        "with --ray: one folder of .npy files or a Parquet dataset")
    r.add_argument("--provider", action="append", help="execution provider, in priority order")
    r.add_argument("-o", "--output", help="write the outputs to this .npz (with --ray: a folder of Parquet files)")
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run over a dataset (--input: a folder of .npy files or Parquet) on the Ray cluster at "
                        "ADDRESS, or on a local one (needs fastseq[ray])")
    r.add_argument("--concurrency", type=int, help="with --ray: actors (default: the cluster's CPUs less one)")
    r.add_argument("--batch-size", type=int, default=256, help="with --ray: rows per batch (default 256)")
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("cache", help="list or empty the session cache")
    c.add_argument("action", choices=["list", "clear"])
    c.add_argument("--dir", help="the cache folder (default: $FASTSEQ_SESSION_CACHE or ~/.cache/fastseq/sessions)")
    c.set_defaults(func=cmd_cache)

    q = sub.add_parser("quantize", help="write an int8 version of a model (onnxruntime.quantization)")
    q.add_argument("model", help="the float model")
    q.add_argument("-o", "--output", required=True, type=Path, help="the quantized model to write")
    q.add_argument("--static", action="store_true",
                   help="quantize activations too, with ranges measured on --calibration (default: dynamic)")
    q.add_argument("--calibration", metavar="DIR",
                   help="folder of .npy batches (one input) or .npz batches (one array per input name)")
    q.add_argument("--per-channel", action="store_true", help="one scale per output channel of each weight")
    q.add_argument("--format", choices=["qdq", "qoperator"],
                   help="static: QuantizeLinear/DequantizeLinear pairs (qdq, default) or integer operators")
    q.add_argument("--no-preprocess", action="store_true", help="skip ONNX Runtime's quant_pre_process")
    q.set_defaults(func=cmd_quantize)

    d = sub.add_parser("demo", help="put built-in operators around a shipped classifier and read bundled digits")
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
    except ModuleNotFoundError as e:
        from fastseq.errors import runtime_missing

        if (missing := runtime_missing(e)) is None:
            raise
        print(f"fastseq: error: {missing}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"fastseq: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
