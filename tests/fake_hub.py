"""A fake Hugging Face Hub on 127.0.0.1 for tests: answers the endpoints huggingface_hub (and ``datasets``) call
for small model and data set repos held in memory, so nothing reaches the internet.

Endpoints (as huggingface_hub 2.x requests them):
    GET  /api/{models|datasets}/<repo>[/revision/<rev>]      repo info: sha, siblings
    GET  /api/{models|datasets}/<repo>/tree/<rev>[/<path>]   file listing (HfFileSystem, datasets)
    POST /api/{models|datasets}/<repo>/paths-info/<rev>      info on given paths (HfFileSystem)
    HEAD/GET /[datasets/]<repo>/resolve/<rev>/<file>         file metadata / content (Range honoured)
Anything else answers 404 and is recorded in ``unknown``, so a test can show what the client asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


class LocalServer:
    """An HTTP server on 127.0.0.1 in a thread, every HEAD / GET / POST handed to ``_answer(handler, head)``; the
    fake Hub and the fake ModelScope (tests/fake_modelscope.py) differ only in what they answer."""

    def __init__(self):
        self.requests: list[str] = []
        self.unknown: list[str] = []
        self._server = None
        self._thread = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                server._answer(self, head=True)

            def do_GET(self):
                server._answer(self, head=False)

            def do_POST(self):
                server._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)

    def _answer(self, handler, head: bool) -> None:
        raise NotImplementedError


class FakeHub(LocalServer):
    def __init__(self):
        super().__init__()
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}  # (kind, repo id) -> {path: bytes}

    def add(self, kind: str, repo_id: str, files: dict[str, bytes]) -> str:
        """Add a repo (kind "models" or "datasets"); returns its commit sha."""
        self.repos[(kind, repo_id)] = dict(files)
        return self.sha(kind, repo_id)

    def sha(self, kind: str, repo_id: str) -> str:
        digest = hashlib.sha1()
        for path, data in sorted(self.repos[(kind, repo_id)].items()):
            digest.update(path.encode() + b"\0" + data)
        return digest.hexdigest()

    # --- request handling -------------------------------------------------------------------------------------

    def _find(self, kind: str, parts: list[str]):
        """The longest repo id at the start of ``parts`` (ids have one or two parts)."""
        for n in (2, 1):
            repo_id = "/".join(parts[:n])
            if (kind, repo_id) in self.repos:
                return repo_id, parts[n:]
        return None, parts

    def _answer(self, handler, head: bool) -> None:
        url = urlsplit(handler.path)
        path = unquote(url.path)
        self.requests.append(f"{handler.command} {handler.path}")
        parts = [p for p in path.split("/") if p]
        try:
            if parts[:1] == ["api"] and len(parts) >= 3 and parts[1] in ("models", "datasets"):
                return self._api(handler, parts[1], parts[2:], parse_qs(url.query))
            kind = "models"
            if parts[:1] == ["datasets"]:
                kind, parts = "datasets", parts[1:]
            repo_id, rest = self._find(kind, parts)
            if repo_id is not None and rest[:1] == ["resolve"] and len(rest) >= 3:
                return self._file(handler, kind, repo_id, rest[1], "/".join(rest[2:]), head)
        except Exception as exc:  # a bug here must show, not hang the client
            self.unknown.append(f"{handler.command} {handler.path}: {exc!r}")
            return self._send(handler, 500, b"fake hub error")
        self.unknown.append(f"{handler.command} {handler.path}")
        self._send(handler, 404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"})

    def _send(self, handler, status: int, body: bytes, headers: dict | None = None, head: bool = False) -> None:
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def _json(self, handler, obj) -> None:
        self._send(handler, 200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _api(self, handler, kind: str, parts: list[str], query) -> None:
        repo_id, rest = self._find(kind, parts)
        if repo_id is None:
            self.unknown.append(f"{handler.command} {handler.path}")
            return self._send(handler, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        files, sha = self.repos[(kind, repo_id)], self.sha(kind, repo_id)
        if not rest or rest[0] == "revision":
            return self._json(handler, {
                "id": repo_id, "_id": repo_id, "sha": sha, "private": False, "disabled": False, "gated": False,
                "downloads": 0, "likes": 0, "tags": [], "lastModified": "2026-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": p, "size": len(d)} for p, d in sorted(files.items())],
                "cardData": {},
            })
        if rest[0] == "tree":
            prefix = "/".join(rest[2:])
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            return self._json(handler, self._tree(files, prefix, recursive))
        if rest[0] == "paths-info":
            length = int(handler.headers.get("Content-Length") or 0)
            body = handler.rfile.read(length).decode()
            form = parse_qs(body)
            try:
                paths = json.loads(body).get("paths", [])
            except json.JSONDecodeError:
                paths = form.get("paths", [])
            entries = self._tree(files, "", True)
            return self._json(handler, [e for e in entries if e["path"] in paths])
        self.unknown.append(f"{handler.command} {handler.path}")
        self._send(handler, 404, b"{}")

    @staticmethod
    def _tree(files: dict[str, bytes], prefix: str, recursive: bool) -> list[dict]:
        prefix = prefix.strip("/")
        entries, dirs = [], set()
        for path, data in sorted(files.items()):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rest = path[len(prefix) + 1:] if prefix else path
            segments = rest.split("/")
            for i in range(1, len(segments)):
                d = "/".join(([prefix] if prefix else []) + segments[:i])
                if recursive or i == 1:
                    dirs.add(d)
            if recursive or len(segments) == 1:
                entries.append({"type": "file", "path": path, "size": len(data),
                                "oid": hashlib.sha1(data).hexdigest()})
        return [{"type": "directory", "path": d, "size": 0, "oid": hashlib.sha1(d.encode()).hexdigest()}
                for d in sorted(dirs)] + entries

    def _file(self, handler, kind: str, repo_id: str, revision: str, filename: str, head: bool) -> None:
        files = self.repos[(kind, repo_id)]
        sha = self.sha(kind, repo_id)
        if filename not in files or revision not in ("main", sha):
            return self._send(handler, 404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, head)
        data = files[filename]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        range_header = handler.headers.get("Range")
        if range_header and range_header.startswith("bytes=") and not head:
            start_s, _, end_s = range_header[6:].partition("-")
            start = int(start_s or 0)
            end = int(end_s) if end_s else len(data) - 1
            chunk = data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"
            return self._send(handler, 206, chunk, headers)
        if head:
            handler.send_response(200)
            for key, value in headers.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            return
        self._send(handler, 200, data, headers)


def folder_files(folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path (a model or data folder -> a repo's contents)."""
    import os

    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            full = os.path.join(root, name)
            out[os.path.relpath(full, folder).replace(os.sep, "/")] = open(full, "rb").read()
    return out


def online_env(monkeypatch, hub: FakeHub, home: str) -> None:
    """Point huggingface_hub (and ``datasets``) at ``hub`` with a fresh cache under ``home``; online mode even
    though the test session runs with HF_HUB_OFFLINE=1 (huggingface_hub reads that once, at import)."""
    import huggingface_hub.constants as constants

    for key in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_HOME", home)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")


def offline_env(monkeypatch, home: str) -> None:
    import huggingface_hub.constants as constants

    for key in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_HOME", home)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


class SilentHub:
    """A server on 127.0.0.1 that accepts every connection and never answers a byte: a Hub or mirror that hangs.
    The kernel completes the TCP handshake from the listen backlog; connections are also accepted and held so a
    client's request is read by nobody and answered by nothing."""

    def __init__(self):
        import socket

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self._held: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self.connections = 0

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self._socket.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                continue
            self.connections += 1
            self._held.append(conn)
            self._serve(conn)

    def _serve(self, conn) -> None:
        """What happens to an accepted connection: here nothing (it is held open, unanswered)."""

    def start(self) -> "SilentHub":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._socket.close()


class TricklingHub(SilentHub):
    """A server on 127.0.0.1 that answers every request (HEAD or GET) with a 200 whose headers never end: one byte
    every ``interval_s`` seconds. Each read of the client gets a byte well within any per-read timeout, so only an
    overall deadline ends a call to it (a mirror behind a stalling proxy, a link that crawls)."""

    def __init__(self, interval_s: float = 0.2):
        super().__init__()
        self.interval_s = interval_s

    def _serve(self, conn) -> None:
        threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn) -> None:
        try:
            conn.settimeout(5)
            conn.recv(65536)  # the request (its headers); what it asks does not matter
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Padding: ")
            while not self._stop.wait(self.interval_s):
                conn.sendall(b"a")
        except OSError:  # the client gave up, or the server stopped
            pass
