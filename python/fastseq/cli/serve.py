"""``fastseq serve``: pipelines over the network on the KServe v2 protocol (what Triton's
clients speak), batched, until SIGTERM. It only reads the flags, builds the pipelines as
``run`` does and starts :mod:`fastseq.serving` (the ``serve`` extra)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fastseq.cli.console import Quiet, fail, verbose_option
from fastseq.cli.models import dynamic_batch_option, io_map_option, opset_option, providers_option

#: The session options the server starts its pipelines with, where a pipeline file's own
#: session_options say nothing else: without ONNX Runtime's spinning, as the server's batchers
#: run them (one session each, not two), and at ONNX Runtime's own default optimisation level,
#: ORT_ENABLE_ALL, where fastseq's Python API keeps kornia's ORT_ENABLE_EXTENDED: a server is
#: built for throughput (on the small CNN of benches/bench_netserve.py a row took 2.2x less
#: CPU: 21 µs against 47 µs on one thread).
SERVING_OPTIONS = {"graph_optimization_level": "all", "session.intra_op.allow_spinning": "0"}


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}': expected a number") from None
        if not value > 0 or value != value:
            raise argparse.ArgumentTypeError(f"'{text}': expected a number > 0")
        return value

    return parse


def _delay(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected milliseconds") from None
    if not 0 <= value < 1e7:
        raise argparse.ArgumentTypeError(f"'{text}': expected milliseconds from 0")
    return value


def _size(text: str) -> int:
    """``1048576``, ``64K``, ``32M``, ``1G`` (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected bytes, e.g. 1048576 or 64M") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}': expected at least 1 byte")
    return value


def add(sub: Any) -> None:
    from fastseq.serving import DEFAULTS

    s = sub.add_parser(
        "serve",
        help="serve a model, several composed in order, or the pipelines of a pipeline.toml "
        "on the KServe v2 / Triton protocol over HTTP and gRPC",
    )
    s.add_argument(
        "models",
        nargs="+",
        metavar="SOURCE",
        help="paths, URLs, hf:// ids or builtin:NAME, composed in order; or one pipeline.toml (each of "
        "its pipelines served under its name)",
    )
    s.add_argument(
        "--name",
        help="the served model's name (default: the model file's stem, or 'pipeline' for "
        "several); a pipeline.toml names its own",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; the server has no "
        "authentication, see docs/netserve.md)",
    )
    s.add_argument("--port", type=int, default=8000, help="the port (default 8000; 0 picks a free one)")
    s.add_argument(
        "--grpc-port",
        type=int,
        help="also serve the protocol over gRPC on this port (Triton's GRPCInferenceService, what "
        "tritonclient.grpc calls; 0 picks a free one)",
    )
    s.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULTS["max_batch_size"],
        help=f"rows of concurrent requests joined into one run (default {DEFAULTS['max_batch_size']}; "
        "1 turns batching off)",
    )
    s.add_argument(
        "--max-delay-ms",
        type=_delay,
        default=DEFAULTS["max_delay_ms"],
        help="how long a free worker waits for a batch to fill (default 0: it runs what is queued)",
    )
    s.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULTS["max_queue"],
        help=f"requests open at once before a 503 (default {DEFAULTS['max_queue']})",
    )
    s.add_argument(
        "--max-request-bytes",
        type=_size,
        default=DEFAULTS["max_request_bytes"],
        help="the largest request body, e.g. 64M (default 32M); a larger one is a 413",
    )
    s.add_argument(
        "--timeout-s",
        type=_positive(float),
        default=DEFAULTS["timeout_s"],
        help=f"a request's limit from its arrival (its headers read) to its answer (default "
        f"{DEFAULTS['timeout_s']:g}); a request's own timeout parameter may be shorter",
    )
    s.add_argument(
        "--body-timeout-s",
        type=_positive(float),
        default=DEFAULTS["body_timeout_s"],
        help=f"how long a request body may take to arrive (default {DEFAULTS['body_timeout_s']:g}); "
        "a slower one is a 408",
    )
    s.add_argument(
        "--max-uploads",
        type=int,
        default=DEFAULTS["max_uploads"],
        help=f"request bodies arriving at once before a 503 (default {DEFAULTS['max_uploads']}); a request "
        "takes a place in the queue only once its body has arrived",
    )
    s.add_argument(
        "--memory-budget",
        type=_size,
        default=DEFAULTS["memory_budget"],
        help="bytes all requests may hold together, e.g. 512M (default 1G): bodies, decoded tensors, batches "
        "and answers until read; past it a request waits (then 503), and one alone over it is a 413",
    )
    s.add_argument(
        "--no-warm-up",
        action="store_true",
        help="ready once the sessions exist, without a warm-up run (for a model that a row of zeros, each "
        "dynamic axis 1, does not fit)",
    )
    s.add_argument(
        "--row-independent",
        action="store_true",
        help="batch a pipeline whose rows the analysis cannot show to stay apart (you know they do)",
    )
    io_map_option(s)
    opset_option(s)
    dynamic_batch_option(s)
    providers_option(s, "the execution providers, in priority order")
    verbose_option(s)
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace, quiet: Quiet) -> int:
    for flag in ("max_batch_size", "max_queue", "max_uploads"):
        if getattr(args, flag) < 1:
            raise fail(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    for flag in ("port", "grpc_port"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value <= 65535:
            raise fail(f"--{flag.replace('_', '-')} must be from 0 to 65535, got {value}")
    from fastseq import serving
    from fastseq.serving.server import Server, say

    _log(quiet)
    pipelines = _pipelines(args, quiet)
    served = serving.served(
        pipelines,
        row_independent=args.row_independent,
        warm_up=not args.no_warm_up,
        max_batch_size=args.max_batch_size,
        max_delay_ms=args.max_delay_ms,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
        timeout_s=args.timeout_s,
        body_timeout_s=args.body_timeout_s,
        max_uploads=args.max_uploads,
        memory_budget=args.memory_budget,
    )
    try:
        server = Server(served, args.host, args.port, grpc_port=args.grpc_port, announce=say, verbose=quiet.verbose)
    except OSError as e:
        raise fail(f"cannot listen: {e.strerror or e}") from None  # strerror names the port (HTTP or gRPC)
    return server.run()  # 1 where a model's warm-up failed (its line says which)


def _pipelines(args: argparse.Namespace, quiet: Quiet) -> dict[str, Any]:
    """The pipelines to serve by name: each of a pipeline.toml's, or the models composed in order."""
    from fastseq.cli.models import from_spec, pipeline, pipeline_file

    file = pipeline_file(args)
    if file is not None:
        from fastseq.graph import pipefile

        specs = pipefile.read_all(file)
        if args.name is not None:
            if len(specs) > 1:
                raise fail(f"--name names one pipeline; {file} names {len(specs)}: {', '.join(specs)}")
            specs = {args.name: next(iter(specs.values()))}
        quiet.runtime()
        for spec in specs.values():
            spec.session_options = {**SERVING_OPTIONS, **(spec.session_options or {})}
        return {name: from_spec(spec, args, quiet) for name, spec in specs.items()}
    from fastseq.graph.session_settings import session_options

    name = args.name or (_stem(args.models[0]) if len(args.models) == 1 else "pipeline")
    return {name: pipeline(args, quiet, session_options(SERVING_OPTIONS))}


def _stem(source: str) -> str:
    """A model's name from its source: the file's stem (``hf://org/repo/m.onnx``: ``m``)."""
    tail = source.rstrip("/").rsplit("/", 1)[-1].partition("?")[0]
    stem = Path(tail).stem if tail.endswith(".onnx") else tail.removeprefix("builtin:")
    from fastseq.serving import NAME_CHARS

    cleaned = "".join(c if c in NAME_CHARS else "_" for c in stem)
    return cleaned or "pipeline"


def _log(quiet: Quiet) -> None:
    """The server's own log lines (one per error) as ``fastseq serve: ...`` on stderr."""
    import logging
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("fastseq serve: %(message)s"))
    log = logging.getLogger("fastseq.serve")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
