"""The environment huggingface_hub reads when it is imported, checked before it is.

huggingface_hub parses `HF_ENDPOINT` at import time, and mlx-lm imports it, so a malformed
value (`http://[::1`) made every `brisk` command and the app end in a ValueError traceback.
Its telemetry also fetches `{HF_ENDPOINT}/api/agent-harnesses` once per process and reads
the reply whole (a hostile hub's 2 MB of gzip took 2 GB): a local app sends none.
No imports beyond the standard library: this runs before anything imports the hub.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit


def quiet_hub_telemetry() -> None:
    """No telemetry or agent detection from huggingface_hub, unless the user asked for it."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def hub_endpoint_problem() -> str | None:
    """Why `HF_ENDPOINT` cannot be used as a hub address, or None when it can (or is unset)."""
    value = os.environ.get("HF_ENDPOINT")
    if value is None or value == "":
        return None
    shown = ascii(value[:200])
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number)
    except ValueError as exc:
        return f"HF_ENDPOINT is not a valid URL ({shown}: {exc}); fix it or unset it"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"HF_ENDPOINT must be an http:// or https:// address of a hub, not {shown}; fix it or unset it"
    return None
