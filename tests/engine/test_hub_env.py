"""huggingface_hub's import-time environment: a malformed HF_ENDPOINT is one clear line, and
no process of Brisk's asks a hub for its agent-detection registry."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(extra)
    return env


@pytest.mark.parametrize("endpoint", ["http://[::1", "http://hub:port", "ftp://mirror.example", "not a url"])
def test_bad_hf_endpoint_is_one_line_not_a_traceback(endpoint):
    # huggingface_hub parses HF_ENDPOINT when imported (mlx-lm imports it): `brisk --version`
    # ended in a ValueError traceback for the first two.
    done = subprocess.run(
        [sys.executable, "-m", "brisk.engine.host.cli", "--version"],
        env=_env(HF_ENDPOINT=endpoint),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("brisk: error: HF_ENDPOINT"), done.stderr


def test_good_hf_endpoint_is_accepted():
    from brisk.engine.runtime.hub_env import hub_endpoint_problem

    os.environ["HF_ENDPOINT"], saved = "http://127.0.0.1:8123", os.environ.get("HF_ENDPOINT")
    try:
        assert hub_endpoint_problem() is None
    finally:
        os.environ.pop("HF_ENDPOINT")
        if saved is not None:
            os.environ["HF_ENDPOINT"] = saved


def test_no_agent_registry_fetch_from_the_hub():
    # huggingface_hub's headers fetched {HF_ENDPOINT}/api/agent-harnesses once per process
    # and read the reply whole (a hostile hub's gzip bomb took 2 GB); importing Brisk's engine
    # turns that telemetry off unless the user set it.
    asked: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = "import brisk.engine\nfrom huggingface_hub.utils import build_hf_headers\nbuild_hf_headers()\n"
        env = _env(
            HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
            HF_HOME=os.environ.get("TMPDIR", "/tmp") + "/brisk-hf-home-test",
        )
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert not [p for p in asked if "agent-harnesses" in p]
