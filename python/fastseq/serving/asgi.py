"""The KServe v2 protocol over HTTP as an ASGI application: the routes, reading bodies within
their limits, and the answers; what every request meets whatever carries it (admission,
timeouts, metrics, the lifecycle) is :class:`~fastseq.serving.service.Service`'s.

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
from fastseq.errors import RequestError
from fastseq.serving.model import ServedModel
from fastseq.serving.protocol import decode_infer, encode_infer, error_body
from fastseq.serving.service import Service

log = logging.getLogger("fastseq.serve")

_JSON = [(b"content-type", b"application/json")]
_CLOSE = (b"connection", b"close")
_EXTENSIONS = ["binary_tensor_data", "model_configuration"]


class _Gone(Exception):
    """The client disconnected before its request was read."""


class App:
    """The ASGI application over a :class:`Service`. Warm-ups start with the ASGI lifespan's
    startup, or with the first request where the application is mounted in another (which
    does not pass lifespan on)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    @property
    def models(self) -> dict[str, ServedModel]:
        return self.service.models

    # --- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self.service.started:  # mounted in another application: no lifespan comes
                self.service.start()
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.service.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.service.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):  # mounted: Starlette passes the full path
            path = path[len(root) :]
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
                    await self._send(send, 200 if model.ready and not self.service.draining else 503, b"")
                elif what == "config":
                    await self._send(send, 200, model.config)
                else:
                    raise RequestError(f"no route {path}", 404)
            elif parts == ["v2"]:
                _method(method, "GET", path)
                await self._send(
                    send,
                    200,
                    json.dumps({"name": "fastseq", "version": __version__, "extensions": _EXTENSIONS}).encode(),
                )
            elif parts[:2] == ["v2", "health"] and len(parts) == 3 and parts[2] in ("live", "ready"):
                _method(method, "GET", path)
                up = parts[2] == "live" or self.service.ready
                await self._send(send, 200 if up else 503, b"")
            elif parts == ["metrics"]:
                _method(method, "GET", path)
                await self._send(
                    send,
                    200,
                    self.service.metrics.text(),
                    [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")],
                )
            else:
                raise RequestError(f"no route {path}: the KServe v2 routes are under /v2", 404)
        except RequestError as e:
            log.warning("%s %s: %d %s", method, path, e.status, e)
            await self._send(send, e.status, error_body(str(e)))

    def _model(self, parts: list[str]) -> ServedModel:
        """The model a /v2/models/... path names (404 for an unknown name or version)."""
        if len(parts) > 3 and parts[3] == "versions":
            return self.service.model(parts[2], parts[4] if len(parts) > 4 else "")
        if len(parts) > 4:
            raise RequestError(f"no route /{'/'.join(parts)}", 404)
        return self.service.model(parts[2])

    async def _send(
        self, send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.service.metrics.response(status)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": (headers or _JSON) + [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    # --- infer --------------------------------------------------------------------------------
    async def _infer(self, model: ServedModel, scope: dict[str, Any], receive: Any, send: Any) -> None:
        began = time.perf_counter()
        service = self.service
        path = scope["path"]
        try:
            stats = service.admit(model)
        except RequestError as e:  # refused before its body is read, which the connection's end spares
            log.warning("POST %s: %d %s", path, e.status, e)
            await self._send(send, e.status, error_body(str(e)), _JSON + [(b"retry-after", b"1"), _CLOSE])
            return
        held = True
        try:
            header_length = declared = None
            for key, value in scope["headers"]:
                if key == b"inference-header-content-length":
                    header_length = _int_header("Inference-Header-Content-Length", value)
                elif key == b"content-length":
                    declared = _int_header("Content-Length", value)
                elif key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                    raise RequestError(
                        f"Content-Encoding {value[:40].decode('latin-1')} is not supported: send the "
                        "request uncompressed",
                        415,
                    )
            if declared is not None and declared > service.max_request_bytes:
                raise RequestError(
                    f"the body has {declared} bytes, over the limit of {service.max_request_bytes} (max_request_bytes)",
                    413,
                )
            body = await self._body(receive)
            request = decode_infer(
                model.name, body, header_length, model.inputs, model.outputs, every_input=True, spec=model.spec
            )
            chosen = await service.infer(model, request, began)
            body, header = encode_infer(
                model.name, model.version, request.id, chosen, spec=model.spec, index=model.output_index
            )
            headers = [
                (b"content-type", b"application/octet-stream" if header is not None else b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            if header is not None:
                headers.append((b"inference-header-content-length", str(header).encode()))
            # Its place in the queue is free once the answer exists: a client slow to read it
            # holds its connection, not a request slot.
            service.release(stats)
            held = False
            service.metrics.response(200)
            async with asyncio.timeout(service.body_timeout_s):  # a client that stops reading is let go
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            stats.done(time.perf_counter() - began)
        except _Gone:
            stats.failed("CANCELED", time.perf_counter() - began)
        except TimeoutError:  # the answer could not be sent in time: the client left it unread
            stats.failed("CANCELED", time.perf_counter() - began)
            raise  # uvicorn closes a connection whose answer the application did not finish
        except Exception as e:  # noqa: BLE001 - a request's failure is its answer, never the server's end
            error = service.failure(model, e, began, f"POST {path}")
            close = [_CLOSE] if error.status in (408, 413, 415) else []  # its body is not read
            await self._send(send, error.status, error_body(str(error)), _JSON + close)
        finally:
            if held:
                service.release(stats)

    async def _body(self, receive: Any) -> bytes:
        """The request's body, at most ``max_request_bytes`` (413), within ``body_timeout_s`` (408)."""
        limit = self.service.max_request_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.service.body_timeout_s):
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
            raise RequestError(
                f"the body did not arrive within {self.service.body_timeout_s:g} s ({size} bytes came)", 408
            ) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _method(method: str, allowed: str, path: str) -> None:
    if method != allowed and not (allowed == "GET" and method == "HEAD"):
        raise RequestError(f"{path} takes {allowed}, not {method}", 405)


def _int_header(name: str, value: bytes) -> int:
    if not value.isdigit() or len(value) > 18:
        raise RequestError(f"the {name} header must be a non-negative integer, got {value[:40]!r}")
    return int(value)
