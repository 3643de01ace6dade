"""A fake ModelScope server on 127.0.0.1 for tests: answers what the modelscope package (1.40, modelscope-hub 0.5)
and npu_rl.models.modelscope_hub request for small model repos held in memory, so nothing reaches the internet.

Endpoints:
    GET /api/v1/models/<owner>/<name>/repo/files?Revision=<rev>&Recursive=True   file list ({"Data": {"Files": []}})
    GET /api/v1/models/<owner>/<name>/repo?Revision=<rev>&FilePath=<file>         file content
Anything else answers 404 and is recorded in ``unknown`` (modelscope also asks ``/api/v1/repos/
internalAccelerationInfo``, which it does without). A revision is ``master`` or one given to ``add``.

``SilentServer`` accepts connections and never answers: a server that hangs, for the timeout's test.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


class FakeModelScope:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.revisions: dict[str, set[str]] = {}
        self.requests: list[str] = []
        self.unknown: list[str] = []
        self._server = None
        self._thread = None

    def add(self, repo_id: str, files: dict[str, bytes], revisions: tuple[str, ...] = ()) -> None:
        self.repos[repo_id] = dict(files)
        self.revisions[repo_id] = {"master", *revisions}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeModelScope:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                server._answer(self, head=False)

            def do_HEAD(self):
                server._answer(self, head=True)

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
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        self.requests.append(f"{handler.command} {handler.path}")
        parts = [p for p in unquote(url.path).split("/") if p]
        if parts[:3] == ["api", "v1", "models"] and len(parts) >= 6:
            repo_id, rest = "/".join(parts[3:5]), parts[5:]
            revision = query.get("Revision", ["master"])[0]
            if repo_id in self.repos and revision in self.revisions[repo_id]:
                files = self.repos[repo_id]
                if rest == ["repo", "files"]:
                    listing = [{"Path": p, "Name": p.rsplit("/", 1)[-1], "Type": "blob", "Size": len(d),
                                "Sha256": hashlib.sha256(d).hexdigest(), "Revision": revision}
                               for p, d in sorted(files.items())]
                    body = json.dumps({"Code": 200, "Success": True, "Data": {"Files": listing}}).encode()
                    return self._send(handler, 200, body, head, "application/json")
                file_path = query.get("FilePath", [""])[0]
                if rest == ["repo"] and file_path in files:
                    return self._send(handler, 200, files[file_path], head, "application/octet-stream")
        self.unknown.append(f"{handler.command} {handler.path}")
        body = json.dumps({"Code": 10010205001, "Success": False, "Message": "not found"}).encode()
        self._send(handler, 404, body, head, "application/json")

    @staticmethod
    def _send(handler, status: int, body: bytes, head: bool, content_type: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)


class SilentServer:
    """A listening socket that never accepts: connections complete (the kernel's backlog) and reads hang."""

    def __init__(self):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(8)

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    def close(self) -> None:
        self._socket.close()
