"""A chat whose engine is a Brisk server elsewhere (issue 59): the real window sends its turns
over the server's streaming API, to a real `brisk serve` app with a tiny random-weight model
or to a loopback Starlette stand-in that refuses (401, 503), breaks mid-answer or stalls.
Each fault is one line in the composer, the partial answer is kept and marked, and Regenerate
retries; the stored messages are checked."""

import asyncio
import json
import os
import stat

import pytest
from PySide6.QtCore import Qt
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from brisk.app.remote_client import RemoteServer, load_remotes, make_remote, masked, save_remotes
from brisk.engine.host.serve.local import LocalServer

RANKS = [
    {"rank": 0, "host": "127.0.0.1", "weight_bytes": 300 << 20, "weight_share": 0.5, "kv_bytes": 2 << 20,
     "peak_memory_bytes": 700 << 20},
    {"rank": 1, "host": "127.0.0.1", "weight_bytes": 290 << 20, "weight_share": 0.4833, "kv_bytes": 2 << 20,
     "peak_memory_bytes": 650 << 20},
]  # fmt: skip
SERVER_METRICS = {
    "ttft_s": 0.42,
    "prompt_tokens": 20,
    "generated_tokens": 2,
    "prefill_tps": 47.6,
    "decode_tps": 31.0,
    "kv_bytes": 2 << 20,
    "finish_reason": "stop",
    "prefill_s": 0.3,
    "first_step_s": 0.1,
    "engine_started_at": 123456.0,  # the server's own clock: must not be taken as the app's
    "model_id": "qwen-on-server",
    "context_length": 32768,
    "extra": {"ranks": RANKS, "parallel": "tensor"},  # as `brisk serve --ranks` reports them
}


def _sse(payload) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _chunk(text):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}


class StandIn:
    """A loopback server speaking the streaming API; `mode` says how it answers next."""

    def __init__(self, key="sekrit-key-0123456789"):
        self.mode, self.key, self.seen = "ok", key, []
        self.live = LocalServer(Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])]))
        self.url = self.live.url

    async def chat(self, request):
        body = await request.json()
        self.seen.append((request.headers.get("authorization"), body))
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return JSONResponse({"error": {"message": "Incorrect or missing API key", "code": "invalid_api_key"}}, 401)
        if self.mode == "503":
            return JSONResponse({"error": {"message": "rank 1 left; the group is regrouping"}}, 503)
        return StreamingResponse(self._stream(), media_type="text/event-stream")

    async def _stream(self):
        yield _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        yield _sse(_chunk("Hel"))
        if self.mode == "broken":
            raise RuntimeError("rank died")  # uvicorn drops the connection mid-body
        if self.mode == "stall":
            await asyncio.sleep(60)  # until the client goes away
        yield _sse(_chunk("lo"))
        yield _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        yield _sse({"choices": [], "usage": {"prompt_tokens": 20}, "brisk": {"metrics": SERVER_METRICS}})
        yield "data: [DONE]\n\n"


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.live.stop()


def use_remote(window, server: RemoteServer) -> None:
    """What adding it in Models… does, without writing the session's shared BRISK_HOME."""
    window.remote.servers = {server.id: server}
    window.settings_panel.set_remotes({server.id: server.url})
    window.settings_panel.model.setCurrentText(server.id)
    assert window.settings_panel.settings().model == server.id


def send_and_wait(qtbot, window, text="Hi"):
    window.composer.edit.setPlainText(text)
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=60000)
    return window.store.messages(window.controller.current)


def test_a_remote_turn_streams_into_the_chat_with_the_servers_metrics_and_ranks(qtbot, make_window, engine, stand_in):
    w = make_window()
    use_remote(w, make_remote("studio", stand_in.url, stand_in.key))
    stored = send_and_wait(qtbot, w, "Say hello")
    assert engine.commands == []  # nothing went to this machine's engine
    assert [(m.role, m.content, m.finish_reason) for m in stored] == [
        ("user", "Say hello", None),
        ("assistant", "Hello", "stop"),
    ]
    key, body = stand_in.seen[-1]
    assert key == f"Bearer {stand_in.key}" and body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Say hello"}]
    m = stored[-1].metrics
    assert m["ttft_s"] == 0.42 and m["decode_tps"] == 31.0 and m["model_id"] == "remote:studio"
    assert m["engine_started_at"] != 123456.0 and m["extra"]["remote"]["url"] == stand_in.url
    assert m["extra"]["ranks"][1]["weight_share"] == 0.4833
    note = w.dashboard.remote_note.text()
    assert note.startswith(f"Remote engine: studio at {stand_in.url} · model qwen-on-server")
    assert (
        "2 ranks (tensor parallel)" in note
        and "• rank 1 (127.0.0.1): 290.0 MiB weights (48%), 2.0 MiB KV, peak 650.0 MiB" in note
    )
    assert w.dashboard.remote_note.isVisible() and "(on the server)" in w.dashboard.kv_note.text()
    assert w.dashboard.model_state.text() == "The model runs on the server, not in this app"
    assert w.dashboard.speed.text().endswith("decode 31.0 tok/s")
    assert stand_in.key not in note and stand_in.key not in w.statusBar().currentMessage()


@pytest.mark.parametrize(
    ("mode", "key", "line", "kept"),
    [
        ("ok", "wrong-key-0123456789", "refused the API key (401)", ""),
        ("503", None, "is not taking turns now (503): rank 1 left; the group is regrouping; try again shortly", ""),
        ("broken", None, "broke mid-answer", "Hel"),
    ],
)
def test_a_refusal_or_broken_stream_is_one_line_keeps_the_partial_answer_and_regenerate_retries(
    qtbot, make_window, stand_in, mode, key, line, kept
):
    w = make_window()
    stand_in.mode = mode
    use_remote(w, make_remote("studio", stand_in.url, key or stand_in.key))
    stored = send_and_wait(qtbot, w, "Say hello")
    assert [(m.role, m.content, m.finish_reason) for m in stored] == [
        ("user", "Say hello", None),
        ("assistant", kept, "error"),
    ]
    shown = w.composer.message.text()
    assert line in shown and "\n" not in shown and "Traceback" not in shown
    assert w.chat_view.messages[-1].role == "assistant"
    # fixed on the server (or the key corrected): Regenerate answers, the failed answer kept as a version
    stand_in.mode = "ok"
    use_remote(w, make_remote("studio", stand_in.url, stand_in.key))
    w.controller.regenerate()
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=60000)
    stored = w.store.messages(w.controller.current)
    assert (stored[-1].content, stored[-1].finish_reason) == ("Hello", "stop")
    assert w.composer.message.text() == ""  # the failure's line went with the retry
    # the partial answer stays as an earlier version ("< 1/2 >"); an empty failed one is not kept
    assert w.store.versions(w.controller.current, 1) == ((1, 2) if kept else (0, 1))


def test_an_unreachable_server_is_one_line_and_loses_nothing(qtbot, make_window, stand_in):
    w = make_window()
    address = stand_in.url
    stand_in.live.stop()  # nothing listens there now
    use_remote(w, make_remote("gone", address))
    stored = send_and_wait(qtbot, w, "Anyone there?")
    assert [(m.role, m.content, m.finish_reason) for m in stored] == [
        ("user", "Anyone there?", None),
        ("assistant", "", "error"),
    ]
    assert w.composer.message.text().startswith(f"Cannot reach the remote engine gone at {address[7:]}: ")


def test_stop_cancels_a_stream_that_waits_on_the_server_and_keeps_what_came(qtbot, make_window, stand_in):
    w = make_window()
    stand_in.mode = "stall"
    use_remote(w, make_remote("studio", stand_in.url, stand_in.key))
    w.composer.edit.setPlainText("Go on")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    qtbot.waitUntil(lambda: (w.controller._answer or {}).get("text") == "Hel", timeout=30000)
    w.actions_by_text["Stop answer"].trigger()  # Esc
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=5000)  # the read woke at once, not after 300 s
    stored = w.store.messages(w.controller.current)
    assert (stored[-1].content, stored[-1].finish_reason) == ("Hel", "cancelled")


def test_closing_the_window_mid_answer_ends_the_stream_and_keeps_what_came(qtbot, make_window, stand_in):
    w = make_window()
    stand_in.mode = "stall"
    use_remote(w, make_remote("studio", stand_in.url, stand_in.key))
    w.composer.edit.setPlainText("Go on")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    qtbot.waitUntil(lambda: (w.controller._answer or {}).get("text") == "Hel", timeout=30000)
    cid, store = w.controller.current, w.store
    w.close()
    assert not any(t.is_alive() for t in w.remote._threads)  # not left reading for READ_TIMEOUT_S
    assert store.messages(cid)[-1].content == "Hel"


def test_the_settings_a_remote_engine_cannot_use_are_disabled_and_say_why(qtbot, make_window, stand_in):
    w = make_window()
    panel = w.settings_panel
    assert panel.draft.isEnabled() and panel.top_k.isEnabled()
    use_remote(w, make_remote("studio", stand_in.url, stand_in.key))
    for widget, why in (
        (panel.draft, "cannot draft with a model on this machine"),
        (panel.sparse, "SpecPrefill needs a draft model"),
        (panel.top_k, "takes no top-k"),
        (panel.repetition_penalty, "takes no repetition penalty"),
    ):
        assert not widget.isEnabled() and why in widget.toolTip()
        assert why in panel.form.labelForField(widget).toolTip()
    assert panel.kv_bits.isEnabled() and "Sent to the server" in panel.kv_bits.toolTip()
    w.controller.context_fill.measure()
    assert "not measured with a remote engine" in w.composer.meter.label.text()
    panel.model.setCurrentText("big")  # back to a local model: enabled, the local tips back
    assert panel.draft.isEnabled() and panel.top_k.isEnabled()
    assert "cannot draft" not in panel.draft.toolTip() and "takes no top-k" not in panel.top_k.toolTip()


def test_kv_bits_and_uniprefill_travel_as_the_servers_brisk_controls(qtbot, make_window, stand_in):
    w = make_window()
    use_remote(w, make_remote("studio", stand_in.url, stand_in.key))
    w.settings_panel.kv_bits.setCurrentIndex(w.settings_panel.kv_bits.findData("K8/V4"))
    w.settings_panel.uniprefill.setCurrentText("on")
    send_and_wait(qtbot, w)
    brisk = stand_in.seen[-1][1]["brisk"]
    assert brisk["prefill"] == "uniprefill" and (brisk["k_bits"], brisk["v_bits"]) == (8, 4)


def test_a_remote_engine_needs_a_key_unless_on_loopback_and_the_key_is_kept_owner_only(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="192.168.1.20 is not this machine: its server needs an API key"):
        make_remote("studio", "http://192.168.1.20:8088")
    assert make_remote("here", "http://localhost").url == "http://localhost:8088"
    assert make_remote("here", "http://127.0.0.1:9000/v1/").url == "http://127.0.0.1:9000"
    for bad in ("ftp://host", "http://user:pw@host:1", "not a url"):
        with pytest.raises(ValueError):
            make_remote("x", bad, "k")
    with pytest.raises(ValueError, match="header cannot carry"):
        make_remote("x", "http://10.0.0.2:8088", "abc\r\nX-Evil: 1")
    server = make_remote("studio", "https://10.0.0.2:8443", "sk-abcdefghijklmnop1234")
    assert "sk-abc" not in repr(server) and masked(server.key) == "••••1234" and masked("short") == "••••"
    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "home"))
    save_remotes([server])
    saved = tmp_path / "home" / "remote_engines.json"
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    assert load_remotes() == {"remote:studio": server}
    saved.chmod(0o666)  # another user could have written it: not trusted
    assert load_remotes() == {}


def test_the_model_manager_adds_a_remote_engine_that_the_model_list_offers(qtbot, make_window, tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "home"))
    w = make_window()
    box = w.show_models().remotes
    box.name.setText("studio")
    box.url.setText("http://10.1.2.3:8088")
    box.add_button.click()
    assert "needs an API key" in box.status.text() and box.table.rowCount() == 0
    box.key.setText("sk-abcdefghijklmnop9876")
    box.add_button.click()
    assert box.table.item(0, 0).text() == "remote:studio" and box.table.item(0, 3).text() == "••••9876"
    assert "unencrypted: an SSH tunnel" in box.status.text()  # plain http off this machine
    assert box.key.text() == "" and w.settings_panel.model.findText("remote:studio") >= 0
    assert load_remotes()["remote:studio"].key == "sk-abcdefghijklmnop9876"
    box.table.selectRow(0)
    box.remove_button.click()
    assert w.settings_panel.model.findText("remote:studio") < 0 and load_remotes() == {}


# --- a real `brisk serve` (its Starlette app and engine queue, in process) -----------------


@pytest.fixture(scope="module")
def real_server(tiny_llama_dir):
    from brisk.engine.host.serve.app import Server
    from brisk.engine.host.serve.scheduler import EngineQueue
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    if not store.has("tiny"):
        store.install_folder(tiny_llama_dir, model_id="tiny", source="test")
    queue = EngineQueue()
    live = LocalServer(Server(queue, default_model="tiny", api_key="real-key-0123456789").app())
    yield live
    live.stop()
    queue.close()


def test_a_chat_with_a_real_brisk_serve_stores_its_answer_and_metrics(qtbot, make_window, real_server):
    import http.client

    w = make_window()
    use_remote(w, make_remote("real", real_server.url, "real-key-0123456789", "tiny"))
    w.settings_panel.temperature.setValue(0.0)
    w.settings_panel.max_tokens.setValue(8)
    stored = send_and_wait(qtbot, w, "The quick brown fox")
    answer = stored[-1]
    assert answer.role == "assistant" and answer.finish_reason in ("stop", "length") and answer.content
    assert answer.metrics["generated_tokens"] > 0 and answer.metrics["ttft_s"] > 0
    assert answer.metrics["extra"]["remote"]["model"] == "tiny"
    # the same request whole (not streamed) gives the same greedy text
    conn = http.client.HTTPConnection(real_server.url[7:].split(":")[0], int(real_server.url.rsplit(":", 1)[1]))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "The quick brown fox"}], "max_tokens": 8}
    body["temperature"] = 0
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Content-Type": "application/json", "Authorization": "Bearer real-key-0123456789"},
    )
    whole = json.loads(conn.getresponse().read())
    assert whole["choices"][0]["message"]["content"] == answer.content
    assert w.dashboard.remote_note.text().startswith(f"Remote engine: real at {real_server.url} · model tiny")


def test_a_real_brisk_serve_refuses_a_wrong_key_in_one_line_and_nothing_is_lost(qtbot, make_window, real_server):
    w = make_window()
    use_remote(w, make_remote("real", real_server.url, "not-the-key-0123456789", "tiny"))
    stored = send_and_wait(qtbot, w, "Hello?")
    assert [(m.role, m.content, m.finish_reason) for m in stored] == [
        ("user", "Hello?", None),
        ("assistant", "", "error"),
    ]
    assert w.composer.message.text() == (
        f"The remote engine real ({real_server.url[7:]}) refused the API key (401): "
        "check it in Models… > Remote engines"
    )
    assert "not-the-key" not in w.composer.message.text() + w.statusBar().currentMessage()
