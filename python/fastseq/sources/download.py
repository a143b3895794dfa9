"""URL downloads: one file from an ``http(s)://`` URL into a cache, atomically, checked
before it is kept (its length, its sha256, that it is an ONNX model), with bounded waits.

The waits: ``timeout`` bounds each wait for the server (connecting, each read; the
``KORNIA_DOWNLOAD_TIMEOUT`` variable sets it, as in kornia), ``deadline`` the whole
download, retries and pauses included (``FASTSEQ_DOWNLOAD_DEADLINE``). The errors are
fastseq's, each a subclass of what kornia raises for the same failure, with the original
chained: an HTTP error is a :class:`DownloadError` (a ``ValueError``), a body shorter than
its ``Content-Length`` a ``TruncatedDownloadError`` (urllib's ``ContentTooShortError``), a
server gone quiet a :class:`DownloadTimeoutError` (a ``TimeoutError``).

``HF_HUB_OFFLINE`` is about the Hugging Face Hub and does not stop these downloads;
``FASTSEQ_OFFLINE`` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastseq import _core
from fastseq.errors import DownloadError, DownloadTimeoutError, LoadError

if TYPE_CHECKING:
    import http.client
    import socket
    import urllib.request

# http.client, socket and urllib.request are imported inside the functions that use them:
# `import fastseq` and the CLI do not pay for them.

#: Downloads larger than this are refused (bytes); ``FASTSEQ_MAX_DOWNLOAD`` overrides it.
MAX_DOWNLOAD = int(os.environ.get("FASTSEQ_MAX_DOWNLOAD", str(16 << 30)))
#: Every URL download must be done within this many seconds, retries and their pauses
#: included (``FASTSEQ_DOWNLOAD_DEADLINE`` overrides it; ``deadline=`` per call). The per-read
#: ``timeout`` alone bounds nothing against a server that sends a byte now and then.
DOWNLOAD_DEADLINE = float(os.environ.get("FASTSEQ_DOWNLOAD_DEADLINE", "3600"))
#: The per-read timeout (seconds) when neither ``timeout=`` nor ``KORNIA_DOWNLOAD_TIMEOUT``
#: sets one.
READ_TIMEOUT = 60.0
#: kornia's variable for the per-read timeout, read at each download as kornia reads it.
TIMEOUT_VARIABLE = "KORNIA_DOWNLOAD_TIMEOUT"


def read_timeout() -> float:
    """The per-read timeout: ``KORNIA_DOWNLOAD_TIMEOUT`` when set (kornia's rule: a number
    of seconds above 0 and at most ``threading.TIMEOUT_MAX``; anything else is a
    DownloadError naming the variable, as kornia raises a ValueError), else
    :data:`READ_TIMEOUT`."""
    raw = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return READ_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= threading.TIMEOUT_MAX:  # NaN and inf fail too
        raise DownloadError(
            f"{TIMEOUT_VARIABLE} must be a number of seconds greater than 0 and at most "
            f"{threading.TIMEOUT_MAX!r}, got {raw!r}; unset it for the default of {READ_TIMEOUT:g} s"
        )
    return value


def check_sha256(path: Path, expected: str, source: str) -> None:
    digest = hashlib.sha256()
    # The core's open: a FIFO or a device in the cache (or named by the caller) is refused
    # without blocking, a LoadError naming it.
    with os.fdopen(_core.open_input(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected.lower():
        raise DownloadError(f"{source}: sha256 mismatch: expected {expected}, got {digest.hexdigest()}")


def _offline() -> bool:
    """``FASTSEQ_OFFLINE``: no URL downloads. ``HF_HUB_OFFLINE`` is the Hub's switch and
    does not stop a download from any other server (kornia downloads those too)."""
    return os.environ.get("FASTSEQ_OFFLINE", "").lower() in ("1", "on", "true", "yes")


def url_cache_path(url: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    base = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache() / "urls"
    name = urllib.parse.urlparse(url).path.rsplit("/", 1)[-1]
    if name in ("", ".", ".."):  # a URL ending in /.. would name the cache folder itself
        name = "model.onnx"
    return base / hashlib.sha256(url.encode()).hexdigest()[:16] / name


def _default_cache() -> Path:
    root = os.environ.get("FASTSEQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastseq"
    )
    return Path(root)


def url_download(
    url: str,
    cache_dir: str | os.PathLike[str] | None = None,
    force_download: bool = False,
    *,
    sha256: str | None = None,
    timeout: float | None = None,
    retries: int = 3,
    max_bytes: int | None = None,
    deadline: float | None = None,
    model: bool = False,
) -> Path:
    """Downloads ``url`` into the cache (atomically) and returns the local path. A cached
    copy is reused unless ``force_download``; with ``FASTSEQ_OFFLINE`` set, the cached copy
    is the only option. What arrives is checked before it enters the cache: its length
    against ``Content-Length``, its ``sha256`` when one is given and, with ``model=True``,
    that the core decodes it as an ONNX model (so a truncated or garbage body is never a
    cached file).

    ``timeout`` bounds each wait for the server (connecting, each read; default
    ``KORNIA_DOWNLOAD_TIMEOUT``, else :data:`READ_TIMEOUT`); ``deadline`` (default
    :data:`DOWNLOAD_DEADLINE`) bounds the whole download, every attempt and pause included:
    past it the connection is shut. A failed attempt is tried again, ``retries`` attempts in
    all, unless the server refused the request (an HTTP 4xx other than 408 and 429).

    Raises:
        DownloadError: the server answered an HTTP error (a ``ValueError``; the
            ``HTTPError`` is the cause), could not be reached, or sent something malformed.
        TruncatedDownloadError: the body was shorter than its ``Content-Length`` (urllib's
            ``ContentTooShortError``).
        DownloadTimeoutError: the server went ``timeout`` seconds without answering, or the
            deadline passed (a ``TimeoutError``).
    """
    import urllib.error

    from fastseq.errors import TruncatedDownloadError

    url, _, fragment = url.partition("#")
    if fragment.startswith("sha256=") and sha256 is None:
        sha256 = fragment[len("sha256=") :]
    target = url_cache_path(url, cache_dir)
    if target.exists() and not force_download:
        if sha256 is None:
            return target
        try:
            check_sha256(target, sha256, url)
            return target
        except DownloadError:
            target.unlink(missing_ok=True)  # a corrupt cached copy is fetched again
    if _offline():
        raise DownloadError(f"{url}: offline (FASTSEQ_OFFLINE) and not cached at {target}")
    per_read = read_timeout() if timeout is None else timeout
    limit = MAX_DOWNLOAD if max_bytes is None else max_bytes
    allowed = DOWNLOAD_DEADLINE if deadline is None else deadline
    fresh = not target.parent.exists()  # a failed download leaves no empty folder of its own
    target.parent.mkdir(parents=True, exist_ok=True)
    watchdog = _Watchdog(time.monotonic() + allowed)
    last: Exception | None = None
    tried = 0
    out_of_time = False
    try:
        for attempt in range(retries):
            if attempt:
                pause = min(0.5 * 2 ** (attempt - 1), 8.0)
                if watchdog.left() <= pause:
                    out_of_time = True  # the next try would start past the deadline
                    break
                time.sleep(pause)
            tried += 1
            try:
                _fetch(url, target, per_read, limit, watchdog, lambda part: _verify(part, url, sha256, model))
                return target
            except urllib.error.HTTPError as e:
                last = e
                if 400 <= e.code < 500 and e.code not in (408, 429):
                    break  # the server says no; asking again will not help
            except TruncatedDownloadError as e:
                last = e
            except DownloadError:
                raise
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                last = e
            if watchdog.fired:
                break
    finally:
        watchdog.cancel()
        if fresh and not target.exists():
            with contextlib.suppress(OSError):
                target.parent.rmdir()
    attempts = f"after {tried} attempts: " if tried > 1 else ""
    if out_of_time or watchdog.fired or watchdog.left() <= 0:
        raise DownloadTimeoutError(
            f"{url}: download not done within its deadline of {allowed:g} s "
            f"(deadline=, FASTSEQ_DOWNLOAD_DEADLINE) after {tried} attempt(s): {last}"
        ) from last
    if isinstance(last, urllib.error.HTTPError):
        # kornia's words for it, which code written for kornia may look for
        raise DownloadError(f"Error in resolving {url}: {attempts}{last}") from last
    if isinstance(last, TruncatedDownloadError):
        if tried == 1:
            raise last
        detail = str(last).removeprefix(f"{url}: ")
        raise TruncatedDownloadError(
            f"{url}: {attempts}{detail}", received=last.received, announced=last.announced
        ) from last
    if _is_timeout(last):
        raise DownloadTimeoutError(
            f"{url}: the server went {per_read:g} s without answering ({attempts}the per-read timeout, which "
            f"timeout= or the {TIMEOUT_VARIABLE} variable sets)"
        ) from last
    raise DownloadError(f"{url}: download failed {attempts or f'after {tried} attempt: '}{last}") from last


def _is_timeout(error: BaseException | None) -> bool:
    """A socket timeout, raised as it is or wrapped by urllib (connecting)."""
    import urllib.error

    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        error = error.reason if isinstance(error.reason, BaseException) else None
    return isinstance(error, TimeoutError)


class _Watchdog:
    """Shuts a download's sockets at its deadline, so that no blocking read outlives it (a
    server that trickles bytes never trips the per-read timeout)."""

    def __init__(self, end: float) -> None:
        import threading

        self.end = end
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, end - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return self.end - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.fired:
                _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _opener(watchdog: _Watchdog) -> urllib.request.OpenerDirector:
    """urllib's opener (redirects, proxies, TLS), its connections' sockets watched."""
    import http.client
    import urllib.request

    def watched(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
        class Connection(base):  # type: ignore[valid-type,misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                # socket.create_connection, kept per instance (the base is a variable: mypy cannot see it)
                create: Callable[..., socket.socket] = self._create_connection  # type: ignore[has-type]

                def create_watched(*a: Any, **kw: Any) -> socket.socket:
                    sock = create(*a, **kw)
                    watchdog.watch(sock)
                    return sock

                self._create_connection = create_watched

        return Connection

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(watched(http.client.HTTPConnection), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            kwargs: dict[str, Any] = {"context": self._context}  # type: ignore[attr-defined]  # (not in typeshed)
            if hasattr(self, "_check_hostname"):  # Python 3.11
                kwargs["check_hostname"] = self._check_hostname
            return self.do_open(watched(http.client.HTTPSConnection), req, **kwargs)

    return urllib.request.build_opener(Http, Https)


def _content_length(url: str, response: http.client.HTTPResponse) -> int | None:
    """The body's announced length, or None; a malformed or conflicting one is refused
    (``int()`` would accept ``" 1_0 "`` and refuse ``"abc"`` with a bare ValueError)."""
    if getattr(response, "chunked", False):
        return None  # Transfer-Encoding wins over Content-Length (RFC 9112 6.3)
    values = {v.strip() for v in response.headers.get_all("Content-Length") or []}
    if not values:
        return None
    if len(values) > 1:
        raise DownloadError(f"{url}: conflicting Content-Length headers: {', '.join(sorted(map(repr, values)))}")
    value = values.pop()
    if not (value.isascii() and value.isdigit()):
        raise DownloadError(f"{url}: malformed Content-Length header {value[:80]!r}")
    return int(value)


def _verify(part: Path, url: str, sha256: str | None, model: bool) -> None:
    """Checks a downloaded file before it is committed to the cache (see :func:`url_download`)."""
    if sha256 is not None:
        check_sha256(part, sha256, url)
    if model:
        check_model_file(part, url)


def check_model_file(path: Path, source: str) -> None:
    """Raises DownloadError unless the core decodes the file at ``path`` as an ONNX model
    (every check of loading but the external data files, which may come later)."""
    try:
        _core.external_data_locations(str(path))
    except LoadError as e:
        detail = str(e).removeprefix(f"{path}: ")
        raise DownloadError(f"{source}: the download is not a whole ONNX model, so it was not kept: {detail}") from None


def _fetch(
    url: str, target: Path, timeout: float, limit: int, watchdog: _Watchdog, verify: Callable[[Path], None]
) -> None:
    import http.client
    import tempfile
    import urllib.request

    from fastseq.errors import TruncatedDownloadError

    request = urllib.request.Request(url, headers={"User-Agent": "fastseq"})
    tmp: str | None = None
    try:
        with _opener(watchdog).open(request, timeout=max(0.001, min(timeout, watchdog.left()))) as response:
            length = _content_length(url, response)
            if length is not None and length > limit:
                raise DownloadError(f"{url}: {length} bytes is over the download limit of {limit}")
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
            received = 0
            with os.fdopen(fd, "wb") as out:
                # read1: whatever one read from the socket gives, so that the deadline is
                # looked at between reads (read(n) would wait for all n bytes).
                while block := response.read1(1 << 20):
                    received += len(block)
                    if received > limit:
                        raise DownloadError(f"{url}: over the download limit of {limit} bytes")
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
            if watchdog.fired:
                raise TimeoutError("deadline reached")
            if length is not None and received != length:
                raise TruncatedDownloadError(
                    f"{url}: truncated: the server sent {received} of the {length} bytes its Content-Length announced",
                    received=received,
                    announced=length,
                )
            verify(Path(tmp))
            os.replace(tmp, target)
            tmp = None
    except DownloadError:
        raise  # a ValueError, but not a malformed answer
    except http.client.IncompleteRead as e:  # a chunked body cut mid-chunk
        raise TruncatedDownloadError(
            f"{url}: truncated: {e}", received=len(e.partial), announced=len(e.partial) + (e.expected or 0)
        ) from e
    except http.client.RemoteDisconnected:
        raise  # an OSError: retried
    except (http.client.HTTPException, ValueError) as e:
        if watchdog.fired:
            raise TimeoutError("deadline reached") from e
        raise DownloadError(f"{url}: malformed answer from the server: {type(e).__name__}: {e}") from e
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
