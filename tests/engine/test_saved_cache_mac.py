"""Saved prompt caches are trusted only when signed by this installation and kept where no
one else can write (issue 54 items 8 and 15). Each hostile file is built the way an
attacker would: with mlx-lm's own save, and the unkeyed digests Brisk used to check
recomputed, so only a keyed MAC can tell it apart."""

import hashlib
import json
import os
import stat

import pytest

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.errors import UnsafeLocation
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import Answer, EngineWorker
from brisk.engine.kv.saved import SavedCaches
from brisk.engine.kv.signing import KEY_BYTES, installation_key, key_path

DOCUMENT = "The committee met on Tuesday to review the water budget for the coming year. " * 4
STRANGER = 12345  # a uid no account on the test machine has


def settings():
    return ChatSettings(model="tiny-llama", temperature=0.0, max_tokens=6)


def worker_for(lm, saved):
    return EngineWorker({"tiny-llama": lm}.__getitem__, memory_available=lambda: 2**30, saved_caches=saved)


def answer(worker, history):
    """The turn's TurnFinished (an IndexError here means the turn failed instead)."""
    events = [e.event for e in worker.handle(Answer(1, settings(), history), CancelToken())]
    return [e for e in events if isinstance(e, TurnFinished)][0]


def saved_chat(lm, folder):
    """Chat 1 answered and its cache saved to `folder` as the app does on exit; the history
    that continues it."""
    worker = worker_for(lm, SavedCaches(folder))
    first = answer(worker, [Message("user", DOCUMENT)])
    worker.close()
    return [Message("user", DOCUMENT), Message("assistant", first.text), Message("user", "What was reviewed?")]


def cold_answer(lm, history):
    events = list(Session(lm, settings()).answer(history))
    return [e for e in events if isinstance(e, TurnFinished)][0].token_ids


def old_kv_digest(layers) -> str:
    """The unkeyed digest Brisk checked before issue 54: anyone could recompute it."""
    import mlx.core as mx
    import numpy as np

    from brisk.engine.runtime.mx_values import tree_leaves

    digest = hashlib.sha256()
    for layer in layers:
        for value in tree_leaves(layer.state):
            if not isinstance(value, mx.array):
                digest.update(repr(value).encode())
                continue
            digest.update(f"{value.shape}{value.dtype}".encode())
            digest.update(np.array(mx.view(value, mx.uint8)).tobytes())
    return digest.hexdigest()


def tamper(path, edit):
    """Rewrite a saved cache with `edit(layers, state)` applied and the old digests recomputed."""
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    layers, meta = load_prompt_cache(str(path), return_metadata=True)
    state = json.loads(meta["brisk"])
    edit(layers, state)
    state["tokens_sha256"] = hashlib.sha256(json.dumps(state["tokens"]).encode()).hexdigest()
    state["kv_sha256"] = old_kv_digest(layers)
    save_prompt_cache(str(path), layers, {"brisk": json.dumps(state)})


def test_a_cache_rehashed_to_claim_30_more_tokens_is_refused(tiny_llama, tmp_path):
    history = saved_chat(tiny_llama, tmp_path)
    extra = tiny_llama.tokenizer.encode("The budget was approved without changes. " * 6)[:30]
    tamper(tmp_path / "chat-1.safetensors", lambda layers, state: state["tokens"].extend(extra))
    follow = answer(worker_for(tiny_llama, SavedCaches(tmp_path)), history)
    assert follow.metrics.cached_tokens == 0 and follow.token_ids == cold_answer(tiny_llama, history)
    assert not (tmp_path / "chat-1.safetensors").exists()


def test_a_tampered_layer_offset_is_a_miss_not_a_crash(tiny_llama, tmp_path):
    history = saved_chat(tiny_llama, tmp_path)

    def shift_offset(layers, state):
        layers[0].offset = layers[0].offset + 0.5  # no longer a whole number of slots

    tamper(tmp_path / "chat-1.safetensors", shift_offset)
    follow = answer(worker_for(tiny_llama, SavedCaches(tmp_path)), history)
    assert follow.metrics.cached_tokens == 0 and follow.token_ids == cold_answer(tiny_llama, history)
    assert not (tmp_path / "chat-1.safetensors").exists()


def test_a_cache_signed_by_another_installation_is_refused(tiny_llama, tmp_path, monkeypatch):
    history = saved_chat(tiny_llama, tmp_path / "caches")
    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "another-home"))
    follow = answer(worker_for(tiny_llama, SavedCaches(tmp_path / "caches")), history)
    assert follow.metrics.cached_tokens == 0 and follow.token_ids == cold_answer(tiny_llama, history)


def test_the_key_is_made_once_private_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "home"))
    key = installation_key()
    assert len(key) == KEY_BYTES and installation_key() == key
    assert stat.S_IMODE(key_path().stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path().parent.stat().st_mode) == 0o700


def test_a_key_file_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "home"))
    installation_key()
    os.chown(key_path(), STRANGER, STRANGER)
    with pytest.raises(UnsafeLocation, match="belongs to another user"):
        installation_key()
    with pytest.raises(UnsafeLocation):
        SavedCaches.beside(tmp_path / "home" / "brisk.db")


def save_chats(lm, saved, ids):
    for cid in ids:
        session = Session(lm, settings())
        list(session.send(f"chat number {cid}"))
        saved.save(cid, session)


def test_a_dangling_symlink_does_not_stop_pruning(tiny_llama, tmp_path):
    folder = tmp_path / "caches"
    folder.mkdir(mode=0o700)
    (folder / "chat-9.safetensors").symlink_to(tmp_path / "gone")
    save_chats(tiny_llama, SavedCaches(folder, max_files=1), [1, 2])
    assert sorted(p.name for p in folder.iterdir()) == ["chat-2.safetensors"]


def test_partial_files_a_crash_left_behind_are_removed(tiny_llama, tmp_path):
    folder = tmp_path / "caches"
    folder.mkdir(mode=0o700)
    for name in ("chat-3.partial.safetensors", "chat-4.k2j3h4.partial.safetensors"):
        (folder / name).write_bytes(b"half a cache")
        os.utime(folder / name, (1, 1))
    save_chats(tiny_llama, SavedCaches(folder), [1])
    assert sorted(p.name for p in folder.iterdir()) == ["chat-1.safetensors"]


def test_partial_files_are_also_removed_when_the_app_starts(tmp_path):
    folder = tmp_path / "brisk.db.caches"
    folder.mkdir(mode=0o700)
    (folder / "chat-3.partial.safetensors").write_bytes(b"half a cache")
    os.utime(folder / "chat-3.partial.safetensors", (1, 1))
    SavedCaches(folder).check()
    assert list(folder.iterdir()) == []


def test_a_symlinked_caches_folder_is_never_written_through(tiny_llama, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "brisk.db.caches").symlink_to(elsewhere)
    save_chats(tiny_llama, SavedCaches(tmp_path / "brisk.db.caches"), [1])
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(UnsafeLocation, match="symbolic link"):
        SavedCaches.beside(tmp_path / "brisk.db")


def test_a_caches_folder_planted_by_another_user_is_refused(tiny_llama, tmp_path):
    """In a folder anyone can write (mode 1777), another user made the caches folder and a
    partial file of their own that links to a file of the victim's."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    planted = shared / "brisk.db.caches"
    planted.mkdir()
    (planted / "chat-1.partial.safetensors").symlink_to(victim)
    os.chown(planted / "chat-1.partial.safetensors", STRANGER, STRANGER, follow_symlinks=False)
    os.chown(planted, STRANGER, STRANGER)
    planted.chmod(0o777)
    save_chats(tiny_llama, SavedCaches(planted), [1])
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in planted.iterdir()) == ["chat-1.partial.safetensors"]
    with pytest.raises(UnsafeLocation, match="belongs to another user"):
        SavedCaches.beside(shared / "brisk.db")


def test_a_cache_file_of_another_user_is_not_loaded(tiny_llama, tmp_path):
    history = saved_chat(tiny_llama, tmp_path)
    os.chown(tmp_path / "chat-1.safetensors", STRANGER, STRANGER)
    follow = answer(worker_for(tiny_llama, SavedCaches(tmp_path)), history)
    assert follow.metrics.cached_tokens == 0 and not (tmp_path / "chat-1.safetensors").exists()
