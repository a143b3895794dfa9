"""The server as an ASGI application: the KServe v2 routes, the limits every request meets,
the metrics, and the lifecycle (ready after a warm-up, draining on shutdown).

It runs on any ASGI server (``fastseq serve`` runs it on uvicorn) and mounts in an existing
application (``app.mount("/triton", fastseq.serving.app(pipe))`` in Starlette or FastAPI).
Routes (``{v}`` is the one version, ``1``)::

    GET  /v2                                        server metadata
    GET  /v2/health/live, /v2/health/ready          200 or 503
    GET  /v2/models/{name}[/versions/{v}]           inputs and outputs: datatypes, shapes
    GET  /v2/models/{name}[/versions/{v}]/ready     200 or 503
    GET  /v2/models/{name}[/versions/{v}]/config    Triton's model configuration
    POST /v2/models/{name}[/versions/{v}]/infer     JSON tensors or Triton's binary extension
    GET  /metrics                                   Prometheus' text format

Limits, each answered with ``{"error": ...}``: a body over ``max_request_bytes`` is a 413
(refused on its Content-Length before it is read, or as soon as it grows past it); a body
that has not arrived within ``body_timeout_s`` a 408; more than ``max_queue`` requests open
at once a 503, before the body is read (so memory stays within ``max_queue`` bodies); a
request not answered within its timeout (``timeout_s``, or its own ``timeout`` parameter
if shorter) a 503. Errors of a request are 400 (404 for an unknown model or version) in the
pipeline's own tensor names, one log line each; a run that fails for another reason is a
500."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastseq._core import __version__
from fastseq.errors import FastseqError, InputError, RequestError, RunTimeoutError
from fastseq.serving.metrics import Metrics
from fastseq.serving.model import ServedModel
from fastseq.serving.protocol import decode_infer, encode_infer, error_body

log = logging.getLogger("fastseq.serve")

_JSON = [(b"content-type", b"application/json")]
_EXTENSIONS = ["binary_tensor_data", "model_configuration"]


class _Gone(Exception):
    """The client disconnected before its request was read."""


class App:
    """The ASGI application over ``models`` (name -> :class:`ServedModel`). Ready once every
    model's warm-up passed; warm-ups start with the ASGI lifespan's startup, or with the first
    request where the application is mounted in another (which does not pass lifespan on)."""

    def __init__(self, models: dict[str, ServedModel], metrics: Metrics | None = None, *, max_queue: int = 128, max_request_bytes: int = 32 << 20,
                 timeout_s: float = 60.0, body_timeout_s: float = 30.0, warm_up: bool = True) -> None:
        for name, value in (("max_queue", max_queue), ("max_request_bytes", max_request_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an int >= 1, got {value!r}")
        for name, value in (("timeout_s", timeout_s), ("body_timeout_s", body_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise InputError(f"{name} must be a number of seconds > 0, got {value!r}")
        self.models = models
        self.max_queue, self.max_request_bytes = max_queue, max_request_bytes
        self.timeout_s, self.body_timeout_s = float(timeout_s), float(body_timeout_s)
        self.metrics = metrics if metrics is not None else Metrics()
        known = self.metrics.models
        self.stats = {name: known.get(name) or self.metrics.model(name, m.version) for name, m in models.items()}
        self.open = 0  # requests open (reading, queued or running), every model's
        self.draining = False
        self._warm_up = warm_up
        self._started: asyncio.Task | None = None
        self.failed: BaseException | None = None  # a warm-up that failed

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return not self.draining and all(m.ready for m in self.models.values())

    def start(self) -> asyncio.Task:
        """Starts the warm-ups on the running loop (once): each model runs a row of zeros
        through its own path. The future is done once every model is ready."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._warm())
        return self._started

    async def _warm(self) -> None:
        for model in self.models.values():
            try:
                if self._warm_up:
                    await model.warm_up()
                else:
                    model.ready = True
            except Exception as e:
                self.failed = e
                log.error("model '%s' failed its warm-up run, so it is not ready: %s", model.name, e)
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

    # --- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            if self._started is None:
                self.start()
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):  # mounted: Starlette passes the full path
            path = path[len(root):]
        method = scope["method"]
        parts = path.strip("/").split("/")
        try:
            if parts[0] == "v2" and len(parts) >= 3 and parts[1] == "models":
                model = self._model(parts)
                rest = parts[5:] if len(parts) > 3 and parts[3] == "versions" else parts[3:]
                what = rest[0] if len(rest) == 1 else ("" if not rest else "?")
                if what == "infer":
                    _method(method, "POST", path)
                    await self._infer(model, scope, receive, send)
                    return
                _method(method, "GET", path)
                if what == "":
                    await self._send(send, 200, model.metadata)
                elif what == "ready":
                    await self._send(send, 200 if model.ready and not self.draining else 503, b"")
                elif what == "config":
                    await self._send(send, 200, model.config)
                else:
                    raise RequestError(f"no route {path}", 404)
            elif parts == ["v2"]:
                _method(method, "GET", path)
                await self._send(send, 200, json.dumps({"name": "fastseq", "version": __version__,
                                                        "extensions": _EXTENSIONS}).encode())
            elif parts[:2] == ["v2", "health"] and len(parts) == 3 and parts[2] in ("live", "ready"):
                _method(method, "GET", path)
                up = parts[2] == "live" or self.ready
                await self._send(send, 200 if up else 503, b"")
            elif parts == ["metrics"]:
                _method(method, "GET", path)
                await self._send(send, 200, self.metrics.text(),
                                 [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")])
            else:
                raise RequestError(f"no route {path}: the KServe v2 routes are under /v2", 404)
        except RequestError as e:
            log.warning("%s %s: %d %s", method, path, e.status, e)
            await self._send(send, e.status, error_body(str(e)))

    def _model(self, parts: list[str]) -> ServedModel:
        """The model a /v2/models/... path names (404 for an unknown name or version)."""
        from fastseq import _core

        name = parts[2]
        model = self.models.get(name)
        if model is None:
            raise RequestError(f"no model '{name}'{_core.did_you_mean(name, list(self.models))}; models: "
                               + ", ".join(self.models), 404)
        if len(parts) > 3 and parts[3] == "versions":
            if len(parts) < 5 or parts[4] != model.version:
                got = f"'{parts[4]}'" if len(parts) > 4 else "none"
                raise RequestError(f"model '{name}' has no version {got}; versions: {model.version}", 404)
        elif len(parts) > 4:
            raise RequestError(f"no route /{'/'.join(parts)}", 404)
        return model

    async def _send(self, send: Any, status: int, body: bytes, headers: list | None = None) -> None:
        self.metrics.response(status)
        await send({"type": "http.response.start", "status": status,
                    "headers": (headers or _JSON) + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    # --- infer --------------------------------------------------------------------------------
    async def _infer(self, model: ServedModel, scope: dict[str, Any], receive: Any, send: Any) -> None:
        began = time.perf_counter()
        stats = self.stats[model.name]
        if self.draining or not model.ready:
            why = "the server is shutting down" if self.draining else f"model '{model.name}' is not ready yet"
            stats.failed("REJECTED", 0.0)
            await self._refuse(send, 503, why)
            return
        if self.open >= self.max_queue:
            stats.failed("REJECTED", 0.0)
            await self._refuse(send, 503, f"{self.open} requests are open, the most this server takes (max_queue); "
                               "try again later", [(b"retry-after", b"1")])
            return
        self.open += 1
        stats.pending += 1
        try:
            await self._answer(model, stats, scope, receive, send, began)
        finally:
            self.open -= 1
            stats.pending -= 1

    async def _answer(self, model: ServedModel, stats: Any, scope: dict[str, Any], receive: Any, send: Any,
                      began: float) -> None:
        reason, status, message, close = "OTHER", 400, "", False
        try:
            header_length = declared = None
            for key, value in scope["headers"]:
                if key == b"inference-header-content-length":
                    header_length = _int_header("Inference-Header-Content-Length", value)
                elif key == b"content-length":
                    declared = _int_header("Content-Length", value)
            if declared is not None and declared > self.max_request_bytes:
                close = True
                raise RequestError(f"the body has {declared} bytes, over the limit of {self.max_request_bytes} "
                                   "(max_request_bytes)", 413)
            body = await self._body(receive)
            request = decode_infer(model.name, body, header_length, model.inputs, model.outputs)
            timeout = self.timeout_s if request.timeout_s is None else min(request.timeout_s, self.timeout_s)
            try:
                async with asyncio.timeout(timeout):
                    outputs = await model.infer(request.inputs)
            except TimeoutError:
                reason = "REJECTED"
                raise RequestError(f"model '{model.name}': the request was not answered within its timeout of "
                                   f"{timeout:g} s", 503) from None
            if model.batcher is None:  # no batcher to report its batches
                stats.unbatched(time.perf_counter() - began, len(next(iter(request.inputs.values()))))
            asked = request.outputs
            tensors = model.outputs
            if asked is None:
                binary = request.binary_output
                chosen = [(tensors[n], a, binary) for n, a in zip(model.output_order, outputs)]
            else:
                by_name = dict(zip(model.output_order, outputs))
                chosen = [(tensors[n], by_name[n], b) for n, b in asked]
            body, header = encode_infer(model.name, model.version, request.id, chosen)
            headers = [(b"content-type", b"application/octet-stream" if header is not None else b"application/json"),
                       (b"content-length", str(len(body)).encode())]
            if header is not None:
                headers.append((b"inference-header-content-length", str(header).encode()))
            self.metrics.response(200)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            stats.done(time.perf_counter() - began)
            return
        except _Gone:
            stats.failed("CANCELED", time.perf_counter() - began)
            return
        except RequestError as e:
            status, message = e.status, str(e)
            if status in (408, 413):
                close = True
            if status >= 500:
                reason = "REJECTED"
        except RunTimeoutError as e:
            reason, status, message = "REJECTED", 503, f"model '{model.name}': {e}"
        except InputError as e:  # the pipeline's input rule: dtype, rank, sizes
            status, message = 400, f"model '{model.name}': {e}"
        except FastseqError as e:
            reason, status, message = "BACKEND", 500, f"model '{model.name}': {e}"
        except Exception as e:  # noqa: BLE001 - a request's failure is its answer, never the server's end
            reason, status, message = "BACKEND", 500, f"model '{model.name}': {type(e).__name__}: {e}"
        stats.failed(reason, time.perf_counter() - began)
        (log.error if status >= 500 else log.warning)("POST %s: %d %s", scope["path"], status, message)
        await self._refuse(send, status, message, [(b"connection", b"close")] if close else None, logged=True)

    async def _refuse(self, send: Any, status: int, message: str, headers: list | None = None,
                      logged: bool = False) -> None:
        if not logged:
            log.warning("%d %s", status, message)
        await self._send(send, status, error_body(message), _JSON + (headers or []))

    async def _body(self, receive: Any) -> bytes:
        """The request's body, at most ``max_request_bytes`` (413), within ``body_timeout_s`` (408)."""
        limit = self.max_request_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        raise _Gone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise RequestError(f"the body is over the limit of {limit} bytes (max_request_bytes)", 413)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestError(f"the body did not arrive within {self.body_timeout_s:g} s ({size} bytes came)",
                               408) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _method(method: str, allowed: str, path: str) -> None:
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        raise RequestError(f"{path} takes {allowed}, not {method}", 405)


def _int_header(name: str, value: bytes) -> int:
    if not value.isdigit() or len(value) > 18:
        raise RequestError(f"the {name} header must be a non-negative integer, got {value[:40]!r}")
    return int(value)
