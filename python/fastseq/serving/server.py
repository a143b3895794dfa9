"""The server process: the request path of the core (``fastseq._core.Server``: HTTP/1.1 and
gRPC on tokio and hyper, the protocol, batching, limits and metrics in Rust) over the models of
an :class:`~fastseq.serving.asgi.App`, entered in Python once a batch. Its sockets are bound
here, before the models warm up, so that the port is known (``port=0`` picks a free one) and a
client sees "not ready" rather than "refused" meanwhile.

SIGTERM (or SIGINT) stops taking requests: ready turns false, the listening sockets close, new
requests on open connections are a 503, the requests open are answered, the batches taken run,
and :meth:`Server.run` returns 0. A second SIGINT stops at once. A model whose warm-up fails
stops the server: :meth:`run` returns 1."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from typing import Any

from fastseq._core import __version__
from fastseq.serving.asgi import App

log = logging.getLogger("fastseq.serve")

#: how long a shutdown waits for open requests past their own timeout
GRACE_S = 5.0


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (IPv6 where ``host`` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


def _listening(host: str, port: int, what: str) -> socket.socket:
    """``bind`` whose refusal says which of the server's ports it was (an OSError whose
    strerror reads "HTTP on 127.0.0.1:8000: Address already in use")."""
    try:
        return bind(host, port)
    except OSError as e:
        raise OSError(e.errno, f"{what} on {host}:{port}: {e.strerror or e}") from None


def _log_line(error: bool, line: str) -> None:
    (log.error if error else log.warning)("%s", line)


class Server:
    """The models of ``served`` (:func:`fastseq.serving.served`'s, or an ASGI app's) served on
    ``host``:``port`` (bound when made: :attr:`port` is the real one), and over gRPC on
    ``grpc_port`` if given. :meth:`run` blocks until stopped (a signal in the main thread, or
    :meth:`stop` from any)."""

    def __init__(
        self,
        served: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        grpc_port: int | None = None,
        announce: Any = None,
        verbose: bool = False,
    ) -> None:
        # what fastseq.serving.served made, or the ASGI application over it
        self.service = served.service if isinstance(served, App) else served
        self.host = host
        self._sockets = [_listening(host, port, "HTTP")]
        self.port = self._sockets[0].getsockname()[1]
        self.grpc_port = None
        if grpc_port is not None:
            try:
                self._sockets.append(_listening(host, grpc_port, "gRPC"))
            except OSError:
                self._sockets[0].close()
                raise
            self.grpc_port = self._sockets[1].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"
        self._announce = announce
        self._stop = threading.Event()
        self._core: Any = None
        self.exit_code: int | None = None

    def _options(self) -> dict[str, Any]:
        s = self.service
        return {
            "max_queue": s.max_queue,
            "max_request_bytes": s.max_request_bytes,
            "timeout_s": s.timeout_s,
            "body_timeout_s": s.body_timeout_s,
            "version": __version__,
            **s.core_options,
        }

    def run(self) -> int:
        """Serves until stopped; 0 after a clean shutdown, 1 if a model failed its warm-up."""
        from fastseq._core import start_server

        service = self.service
        models = [(m.spec, m.batch_run()) for m in service.models.values()]
        fds = [s.detach() for s in self._sockets]
        self._core = core = start_server(models, fds[0], fds[1] if len(fds) > 1 else None, self._options(), _log_line)
        restore = self._signals()
        try:
            grpc = f" and gRPC on {self.host}:{self.grpc_port}" if self.grpc_port is not None else ""
            self._say(
                f"listening on {self.url} (KServe v2 over HTTP{grpc}); warming up "
                + ", ".join(f"'{name}'" for name in service.models)
            )
            code = 0
            if service.warm:
                try:
                    core.warm_up()
                except RuntimeError as e:  # its line is logged by the core, naming the model
                    from fastseq.errors import RunError

                    service.failed = RunError(str(e))
                    code = 1
            else:
                core.mark_ready()
            if code == 0 and not self._stop.is_set():
                ready = "; ".join(
                    f"{name} at {self.url}/v2/models/{name}"
                    + (f" (batched, up to {m.max_batch_size} rows)" if m.batched else " (not batched)")
                    for name, m in service.models.items()
                )
                self._say(f"ready: {ready}")
                while not self._stop.wait(0.5):
                    pass
            core.shutdown(service.body_timeout_s + service.timeout_s + GRACE_S)
        finally:
            restore()
        self.exit_code = code
        return code

    def stop(self) -> None:
        """As SIGTERM: drains and shuts down (from any thread)."""
        if self._core is not None:
            self._core.drain()
        self._stop.set()

    def _signals(self) -> Any:
        """SIGTERM and SIGINT drain (a second SIGINT exits at once), where this is the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handle(signum: int, frame: Any) -> None:
            if self._stop.is_set() and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.stop()

        previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(s, h) for s, h in previous.items()]

    def _say(self, line: str) -> None:
        if self._announce is not None:
            self._announce(line)


def say(line: str) -> None:
    """A line of the server's own on stderr (where it started, when it is ready)."""
    print(f"fastseq serve: {line}", file=sys.stderr, flush=True)
