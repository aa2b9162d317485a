"""`models pull` through the real huggingface_hub client against a loopback hub."""

import json
import socket

import pytest

from brisk.engine.api.errors import DownloadError, UnsupportedModel
from brisk.engine.models.download import pull
from brisk.engine.models.loader import load_model
from brisk.engine.models.store import ModelStore
from tests.hub_server import HubServer
from tests.tiny_models import make_tiny_model

# It runs a model only to have something to answer: what it checks (a hub download) no kernel
# plan changes, so CI runs it once (the main stage).
pytestmark = pytest.mark.plan_agnostic


@pytest.fixture
def hub_root(tmp_path):
    make_tiny_model(tmp_path / "hub" / "acme" / "tiny-llama")
    return tmp_path / "hub"


def test_pull_downloads_verifies_and_installs(tmp_path, hub_root, monkeypatch):
    store = ModelStore(tmp_path / "home")
    events = []
    with HubServer(hub_root) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        entry = pull("acme/tiny-llama", store=store, on_progress=events.append)
    assert entry.id == "tiny-llama" and entry.architecture == "llama"
    assert entry.source.startswith("hf:acme/tiny-llama@")
    assert events[-1].done_bytes == events[-1].total_bytes > 400_000
    assert [e.done_bytes for e in events] == sorted(e.done_bytes for e in events)
    assert load_model("tiny-llama", store=store).context_length == 512
    # config.json first, so an unsupported repo costs no weight download
    gets = [r for r in hub.requests if r.startswith("GET /acme")]
    assert gets[0].endswith("/config.json")


@pytest.fixture
def small_chunks(monkeypatch):
    """64 KiB download chunks so a tiny file arrives in several pieces, like a big one."""
    monkeypatch.setattr("brisk.engine.models.download.CHUNK_BYTES", 65536)


def test_dropped_connection_resumes_with_a_range_request(tmp_path, hub_root, monkeypatch, small_chunks):
    store = ModelStore(tmp_path / "home")
    with HubServer(hub_root, drop_first_get_after=200_000) as flaky:
        monkeypatch.setenv("HF_ENDPOINT", flaky.url)
        pull("acme/tiny-llama", store=store)
    assert any("model.safetensors Range=bytes=" in r for r in flaky.requests)
    assert load_model("tiny-llama", store=store)


def test_cancelled_pull_resumes_where_it_stopped(tmp_path, hub_root, monkeypatch, small_chunks):
    store = ModelStore(tmp_path / "home")
    seen = []
    with HubServer(hub_root) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DownloadError, match="cancelled"):
            pull(
                "acme/tiny-llama",
                store=store,
                on_progress=seen.append,
                should_stop=lambda: seen[-1].file == "model.safetensors" and seen[-1].done_bytes > 150_000,
            )
        assert not store.has("tiny-llama")
        partial = list((store.cache_dir / "hf" / "tiny-llama").glob("*.part"))
        assert partial and partial[0].stat().st_size > 0
        pull("acme/tiny-llama", store=store)
    assert any("model.safetensors Range=bytes=" in r for r in hub.requests)
    assert load_model("tiny-llama", store=store)


def test_pull_refuses_an_architecture_mlx_lm_cannot_run(tmp_path, hub_root, monkeypatch):
    repo = hub_root / "acme" / "tiny-llama"
    config = json.loads((repo / "config.json").read_text())
    (repo / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with HubServer(hub_root) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(UnsupportedModel, match="'bert'"):
            pull("acme/tiny-llama", store=ModelStore(tmp_path / "home"))
    assert not any("safetensors" in r for r in hub.requests if r.startswith("GET"))


def test_pull_of_a_missing_repo_says_so(tmp_path, hub_root, monkeypatch):
    with HubServer(hub_root) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DownloadError, match="No model repository 'acme/nothing'"):
            pull("acme/nothing", store=ModelStore(tmp_path / "home"))


def test_pull_while_offline_says_so(tmp_path, monkeypatch):
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError, match="Cannot reach .* offline"):
        pull("acme/tiny-llama", store=ModelStore(tmp_path / "home"))


def test_a_hub_that_hides_the_weights_size_is_refused_before_any_weight_byte(tmp_path, hub_root, monkeypatch):
    """With no size, nothing bounded the download: a hostile hub streamed 200 MB for a file
    it listed without one (an endless stream would fill the disk)."""
    store = ModelStore(tmp_path / "home")
    with HubServer(hub_root, omit_sizes=True) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(DownloadError, match="does not say how large model.safetensors is"):
            pull("acme/tiny-llama", store=store)
    assert not [r for r in hub.requests if r.startswith("GET") and r.endswith(".safetensors")]
    assert not store.has("tiny-llama")
