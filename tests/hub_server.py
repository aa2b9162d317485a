"""A tiny Hugging Face-compatible hub on loopback, serving model folders from disk.

It answers the calls huggingface_hub makes for `model_info` and `hf_hub_download`
(repo info with siblings, file HEAD/GET with Range for resuming), so `brisk models pull`
is tested through the real client over real HTTP, via HF_ENDPOINT.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    """Serves `root/<org>/<name>/*` as repos `<org>/<name>`; records requests."""

    def __init__(self, root: Path, *, drop_first_get_after: int | None = None, omit_sizes: bool = False):
        self.omit_sizes = omit_sizes  # a hub that lists files without their sizes
        self.root = Path(root)
        self.drop_first_get_after = drop_first_get_after  # simulate one dropped connection per file
        self._dropped: set[str] = set()
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, head=True)

            def do_GET(self):
                hub._serve(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _repo(self, org: str, name: str) -> Path | None:
        path = self.root / org / name
        return path if path.is_dir() else None

    def _serve(self, req: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = unquote(urlparse(req.path).path)
        rng = req.headers.get("Range")
        self.requests.append(f"{req.command} {path}" + (f" Range={rng}" if rng else ""))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._info(req, parts[2], parts[3])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(req, parts[0], parts[1], "/".join(parts[4:]), head=head)
        self._send(req, 404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"})

    def _info(self, req, org: str, name: str) -> None:
        repo = self._repo(org, name)
        if repo is None:
            return self._send(req, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        siblings = [
            {"rfilename": f.name, "size": None if self.omit_sizes else f.stat().st_size, "blobId": _sha1(f)}
            for f in sorted(repo.iterdir())
            if f.is_file()
        ]
        body = {
            "id": f"{org}/{name}",
            "modelId": f"{org}/{name}",
            "sha": COMMIT,
            "private": False,
            "siblings": siblings,
            "tags": [],
            "downloads": 0,
            "likes": 0,
        }
        self._send(req, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, req, org: str, name: str, filename: str, *, head: bool) -> None:
        repo = self._repo(org, name)
        target = repo / filename if repo else None
        if target is None or not target.is_file():
            return self._send(req, 404, b"", {"X-Error-Code": "EntryNotFound"})
        data = target.read_bytes()
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": f'"{_sha1(target)}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start, status = 0, 200
        rng = req.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if head:
            headers["Content-Length"] = str(len(data))
            return self._send(req, 200, b"", headers, head=True)
        cut = self.drop_first_get_after
        if cut is not None and len(body) > cut and filename not in self._dropped:
            self._dropped.add(filename)
            headers["Content-Length"] = str(len(body))
            req.send_response(status)
            for k, v in headers.items():
                req.send_header(k, v)
            req.end_headers()
            req.wfile.write(body[:cut])
            req.close_connection = True
            return
        self._send(req, status, body, headers)

    @staticmethod
    def _send(req, status: int, body: bytes, headers: dict, *, head: bool = False) -> None:
        req.send_response(status)
        for key, value in headers.items():
            req.send_header(key, value)
        if "Content-Length" not in headers:
            req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if not head and body:
            req.wfile.write(body)


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()
