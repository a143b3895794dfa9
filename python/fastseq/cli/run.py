"""``fastseq run`` and ``fastseq profile``: a pipeline on ``.npy`` inputs (or, for run, over
a dataset on Ray)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from fastseq.cli.console import Quiet, check_output, fail, progress, verbose_option
from fastseq.cli.models import (
    cast_option,
    dynamic_batch_option,
    feeds,
    input_option,
    io_map_option,
    opset_option,
    pipeline,
    providers_option,
)


def add(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="run a model, several composed in order, or a pipeline.toml on .npy inputs, or over a dataset on Ray",
    )
    r.add_argument(
        "models", nargs="+", help="paths, URLs, hf:// ids or builtin:NAME, composed in order; or one pipeline.toml"
    )
    io_map_option(r)
    opset_option(r)
    dynamic_batch_option(r)
    input_option(r, "; with --ray: one folder of .npy files or a Parquet dataset")
    cast_option(r)
    providers_option(r, "the execution providers, in priority order")
    r.add_argument(
        "-o",
        "--output",
        help="write the outputs to this .npz (.npz is added to a name without it; "
        "with --ray: a folder of Parquet files); without it each output's "
        "shape, dtype and values are summarised",
    )
    r.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run over a dataset (--input: a folder of .npy files or Parquet) on the Ray cluster at "
        "ADDRESS, or on a local one (needs the ray extra)",
    )
    r.add_argument("--concurrency", type=int, help="with --ray: actors (default: the cluster's CPUs less one)")
    r.add_argument("--batch-size", type=int, default=256, help="with --ray: rows per batch (default 256)")
    verbose_option(r)
    r.set_defaults(func=cmd_run)

    pr = sub.add_parser(
        "profile",
        help="where a pipeline spends its time, per stage (ONNX Runtime's profiler, "
        "mapped back to the stages' own node names)",
    )
    _pipeline_options(pr, "the execution providers, in priority order")
    pr.add_argument("--runs", type=int, default=20, help="profiled runs (default 20)")
    pr.add_argument("--warmup", type=int, default=3, help="runs before the profiled ones (default 3)")
    verbose_option(pr)
    pr.set_defaults(func=cmd_profile)

    v = sub.add_parser(
        "verify",
        help="run the composed pipeline and its stages one by one as given (before "
        "conversion and optimisation) and compare each output",
    )
    _pipeline_options(v, "the execution providers of the composed pipeline, in priority order")
    v.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    v.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    verbose_option(v)
    v.set_defaults(func=cmd_verify)


def _pipeline_options(p: Any, providers_help: str) -> None:
    """The pipeline and its inputs, as profile and verify take them (run's own say more:
    sources, and --ray's input)."""
    p.add_argument("models", nargs="+", help="a pipeline.toml, or models composed in order (as for run)")
    io_map_option(p)
    opset_option(p)
    dynamic_batch_option(p)
    input_option(p)
    cast_option(p)
    providers_option(p, providers_help)


def npz_path(output: str) -> Path:
    """Where ``-o`` writes: the name given, with ``.npz`` added as numpy.savez adds it."""
    text = os.fspath(output)
    if Path(text).expanduser().is_dir():
        check_output(text)  # the core's error: a folder is not a file to write
    return Path(text if text.endswith(".npz") else text + ".npz").expanduser()


def cmd_run(args: argparse.Namespace, quiet: Quiet) -> int:
    if args.ray is not None:  # a dataset on a Ray cluster (extra: ray)
        return _run_on_ray(args, quiet)
    out = None
    if args.output:
        out = npz_path(args.output)
        check_output(out)  # before the model runs: a result that cannot be kept is not computed
    pipe = pipeline(args, quiet)
    inputs = feeds(args, pipe)
    with progress("running"):
        outputs = pipe.run(inputs)
    names = [o.name for o in pipe.outputs]
    for name, value in zip(names, outputs):
        print(f"{name}: {value.dtype}{list(value.shape)}" + ("" if out else f"  {_summary(value)}"))
    if out is not None:
        import io

        import numpy as np

        from fastseq import _core

        archive = io.BytesIO()
        np.savez(archive, **dict(zip(names, outputs)))
        _core.commit_bytes(archive.getvalue(), str(out))  # atomically, never through a link
        print(f"wrote {out}")
    return 0


def _run_on_ray(args: argparse.Namespace, quiet: Quiet) -> int:
    if args.cast:
        raise fail("--cast converts .npy inputs; a dataset's columns must hold the inputs' dtypes")
    if not args.input or len(args.input) != 1 or not args.output:
        raise fail(
            "--ray needs one --input (a folder of .npy files or a Parquet dataset) and --output "
            "(a folder for Parquet files)"
        )
    check_output(Path(args.output) / "part.parquet", folders=True)
    from fastseq.errors import require_extra

    require_extra("fastseq run --ray", "ray", ("ray", "pyarrow"))  # before anything imports Ray
    quiet.ray()
    from fastseq.ray import run_dataset

    pipe = pipeline(args, quiet)
    run_dataset(pipe, args.input[0], args.output, args.ray or None, args.concurrency, args.batch_size)
    return 0


def _summary(value: Any) -> str:
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


def cmd_profile(args: argparse.Namespace, quiet: Quiet) -> int:
    pipe = pipeline(args, quiet)
    inputs = feeds(args, pipe)
    with progress("profiling"):
        profile = pipe.profile(runs=args.runs, warmup=args.warmup, **inputs)
    print(profile)
    return 0


def cmd_verify(args: argparse.Namespace, quiet: Quiet) -> int:
    """Exit 0 where every output agrees within the tolerances, 1 where one does not."""
    pipe = pipeline(args, quiet)
    inputs = feeds(args, pipe)
    with progress("verifying"):
        parity = pipe.verify(rtol=args.rtol, atol=args.atol, **inputs)
    print(parity)
    return 0 if parity.ok else 1
