"""The app's API server: switched on from the Models menu, it answers OpenAI requests on
the app's own engine thread, shows its address and count in the status bar and its turns
on the dashboard, and stops when switched off."""

import socket
import threading

import pytest

from brisk.app.main import build_window
from brisk.engine.host.worker import EngineWorker
from brisk.engine.models.loader import load_folder

openai = pytest.importorskip("openai", reason="the request is sent with the openai client (the test extra)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_menu_toggle_serves_requests_on_the_apps_engine(qtbot, tmp_path, tiny_llama_dir, monkeypatch):
    import brisk.app.api_server

    port = free_port()
    monkeypatch.setattr(brisk.app.api_server, "PORT", port)
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    if not store.has("tiny"):  # the server checks a request's model against the store
        store.install_folder(tiny_llama_dir, model_id="tiny", source="test")
    worker = EngineWorker(lambda model_id: load_folder(tiny_llama_dir, model_id=model_id))
    window = build_window(model_id="tiny", store_path=tmp_path / "brisk.db", worker=worker, models=[])
    qtbot.addWidget(window)
    try:
        # A hang guard, not a speed bound: a first load compiles the kernels (minutes on a loaded machine).
        qtbot.waitUntil(lambda: "loaded" in window.dashboard.model_state.text(), timeout=600_000)
        action = window.actions_by_text["Serve OpenAI-compatible API"]
        action.trigger()
        assert action.isChecked() and window.api_server.running
        qtbot.waitUntil(lambda: f"127.0.0.1:{port}/v1" in window.api_status.text(), timeout=5_000)

        got = {}

        def ask():
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
            got["answer"] = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=6, temperature=0
            )

        thread = threading.Thread(target=ask)
        thread.start()
        qtbot.waitUntil(lambda: "answer" in got, timeout=60_000)
        thread.join()
        assert got["answer"].choices[0].message.content is not None
        qtbot.waitUntil(lambda: "1 served" in window.api_status.text(), timeout=5_000)
        # its own box on the dashboard, not the open chat's numbers (issue 58 item 8)
        qtbot.waitUntil(lambda: "Last API request" in window.dashboard.api_note.text(), timeout=5_000)

        action.trigger()
        assert not action.isChecked() and not window.api_server.running and window.api_status.text() == ""
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        window.close()
        window.engine.shutdown(timeout=10)
