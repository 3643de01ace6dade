"""A fake ModelScope server on 127.0.0.1 for tests: answers what the modelscope package (1.40, modelscope-hub 0.5)
and npu_rl.models.modelscope_hub / npu_rl.data.modelscope_data request for small model and data set repos held in
memory, so nothing reaches the internet.

Endpoints:
    GET /api/v1/models/<owner>/<name>/repo/files?Revision=<rev>&Recursive=True   file list ({"Data": {"Files": []}})
    GET /api/v1/datasets/<owner>/<name>/repo/tree?Revision=<rev>&Recursive=True&PageNumber=<n>&PageSize=<k>
                                                                                 a data set's file list, paged
    GET /api/v1/{models|datasets}/<owner>/<name>/repo?Revision=<rev>&FilePath=<file>   file content
Anything else answers 404 and is recorded in ``unknown`` (modelscope also asks ``/api/v1/repos/
internalAccelerationInfo``, which it does without). A revision is ``master`` or one given to ``add``.

The server in a thread is tests/fake_hub.py's ``LocalServer``; a server that hangs is its ``SilentHub``.
"""

from __future__ import annotations

import hashlib
import json
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fake_hub import LocalServer


class FakeModelScope(LocalServer):
    def __init__(self):
        super().__init__()
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}  # (kind, repo id) -> {path: bytes}
        self.revisions: dict[tuple[str, str], set[str]] = {}

    def add(self, repo_id: str, files: dict[str, bytes], revisions: tuple[str, ...] = (),
            kind: str = "models") -> None:
        """A model repo (``kind="models"``) or a data set repo (``kind="datasets"``)."""
        self.repos[(kind, repo_id)] = dict(files)
        self.revisions[(kind, repo_id)] = {"master", *revisions}

    def add_dataset(self, repo_id: str, files: dict[str, bytes], revisions: tuple[str, ...] = ()) -> None:
        self.add(repo_id, files, revisions, kind="datasets")

    def _answer(self, handler, head: bool) -> None:
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        self.requests.append(f"{handler.command} {handler.path}")
        parts = [p for p in unquote(url.path).split("/") if p]
        if parts[:2] == ["api", "v1"] and len(parts) >= 6 and parts[2] in ("models", "datasets"):
            kind, repo_id, rest = parts[2], "/".join(parts[3:5]), parts[5:]
            revision = query.get("Revision", ["master"])[0]
            if (kind, repo_id) in self.repos and revision in self.revisions[(kind, repo_id)]:
                files = self.repos[(kind, repo_id)]
                listing = [{"Path": p, "Name": p.rsplit("/", 1)[-1], "Type": "blob", "Size": len(d),
                            "Sha256": hashlib.sha256(d).hexdigest(), "Revision": revision}
                           for p, d in sorted(files.items())]
                if rest == ["repo", "files"] and kind == "models":
                    body = json.dumps({"Code": 200, "Success": True, "Data": {"Files": listing}}).encode()
                    return self._send(handler, 200, body, head, "application/json")
                if rest == ["repo", "tree"] and kind == "datasets":
                    page = int(query.get("PageNumber", ["1"])[0])
                    size = int(query.get("PageSize", ["200"])[0])
                    chunk = listing[(page - 1) * size:page * size]
                    body = json.dumps({"Code": 200, "Success": True, "Data": {"Files": chunk}}).encode()
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
