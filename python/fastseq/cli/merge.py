"""``fastseq merge`` and ``fastseq quantize``: the commands that write a model."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastseq.cli.console import Quiet, check_output, fail, make_folders, progress, verbose_option
from fastseq.cli.inspect import print_cleanups
from fastseq.cli.models import (
    check_io_maps,
    dynamic_batch_option,
    io_map_option,
    is_pipeline_file,
    opset_option,
    providers_option,
)
from fastseq.errors import human_size

if TYPE_CHECKING:
    from fastseq import _core


def add(sub: Any) -> None:
    m = sub.add_parser("merge", help="compose models into one file")
    m.add_argument(
        "models",
        nargs="+",
        help="paths, URLs, hf:// ids, builtin:NAME or builtin:NAME?KEY=VALUE&... (quoted), in order; "
        "or one pipeline.toml",
    )
    io_map_option(m)
    m.add_argument(
        "-o", "--output", required=True, type=Path, help="the merged model to write (missing folders are made)"
    )
    m.add_argument(
        "--external-data",
        choices=["auto", "yes", "no", "reuse"],
        default=None,
        nargs="?",
        const="yes",
        help="weights in a data file beside the output (auto: above 2 GB); reuse: link the "
        "sources' data files instead of copying them",
    )
    m.add_argument("--keep-outputs", action="store_true", help="keep unconsumed outputs of earlier models")
    opset_option(m)
    dynamic_batch_option(m)
    m.add_argument(
        "--optimize",
        action="store_true",
        help="write the model as ONNX Runtime leaves it after its graph optimisations (weights "
        "in a data file), so that deployments start sessions with optimisation off",
    )
    providers_option(m, "with --optimize: the execution providers to optimise for, in priority order")
    m.add_argument("--cache-dir", help="where downloads are cached")
    m.add_argument("--force-download", action="store_true")
    verbose_option(m)
    m.set_defaults(func=cmd_merge)

    q = sub.add_parser("quantize", help="write an int8 version of a model (onnxruntime.quantization)")
    q.add_argument("model", help="the float model")
    q.add_argument("-o", "--output", required=True, type=Path, help="the quantized model to write")
    q.add_argument(
        "--static",
        action="store_true",
        help="quantize activations too, with ranges measured on --calibration (default: dynamic)",
    )
    q.add_argument(
        "--calibration",
        metavar="DIR",
        help="folder of .npy batches (one input) or .npz batches (one array per input name)",
    )
    q.add_argument("--per-channel", action="store_true", help="one scale per output channel of each weight")
    q.add_argument(
        "--format",
        choices=["qdq", "qoperator"],
        help="static: QuantizeLinear/DequantizeLinear pairs (qdq, default) or integer operators",
    )
    q.add_argument("--no-preprocess", action="store_true", help="skip ONNX Runtime's quant_pre_process")
    verbose_option(q)
    q.set_defaults(func=cmd_quantize)


def written(result: _core.Saved) -> tuple[int, int, list[str]]:
    """The writer's account of a write: model bytes, data bytes, data files (every writer of
    the core returns a ``_core.Saved``)."""
    return result.model_bytes, result.data_bytes, list(result.data_files)


def cmd_merge(args: argparse.Namespace, quiet: Quiet) -> int:
    from fastseq.graph.build import build
    from fastseq.graph.spec import PipelineSpec

    if len(args.models) == 1 and is_pipeline_file(args.models[0]):
        from fastseq.graph import pipefile

        if args.io_map is not None or args.keep_outputs:
            raise fail("--io-map and --keep-outputs are for a chain of models; a pipeline file has edges and outputs")
        spec = pipefile.read(args.models[0])
        what = f"merging {len(spec.stages)} stages"
    else:
        check_io_maps(args)
        spec = PipelineSpec.chain(args.models, args.io_map, keep_outputs=args.keep_outputs)
        what = f"merging {len(args.models)} models"
    spec.cache_dir = args.cache_dir or spec.cache_dir
    spec.force_download = args.force_download
    if args.opset is not None:
        spec.opset = args.opset
    spec.dynamic_batch = spec.dynamic_batch or args.dynamic_batch
    if args.external_data is not None:
        spec.external_data = {"auto": None, "yes": True, "no": False, "reuse": "reuse"}[args.external_data]
    spec.entry = "cli"
    check_output(args.output, folders=True)  # -o new_folder/out.onnx: made once the merge is done
    if args.optimize:
        quiet.runtime()
    with progress(what):
        built = build(spec)
        if spec.dynamic_batch:
            from fastseq.runtime.rows import dynamic_batch

            built.composed = dynamic_batch(built.composed)
        made = make_folders(args.output)
        try:
            if args.optimize:
                from fastseq.runtime.optimized import export_optimized

                result = export_optimized(built.composed, args.output, args.providers, None)
            else:
                from fastseq.facades.compose import save

                result = save(built.composed, args.output, spec.external_data)
            model_bytes, data_bytes, data_files = written(result)
        except BaseException:
            for folder in reversed(made):  # only the folders made for this output, if still empty
                try:
                    folder.rmdir()
                except OSError:
                    break
            raise
    info = built.composed.summary()
    print(
        f"wrote {args.output} ({human_size(model_bytes)}"
        + (f" + {', '.join(data_files)} {human_size(data_bytes)}" if data_files else "")
        + f"): {info['nodes']} nodes, {info['initializers']} weights"
    )
    print_cleanups(built.report, built.plan)
    return 0


def cmd_quantize(args: argparse.Namespace, quiet: Quiet) -> int:
    from fastseq.quantize import quantize

    check_output(args.output)
    quiet.runtime()
    # Static quantization draws its own bar over the calibration batches.
    with nullcontext() if args.static else progress(f"quantizing {args.model}"):
        result = quantize(
            args.model,
            args.output,
            static=args.static,
            calibration=args.calibration,
            per_channel=args.per_channel,
            format=args.format,
            preprocess=not args.no_preprocess,
        )
    print(f"wrote {result}")
    return 0
