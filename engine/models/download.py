"""`brisk models pull REPO_ID`: download an mlx-lm compatible model from a Hugging Face hub.

The hub is whatever `HF_ENDPOINT` points at (huggingface.co by default). huggingface_hub
lists the repo and builds URLs and auth headers; the bytes are streamed here into
`cache/hf/<id>/<file>.part` with HTTP Range requests, because huggingface_hub >= 2 deletes
partial files on failure. So a dropped connection, a cancel or a crash resumes where it
stopped. config.json comes first: a repo whose architecture mlx-lm cannot run is refused
before any weights are fetched.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, NoReturn

from brisk.engine.api.errors import DownloadError, UnsupportedModel
from brisk.engine.api.events import DownloadProgressed
from brisk.engine.models.folder import mlx_architecture, read_config
from brisk.engine.models.store import CatalogEntry, ModelStore, model_id_from_repo, validate_model_id

log = logging.getLogger(__name__)

# What an MLX model folder needs; PyTorch .bin/.pt files and READMEs are skipped.
ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja")


def _wanted(path: str) -> bool:
    return "/" not in path and any(fnmatch.fnmatch(path, p) for p in ALLOW_PATTERNS)


# Retries of a dropped transfer within one pull; each resumes from the bytes on disk.
TRANSFER_RETRIES = 5
CHUNK_BYTES = 1 << 20


# A config or tokenizer file whose size the hub does not give is read up to this much.
UNSIZED_FILE_BYTES = 64 << 20


def fetch_resumable(
    url: str,
    dest: Path,
    size: int,
    on_progress: Callable[[int], None],
    headers: dict[str, str] | None = None,
    *,
    max_bytes: int | None = None,
) -> None:
    """Download `url` to `dest`, continuing a `dest.part` left by an earlier attempt.

    `on_progress` receives the bytes of this file on disk so far (it may raise to cancel).
    `headers` replace the hub's own (a Hugging Face token must never go to another host).
    At most `size` bytes are taken (or `max_bytes` when the size is not known): a server
    that sends more is stopped there and its bytes discarded (one declared 1 MiB and sent
    500 MB, all of it written).
    """
    import httpx2
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers

    part = dest.with_name(dest.name + ".part")
    limit = size or max_bytes
    for attempt in range(TRANSFER_RETRIES + 1):
        have = part.stat().st_size if part.exists() else 0
        if limit and have > limit:  # left by a server that sent too much: nothing of it is usable
            part.unlink()
            have = 0
        sent = dict(headers) if headers is not None else build_hf_headers()
        if have:
            sent["Range"] = f"bytes={have}-"
        try:
            with get_session().stream("GET", url, headers=sent, follow_redirects=True, timeout=30) as response:
                if response.status_code == 416 and have == size:
                    break  # the part file is already complete
                response.raise_for_status()
                if response.status_code != 206 or not response.headers.get("Content-Range", "").startswith(
                    f"bytes {have}-"
                ):
                    have = 0  # the server ignored Range (or answered another one): start over
                announced = response.headers.get("Content-Length", "")
                if limit and announced.isdigit() and have + int(announced) > limit:
                    _discard(part, dest, limit, f"announced {have + int(announced):,}")
                with open(part, "ab" if have else "wb") as out:
                    on_progress(have)
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        if limit and have + len(chunk) > limit:
                            out.close()
                            _discard(part, dest, limit, "sent more")
                        out.write(chunk)
                        have += len(chunk)
                        on_progress(have)
            break
        except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.ReadTimeout) as exc:
            if attempt == TRANSFER_RETRIES:
                raise
            log.warning("transfer of %s dropped (%s); resuming", dest.name, exc)
    if size and part.stat().st_size != size:
        raise DownloadError(f"{dest.name}: got {part.stat().st_size} bytes, the server lists {size}")
    part.replace(dest)


def _discard(part: Path, dest: Path, limit: int, what: str) -> NoReturn:
    part.unlink(missing_ok=True)
    raise DownloadError(
        f"{dest.name}: the server {what} bytes where {limit:,} were expected; the download was stopped and "
        "discarded (the server is misconfigured or hostile)"
    )


def disk_error(exc: OSError, doing: str) -> DownloadError:
    """One line for a failed write: a full disk says so, and where Brisk keeps its data."""
    from brisk.engine.models.store import brisk_home

    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DownloadError(
            f"The disk is full (no space left while {doing}); free some space on the disk holding "
            f"{brisk_home()} and try again"
        )
    return DownloadError(f"Could not read or write a file while {doing}: {exc.strerror or exc}")


def _hub_errors():
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    return (
        httpx2,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )


def _explain(exc: Exception, repo_id: str, endpoint: str) -> DownloadError:
    httpx2, Gated, HTTPError, LocalMissing, RepoMissing, RevMissing = _hub_errors()
    if isinstance(exc, Gated):
        return DownloadError(f"{repo_id} is gated: accept its license on the hub and log in (huggingface-cli login)")
    if isinstance(exc, RepoMissing):
        return DownloadError(f"No model repository '{repo_id}' at {endpoint} (or it is private)")
    if isinstance(exc, RevMissing):
        return DownloadError(f"{repo_id} has no such revision")
    if isinstance(exc, httpx2.TooManyRedirects):
        return DownloadError(f"{endpoint} redirects in a loop for {repo_id} (it is misconfigured or hostile): {exc}")
    if isinstance(exc, OSError):
        return disk_error(exc, f"downloading {repo_id}")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, LocalMissing)):
        return DownloadError(f"Cannot reach {endpoint}: are you offline? ({type(exc).__name__})")
    if isinstance(exc, httpx2.HTTPStatusError):
        return DownloadError(f"The hub answered HTTP {exc.response.status_code} for {exc.request.url}")
    if isinstance(exc, HTTPError):
        return DownloadError(f"The hub refused the download of {repo_id}: {exc}")
    return DownloadError(f"Download of {repo_id} failed: {exc}")


def pull(
    repo_id: str,
    *,
    store: ModelStore | None = None,
    model_id: str | None = None,
    revision: str = "main",
    on_progress: Callable[[DownloadProgressed], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> CatalogEntry:
    from huggingface_hub import HfApi, constants, hf_hub_url

    store = store or ModelStore()
    model_id = validate_model_id(model_id) if model_id else model_id_from_repo(repo_id)
    if store.has(model_id):
        raise DownloadError(f"Model '{model_id}' is already installed; `brisk models rm {model_id}` first")
    # Read at call time: huggingface_hub freezes HF_ENDPOINT when first imported.
    endpoint = os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")
    report = on_progress or (lambda event: None)
    stop = should_stop or (lambda: False)
    target = store.cache_dir / "hf" / model_id
    target.mkdir(parents=True, exist_ok=True)
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
        files = {s.rfilename: (s.size or 0) for s in info.siblings or [] if _wanted(s.rfilename)}
        if "config.json" not in files:
            raise UnsupportedModel(f"{repo_id} has no config.json: not a transformers/mlx-lm model repository")
        if not any(name.endswith(".safetensors") for name in files):
            raise UnsupportedModel(f"{repo_id} has no .safetensors weights (mlx-lm cannot read PyTorch .bin files)")
        unsized = [name for name, size in files.items() if not size and name.endswith(".safetensors")]
        if unsized:  # nothing would bound the download: a hostile hub could stream until the disk is full
            raise DownloadError(
                f"The hub does not say how large {unsized[0]} is; Brisk downloads weights of known size only"
            )

        def fetch(name: str, done_before: int) -> None:
            def on_bytes(on_disk: int) -> None:
                report(DownloadProgressed(repo_id, done_before + on_disk, total, name))
                if stop():
                    raise DownloadError(f"Download of {repo_id} cancelled; pull again to resume")

            if not (target / name).is_file():
                url = hf_hub_url(repo_id, name, revision=info.sha, endpoint=endpoint)
                fetch_resumable(url, target / name, files[name], on_bytes, max_bytes=UNSIZED_FILE_BYTES)

        total = sum(files.values())
        fetch("config.json", 0)
        mlx_architecture(read_config(target))  # refuse unsupported architectures before the weights
        done = files["config.json"]
        for name in sorted(n for n in files if n != "config.json"):
            fetch(name, done)
            done += files[name]
        report(DownloadProgressed(repo_id, total, total, ""))
    except (DownloadError, UnsupportedModel):
        raise
    except Exception as exc:
        raise _explain(exc, repo_id, endpoint) from exc
    return _install(store, target, model_id, f"hf:{repo_id}@{info.sha}")


def _install(store: ModelStore, downloaded: Path, model_id: str, source: str) -> CatalogEntry:
    try:
        with store.staging(model_id) as stage:
            for item in downloaded.iterdir():
                if item.is_file():
                    shutil.move(str(item), stage / item.name)
            store.register(stage, model_id=model_id, source=source)
    except OSError as exc:
        raise disk_error(exc, f"installing {model_id}") from exc
    shutil.rmtree(downloaded, ignore_errors=True)
    return store.get(model_id)
