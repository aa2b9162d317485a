"""The model catalogue: what a model is before it is installed (size, quantization, licence,
context, whether Brisk runs it and whether it fits this machine), for hub search results and
the bundled models alike. `brisk models search` and the app's model manager both use it.

Search goes through huggingface_hub: its HTTP session, auth headers, endpoint (HF_ENDPOINT)
and `ModelInfo` parser, with the calls `HfApi.list_models` and `HfApi.model_info(...,
files_metadata=True)` make. The replies are read here, bounded: those methods read a reply
whole (a hostile hub could send gigabytes) and stop at the first malformed entry, where one
bad entry should hide only itself.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from brisk.engine.api.errors import BriskError, DownloadError

# What a catalogue says when a hub or a model card names no licence.
NO_LICENCE = "no licence stated"
UNKNOWN = "unknown"
DEFAULT_LIMIT = 10  # a screenful; each result costs two more small requests
MAX_LIMIT = 50
# A search page of 50 full entries is well under 1 MiB on huggingface.co; one model's
# details list every file (a few hundred for the largest GGUF repos).
MAX_LIST_BYTES = 8 << 20
MAX_INFO_BYTES = 8 << 20
MAX_CONFIG_BYTES = 1 << 20
MAX_TEXT = 80  # a licence or quantization label longer than this is cut
MAX_QUERY = 200  # characters of search text: a repo id is at most 96 + 1 + 96
# The context a model must offer at least, beside its weights, to count as fitting.
MIN_USEFUL_CONTEXT = 2048
REQUEST_TIMEOUT_S = 20  # without a byte; a reply as a whole gets MAX_REPLY_S
# A hub that sends a byte every few seconds never trips the timeout above; no reply of
# ours takes this long on any working connection.
MAX_REPLY_S = 60
# A whole search: a hub slow on each of 50 results (8 asked at a time) took minutes.
MAX_SEARCH_S = 90
_clock = time.monotonic
PARALLEL_REQUESTS = 8
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_GGUF_TYPE = re.compile(r"(?i)(?:^|[-_.])((?:I?Q[1-8](?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=[-_.])")
_BITS_IN_NAME = re.compile(r"(?i)(?:^|[-_])([2-8])-?bit(?:$|[-_])")
_FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


class CatalogError(DownloadError):
    """The hub could not be asked, or answered nothing usable: one line for the user."""


@dataclass(frozen=True)
class Fit:
    """Whether a model runs in this machine's memory: the weights, plus the KV cache of its
    context at the chat's KV precision."""

    fits: bool | None  # None: not enough known to say
    text: str
    weights_bytes: int | None = None
    kv_bytes_per_token: float | None = None
    max_context: int | None = None  # tokens of KV that fit beside the weights


@dataclass(frozen=True)
class CatalogModel:
    id: str  # a hub repo id, or a bundled model's id
    source: str  # "hub" or "bundled"
    size_bytes: int | None  # the weights' files
    size_note: str  # "", "about", or what the size counts ("smallest GGUF file")
    quantization: str
    licence: str  # NO_LICENCE when none is stated
    context_length: int | None
    architecture: str  # the model_type, or UNKNOWN
    supported: bool  # Brisk can install and run it as it is
    support_note: str  # why not, or mlx-lm's module for it
    fit: Fit = field(default_factory=lambda: Fit(None, UNKNOWN))

    @property
    def licence_stated(self) -> bool:
        return self.licence != NO_LICENCE

    def size_text(self) -> str:
        if self.size_bytes is None:
            return UNKNOWN
        amount = human_bytes(self.size_bytes)
        if self.size_note == "about":
            return f"about {amount}"
        return f"{amount} ({self.size_note})" if self.size_note else amount

    def context_text(self) -> str:
        return f"{self.context_length:,} tokens" if self.context_length else UNKNOWN

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SearchResult:
    query: str
    endpoint: str
    models: list[CatalogModel]
    skipped: list[str]  # one line per hub entry left out, and why


def human_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


def hub_endpoint() -> str:
    """HF_ENDPOINT as it is now: huggingface_hub freezes it when first imported."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


# --- memory fit -------------------------------------------------------------------------


def estimate_fit(
    weights_bytes: int | None,
    config: dict | None,
    context_length: int | None,
    *,
    k_bits: int = 16,
    v_bits: int = 16,
    group_size: int = 32,
    memory_available: int | None = None,
) -> Fit:
    """The weights plus the KV cache of the model's context (or as much as fits), with the
    same per-token formula the attachment fit check uses (engine/turn/documents.py)."""
    from brisk.engine.kv.half import STORED_ITEMSIZE
    from brisk.engine.kv.packed_cache import kv_bytes_per_token, kv_shape
    from brisk.engine.runtime.info import memory_available as free_memory

    if weights_bytes is None:
        return Fit(None, f"{UNKNOWN} (the hub does not say how large it is)")
    free = free_memory() if memory_available is None else memory_available
    spare = free - weights_bytes
    if spare <= 0:
        return Fit(False, f"no: {human_bytes(weights_bytes)} of weights, {human_bytes(free)} free", weights_bytes)
    per_token = None
    try:
        shape = kv_shape(config) if config else None
        args = (config or {}).get("text_config") or config or {}
        layers = args.get("num_hidden_layers")
        sane = shape and _count(shape["kv_heads"]) and _count(shape["head_dim"])
        if sane and shape and isinstance(layers, int) and _count(layers):
            per_token = kv_bytes_per_token(
                layers,
                shape["kv_heads"],
                shape["head_dim"],
                k_bits=k_bits,
                v_bits=v_bits,
                group_size=group_size,
                itemsize=STORED_ITEMSIZE,
            )
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        per_token = None  # a config of the wrong shape: say what is known, the weights
    if not per_token:
        return Fit(True, f"weights fit ({human_bytes(spare)} left for the context)", weights_bytes)
    max_context = int(spare // per_token)
    precision = f"{k_bits}-bit KV" if k_bits == v_bits else f"K{k_bits}/V{v_bits} KV"
    if context_length and max_context >= context_length:
        return Fit(True, f"yes, full context at {precision}", weights_bytes, per_token, max_context)
    if max_context >= MIN_USEFUL_CONTEXT:
        return Fit(True, f"yes, up to {max_context:,} tokens at {precision}", weights_bytes, per_token, max_context)
    return Fit(
        False, f"no: under {MIN_USEFUL_CONTEXT:,} tokens of {precision} fit", weights_bytes, per_token, max_context
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 20


# --- the bundled models ---------------------------------------------------------------


def bundled_models(*, k_bits: int = 16, v_bits: int = 16, group_size: int = 32) -> list[CatalogModel]:
    from brisk.engine.models.bundled import BUNDLED

    models = []
    for spec in BUNDLED.values():
        weights = spec.gguf_bytes  # quantized GGUF blocks stay quantized when imported
        config = (
            {
                "num_hidden_layers": spec.layers,
                "num_attention_heads": spec.kv_heads,
                "num_key_value_heads": spec.kv_heads,
                "head_dim": spec.head_dim,
            }
            if spec.layers
            else None
        )
        fit = estimate_fit(weights, config, spec.context_length, k_bits=k_bits, v_bits=v_bits, group_size=group_size)
        models.append(
            CatalogModel(
                id=spec.id,
                source="bundled",
                size_bytes=weights,
                size_note="" if spec.gguf_bytes_exact else "about",
                quantization=f"{spec.quantization} (GGUF)",
                licence=spec.license if spec.license_stated else NO_LICENCE,
                context_length=spec.context_length,
                architecture=spec.architecture,
                supported=True,
                support_note="installed from PyPI wheels",
                fit=fit,
            )
        )
    return models


def installed_licence(model_id: str) -> str:
    """What an installed model's listing says of its licence: a bundled model's own, else
    where to read it (a hub model's card is not kept with its files)."""
    from brisk.engine.models.bundled import BUNDLED

    spec = BUNDLED.get(model_id)
    if spec is None:
        return "see its model card"
    return spec.license if spec.license_stated else NO_LICENCE


# --- hub search -----------------------------------------------------------------------


def search_hub(
    query: str,
    *,
    limit: int = DEFAULT_LIMIT,
    k_bits: int = 16,
    v_bits: int = 16,
    group_size: int = 32,
    memory_available: int | None = None,
) -> SearchResult:
    """Models whose id matches `query` on the hub, with their details (CatalogError when the
    hub cannot be reached or its search reply is unusable)."""
    endpoint = hub_endpoint()
    limit = max(1, min(int(limit), MAX_LIMIT))
    query = query.strip()
    if not query:
        raise CatalogError("Type part of a model's name to search for")
    if len(query) > MAX_QUERY:  # longer than any repo id: the hub or the URL would refuse it
        raise CatalogError(
            f"The search text is {len(query):,} characters; type part of a model's name (at most {MAX_QUERY})"
        )
    # Most downloaded first, as the hub's own search page and LM Studio list them.
    params = {"search": query, "limit": limit, "sort": "downloads"}
    deadline = _clock() + MAX_SEARCH_S
    listing = _get_json(f"{endpoint}/api/models", params, MAX_LIST_BYTES, endpoint, deadline)
    if not isinstance(listing, list):
        raise CatalogError(f"The hub at {endpoint} answered the search with {type(listing).__name__}, not a list")
    skipped: list[str] = []
    ids: list[str] = []
    invalid = []
    for entry in listing:
        if len(ids) >= limit:  # a hub that ignores the limit: the rest are never looked at
            break
        repo_id = entry.get("id", entry.get("modelId")) if isinstance(entry, dict) else None
        if not isinstance(repo_id, str) or not _REPO_ID.fullmatch(repo_id):
            invalid.append(entry)
        elif repo_id not in ids:
            ids.append(repo_id)
    if invalid:  # one line however many: a hostile list could hold a million
        many = f"{len(invalid)} entries" if len(invalid) > 1 else "an entry"
        skipped.append(f"{many} without a valid repo id (the first: {_shown(invalid[0])})")

    def describe(repo_id: str) -> CatalogModel | str | None:
        if _clock() > deadline:
            return None  # not asked: the search has taken long enough
        try:
            return _describe(repo_id, endpoint, k_bits, v_bits, group_size, memory_available, deadline)
        except _Unreachable:
            raise
        except BriskError as exc:
            return f"{repo_id}: {exc}"
        except Exception as exc:  # a hostile reply of a shape nobody foresaw hides only this entry
            return f"{repo_id}: its details are malformed ({type(exc).__name__})"

    with ThreadPoolExecutor(PARALLEL_REQUESTS) as pool:
        described = list(pool.map(describe, ids))
    models = [d for d in described if isinstance(d, CatalogModel)]
    skipped += [d for d in described if isinstance(d, str)]
    if late := described.count(None):
        skipped.append(f"{late} result{'s' if late > 1 else ''} not looked up: the hub took over {MAX_SEARCH_S} s")
    return SearchResult(query, endpoint, models, skipped)


class _Unreachable(CatalogError):
    """The connection itself failed: the whole search stops with one line."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _get_json(url: str, params: dict | None, max_bytes: int, endpoint: str, deadline: float) -> Any:
    """The JSON at `url`, read through huggingface_hub's session with its headers, at most
    `max_bytes` of it, stopped at the search's deadline."""
    body = _get_bytes(url, params, max_bytes, endpoint, deadline)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CatalogError(f"The hub at {endpoint} sent something that is not JSON for {_path(url)}") from exc
    except RecursionError as exc:  # 200,000 nested brackets fit well within the size limit
        raise CatalogError(f"The hub at {endpoint} sent JSON nested too deeply for {_path(url)}") from exc


def _get_bytes(url: str, params: dict | None, max_bytes: int, endpoint: str, deadline: float) -> bytes:
    from huggingface_hub import get_session

    from brisk.engine.models.pypi import explain_request_error

    try:
        with get_session().stream(
            "GET", url, params=params, headers=_hub_headers(), follow_redirects=True, timeout=REQUEST_TIMEOUT_S
        ) as response:
            if response.status_code == 404:
                raise CatalogError(f"not found on the hub at {endpoint}")
            if response.status_code != 200:
                raise CatalogError(f"The hub at {endpoint} answered HTTP {response.status_code} for {_path(url)}")
            body = bytearray()
            started = _clock()
            for chunk in response.iter_bytes(1 << 16):
                body += chunk
                now = _clock()
                if now - started > MAX_REPLY_S or now > deadline:
                    raise CatalogError(
                        f"The hub at {endpoint} sent {_path(url)} too slowly ({len(body):,} bytes in "
                        f"{now - started:.0f} s); it is overloaded or hostile"
                    )
                if len(body) > max_bytes:
                    raise CatalogError(
                        f"The hub at {endpoint} sent more than {max_bytes >> 20} MiB for {_path(url)}; "
                        "it is misconfigured or hostile"
                    )
            return bytes(body)
    except CatalogError:
        raise
    except Exception as exc:  # httpx's connect, timeout, redirect and protocol errors
        import httpx2

        if isinstance(exc, httpx2.TimeoutException) and not isinstance(exc, httpx2.ConnectTimeout):
            # it answered the connection: a hub slow on one model, not a machine offline
            raise CatalogError(
                f"The hub at {endpoint} did not answer {_path(url)} within {REQUEST_TIMEOUT_S} s"
            ) from exc
        error = explain_request_error(exc, f"the hub at {endpoint}")
        if str(error).startswith("Cannot reach"):
            raise _Unreachable(str(error)) from exc
        raise CatalogError(str(error)) from exc


def _hub_headers() -> dict[str, str]:
    """The user's token as huggingface_hub sends it, and Brisk's user agent. Not its
    build_hf_headers(): for the user agent it fetches the endpoint's /api/agent-harnesses once
    per process and reads it whole (huggingface_hub 2.4), so a hostile HF_ENDPOINT's 2 MB of
    gzip there took 2 GB of memory and 30 s before the search began."""
    from huggingface_hub import constants, get_token

    headers = {"user-agent": "brisk"}
    token = None if constants.HF_HUB_DISABLE_IMPLICIT_TOKEN else get_token()
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _path(url: str) -> str:
    from urllib.parse import urlparse

    return urlparse(url).path[:120]


def _describe(
    repo_id: str,
    endpoint: str,
    k_bits: int,
    v_bits: int,
    group_size: int,
    memory_available: int | None,
    deadline: float,
) -> CatalogModel:
    from urllib.parse import quote

    from huggingface_hub.hf_api import ModelInfo

    data = _get_json(f"{endpoint}/api/models/{repo_id}", {"blobs": True}, MAX_INFO_BYTES, endpoint, deadline)
    if not isinstance(data, dict):
        raise CatalogError(f"its details are {type(data).__name__}, not an object")
    if data.get("id") not in (None, repo_id):  # a reply about another repo is not this one's
        raise CatalogError(f"the hub described {_shown(data.get('id'))} instead")
    info = ModelInfo(**{**data, "id": repo_id})
    files = _files(info.siblings)
    weights = {name: size for name, size in files.items() if name.endswith(".safetensors") and "/" not in name}
    ggufs = {name: size for name, size in files.items() if name.lower().endswith(".gguf")}
    config = None
    if "config.json" in files and weights:
        revision = info.sha if isinstance(info.sha, str) and re.fullmatch(r"[0-9a-f]{40}", info.sha) else "main"
        url = f"{endpoint}/{repo_id}/resolve/{quote(revision, safe='')}/config.json"
        try:
            loaded = _get_json(url, None, MAX_CONFIG_BYTES, endpoint, deadline)
            config = loaded if isinstance(loaded, dict) else None
        except _Unreachable:
            raise
        except CatalogError:
            config = None  # details without the config: context and architecture unknown
    if config is None and isinstance(info.config, dict):
        config = info.config  # the hub's own summary: model_type, quantization, no sizes
    size, note = _size(weights, ggufs)
    context = _context(config, info.gguf)
    weights_memory = _memory_bytes(size, info.safetensors, config) if weights else size
    return CatalogModel(
        id=repo_id,
        source="hub",
        size_bytes=size,
        size_note=note,
        quantization=_quantization(repo_id, config, weights, ggufs, info.safetensors),
        licence=_licence(info.card_data, info.tags),
        context_length=context,
        architecture=_architecture(config, info.gguf),
        supported=(support := _support(config, files, weights, ggufs, repo_id))[0],
        support_note=support[1],
        fit=estimate_fit(
            weights_memory,
            config if weights else None,
            context,
            k_bits=k_bits,
            v_bits=v_bits,
            group_size=group_size,
            memory_available=memory_available,
        ),
    )


def _files(siblings: Any) -> dict[str, int | None]:
    """File name -> size in bytes (None when the hub gives no plausible size)."""
    files: dict[str, int | None] = {}
    for sibling in siblings if isinstance(siblings, list) else []:
        name, size = getattr(sibling, "rfilename", None), getattr(sibling, "size", None)
        if not isinstance(name, str):
            continue
        files[name] = size if _count_bytes(size) else None
    return files


def _count_bytes(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 44


def _size(weights: dict[str, int | None], ggufs: dict[str, int | None]) -> tuple[int | None, str]:
    if weights:
        if any(size is None for size in weights.values()):
            return None, ""
        return sum(size for size in weights.values() if size is not None), ""
    sized = [size for size in ggufs.values() if size is not None]
    if sized:
        return min(sized), "smallest GGUF file" if len(ggufs) > 1 else ""
    return None, ""


def _memory_bytes(size: int | None, safetensors: Any, config: dict | None) -> int | None:
    """Bytes of the weights in memory: float tensors are computed in float32 where the CPU
    kernels run (engine/models/loader.py), quantized ones stay packed."""
    from brisk.engine.models.loader import compute_dtype_name

    if size is None:
        return None
    if isinstance(config, dict) and config.get("quantization"):
        return size
    params = getattr(safetensors, "parameters", None)
    if compute_dtype_name() != "float32" or not isinstance(params, dict):
        return size
    counts = {k: v for k, v in params.items() if isinstance(k, str) and _count_bytes(v)}
    if not counts or any(dtype not in _FLOAT_BYTES for dtype in counts):
        return size
    # Never less than the files: a parameter count that disagrees with them (a hub's stale
    # summary, or a hostile one) said 900 GB of weights fit in 8 GB.
    return max(size, sum(4 * n for n in counts.values()))


def _quantization(repo_id: str, config: dict | None, weights: dict, ggufs: dict, safetensors: Any) -> str:
    config = config if isinstance(config, dict) else {}
    mlx = config.get("quantization")
    if isinstance(mlx, dict) and _count(mlx.get("bits")):
        group = f", groups of {mlx['group_size']}" if _count(mlx.get("group_size")) else ""
        return f"{mlx['bits']}-bit MLX{group}"
    foreign = config.get("quantization_config")
    if isinstance(foreign, dict) and isinstance(foreign.get("quant_method"), str):
        bits = f" {foreign['bits']}-bit" if _count(foreign.get("bits")) else ""
        return _clean(f"{foreign['quant_method']}{bits}")
    if not weights and ggufs:
        types = sorted({m.group(1).upper() for name in ggufs if (m := _GGUF_TYPE.search(name.rsplit("/", 1)[-1]))})
        return _clean("GGUF " + (", ".join(types) if types else "of unstated type"))
    params = getattr(safetensors, "parameters", None)
    if isinstance(params, dict) and params:
        dtypes = [k for k in params if isinstance(k, str)]
        if "U32" in dtypes:
            return "quantized (packed 32-bit words)"
        if dtypes and all(d in _FLOAT_BYTES for d in dtypes):
            return _clean("/".join(sorted(d.lower() for d in dtypes)) + " (not quantized)")
    dtype = config.get("torch_dtype", config.get("dtype"))
    if isinstance(dtype, str) and dtype in ("float32", "float16", "bfloat16"):
        return f"{dtype} (not quantized)"
    if (named := _BITS_IN_NAME.search(repo_id.split("/")[-1])) is not None:
        return f"{named.group(1)}-bit (from its name)"
    return UNKNOWN


def _licence(card_data: Any, tags: Any) -> str:
    named = getattr(card_data, "license", None) if card_data is not None else None
    if isinstance(card_data, dict):
        named = card_data.get("license")
    if isinstance(named, list):
        named = ", ".join(n for n in named if isinstance(n, str)) or None
    if isinstance(named, str) and named.strip():
        # 'other' names its licence in license_name (Qwen's 'qwen-research', say)
        own = card_data.get("license_name") if isinstance(card_data, dict) else getattr(card_data, "license_name", None)
        if named.strip().lower() == "other" and isinstance(own, str) and own.strip():
            return _clean(f"other: {own}")
        return _clean(named)
    for tag in tags if isinstance(tags, list) else []:
        if isinstance(tag, str) and tag.startswith("license:") and tag[8:].strip():
            return _clean(tag[8:])
    return NO_LICENCE


def _clean(text: str) -> str:
    """One printable line: a hub's text may hold control characters or be very long."""
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _context(config: dict | None, gguf: Any) -> int | None:
    from brisk.engine.models.folder import CONTEXT_KEYS, MAX_CONTEXT_LENGTH

    if isinstance(config, dict):
        for source in (config, config.get("text_config")):
            if not isinstance(source, dict):
                continue
            for key in CONTEXT_KEYS:
                value = source.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONTEXT_LENGTH:
                    return value
    value = gguf.get("context_length") if isinstance(gguf, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONTEXT_LENGTH:
        return value
    return None


def _architecture(config: dict | None, gguf: Any) -> str:
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type is None and isinstance(gguf, dict):
        model_type = gguf.get("architecture")
    return _clean(model_type) if isinstance(model_type, str) and model_type.strip() else UNKNOWN


def _support(config: dict | None, files: dict, weights: dict, ggufs: dict, repo_id: str) -> tuple[bool, str]:
    """Whether `brisk models pull` installs it and mlx-lm runs it, by the same checks
    (engine/models/download.py): a hub's config summary is no config.json to download."""
    from brisk.engine.api.errors import UnsupportedModel
    from brisk.engine.models.folder import mlx_architecture
    from brisk.engine.models.store import model_id_from_repo

    if not weights:
        if ggufs:
            return False, "GGUF files only: download one and use Import GGUF"
        return False, "no .safetensors weights"
    if "config.json" not in files:
        return False, "no config.json file to download"
    if not all(weights.values()):  # pull downloads weights of known size only
        return False, "the hub does not say how large its weights are"
    try:
        model_id_from_repo(repo_id)  # the local id Install and pull give it
    except BriskError:
        return False, "its name makes no local model id (over 80 characters); brisk models pull --id NAME installs it"
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        return False, "no config.json naming its architecture"
    if not re.fullmatch(r"[a-z0-9_]{1,64}", config["model_type"]):  # it names a module mlx-lm imports
        return False, f"'{_clean(config['model_type'])}' is not an architecture Brisk knows"
    foreign = config.get("quantization_config")
    if not config.get("quantization") and isinstance(foreign, dict) and foreign.get("quant_method"):
        return False, f"{_clean(str(foreign['quant_method']))} weights: mlx-lm reads MLX quantization only"
    try:
        return True, f"mlx-lm {mlx_architecture(config)}"
    except UnsupportedModel as exc:
        return False, _clean(str(exc))
    except Exception:  # a config of a shape mlx-lm's lookup trips over
        return False, f"'{_clean(config['model_type'])}' is not an architecture Brisk knows"
