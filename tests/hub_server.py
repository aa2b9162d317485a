"""A tiny Hugging Face-compatible hub on loopback, serving model folders from disk.

It answers the calls huggingface_hub makes for `list_models` (search), `model_info` and
`hf_hub_download` (repo info with siblings, file HEAD/GET with Range for resuming), so
`brisk models pull` and `brisk models search` are tested through the real client over real
HTTP, via HF_ENDPOINT. A repo folder's `.hub.json` (not listed as a file) adds fields to its
info, as the hub's model card and metadata do (cardData, tags, gguf, safetensors); `replies`
overrides any path's JSON body with raw bytes, to play a hostile hub.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    """Serves `root/<org>/<name>/*` as repos `<org>/<name>`; records requests."""

    def __init__(
        self,
        root: Path,
        *,
        drop_first_get_after: int | None = None,
        omit_sizes: bool = False,
        replies: dict[str, bytes] | None = None,
        stalls: dict[str, float] | None = None,
    ):
        self.omit_sizes = omit_sizes  # a hub that lists files without their sizes
        self.replies = dict(replies or {})  # path -> the raw body sent instead (status 200)
        self.stalls = dict(stalls or {})  # path -> seconds of silence before its reply
        self.root = Path(root)
        self.drop_first_get_after = drop_first_get_after  # simulate one dropped connection per file
        self._dropped: set[str] = set()
        self.requests: list[str] = []
        self.queries: list[dict] = []  # each search's query parameters
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, head=True)

            def do_GET(self):
                hub._serve(self, head=False)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
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
        if path in self.stalls:
            time.sleep(self.stalls[path])
        parts = path.strip("/").split("/")
        if path in self.replies:
            return self._send(req, 200, self.replies[path], {"Content-Type": "application/json"})
        if parts == ["api", "models"]:
            return self._search(req, parse_qs(urlparse(req.path).query))
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
            if f.is_file() and not f.name.startswith(".")
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
        config = repo / "config.json"
        if config.is_file():  # the hub's summary of it, as huggingface.co gives
            try:
                loaded = json.loads(config.read_text())
                body["config"] = {k: loaded[k] for k in ("model_type", "architectures") if k in loaded}
            except (ValueError, TypeError, AttributeError):
                pass
        parameters: dict[str, int] = {}
        for shard in sorted(repo.glob("*.safetensors")):  # the hub's count of the weights, by dtype
            for name, tensor in _safetensors_header(shard).items():
                if name != "__metadata__":
                    count = 1
                    for dim in tensor["shape"]:
                        count *= dim
                    parameters[tensor["dtype"]] = parameters.get(tensor["dtype"], 0) + count
        if parameters:
            body["safetensors"] = {"parameters": parameters, "total": sum(parameters.values())}
        extra = repo / ".hub.json"
        if extra.is_file():
            body.update(json.loads(extra.read_text()))
        self._send(req, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _search(self, req, query: dict) -> None:
        """`GET /api/models?search=...&limit=...`: repos whose id holds the text, by name."""
        self.queries.append(query)
        text = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["1000"])[0])
        repos = sorted(
            f"{o.name}/{n.name}" for o in self.root.iterdir() if o.is_dir() for n in o.iterdir() if n.is_dir()
        )
        found = [{"id": r, "modelId": r, "tags": [], "downloads": 0, "likes": 0, "private": False} for r in repos]
        body = [entry for entry in found if text in entry["id"].lower()][:limit]
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


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-reply (as Brisk does past its size limit) is no error of
    the hub's: socketserver would print its traceback into the stderr a test reads."""

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(size))
