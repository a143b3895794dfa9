"""Serving pipelines over the network on the KServe v2 inference protocol (Triton's, KServe's,
Seldon MLServer's, OpenVINO Model Server's), so that the clients people have (``tritonclient``,
``perf_analyzer``) call them: requests of many connections batched into one run, limits,
metrics and a clean shutdown.

The request path is the core's (``crates/fastseq-serve``: HTTP/1.1 and gRPC, the protocol,
batching, limits and metrics in Rust), entered in Python once a batch; Python keeps what is
decided once per pipeline:

- :mod:`.datatypes`: the KServe datatypes of ONNX element types;
- :mod:`.model`: one pipeline as served (its description for the core, its batching, its
  warm-up);
- :mod:`.runs`: what the core's server calls once a batch (the pipeline's runner);
- :mod:`.server`: the process: sockets bound, the core's server started, signals, the drain.

And the ASGI application, to mount in another (``fastseq.serving.app``; the ``serve`` extra),
which runs requests through the runtime's batcher with the core's decode and encode:

- :mod:`.protocol`: requests and responses to and from arrays (the core's functions);
- :mod:`.metrics`, :mod:`.service`, :mod:`.asgi`: its counts, admission and routes.

``fastseq.serve(pipe)`` blocks serving one pipeline (or a dict of them by name);
``fastseq.serving.app(pipe)`` is the ASGI application; ``fastseq serve`` is the command."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULTS: dict[str, Any] = {
    "max_batch_size": 32,  # rows joined into one run; 1 turns batching off
    "max_delay_ms": 0.0,  # how long a free worker waits for a batch to fill
    "max_queue": 128,  # requests open at once (reading, queued, running) before a 503
    "max_request_bytes": 32 << 20,  # a body's limit (413)
    "timeout_s": 60.0,  # a request's limit from its arrival (headers read) to its answer (503)
    "body_timeout_s": 30.0,  # how long a body may take to arrive (408), or an answer to be read
    "max_uploads": 64,  # request bodies arriving at once before a 503 (a queue place is taken once complete)
    "memory_budget": 1 << 30,  # bytes all requests hold together: bodies, tensors, batches, unread answers
    "header_timeout_s": 10.0,  # how long request headers may take to arrive (408)
    "max_header_bytes": 16 << 10,  # the request line and headers together (431)
    "max_headers": 64,  # headers a request may have (431)
}

#: the options only the server in the core keeps (the ASGI app's host keeps its own)
CORE_OPTIONS = ("max_uploads", "memory_budget", "header_timeout_s", "max_header_bytes", "max_headers")

#: a model's name, as it appears in a URL path
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """:data:`DEFAULTS` with ``options`` over them: an InputError naming an unknown key."""
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        from fastseq import _core
        from fastseq.errors import InputError

        raise InputError(f"'{unknown[0]}' is not a serving option{_core.did_you_mean(unknown[0], list(DEFAULTS))}; "
                         f"options: {', '.join(DEFAULTS)}")
    return {**DEFAULTS, **options}


def named(pipelines: Any, name: str) -> dict[str, Any]:
    """The pipelines to serve by name: a mapping as it is, one pipeline under ``name``; an
    InputError for a name that a URL path cannot carry, or for nothing to serve."""
    from fastseq.errors import InputError

    found = dict(pipelines) if isinstance(pipelines, Mapping) else {name: pipelines}
    if not found:
        raise InputError("nothing to serve: give a pipeline, or a dict of pipelines by name")
    for key in found:
        if not isinstance(key, str) or not key or not set(key) <= NAME_CHARS:
            raise InputError(f"a served model's name is letters, digits, '_', '.' and '-', got {key!r}")
    return found


def served(pipelines: Any, *, name: str = "pipeline", row_independent: bool = False, warm_up: bool = True,
            run_with: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """The models served and the limits they are served within (a
    :class:`~fastseq.serving.service.Service`): what the server in the core and the ASGI
    application both serve. ``pipelines``: one pipeline (served as ``name``) or a mapping of
    names to pipelines; ``options``: :data:`DEFAULTS`' keys. ``warm_up=False`` marks the
    models ready without a warm-up run; ``run_with`` (by name) runs a model's requests in
    place of its batcher (another batching: Ray Serve's, on the ASGI application)."""
    from fastseq.serving.metrics import Metrics
    from fastseq.serving.model import VERSION, ServedModel
    from fastseq.serving.service import Service

    chosen = settings(options)
    metrics = Metrics()
    models = {
        key: ServedModel(key, pipe, max_batch_size=chosen["max_batch_size"], max_delay_ms=chosen["max_delay_ms"],
                         row_independent=row_independent, on_batch=metrics.model(key, VERSION).batch,
                         run_with=(run_with or {}).get(key))
        for key, pipe in named(pipelines, name).items()
    }
    return Service(models, metrics, max_queue=chosen["max_queue"], max_request_bytes=chosen["max_request_bytes"],
                   timeout_s=chosen["timeout_s"], body_timeout_s=chosen["body_timeout_s"], warm_up=warm_up,
                   core_options={k: chosen[k] for k in CORE_OPTIONS})


def app(pipelines: Any, **kwargs: Any) -> Any:
    """The ASGI application serving ``pipelines`` (:func:`served`'s arguments), to mount in
    another application or run on an ASGI server: the protocol's decode and encode are the
    core's; requests run through the runtime's batcher. Needs the ``serve`` extra (its
    ``/metrics`` reads the process's figures with prometheus_client)."""
    from fastseq.errors import require_extra

    require_extra("fastseq.serving.app", "serve", ("prometheus_client",))
    from fastseq.serving.asgi import App

    return App(served(pipelines, **kwargs))


def serve(pipelines: Any, *, host: str = "127.0.0.1", port: int = 8000, grpc_port: int | None = None,
          name: str = "pipeline", row_independent: bool = False, warm_up: bool = True, **options: Any) -> int:
    """Serves ``pipelines`` (one, as ``name``, or a dict by name) on ``host``:``port`` over
    HTTP (and over gRPC on ``grpc_port``, if given) until SIGTERM or SIGINT, on the request
    path in the core (nothing to install beyond fastseq); returns the exit status (0 after a
    clean shutdown). Binds to the loopback interface unless told otherwise: the server has no
    authentication."""
    from fastseq.serving.server import Server, say

    models = served(pipelines, name=name, row_independent=row_independent, warm_up=warm_up, **options)
    return Server(models, host, port, grpc_port=grpc_port, announce=say).run()
