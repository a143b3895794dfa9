"""Real HTTP servers on 127.0.0.1 for download tests: a static file server and a stand-in
for the Hugging Face Hub that answers what hf_hub_download asks."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Server:
    def __init__(self, handler_factory):
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.fail_next = 0  # answer this many requests with 503 first
        self.truncate = False  # send half the body with the full Content-Length
        self.short_length = False  # announce half the body's length in Content-Length, send it whole
        self.delay = 0.0  # seconds to wait before answering
        self.trickle = 0.0  # seconds to wait before each byte of the body
        self.stall = False  # send the headers and 10 bytes of the body, then nothing until closed
        self.released = threading.Event()  # ends a stall (set by close)
        server = self

        class Handler(handler_factory):
            owner = server

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def count(self, method: str = "GET", path_part: str = "") -> int:
        return sum(1 for m, p, _ in self.requests if m == method and path_part in p)

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class _FileHandler(BaseHTTPRequestHandler):
    owner: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    def _resolve(self) -> tuple[Path | None, dict[str, str]]:
        raise NotImplementedError

    def _answer(self, body: bool) -> None:
        self.owner.requests.append((self.command, self.path, dict(self.headers)))
        if self.owner.delay:
            import time

            time.sleep(self.owner.delay)
        if self.owner.fail_next > 0:
            self.owner.fail_next -= 1
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, headers = self._resolve()
        if path is None or not path.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            for k, v in headers.items():  # the Hub's X-Error-Code says what is missing
                self.send_header(k, v)
            self.end_headers()
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data) // 2 if self.owner.short_length else len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if body and self.owner.stall:
            self.wfile.write(data[:10])
            self.wfile.flush()
            self.owner.released.wait(60)
        elif body and self.owner.trickle:
            import time

            for k in range(len(data)):
                time.sleep(self.owner.trickle)
                self.wfile.write(data[k : k + 1])
                self.wfile.flush()
        elif body:
            self.wfile.write(data[: len(data) // 2] if self.owner.truncate else data)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)


def serve_files(root: Path) -> _Server:
    """GET /<path> answers the file root/<path>."""

    class Handler(_FileHandler):
        def _resolve(self):
            return root / self.path.lstrip("/").split("?")[0], {}

    return _Server(Handler)


def serve_hub(root: Path) -> _Server:
    """GET/HEAD /{org}/{repo}/resolve/{revision}/{path} answers root/org/repo/path, or
    root/org/repo@revision/path for a revision other than main. Like the Hub, a 404 carries
    X-Error-Code: RepoNotFound, RevisionNotFound or EntryNotFound. It also lists folders
    (GET /api/models/{org}/{repo}/tree/{rev}/{folder}), as huggingface_hub's tree API asks."""

    class Handler(_FileHandler):
        def _resolve(self):
            parts = self.path.split("?")[0].lstrip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return None, {}
            org, repo, _, revision, *rest = parts
            folder = f"{repo}" if revision == "main" else f"{repo}@{revision}"
            commit = hashlib.sha1(f"{org}/{repo}@{revision}".encode()).hexdigest()
            if not (root / org / repo).is_dir():
                return None, {"X-Error-Code": "RepoNotFound"}
            if not (root / org / folder).is_dir():
                return None, {"X-Error-Code": "RevisionNotFound"}
            path = root / org / folder / "/".join(rest)
            headers = {"X-Repo-Commit": commit}
            if not path.is_file():
                headers["X-Error-Code"] = "EntryNotFound"
            return path, headers

        def do_GET(self):
            # GET /api/models/{org}/{repo}/tree/{rev}/{folder}: what list_repo_tree asks for.
            parts = self.path.split("?")[0].lstrip("/").split("/")
            if parts[:2] != ["api", "models"] or len(parts) < 6 or parts[4] != "tree":
                return self._answer(True)
            org, repo, folder = parts[2], parts[3], "/".join(parts[6:])
            self.owner.requests.append((self.command, self.path, dict(self.headers)))
            base = root / org / repo / folder
            entries = [
                {
                    "type": "file" if p.is_file() else "directory",
                    "path": f"{folder}/{p.name}",
                    "oid": "0" * 40,
                    "size": p.stat().st_size if p.is_file() else 0,
                }
                for p in (sorted(base.iterdir()) if base.is_dir() else [])
            ]
            body = json.dumps(entries).encode()
            self.send_response(200 if base.is_dir() else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if base.is_dir() else 0))
            self.end_headers()
            if base.is_dir():
                self.wfile.write(body)

    return _Server(Handler)


def serve_raw(answer: bytes) -> _Server:
    """Answers every GET with ``answer``, raw bytes written as they are (status line and
    headers included), then closes the connection: for malformed answers."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self.owner.requests.append((self.command, self.path, dict(self.headers)))
            self.wfile.write(answer)
            self.wfile.flush()
            self.close_connection = True

    return _Server(Handler)


class HangUp:
    """Accepts each connection and closes it at once: a Hub that is there and is not."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
