"""`brisk models pull REPO_ID`: download an mlx-lm compatible model from a Hugging Face hub.

The hub is whatever `HF_ENDPOINT` points at (huggingface.co by default). Files land in
`cache/hf/<id>/` through `hf_hub_download`, which resumes `.incomplete` files, so an
interrupted pull continues where it stopped. config.json comes first: a repo whose
architecture mlx-lm cannot run is refused before any weights are fetched.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from engine.errors import DownloadError, UnsupportedModel
from engine.events import DownloadProgressed
from engine.models.folder import mlx_architecture, read_config
from engine.models.store import CatalogEntry, ModelStore, model_id_from_repo, validate_model_id

log = logging.getLogger(__name__)

# What an MLX model folder needs; PyTorch .bin/.pt files and READMEs are skipped.
ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja")


def _wanted(path: str) -> bool:
    return "/" not in path and any(fnmatch.fnmatch(path, p) for p in ALLOW_PATTERNS)


class _ByteCounter:
    """A tqdm stand-in handed to hf_hub_download: forwards bytes to one callback."""

    on_bytes: Callable[[int], None] = staticmethod(lambda n: None)

    def __init__(self, *args, total=None, initial=0, **kwargs):
        self.n = initial or 0
        if initial:
            self.on_bytes(int(initial))  # bytes already on disk from an earlier attempt

    def update(self, n=1):
        self.n += n or 0
        self.on_bytes(int(n or 0))

    def update_transfer(self, n=1):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass

    def refresh(self, *a, **k):
        pass

    def set_postfix_str(self, *a, **k):
        pass

    set_transfer_postfix_str = set_description = set_description_str = set_postfix_str


def _hub_errors():
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    return httpx2, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError


def _explain(exc: Exception, repo_id: str, endpoint: str) -> DownloadError:
    httpx2, Gated, HTTPError, LocalMissing, RepoMissing, RevMissing = _hub_errors()
    if isinstance(exc, Gated):
        return DownloadError(f"{repo_id} is gated: accept its license on the hub and log in (huggingface-cli login)")
    if isinstance(exc, RepoMissing):
        return DownloadError(f"No model repository '{repo_id}' at {endpoint} (or it is private)")
    if isinstance(exc, RevMissing):
        return DownloadError(f"{repo_id} has no such revision")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, LocalMissing)):
        return DownloadError(f"Cannot reach {endpoint}: are you offline? ({type(exc).__name__})")
    if isinstance(exc, HTTPError):
        return DownloadError(f"The hub refused the download of {repo_id}: {exc}")
    return DownloadError(f"Download of {repo_id} failed: {exc}")


def pull(repo_id: str, *, store: ModelStore | None = None, model_id: str | None = None,
         revision: str = "main", on_progress: Callable[[DownloadProgressed], None] | None = None,
         should_stop: Callable[[], bool] | None = None) -> CatalogEntry:
    from huggingface_hub import HfApi, constants, hf_hub_download

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

        def fetch(name: str, done_before: int) -> None:
            class Counter(_ByteCounter):
                @staticmethod
                def on_bytes(n):
                    Counter.seen += n
                    report(DownloadProgressed(repo_id, done_before + Counter.seen, total, name))
                    if stop():
                        raise DownloadError(f"Download of {repo_id} cancelled; pull again to resume")

            Counter.seen = 0
            hf_hub_download(repo_id, name, revision=info.sha, local_dir=target, tqdm_class=Counter,
                            endpoint=endpoint)

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
    with store.staging(model_id) as stage:
        for item in downloaded.iterdir():
            if item.is_file():
                shutil.move(str(item), stage / item.name)
        store.register(stage, model_id=model_id, source=source)
    shutil.rmtree(downloaded, ignore_errors=True)
    return store.get(model_id)
