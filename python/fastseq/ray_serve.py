"""Pipelines served on a Ray cluster with Ray Serve (extra: ``fastseq-onnx[ray-serve]``), on the
same KServe v2 protocol, routes, limits and metrics as ``fastseq serve``: each replica runs
:func:`fastseq.serving.app`, which its ``__call__`` hands every HTTP request (Ray Serve's
plain request API, stable across its versions).

    from ray import serve
    import fastseq.ray_serve

    serve.run(fastseq.ray_serve.application({"classify": pipe}, num_replicas=4), route_prefix="/")
    # tritonclient.http.InferenceServerClient("HOST:8000").infer("classify", ...)

What travels where: the driver puts each pipeline's model in the object store once
(:func:`fastseq.ray.ship`); each replica fetches it from its node's store (once per node
over the network) and starts its session sized to the CPUs Ray gave it, without spinning.
The objects are the driver's: it must stay up while replicas may start (``serve run``'s
process does). A replica warms every pipeline up in its constructor, so Ray Serve routes
nothing to it before it is ready.

Batching, per replica: ``batching="fastseq"`` (the default) joins the replica's concurrent
requests with fastseq's batcher, as ``fastseq serve`` does; ``batching="ray"`` uses Ray
Serve's ``@serve.batch`` (``max_batch_size`` requests, waiting at most ``max_delay_ms``),
whose batches are split and joined by fastseq's rules: only requests of the same dtypes and
row shapes are joined, a pipeline whose rows may mix is not batched at all, and a failing
joint run is retried per request so that only its own caller gets an error."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

try:
    from ray import serve
except ModuleNotFoundError as e:  # the extra is not installed: a typed error that names it
    from fastseq.errors import missing_extra

    raise missing_extra("fastseq.ray_serve", "ray-serve", e) from e

from fastseq import serving
from fastseq.errors import CompositionError, InputError
from fastseq.ray import Shipment, ship, unship
from fastseq.runtime.batches import run_all
from fastseq.runtime.engine import Engine, Pipelined, engine_of

#: the replicas' sessions run without ONNX Runtime's spinning, as ``fastseq serve``'s
SPINNING = {"session.intra_op.allow_spinning": "0"}


def application(
    pipelines: Any,
    *,
    name: str = "pipeline",
    batching: str = "fastseq",
    num_replicas: int = 1,
    ray_actor_options: Mapping[str, Any] | None = None,
    row_independent: bool = False,
    **options: Any,
) -> Any:
    """A Ray Serve application (for ``serve.run``) serving ``pipelines`` (one, as ``name``,
    or a dict by name) on the KServe v2 protocol; ``options``: :data:`fastseq.serving.DEFAULTS`'
    keys. Call it where Ray is initialised: the models go into the object store now."""
    if batching not in ("fastseq", "ray"):
        raise InputError(f"batching must be 'fastseq' or 'ray', got {batching!r}")
    # Checked here, before anything is shipped or a replica fails to start: the server's rules.
    chosen = serving.settings(options)
    shipped = {key: ship(pipe) for key, pipe in serving.named(pipelines, name).items()}
    deployment = serve.deployment(
        _replica(batching, chosen["max_batch_size"], chosen["max_delay_ms"]),
        name="fastseq",
        num_replicas=num_replicas,
        ray_actor_options=dict(ray_actor_options or {}),
    )
    # Ray's overloads type deployment(cls, **options) as the decorator form, deployment(**options)
    return deployment.bind(shipped, chosen, row_independent)  # type: ignore[attr-defined]


def _replica(batching: str, max_batch_size: int, max_delay_ms: float) -> type:
    """The replica class: fastseq.serving.app over the shipped pipelines, called per request."""

    class FastseqReplica:
        def __init__(self, shipped: dict[str, Shipment], settings: dict[str, Any], row_independent: bool) -> None:
            pipes = {key: unship(s, SPINNING) for key, s in shipped.items()}
            options = dict(settings)
            runs = None
            if batching == "ray":
                runs = {
                    key: _ray_batched(pipe, row_independent, max_batch_size, max_delay_ms)
                    for key, pipe in pipes.items()
                }
                options["max_batch_size"] = 1  # no second batcher behind Ray Serve's
            self._served = serving.app(pipes, row_independent=row_independent, run_with=runs, warm_up=False, **options)
            # Warmed here, before Ray Serve routes a request to this replica: a row of zeros
            # through each session (not through Ray Serve's batch queue, which is bound to the
            # loop of its first call: the requests' loop).
            for key, model in self._served.models.items():
                pipes[key].run(model.warm_up_feeds())

        async def __call__(self, request: Any) -> Any:
            """Ray Serve's request (Starlette's) through the ASGI application; its answer."""
            from starlette.responses import Response

            answer: dict[str, Any] = {"status": 500, "headers": [], "body": []}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    answer["status"], answer["headers"] = message["status"], message.get("headers", [])
                else:
                    answer["body"].append(message.get("body", b""))

            await self._served(request.scope, request.receive, send)
            response = Response(b"".join(answer["body"]), status_code=answer["status"])
            response.raw_headers = [(k, v) for k, v in answer["headers"]]
            return response

    return FastseqReplica


def _ray_batched(pipe: Engine | Pipelined, row_independent: bool, max_batch_size: int, max_delay_ms: float) -> Any:
    """A coroutine function of one request's feeds, batched by Ray Serve; None where the
    pipeline's rows may mix (it is served request by request)."""
    engine = engine_of(pipe)
    if not row_independent:
        try:
            engine.check_rows()
        except CompositionError:
            return None
    runner = engine.runner

    @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_delay_ms / 1000)
    async def batched(requests: list[dict[str, Any]]) -> list[Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, run_all, runner, requests, max_batch_size)

    async def one(feeds: dict[str, Any]) -> list[Any]:
        answer = await batched(feeds)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return one
