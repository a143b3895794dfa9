"""What every inference request meets, whichever transport carries it (HTTP, gRPC): the models
by name and version, admission (a bounded number of requests open, none while not ready or
shutting down), its timeout, the outputs it asked for, its failure as a status and one log
line, the metrics; and the lifecycle (ready after a warm-up, draining, closing)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from fastseq import _core
from fastseq.errors import FastseqError, InputError, RequestError, RunTimeoutError
from fastseq.serving.metrics import Metrics, ModelStats
from fastseq.serving.model import ServedModel
from fastseq.serving.protocol import InferRequest, Tensor

log = logging.getLogger("fastseq.serve")


class Service:
    """``models`` (name -> :class:`ServedModel`) served within limits: at most ``max_queue``
    requests open at once (503), bodies of at most ``max_request_bytes`` (413) arriving
    within ``body_timeout_s`` (408, for transports that read bodies), answers within
    ``timeout_s`` or a request's own shorter timeout (503). Ready once every model's warm-up
    passed (``warm_up=False``: at once)."""

    def __init__(
        self,
        models: dict[str, ServedModel],
        metrics: Metrics | None = None,
        *,
        max_queue: int = 128,
        max_request_bytes: int = 32 << 20,
        timeout_s: float = 60.0,
        body_timeout_s: float = 30.0,
        warm_up: bool = True,
        core_options: dict[str, Any] | None = None,
    ) -> None:
        for name, count in (("max_queue", max_queue), ("max_request_bytes", max_request_bytes)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise InputError(f"{name} must be an int >= 1, got {count!r}")
        for name, seconds in (("timeout_s", timeout_s), ("body_timeout_s", body_timeout_s)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 1e9:
                raise InputError(f"{name} must be a number of seconds > 0, got {seconds!r}")
        self.models = models
        self.max_queue, self.max_request_bytes = max_queue, max_request_bytes
        self.core_options = dict(core_options or {})  # the limits only the core's server keeps
        self.timeout_s, self.body_timeout_s = float(timeout_s), float(body_timeout_s)
        self.metrics = metrics if metrics is not None else Metrics()
        known = self.metrics.models
        self.stats = {name: known.get(name) or self.metrics.model(name, m.version) for name, m in models.items()}
        self.open = 0  # requests open (reading, queued or running), every model's
        self.draining = False
        self._warm_up = warm_up
        if not warm_up:  # ready now: the sessions exist (a request right away must not find it "not ready")
            for model in models.values():
                model.ready = True
        self._started: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None  # a warm-up's failure

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return not self.draining and all(m.ready for m in self.models.values())

    def start(self) -> asyncio.Task[None]:
        """Starts the warm-ups on the running loop (once): each model runs a row of zeros
        through its own path. The task is done once every model is ready; a failure is kept
        (:attr:`failed`) and said to every request after it."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._warm())
            self._started.add_done_callback(self._warmed)
        return self._started

    def _warmed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failed = task.exception()

    @property
    def warm(self) -> bool:
        """Whether the models run a warm-up before they are ready."""
        return self._warm_up

    @property
    def started(self) -> bool:
        return self._started is not None

    async def _warm(self) -> None:
        if not self._warm_up:
            return
        for model in self.models.values():
            try:
                await model.warm_up()
            except Exception as e:
                log.error(
                    "model '%s' failed its warm-up run (a row of zeros, each dynamic axis 1), so it is not "
                    "ready: %s; serve it without a warm-up run (--no-warm-up, warm_up=False) if such a row "
                    "is not an input it takes",
                    model.name,
                    e,
                )
                raise

    def drain(self) -> None:
        """Stops taking requests (ready turns false); those open go on."""
        self.draining = True

    async def close(self) -> None:
        """Drains, waits for the open requests, then closes the models' batchers."""
        self.drain()
        while self.open:
            await asyncio.sleep(0.01)
        for model in self.models.values():
            await asyncio.get_running_loop().run_in_executor(None, model.close)

    # --- a request --------------------------------------------------------------------------
    def model(self, name: str, version: str | None = None) -> ServedModel:
        """The model ``name`` (at ``version``, if given): a 404 naming the near miss if none."""
        model = self.models.get(name)
        if model is None:
            raise RequestError(
                f"no model '{name}'{_core.did_you_mean(name, list(self.models))}; models: " + ", ".join(self.models),
                404,
            )
        if version is not None and version != model.version:
            raise RequestError(f"model '{name}' has no version '{version}'; versions: {model.version}", 404)
        return model

    def admit(self, model: ServedModel) -> ModelStats:
        """Takes a request for ``model`` in (a 503 while not ready, shutting down, or with
        ``max_queue`` open); :meth:`release` lets it out."""
        stats = self.stats[model.name]
        if self.draining or not model.ready:
            stats.failed("REJECTED", 0.0)
            if self.draining:
                raise RequestError("the server is shutting down", 503)
            if self.failed is not None:
                raise RequestError(f"model '{model.name}' is not ready: its warm-up run failed: {self.failed}", 503)
            raise RequestError(f"model '{model.name}' is not ready yet", 503)
        if self.open >= self.max_queue:
            stats.failed("REJECTED", 0.0)
            raise RequestError(
                f"{self.open} requests are open, the most this server takes (max_queue); try again later", 503
            )
        self.open += 1
        stats.pending += 1
        return stats

    def release(self, stats: ModelStats) -> None:
        self.open -= 1
        stats.pending -= 1

    async def infer(
        self, model: ServedModel, request: InferRequest, began: float
    ) -> list[tuple[Tensor, np.ndarray, bool]]:
        """Runs ``request`` within its timeout; the outputs it asked for, each with whether it
        goes back as binary data."""
        timeout = self.timeout_s if request.timeout_s is None else min(request.timeout_s, self.timeout_s)
        loop = asyncio.get_running_loop()
        run = time.perf_counter()
        try:  # counted from the request's start: reading its body took part of it
            async with asyncio.timeout_at(loop.time() + timeout - (run - began)):
                outputs = await model.infer(request.inputs)
        except TimeoutError:
            raise RequestError(
                f"model '{model.name}': the request was not answered within its timeout of {timeout:g} s", 503
            ) from None
        if model.batcher is None:  # no batcher to report its batches
            first = next(iter(request.inputs.values()))
            self.stats[model.name].unbatched(time.perf_counter() - run, first.shape[0] if first.ndim else 1)
        tensors = model.outputs
        if request.outputs is None:
            binary = request.binary_output
            return [(tensors[n], a, binary) for n, a in zip(model.output_order, outputs)]
        by_name = dict(zip(model.output_order, outputs))
        return [(tensors[n], by_name[n], b) for n, b in request.outputs]

    def failure(self, model: ServedModel, error: BaseException, began: float, where: str) -> RequestError:
        """``error`` of a request for ``model`` as the status it is answered with: counted, and
        said in one log line (``where``: the request, as the transport names it)."""
        reason = "OTHER"
        if isinstance(error, RequestError):
            status, message = error.status, str(error)
            reason = "REJECTED" if status >= 500 else "OTHER"
        elif isinstance(error, RunTimeoutError):
            reason, status, message = "REJECTED", 503, f"model '{model.name}': {error}"
        elif isinstance(error, InputError):  # the pipeline's input rule: dtype, rank, sizes
            status, message = 400, f"model '{model.name}': {error}"
        elif type(error.__cause__).__name__ == "InvalidArgument":  # ONNX Runtime refused the values sent
            status, message = 400, f"model '{model.name}': {error}"
        elif isinstance(error, FastseqError):
            reason, status, message = "BACKEND", 500, f"model '{model.name}': {error}"
        else:
            reason, status, message = "BACKEND", 500, f"model '{model.name}': {type(error).__name__}: {error}"
        self.stats[model.name].failed(reason, time.perf_counter() - began)
        (log.error if status >= 500 else log.warning)("%s: %d %s", where, status, message)
        return error if isinstance(error, RequestError) else RequestError(message, status)
