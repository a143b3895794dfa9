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
from fastseq.compose import build
from fastseq.errors import FastseqError, human_size


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


def _check_io_maps(command: str, args: argparse.Namespace) -> None:
    if args.io_map is not None and len(args.io_map) != len(args.models) - 1:
        raise SystemExit(
            f"fastseq {command}: error: {len(args.models)} models have {len(args.models) - 1} joint(s) "
            f"but {len(args.io_map)} --io-map were given (one per joint, in order)"
        )


def _load_npy(name: str, file: str) -> np.ndarray:
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
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise SystemExit(f"fastseq run: error: --input {name}={file}: {e}") from None


def cmd_merge(args: argparse.Namespace) -> int:
    _check_io_maps("merge", args)
    reuse = args.external_data == "reuse"
    args.output.parent.mkdir(parents=True, exist_ok=True)  # -o new_folder/out.onnx
    with progress(f"merging {len(args.models)} models"):
        composed, _ = build(
            args.models,
            args.io_map,
            args.keep_outputs,
            opset=args.opset,
            cache_dir=args.cache_dir,
            force_download=args.force_download,
            link_external=reuse,
        )
        external = {"auto": None, "yes": True, "no": False, "reuse": True}[args.external_data]
        written = composed.save(str(args.output), external_data=external)
    info = composed.summary()
    print(
        f"wrote {args.output} ({human_size(written['model_bytes'])}"
        + (f" + {written['data_file']} {human_size(written['data_bytes'])}" if written["data_file"] else "")
        + f"): {info['nodes']} nodes, {info['initializers']} weights"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from fastseq import _core

    src = loader.resolve(args.model, 0)
    info = _core.load_model(src.data, src.label).summary()
    def io(items):
        def dims_text(dims):
            return ", ".join("?" if d is None else str(d) for d in dims)

        return "\n".join(f"  {name}: {dtype}[{dims_text(dims)}]" for name, dtype, dims in items) or "  (none)"
    print(f"{src.label}")
    print(f"IR version {info['ir_version']}; producer {info['producer'] or '?'}")
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in info["opsets"]))
    print("inputs:\n" + io(info["inputs"]))
    print("outputs:\n" + io(info["outputs"]))
    print(
        f"nodes: {info['nodes']}; initializers: {info['initializers']} ({human_size(info['weight_bytes'])}); "
        f"local functions: {info['functions']}"
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from fastseq.sequential import ONNXSequential

    _check_io_maps("run", args)
    pipe = ONNXSequential(*args.models, io_maps=args.io_map, providers=args.provider or None)
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
    m.add_argument("models", nargs="+", help="paths, URLs, hf:// ids or builtin:NAME, in order")
    m.add_argument("--io-map", action="append", type=_parse_io_map, metavar="OUT:IN[,OUT:IN]",
                   help="the connections of one joint; give one per joint, in order (default: by position)")
    m.add_argument("-o", "--output", required=True, type=Path, help="the merged model to write")
    m.add_argument("--external-data", choices=["auto", "yes", "no", "reuse"], default="auto", nargs="?", const="yes",
                   help="weights in a data file beside the output (auto: above 2 GB); reuse: link the "
                        "sources' data files instead of copying them")
    m.add_argument("--keep-outputs", action="store_true", help="keep unconsumed outputs of earlier models")
    m.add_argument("--opset", type=int, help="convert every model to this default-domain opset first")
    m.add_argument("--cache-dir", help="where downloads are cached")
    m.add_argument("--force-download", action="store_true")
    m.set_defaults(func=cmd_merge)

    i = sub.add_parser("inspect", help="inputs, outputs, opsets, node and weight counts")
    i.add_argument("model")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="run a model, or several composed in order, on .npy inputs")
    r.add_argument("models", nargs="+", help="paths, URLs, hf:// ids or builtin:NAME, composed in order")
    r.add_argument("--io-map", action="append", type=_parse_io_map, metavar="OUT:IN[,OUT:IN]",
                   help="the connections of one joint; give one per joint, in order (default: by position)")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="a graph input and the .npy file (numpy.save) holding its array; repeat for each input")
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
