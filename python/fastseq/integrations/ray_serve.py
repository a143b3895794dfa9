"""Pipelines served on a Ray cluster with Ray Serve (extra: ``fastseq[serve,ray]``), on the
same KServe v2 protocol, routes, limits and metrics as ``fastseq serve``: the replicas run
:func:`fastseq.serving.app` as their ASGI ingress.

    from ray import serve
    import fastseq.ray_serve

    serve.run(fastseq.ray_serve.application({"classify": pipe}, num_replicas=4), route_prefix="/")
    # tritonclient.http.InferenceServerClient("HOST:8000").infer("classify", ...)

What travels where: the driver puts each pipeline's model in the object store once
(:func:`fastseq.ray.ship`); each replica fetches it from its node's store (once per node
over the network) and starts its session sized to the CPUs Ray gave it, spinning off. A
replica warms every pipeline up in its constructor, so Ray Serve routes nothing to it
before it is ready.

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
except ImportError as e:  # the extras are not installed
    raise ImportError(f"fastseq.ray_serve needs Ray Serve: pip install 'fastseq[serve,ray]' ({e})") from e

from fastseq.errors import CompositionError, InputError
from fastseq.integrations.ray import Shipment, ship, unship
from fastseq.runtime.batches import run_all
from fastseq.serving import DEFAULTS

#: the replicas' sessions run without ONNX Runtime's spinning, as ``fastseq serve``'s
SPINNING = {"session.intra_op.allow_spinning": "0"}


def application(pipelines: Any, *, name: str = "pipeline", batching: str = "fastseq", num_replicas: int = 1,
                ray_actor_options: Mapping[str, Any] | None = None, row_independent: bool = False,
                **options: Any) -> Any:
    """A Ray Serve application (for ``serve.run``) serving ``pipelines`` (one, as ``name``,
    or a dict by name) on the KServe v2 protocol; ``options``: :data:`fastseq.serving.DEFAULTS`'
    keys. Call it where Ray is initialised: the models go into the object store now."""
    if batching not in ("fastseq", "ray"):
        raise InputError(f"batching must be 'fastseq' or 'ray', got {batching!r}")
    named = dict(pipelines) if isinstance(pipelines, Mapping) else {name: pipelines}
    shipped = {key: ship(pipe) for key, pipe in named.items()}
    settings = {**DEFAULTS, **options}
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise InputError(f"'{sorted(unknown)[0]}' is not a serving option; options: {', '.join(DEFAULTS)}")
    deployment = serve.deployment(
        _replica(batching, settings["max_batch_size"], settings["max_delay_ms"]),
        name="fastseq", num_replicas=num_replicas, ray_actor_options=dict(ray_actor_options or {}),
        max_ongoing_requests=settings["max_queue"],
    )
    return deployment.bind(shipped, settings, row_independent)


def _replica(batching: str, max_batch_size: int, max_delay_ms: float) -> type:
    """The replica class: its ASGI ingress is fastseq.serving.app over the shipped pipelines."""

    @serve.ingress()
    class FastseqReplica:
        async def __init__(self, shipped: dict[str, Shipment], settings: dict[str, Any], row_independent: bool) -> None:
            from fastseq import serving

            pipes = {key: unship(s, SPINNING) for key, s in shipped.items()}
            self._pipes = pipes
            options = dict(settings)
            runs = None
            if batching == "ray":
                runs = {key: self._ray_batched(key, pipe, row_independent) for key, pipe in pipes.items()}
                options["max_batch_size"] = 1  # no second batcher behind Ray Serve's
            self._served = serving.app(pipes, row_independent=row_independent, run_with=runs, **options)
            # Warmed on the replica's own loop (Ray Serve's batch queues are bound to the loop
            # of their first call), and before Ray Serve routes a request here.
            await self._served.service.start()

        def _ray_batched(self, key: str, pipe: Any, row_independent: bool) -> Any:
            """A coroutine function of one request's feeds, batched by Ray Serve; None where
            the pipeline's rows may mix (it is served request by request)."""
            if not row_independent:
                try:
                    pipe.check_rows()
                except CompositionError:
                    return None
            runner = pipe.runner

            @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_delay_ms / 1000)
            async def batched(requests: list[dict]) -> list[Any]:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(None, run_all, runner, requests, max_batch_size)

            async def one(feeds: dict) -> list:
                answer = await batched(feeds)
                if isinstance(answer, BaseException):
                    raise answer
                return answer

            return one

        def __serve_build_asgi_app__(self) -> Any:
            return self._served

    return FastseqReplica
