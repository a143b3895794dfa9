"""gRPC spoken by hand over HTTP/2 (the ``h2`` state machine on a plain socket), for what
neither grpcio nor tritonclient would do: a call whose answer is never read (no WINDOW_UPDATE
is ever sent), a model name of bytes that are not UTF-8, a message cut short, many calls on
one connection at once. Messages are Triton's (``tritonclient.grpc.service_pb2``) or bytes."""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse

import pytest

h2_connection = pytest.importorskip("h2.connection")
h2_config = pytest.importorskip("h2.config")
h2_events = pytest.importorskip("h2.events")
h2_settings = pytest.importorskip("h2.settings")
h2_exceptions = pytest.importorskip("h2.exceptions")

SERVICE = "/inference.GRPCInferenceService/"


def framed(message: bytes) -> bytes:
    """One gRPC message: not compressed, its length, its bytes."""
    return b"\0" + struct.pack(">I", len(message)) + message


class Answer:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.data = b""
        self.ended = False

    @property
    def status(self) -> int | None:
        s = self.headers.get("grpc-status")
        return None if s is None else int(s)

    @property
    def message(self) -> str:
        return urllib.parse.unquote(self.headers.get("grpc-message", ""))

    def payload(self) -> bytes:
        """The answer's message (the frame's header taken off)."""
        assert self.data[:1] == b"\0", self.data[:16]
        (n,) = struct.unpack(">I", self.data[1:5])
        return self.data[5 : 5 + n]


class Connection:
    """One HTTP/2 connection to a gRPC port. ``read=False``: answers' data is never
    acknowledged, so the server's flow-control windows close after the first 64 KB (its
    answers then stay on its side, as they do for a client that stopped reading)."""

    def __init__(
        self,
        port: int,
        *,
        read: bool = True,
        window: int | None = None,
        timeout: float = 30.0,
        rcvbuf: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.read = read
        self.conn = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if window is not None:
            self.conn.update_settings({h2_settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.answers: dict[int, Answer] = {}
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(
        self,
        method: str,
        message: bytes = b"",
        *,
        headers: list[tuple[str, str]] | None = None,
        end: bool = True,
        raw_path: str | None = None,
        frame: bool = True,
    ) -> int:
        """Opens a call of ``method`` and sends ``message`` (framed, unless ``frame`` is false);
        ``end=False`` leaves the request open (more may be sent with :meth:`send`)."""
        sid = self.conn.get_next_available_stream_id()
        path = raw_path if raw_path is not None else SERVICE + method
        self.conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "127.0.0.1"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *(headers or []),
            ],
        )
        self.answers[sid] = Answer()
        self.send(sid, framed(message) if frame else message, end=end)
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        """Sends ``data`` on the call (as flow control lets it); where the server has already
        answered and closed the call, the rest is not sent."""
        try:
            self._send(sid, data, end)
        except h2_exceptions.StreamClosedError:
            self.flush()

    def _send(self, sid: int, data: bytes, end: bool) -> None:
        while data:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if room <= 0:
                if not self.pump(0.05) or self.answers[sid].ended:
                    return
                continue
            self.conn.send_data(sid, data[:room])
            data = data[room:]
            self.flush()
        if end:
            self.conn.end_stream(sid)
        self.flush()

    def pump(self, timeout: float) -> bool:
        """Reads what arrives within ``timeout``; False when the connection closed."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError):
            return True
        except OSError:
            return False
        if not data:
            return False
        for event in self.conn.receive_data(data):
            sid = getattr(event, "stream_id", None)
            answer = self.answers.get(sid) if sid else None
            if isinstance(event, (h2_events.ResponseReceived, h2_events.TrailersReceived)) and answer:
                answer.headers.update(dict(event.headers))
            elif isinstance(event, h2_events.DataReceived) and answer:
                answer.data += event.data
                if self.read:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
            elif isinstance(event, (h2_events.StreamEnded, h2_events.StreamReset)) and answer:
                answer.ended = True
        self.flush()
        return True

    def wait(self, sid: int, timeout: float = 30.0) -> Answer:
        """The call's whole answer (its trailers included)."""
        until = time.monotonic() + timeout
        while not self.answers[sid].ended:
            if time.monotonic() > until:
                raise TimeoutError(f"stream {sid} was not answered within {timeout} s")
            if not self.pump(0.2):
                break
        return self.answers[sid]

    def call(self, method: str, message: bytes = b"", **kw) -> Answer:
        return self.wait(self.start(method, message, **kw))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
