"""The ``fastseq`` command: merge, inspect and run ONNX models in build pipelines.

Exit codes: 0 success, 1 a fastseq error (bad model, bad joint, failed download or write),
2 a usage error (after the command's usage), 130 interrupted. Every error goes to stderr as
one ``fastseq: error: ...`` line, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import NoReturn
from contextlib import contextmanager, nullcontext
from pathlib import Path

from fastseq import __version__
from fastseq.facades.compose import save
from fastseq.errors import FastseqError, human_size
from fastseq.graph.build import build
from fastseq.graph.spec import PipelineSpec


def _is_pipeline_file(arg: str) -> bool:
    return arg.endswith(".toml")


def _fail(message: str) -> SystemExit:
    """A usage mistake that argparse cannot see: the one ``fastseq: error:`` line, exit 1."""
    return SystemExit(f"fastseq: error: {message}")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors on the one ``fastseq: error: <command>: ...`` line
    (after the usage), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        command = self.prog.partition(" ")[2]
        self.exit(2, f"fastseq: error: {command + ': ' if command else ''}{message}\n")


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


def _check_io_maps(args: argparse.Namespace) -> None:
    if args.io_map is not None and len(args.io_map) != len(args.models) - 1:
        raise _fail(
            f"{len(args.models)} models have {len(args.models) - 1} joint(s) "
            f"but {len(args.io_map)} --io-map were given (one per joint, in order)"
        )


def _load_npy(name: str, file: str):
    """One --input array; anything but a readable .npy file is a one-line error."""
    path = Path(file).expanduser()
    if not path.is_file():
        raise _fail(f"--input {name}={file}: no such file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        kind = " (an .npz archive: save one array per input with numpy.save)" if magic[:2] == b"PK" else ""
        raise _fail(f"--input {name}={file}: not a .npy file{kind}; write each input with numpy.save(path, array)")
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise _fail(f"--input {name}={file}: {e}") from None


def _feeds(args: argparse.Namespace, pipe) -> dict:
    """The --input arrays by input name: ``NAME=FILE.npy``, or ``FILE.npy`` alone for a
    one-input pipeline; each as its input's dtype where that changes no value (int32 to
    int64, float16 to float32, bool to a number: the pipeline converts), or with ``--cast``
    where it does (float64 to float32)."""
    import numpy as np

    from fastseq import _core
    from fastseq.errors import InputError

    inputs = {i.name: i for i in pipe.inputs}
    feeds = {}
    for item in args.input or []:
        name, sep, file = item.partition("=")
        if not (sep and name in inputs) and len(inputs) == 1 and (not sep or Path(item).expanduser().exists()):
            name, file = next(iter(inputs)), item
        elif not sep or not name or not file:
            raise _fail(f"--input '{item}': expected NAME=FILE.npy; the inputs are {', '.join(map(str, pipe.inputs))}")
        elif name not in inputs:
            raise InputError(f"'{name}' is not an input{_core.did_you_mean(name, list(inputs))}; inputs: "
                             f"{', '.join(inputs)}")
        array = _load_npy(name, file)
        want = inputs[name].dtype
        if want is not None and array.dtype != want and not np.can_cast(array.dtype, want, "safe"):
            if not args.cast:
                raise _fail(
                    f"--input {name}={file} holds {array.dtype}, input '{name}' expects {want}, and converting loses "
                    f"values; pass --cast to convert it anyway (as array.astype(numpy.{want}) does)"
                )
            array = array.astype(want)
        feeds[name] = array
    return feeds


def _pipeline(args: argparse.Namespace):
    """The pipeline that ``args.models`` name: one pipeline.toml, or models composed in order."""
    if len(args.models) == 1 and _is_pipeline_file(args.models[0]):
        from fastseq.graph import pipefile
        from fastseq.facades.pipeline import Pipeline

        if args.io_map is not None:
            raise _fail("--io-map is for a chain of models; a pipeline file has edges")
        spec = pipefile.read(args.models[0])
        if args.providers:
            spec.providers = list(args.providers)
        return Pipeline.from_spec(spec)
    from fastseq.facades.sequential import ONNXSequential

    _check_io_maps(args)
    return ONNXSequential(*args.models, io_maps=args.io_map, providers=args.providers or None)


def cmd_merge(args: argparse.Namespace) -> int:
    if len(args.models) == 1 and _is_pipeline_file(args.models[0]):
        from fastseq.graph import pipefile

        if args.io_map is not None or args.keep_outputs:
            raise _fail("--io-map and --keep-outputs are for a chain of models; "
                "a pipeline file has edges and outputs"
            )
        spec = pipefile.read(args.models[0])
        what = f"merging {len(spec.stages)} stages"
    else:
        _check_io_maps(args)
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
            from fastseq.runtime.optimized import export_optimized

            written = export_optimized(built.composed, args.output, args.providers, None)
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
    _print_cleanups(built.report, built.plan)
    return 0


def _print_cleanups(report: dict, plan: dict) -> None:
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
        raise _fail("--svg and --dot draw a pipeline file (pipeline.toml)")
    src = loader.resolve(args.model, 0)
    model = _core.load_model(src.data, src.label)
    print(f"{src.label}")
    _print_summary(model.summary())
    _print_stages(model)
    return 0


def _print_stages(model) -> None:
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
    plan = built.plan
    print(f"{args.model}: {len(plan['stages'])} stages, {len(plan['edges'])} edges")
    for st in plan["stages"]:
        print(f"  {st['label']}: {built.sources.get(st['label'], '')}{' (pruned)' if st['pruned'] else ''}")
    edges = [f"  {src}.{output} -> {dst}.{inp}" for src, output, dst, inp, _ in plan["edges"]]
    print("edges:\n" + ("\n".join(edges) or "  (none)"))
    _print_summary(built.composed.summary())
    _print_cleanups(built.report, plan)
    text = drawing.to_dot(plan, Path(args.model).stem, built.sources)
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
        if args.cast:
            raise _fail("--cast converts .npy inputs; a dataset's columns must hold the inputs' dtypes")
        if not args.input or len(args.input) != 1 or not args.output:
            raise _fail("--ray needs one --input (a folder of .npy files or a Parquet dataset) and --output "
                        "(a folder for Parquet files)")
        try:
            from fastseq.integrations.ray import run_dataset
        except ImportError as e:
            raise _fail(str(e)) from None
    pipe = _pipeline(args)
    if args.ray is not None:
        run_dataset(pipe, args.input[0], args.output, args.ray or None, args.concurrency, args.batch_size)
        return 0
    feeds = _feeds(args, pipe)
    with progress("running"):
        outputs = pipe.run(feeds)
    names = [o.name for o in pipe.outputs]
    for name, value in zip(names, outputs):
        print(f"{name}: {value.dtype}{list(value.shape)}" + ("" if args.output else f"  {_summary(value)}"))
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs)))
        print(f"wrote {args.output}")
    return 0


def _summary(value) -> str:
    """``min -1.5 max 2 mean 0.25, first [0.1, 0.2, ...]``: what an output holds, in a line."""
    import numpy as np

    if value.size == 0:
        return "empty"
    flat = value.reshape(-1)
    shown = ", ".join(f"{v:.4g}" if value.dtype.kind == "f" else str(v) for v in flat[:5].tolist())
    first = f"[{shown}{', ...' if flat.size > 5 else ''}]"
    if value.dtype.kind not in "biuf":
        return f"first {first}"
    numbers = flat.astype(np.float64)
    return f"min {numbers.min():.6g} max {numbers.max():.6g} mean {numbers.mean():.6g}, first {first}"


def cmd_profile(args: argparse.Namespace) -> int:
    pipe = _pipeline(args)
    feeds = _feeds(args, pipe)
    with progress("profiling"):
        profile = pipe.profile(runs=args.runs, warmup=args.warmup, **feeds)
    print(profile)
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from fastseq.runtime.cache import SessionCache, parse_duration, parse_size, root_from

    cache = SessionCache(args.dir) if args.dir else (root_from(None) or SessionCache())
    if args.action != "prune" and (args.max_size or args.older_than):
        raise FastseqError(f"cache {args.action}: --max-size and --older-than go with prune")
    if args.action == "list":
        if args.dry_run:
            raise FastseqError("cache list: --dry-run goes with clear and prune")
        found = cache.entries()
        total = sum(e["bytes"] for e in found)
        print(f"{cache.path}: {len(found)} entr{'y' if len(found) == 1 else 'ies'}, {human_size(total)} "
              f"(limit {human_size(cache.max_size)}), least recently used first")
        for e in found:
            print("  " + _describe_entry(e))
        return 0
    if args.action == "clear":
        removed = cache.clear(dry_run=args.dry_run)
    else:
        # Checked before anything is removed: a typo must not prune with a default.
        max_size = None if args.max_size is None else parse_size(args.max_size, "--max-size")
        older_than = None if args.older_than is None else parse_duration(args.older_than, "--older-than")
        removed = cache.prune(max_size, older_than, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for e in removed:
        print(f"{verb} {cache.path / e['key']}" + (" (left by a process that was killed)" if e.get("leftover")
                                                    else f": {_describe_entry(e)}"))
    entries = [e for e in removed if not e.get("leftover")]
    print(f"{verb} {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
          f"({human_size(sum(e['bytes'] for e in entries))}) from {cache.path}")
    kept = [] if args.dry_run or args.action == "prune" else cache.entries()
    if kept:
        print(f"kept {len(kept)} entr{'y' if len(kept) == 1 else 'ies'} that another process is loading "
              "or that fastseq did not make")
    return 0


def _describe_entry(e: dict) -> str:
    def when(t: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"

    if e.get("refused"):
        return f"{e['key']}  {human_size(e['bytes']):>9}  not used: {e['refused']}"
    if e.get("damaged"):
        return f"{e['key']}  {human_size(e['bytes']):>9}  damaged (its manifest cannot be read; rebuilt on next use)"
    stages = " -> ".join(e["labels"] or []) or "?"
    if len(stages) > 60:
        stages = stages[:57] + "..."
    providers = ", ".join(p.removesuffix("ExecutionProvider") for p in e["providers"] or [])
    made_by = f"onnx {e.get('onnx')}" if e.get("kind") == "converted stage" else \
        f"{providers}; onnxruntime {e['onnxruntime']}"
    return (f"{e['key']}  {human_size(e['bytes']):>9}  {stages}  [{made_by}]  "
            f"created {when(e['created'])}, last used {when(e['used'])}, {e['hits']} hit{'s' * (e['hits'] != 1)}")


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


def _providers_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--providers A B`` in every command; ``--provider A --provider B`` is taken too."""
    p.add_argument("--providers", "--provider", dest="providers", action="extend", nargs="+", metavar="PROVIDER",
                   help=help)


def _cast_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cast", action="store_true",
                   help="convert each input array to its input's dtype even where values change (float64 to "
                        "float32); without it only exact conversions are made")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastseq", description="Compose ONNX models into one graph and run it.")
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
    _providers_option(m, "with --optimize: the execution providers to optimise for, in priority order")
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
                   help="a graph input and the .npy file (numpy.save) holding its array; repeat for each input "
                        "(FILE.npy alone for a one-input pipeline); with --ray: one folder of .npy files or a "
                        "Parquet dataset")
    _cast_option(r)
    _providers_option(r, "the execution providers, in priority order")
    r.add_argument("-o", "--output", help="write the outputs to this .npz (with --ray: a folder of Parquet files); "
                                          "without it each output's shape, dtype and values are summarised")
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run over a dataset (--input: a folder of .npy files or Parquet) on the Ray cluster at "
                        "ADDRESS, or on a local one (needs fastseq[ray])")
    r.add_argument("--concurrency", type=int, help="with --ray: actors (default: the cluster's CPUs less one)")
    r.add_argument("--batch-size", type=int, default=256, help="with --ray: rows per batch (default 256)")
    r.set_defaults(func=cmd_run)

    pr = sub.add_parser("profile", help="where a pipeline spends its time, per stage (ONNX Runtime's profiler, "
                                        "mapped back to the stages' own node names)")
    pr.add_argument("models", nargs="+", help="a pipeline.toml, or models composed in order (as for run)")
    pr.add_argument("--io-map", action="append", type=_parse_io_map, metavar="OUT:IN[,OUT:IN]",
                    help="the connections of one joint; give one per joint, in order (default: by position)")
    pr.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                    help="a graph input and the .npy file (numpy.save) holding its array; repeat for each input "
                         "(FILE.npy alone for a one-input pipeline)")
    _cast_option(pr)
    _providers_option(pr, "the execution providers, in priority order")
    pr.add_argument("--runs", type=int, default=20, help="profiled runs (default 20)")
    pr.add_argument("--warmup", type=int, default=3, help="runs before the profiled ones (default 3)")
    pr.set_defaults(func=cmd_profile)

    c = sub.add_parser("cache", help="list, prune or empty the session cache")
    c.add_argument("action", choices=["list", "prune", "clear"],
                   help="list: what each entry is for, its size, when made and last used, its hits; prune: remove "
                        "entries by age and least recent use; clear: remove every entry")
    c.add_argument("--dir", help="the cache folder (default: $FASTSEQ_SESSION_CACHE or ~/.cache/fastseq/sessions)")
    c.add_argument("--max-size", metavar="SIZE",
                   help="prune: remove the least recently used entries until the rest fit in SIZE (e.g. 1G, 500M; "
                        "default with no --older-than: the cache's limit, $FASTSEQ_SESSION_CACHE_MAX or 2G)")
    c.add_argument("--older-than", metavar="DURATION",
                   help="prune: remove entries last used more than DURATION ago (e.g. 30d, 12h, 90m)")
    c.add_argument("--dry-run", action="store_true", help="clear, prune: say what would be removed, remove nothing")
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
        return _error(e)
    except ModuleNotFoundError as e:
        from fastseq.errors import runtime_missing

        return _error(runtime_missing(e) or e)
    except (OSError, ValueError) as e:
        return _error(e)
    except KeyboardInterrupt:
        return _error("interrupted", 130)
    except Exception as e:  # noqa: BLE001  (the last resort: still one line, never a traceback)
        return _error(f"unexpected {type(e).__name__}: {e} (a bug in fastseq: please report it)")


def _error(error: BaseException | str, code: int = 1) -> int:
    """Prints the one ``fastseq: error:`` line (a message over several lines joined)."""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip())
    print(f"fastseq: error: {text}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
