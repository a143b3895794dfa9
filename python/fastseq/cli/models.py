"""What the commands that read models share: model lists or a pipeline file, ``--io-map``,
``--input`` arrays, ``--providers``, and the pipeline they build."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fastseq.cli.console import Quiet, fail


def is_pipeline_file(arg: str) -> bool:
    return arg.endswith(".toml")


def parse_io_map(text: str) -> list[tuple[str, str]]:
    """'y:x' or 'y:x,z:w' (one joint); '' for a joint with no connection."""
    from fastseq.errors import CompositionError
    from fastseq.graph.parse import parse_io_pair

    try:
        return [parse_io_pair(part, "") for part in filter(None, (p.strip() for p in text.split(",")))]
    except CompositionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_opset(text: str) -> int | str:
    """'17' or 'highest'."""
    if text == "highest":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected an opset version or 'highest'") from None


def check_io_maps(args: argparse.Namespace) -> None:
    if args.io_map is not None and len(args.io_map) != len(args.models) - 1:
        raise fail(
            f"{len(args.models)} models have {len(args.models) - 1} joint(s) "
            f"but {len(args.io_map)} --io-map were given (one per joint, in order)"
        )


def io_map_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--io-map",
        action="append",
        type=parse_io_map,
        metavar="OUT:IN[,OUT:IN]",
        help="the connections of one joint; give one per joint, in order (default: by position)",
    )


def opset_option(p: argparse.ArgumentParser) -> None:
    """``--opset N|highest``: the models converted before they are composed (merge, run,
    serve and profile alike)."""
    p.add_argument(
        "--opset",
        type=parse_opset,
        metavar="N|highest",
        help="convert the models first: ai.onnx to opset N (or the highest among them), "
        "other domains to the highest version they can share",
    )


def dynamic_batch_option(p: argparse.ArgumentParser) -> None:
    """``--dynamic-batch``: a batch-1 export given a dynamic batch axis where the core proves it."""
    p.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="a model exported with a batch of 1: make its first axis dynamic (constant reshapes copy "
        "the rows' axis), where the batch analysis proves each row stays apart; refused naming the "
        "node otherwise",
    )


def providers_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--providers A B`` in every command; ``--provider A --provider B`` is taken too."""
    p.add_argument(
        "--providers", "--provider", dest="providers", action="extend", nargs="+", metavar="PROVIDER", help=help
    )


def cast_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cast",
        action="store_true",
        help="convert each input array to its input's dtype even where values change (float64 to "
        "float32); without it only exact conversions are made",
    )


def input_option(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument(
        "--input",
        action="append",
        metavar="NAME=FILE.npy",
        help="a graph input and the .npy file (numpy.save) holding its array; repeat for each input "
        f"(FILE.npy alone for a one-input pipeline){extra}",
    )


def load_npy(name: str, file: str) -> Any:
    """One --input array; anything but a readable .npy file is a one-line error."""
    path = Path(file).expanduser()
    if not path.is_file():
        from fastseq.sources.resolve import near_path

        raise fail(f"--input {name}={file}: no such file{near_path(path)}")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        kind = " (an .npz archive: save one array per input with numpy.save)" if magic[:2] == b"PK" else ""
        raise fail(f"--input {name}={file}: not a .npy file{kind}; write each input with numpy.save(path, array)")
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise fail(f"--input {name}={file}: {e}") from None


def feeds(args: argparse.Namespace, pipe: Any) -> dict[str, Any]:
    """The --input arrays by input name: ``NAME=FILE.npy``, or ``FILE.npy`` alone for a
    one-input pipeline; each as its input's dtype where that changes no value (int32 to
    int64, float16 to float32, bool to a number: the pipeline converts), or with ``--cast``
    where it does (float64 to float32)."""
    from fastseq import _core
    from fastseq.errors import InputError
    from fastseq.runtime.inputs import converts

    inputs = {i.name: i for i in pipe.inputs}
    found = {}
    for item in args.input or []:
        name, sep, file = item.partition("=")
        if not (sep and name in inputs) and len(inputs) == 1 and (not sep or Path(item).expanduser().exists()):
            name, file = next(iter(inputs)), item
        elif not sep or not name or not file:
            raise fail(f"--input '{item}': expected NAME=FILE.npy; the inputs are {', '.join(map(str, pipe.inputs))}")
        elif name not in inputs:
            raise InputError(
                f"'{name}' is not an input{_core.did_you_mean(name, list(inputs))}; inputs: {', '.join(inputs)}"
            )
        array = load_npy(name, file)
        want = inputs[name].dtype
        if not converts(want, array.dtype):  # the one input rule; --cast goes past it on purpose
            if not args.cast:
                raise fail(
                    f"--input {name}={file} holds {array.dtype}, input '{name}' expects {want}, and converting loses "
                    f"values; pass --cast to convert it anyway (as array.astype(numpy.{want}) does)"
                )
            array = array.astype(want)
        found[name] = array
    missing = [i for i in pipe.inputs if i.name not in found]
    if missing:
        how = "--input FILE.npy" if len(inputs) == 1 else " ".join(f"--input {i.name}=FILE.npy" for i in missing)
        given = "no --input" if not args.input else "no --input for " + ", ".join(i.name for i in missing)
        raise fail(
            f"{given}: the pipeline needs {', '.join(map(str, missing))}; pass {how} (each array saved with numpy.save)"
        )
    return found


def pipeline_file(args: argparse.Namespace) -> str | None:
    """The pipeline.toml that ``args.models`` name alone, or None for models to compose."""
    if len(args.models) == 1 and is_pipeline_file(args.models[0]):
        if args.io_map is not None:
            raise fail("--io-map is for a chain of models; a pipeline file has edges")
        return args.models[0]
    return None


def pipeline(args: argparse.Namespace, quiet: Quiet, session_options: Any = None) -> Any:
    """The pipeline that ``args.models`` name, started: one pipeline.toml, or models composed
    in order (on ``session_options``, if given). A provider asked for that ONNX Runtime did
    not start (a GPU library missing: ONNX Runtime logs it and falls back) is a warning."""
    quiet.runtime()
    file = pipeline_file(args)
    if file is not None:
        from fastseq.graph import pipefile

        return from_spec(pipefile.read(file), args, quiet)
    from fastseq.errors import OpsetMismatchError
    from fastseq.facades.sequential import ONNXSequential
    from fastseq.graph.convert import HINTS

    check_io_maps(args)
    try:
        pipe = ONNXSequential(
            *args.models,
            io_maps=args.io_map,
            providers=args.providers or None,
            session_options=session_options,
            target_opset_version=getattr(args, "opset", None),
            dynamic_batch=getattr(args, "dynamic_batch", False),
        )
    except OpsetMismatchError as e:  # the remedy on the command line is a flag, not a keyword
        raise OpsetMismatchError(str(e).replace(HINTS["sequential"], HINTS["cli"])) from None
    _warn_unstarted(args.providers, pipe.providers, quiet)
    return pipe


def from_spec(spec: Any, args: argparse.Namespace, quiet: Quiet) -> Any:
    """The pipeline a pipeline file's spec describes, started (``--providers`` over its own)."""
    from fastseq.facades.pipeline import Pipeline

    if args.providers:
        spec.providers = list(args.providers)
    if getattr(args, "opset", None) is not None:
        spec.opset = args.opset
    spec.dynamic_batch = spec.dynamic_batch or getattr(args, "dynamic_batch", False)
    spec.entry = "cli"
    pipe = Pipeline.from_spec(spec)
    _warn_unstarted(spec.providers, pipe.providers, quiet)
    return pipe


def _warn_unstarted(asked: Any, running: list[str], quiet: Quiet) -> None:
    """Each provider asked for that this onnxruntime build has but the session runs without."""
    import warnings

    import onnxruntime as ort

    available = ort.get_available_providers()
    for p in asked or []:
        name = p if isinstance(p, str) else p[0]
        if name in available and name not in running:
            warnings.warn(
                f"{name} could not be started (ONNX Runtime fell back to {', '.join(running)})"
                + ("" if quiet.verbose else "; --verbose shows ONNX Runtime's log of why"),
                RuntimeWarning,
                stacklevel=1,  # said as one line by the console: where it was raised is not shown
            )
