"""The server process: an :class:`~fastseq.serving.asgi.App` on uvicorn (with httptools and
uvloop where installed), on a socket bound before the models warm up, so that the port is
known (``port=0`` picks a free one) and a client sees "not ready" rather than "refused"
meanwhile.

SIGTERM (or SIGINT) stops taking requests: ready turns false and new requests are a 503, the
listening socket closes, the requests open are answered, the batchers run what they took and
close, and :meth:`Server.run` returns 0 (uvicorn would raise the signal again after its
shutdown, which ends the process with the signal's status instead). A second SIGINT stops at
once. A model whose warm-up fails stops the server: :meth:`run` returns 1."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import Any

import uvicorn

from fastseq.serving.asgi import App

#: how long a shutdown waits for open requests past their own timeout
GRACE_S = 5.0


def _loop_and_http() -> tuple[str, str]:
    """uvloop and httptools where installed (uvicorn's "standard" extra), else asyncio and h11."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return loop, http


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (IPv6 where ``host`` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog)
    sock.set_inheritable(True)
    return sock


class Server:
    """``app`` served on ``host``:``port`` (bound when made: :attr:`port` is the real one).
    :meth:`run` blocks until stopped (a signal in the main thread, or :meth:`stop` from any)."""

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 8000, *, grpc_port: int | None = None,
                 announce: Any = None, verbose: bool = False) -> None:
        self.app = app
        self.socket = bind(host, port)
        self.host, self.port = host, self.socket.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"
        self._announce = announce
        self.grpc_port = grpc_port  # the bound one once serving
        self._grpc: Any = None
        loop, http = _loop_and_http()
        config = uvicorn.Config(
            app, loop=loop, http=http, lifespan="on", access_log=False, log_config=None,
            log_level="info" if verbose else "warning", server_header=False, backlog=2048,
            # a request open at the signal may still be reading its body, then running
            timeout_graceful_shutdown=int(app.service.body_timeout_s + app.service.timeout_s + GRACE_S),
        )
        self._server = _Draining(config, app.service)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.exit_code: int | None = None

    def run(self) -> int:
        """Serves until stopped; 0 after a clean shutdown, 1 if a model failed its warm-up."""
        factory = getattr(self._server.config, "get_loop_factory", lambda: None)()  # uvicorn >= 0.36
        if factory is not None:
            with asyncio.Runner(loop_factory=factory) as runner:
                return runner.run(self.serve())
        return asyncio.run(self.serve())

    async def serve(self) -> int:
        self._loop = asyncio.get_running_loop()
        server = self._server
        serving = asyncio.ensure_future(server.serve(sockets=[self.socket]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        grpc = ""
        if self.grpc_port is not None and not serving.done():
            from fastseq.serving import grpc_service

            try:
                self._grpc, self.grpc_port = await grpc_service.start(self.app.service, self.host, self.grpc_port)
            except (OSError, RuntimeError) as e:
                self._say(f"error: cannot serve gRPC: {e}")
                server.should_exit = True
                await serving
                self.exit_code = 1
                return 1
            grpc = f" and gRPC on {self.host}:{self.grpc_port}"
        self._say(f"listening on {self.url} (KServe v2 over HTTP{grpc}); warming up "
                  + ", ".join(f"'{name}'" for name in self.app.models))
        warm = self.app.service.start()
        await asyncio.wait({warm, serving}, return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if warm.done() and warm.exception() is not None:
            code = 1
            server.should_exit = True
        elif warm.done():
            models = "; ".join(f"{name} at {self.url}/v2/models/{name}" + (
                f" (batched, up to {m.max_batch_size} rows)" if m.batcher is not None else " (not batched)")
                for name, m in self.app.models.items())
            self._say(f"ready: {models}")
        await serving  # drained: the service waited for every open request, HTTP's and gRPC's
        if self._grpc is not None:
            await self._grpc.stop(GRACE_S)
        self.exit_code = code
        return code

    def stop(self) -> None:
        """As SIGTERM: drains and shuts down (from any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._server.handle_exit, signal.SIGTERM, None)

    def _say(self, line: str) -> None:
        if self._announce is not None:
            self._announce(line)


class _Draining(uvicorn.Server):
    """uvicorn's Server that drains the service at the first signal, and does not raise the
    signal again once it has shut down (a clean exit is 0)."""

    def __init__(self, config: uvicorn.Config, service: Any) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.service.drain()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def say(line: str) -> None:
    """A line of the server's own on stderr (where it started, when it is ready)."""
    print(f"fastseq serve: {line}", file=sys.stderr, flush=True)
