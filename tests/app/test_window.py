"""The window with a fake engine: each action updates its widget and the store."""

import json

import pytest
from PySide6.QtCore import Qt

from brisk.engine.api.events import EngineErrored, PrefillProgressed, TokenEmitted, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import Answer, CheckDocument, ConversationEvent, DocumentChecked
from brisk.engine.turn.documents import Document, Fit


def metrics(**kw):
    base = dict(
        ttft_s=1.25,
        prompt_tokens=900,
        cached_tokens=400,
        prefilled_tokens=100,
        prefill_tps=80.0,
        generated_tokens=3,
        decode_tps=12.5,
        kv_bytes=3 * 2**20,
        kv_bits=4,
        k_bits=4,
        v_bits=4,
        finish_reason="stop",
        sparse_prefill="used: kept 100 of 500 new tokens",
        sparse_outcome="used",
        kept_tokens=100,
        scoring_s=0.4,
        spec_decode="auto (rejection)",
        acceptance_rate=0.75,
        draft_tokens=4,
        accepted_tokens=3,
        tokens_per_cycle=2.5,
        mean_k=2.0,
        decode_step="compiled",
    )
    return TurnMetrics(**{**base, **kw})


def send(qtbot, window, text="Hello there"):
    window.composer.edit.setPlainText(text)
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    return window.controller.engine.commands[-1]


def answer(engine, cid, pieces, m=None):
    events = [ConversationEvent(cid, TokenEmitted(p, i, source="draft" if i % 2 else "")) for i, p in enumerate(pieces)]
    events.append(ConversationEvent(cid, TurnFinished("".join(pieces), list(range(len(pieces))), m or metrics())))
    engine.play(*events)


def test_send_updates_chat_view_and_store(qtbot, make_window, engine):
    w = make_window()
    command = send(qtbot, w, "What is **Brisk**?")
    assert isinstance(command, Answer) and [(m.role, m.content) for m in command.messages] == [
        ("user", "What is **Brisk**?")
    ]
    assert [m.role for m in w.chat_view.messages] == ["user", "assistant"]
    answer(engine, command.conversation_id, ["Brisk ", "is ", "fast."])
    assert w.chat_view.messages[-1].text == "Brisk is fast."
    stored = w.store.messages(command.conversation_id)
    assert [(m.role, m.content) for m in stored] == [("user", "What is **Brisk**?"), ("assistant", "Brisk is fast.")]
    assert stored[-1].finish_reason == "stop" and stored[-1].metrics["ttft_s"] == 1.25
    assert w.sidebar.titles()[0] == "What is **Brisk**?"  # the first message names the chat


def test_enter_sends_and_shift_enter_breaks_the_line(qtbot, make_window, engine):
    w = make_window()
    w.composer.edit.setPlainText("first")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return, Qt.ShiftModifier)
    assert not engine.commands and "\n" in w.composer.edit.toPlainText()
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    assert isinstance(engine.commands[-1], Answer)


def test_turn_finished_updates_dashboard(qtbot, make_window, engine):
    from brisk.engine.api.events import ModelLoaded

    w = make_window()
    engine.play(ModelLoaded("big", {"architecture": "qwen2", "context_length": 9030}))
    command = send(qtbot, w)
    answer(engine, command.conversation_id, ["ok"])
    d = w.dashboard
    assert d.ttft.text() == "1.25 s"
    assert "prompt cache reused 400 tokens" in d.saved.text() and "sparse prefill skipped 400 tokens" in d.saved.text()
    assert d.chart.series == {"prefill": [80.0], "decode": [12.5]}
    assert d.acceptance.text == "75%" and "2.50 tokens per target pass" in d.spec_note.text()
    # KV now (3 MiB for 903 tokens) against the same at the full 9,030-token context, free memory beside
    assert d.kv_note.text() == (
        "KV cache 3.0 MiB at 4 bits of 30.0 MiB at the full 9,030-token context · 9.0 MiB memory free"
    )
    assert d.kv.value == pytest.approx(0.1)
    assert d.speed.text() == "Last turn: prefill 80.0 tok/s · decode 12.5 tok/s"
    assert d.speed.toolTip() == "Decode step: compiled"
    assert d.memory.text() == "Process memory: 123.0 MiB"


def test_prefill_progress_updates_prefill_bar(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w).conversation_id
    engine.play(
        ConversationEvent(cid, PrefillProgressed(0, 4000)), ConversationEvent(cid, PrefillProgressed(1000, 4000))
    )
    assert w.prefill_bar.isVisibleTo(w) and w.prefill_bar.value() == 250
    assert "25% of 4,000 tokens" in w.prefill_bar.format() and "left" in w.prefill_bar.format()
    engine.play(ConversationEvent(cid, TokenEmitted("Hi", 1)))
    assert not w.prefill_bar.isVisibleTo(w)


def test_draft_toggle_updates_chat_view_tint(qtbot, make_window, engine):
    w = make_window()
    answer(engine, send(qtbot, w).conversation_id, ["plain ", "drafted"])
    w.tint.setChecked(True)
    assert "background-color" in w.chat_view.messages[-1].body.toHtml()
    w.tint.setChecked(False)
    assert "background-color: rgba" not in w.chat_view.messages[-1].body.toHtml()


def test_tint_tells_draft_tokens_from_looked_up_ones(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w).conversation_id
    engine.play(
        *[
            ConversationEvent(cid, TokenEmitted(text, i, source=source))
            for i, (text, source) in enumerate([("own ", ""), ("quoted ", "lookup"), ("drafted", "draft")])
        ],
        ConversationEvent(cid, TurnFinished("own quoted drafted", [0, 1, 2], metrics())),
    )
    w.tint.setChecked(True)
    html = w.chat_view.messages[-1].body.toHtml()
    assert "rgba(63,185,80" in html.replace(" ", "") and "rgba(80,160,255" in html.replace(" ", "")
    assert w.chat_view.messages[-1].segments == [("own ", ""), ("quoted ", "lookup"), ("drafted", "draft")]


def test_acceptance_ring_has_an_arc_per_source(qtbot, make_window, engine):
    w = make_window()
    answer(
        engine,
        send(qtbot, w).conversation_id,
        ["ok"],
        metrics(lookup_tokens=40, lookup_accepted=36, mean_accepted_run=3.2),
    )
    ring = w.dashboard.acceptance
    assert [round(share, 2) for share, _ in ring.arcs] == [0.75, 0.9]
    assert ring.text == "75% · 90%" and ring.caption == "draft · lookup"
    assert "lookup kept 36 of 40" in w.dashboard.spec_note.text()
    assert "draft kept 3 of 4" in w.dashboard.spec_note.text()
    answer(
        engine,
        send(qtbot, w, "again").conversation_id,
        ["ok"],
        metrics(draft_tokens=0, accepted_tokens=0, lookup_tokens=10, lookup_accepted=5),
    )
    assert ring.text == "50%" and ring.caption == "lookup" and len(ring.arcs) == 1


def test_stop_and_escape_update_engine(qtbot, make_window, engine):
    w = make_window()
    send(qtbot, w)
    assert w.composer.stop_button.isVisibleTo(w) and not w.composer.send_button.isVisibleTo(w)
    qtbot.mouseClick(w.composer.stop_button, Qt.LeftButton)
    qtbot.keyClick(w.composer.edit, Qt.Key_Escape)
    assert engine.stopped == 2
    answer(engine, w.controller.current, ["stopped"], metrics(finish_reason="cancelled"))
    assert w.composer.send_button.isVisibleTo(w) and w.chat_view.messages[-1].status.text() == "stopped"


def test_settings_change_persists_across_restart(qtbot, make_window, engine, db_path):
    w = make_window()
    cid = w.controller.current
    panel = w.settings_panel
    panel.spec.setCurrentText("on")
    panel.kv_bits.setCurrentIndex(panel.kv_bits.findData("4"))
    panel.draft.setCurrentText("small")
    assert panel.lookup.isChecked() and panel.lookup.isEnabled()  # on by default
    panel.lookup.setChecked(False)
    again = make_window(db_path)
    again.controller.open(cid)
    s = again.settings_panel.settings()
    assert (s.spec_decode, s.kv_bits, s.draft, s.lookup) == ("on", 4, "small", False)
    assert again.settings_panel.spec.currentText() == "on" and not again.settings_panel.lookup.isChecked()
    again.settings_panel.spec.setCurrentText("off")
    assert not again.settings_panel.lookup.isEnabled()  # nothing to look up for with decoding plain


def test_draft_choice_updates_settings_badge(qtbot, make_window):
    panel = make_window().settings_panel
    panel.draft.setCurrentText("small")
    assert panel.badge.text().startswith("same tokenizer")
    panel.draft.setCurrentText("tiny")
    assert panel.badge.text().startswith("cross tokenizer")
    # A bigger draft is no longer offered; a chat saved with one still says why it cannot work.
    from dataclasses import replace

    panel.set_settings(replace(panel.settings(), model="tiny", draft="big"))
    assert panel.badge.text().startswith("incompatible")


def test_uniprefill_settings_show_the_chat_models_measured_defaults(qtbot, make_window, monkeypatch):
    from brisk.engine.accel.uniprefill import plan

    monkeypatch.setitem(plan.BY_ARCHITECTURE, "qwen2", plan.ModelDefaults(p=0.985, break_even=1024))
    panel = make_window().settings_panel
    panel.model.setCurrentText("big")
    panel.uniprefill.setCurrentText("auto")  # an edit elsewhere leaves p the model's (0.985 is shown whole)
    assert round(panel.mass.value(), 3) == 0.985 and panel.settings().uniprefill_p is None
    assert "1,024+ new tokens" in panel.uniprefill.toolTip()
    panel.model.setCurrentText("tiny")  # llama: its own row
    llama = plan.defaults_for("llama")
    assert round(panel.mass.value(), 3) == llama.p and panel.settings().uniprefill_p is None
    assert f"{llama.break_even:,}+ new tokens" in panel.uniprefill.toolTip()
    panel.mass.setValue(0.95)  # the user's own p stays the chat's, whatever the model
    panel.model.setCurrentText("big")
    assert panel.settings().uniprefill_p == 0.95 and round(panel.mass.value(), 2) == 0.95


def test_search_updates_sidebar(qtbot, make_window, engine):
    w = make_window()
    answer(engine, send(qtbot, w, "about rivers").conversation_id, ["The Vistula flows north."])
    w.controller.new_conversation()
    answer(engine, send(qtbot, w, "about mountains").conversation_id, ["Rysy is high."])
    assert w.sidebar.titles() == ["about mountains", "about rivers"]  # newest first
    w.sidebar.search.setText("vistula")
    assert w.sidebar.titles() == ["about rivers"]


def test_delete_then_undo_updates_sidebar(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w, "keep me").conversation_id
    w.delete_with_undo(cid)
    assert "keep me" not in w.sidebar.titles()
    qtbot.mouseClick(w.undo_button, Qt.LeftButton)
    assert "keep me" in w.sidebar.titles()


def test_error_updates_message_status_and_keeps_partial(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w).conversation_id
    engine.play(
        ConversationEvent(cid, TokenEmitted("Half an ans", 1)),
        ConversationEvent(cid, EngineErrored("Generation failed: boom", "internal")),
    )
    assert w.chat_view.messages[-1].status.text() == "failed"
    assert "boom" in w.composer.message.text()
    stored = w.store.messages(cid)[-1]
    assert (stored.content, stored.finish_reason) == ("Half an ans", "error")


def test_regenerate_and_edit_update_engine_commands(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w, "first question").conversation_id
    answer(engine, cid, ["answer one"])
    w.controller.regenerate()
    command = engine.commands[-1]
    assert isinstance(command, Answer) and [m.content for m in command.messages] == ["first question"]
    answer(engine, cid, ["answer two"])
    w.controller.edit(0, "better question")
    command = engine.commands[-1]
    assert isinstance(command, Answer) and [m.content for m in command.messages] == ["better question"]
    assert [m.content for m in w.store.messages(cid)] == ["better question", ""]


def test_attach_updates_composer_and_refuses_what_does_not_fit(qtbot, make_window, engine, tmp_path):
    w = make_window()
    cid = w.controller.current
    w.controller.attach(str(tmp_path / "report.txt"))
    assert isinstance(engine.commands[-1], CheckDocument)
    doc = Document("report.txt", "text", "word " * 10, 50)
    reason = "report.txt is 90,000 tokens; with the conversation that is 90,020, but big holds 8,192"
    engine.play(DocumentChecked(cid, doc, Fit(90_000, 90_020, 8192, 0, 0, False, reason)))
    assert "does not fit" in w.composer.attachments[0].label.text()
    assert w.composer.message.text() == reason
    n = len(engine.commands)
    send(qtbot, w, "summarize it")
    assert len(engine.commands) == n and "90,020" in w.composer.message.text()
    w.composer.clear_attachments()
    w.controller._documents.clear()
    engine.play(DocumentChecked(cid, doc, Fit(11, 30, 8192, 0, 0, True)))
    assert "11 tokens · fits" in w.composer.attachments[0].label.text()
    command = send(qtbot, w, "summarize it")
    text = command.messages[-1].content
    assert text.startswith("[Attached document: report.txt]") and text.endswith("summarize it")
    assert w.store.attachments(cid)[0]["tokens"] == 11


def test_bad_file_error_updates_composer_message(qtbot, make_window, engine):
    w = make_window()
    cid = w.controller.current
    engine.play(ConversationEvent(cid, EngineErrored("photo.png is a binary file, not text", "document")))
    assert w.composer.message.text() == "photo.png is a binary file, not text"


def test_export_and_import_json_updates_sidebar(qtbot, make_window, engine, tmp_path):
    w = make_window()
    cid = send(qtbot, w, "export me").conversation_id
    answer(engine, cid, ["fine"])
    path = tmp_path / "chat.json"
    w.export("json", str(path))
    w.export("md", str(tmp_path / "chat.md"))
    assert "## Assistant\n\nfine" in (tmp_path / "chat.md").read_text()
    w.import_json(str(path))
    assert w.sidebar.titles().count("export me") == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    w.import_json(str(bad))
    assert "not a Brisk chat export" in w.statusBar().currentMessage()


COVERAGE = {
    "new_tokens": 4000,
    "read_share": 0.55,
    "layers": [[6, [[0, 3000]]], [10, [[0, 1200], [2600, 3000]]]],
    "skipped": [[1200, 2600, "The committee reviewed the quarterly report"]],
}


def test_a_sparse_answer_shows_its_coverage_and_read_it_all_asks_again_densely(qtbot, make_window, engine):
    w = make_window()
    w.settings_panel.uniprefill.setCurrentText("on")  # the chat's own setting, through its combo
    cid = send(qtbot, w, "Summarize the report").conversation_id
    answer(engine, cid, ["A summary."], metrics(prefill_method="uniprefill", coverage=COVERAGE))
    cover = w.chat_view.messages[-1].coverage
    assert cover is not None and "55%" in cover.label.text()
    assert "tokens 1,200–2,600" in cover.toolTip() and "quarterly report" in cover.toolTip()
    n = len(engine.commands)
    qtbot.mouseClick(cover.read_all, Qt.LeftButton)  # the real button, not the slot
    command = engine.commands[n]
    assert isinstance(command, Answer) and [m.content for m in command.messages] == ["Summarize the report"]
    assert command.settings.uniprefill == "off" and command.settings.sparse_prefill == "off"
    assert w.settings_panel.settings().uniprefill == "on"  # the chat keeps its own setting
    answer(engine, cid, ["A full summary."])
    assert w.chat_view.messages[-1].coverage is None  # a dense answer has no map
    w.controller.open(cid)  # reopened: the map comes back from the stored metrics only where it applies
    assert w.chat_view.messages[-1].coverage is None


def test_a_reopened_chat_shows_the_stored_coverage(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w, "Summarize").conversation_id
    answer(engine, cid, ["Sparse."], metrics(prefill_method="uniprefill", coverage=COVERAGE))
    w.controller.open(cid)
    assert w.chat_view.messages[-1].coverage is not None


def test_the_chat_follows_new_content_at_the_bottom_but_not_a_reader_above(qtbot, make_window, engine):
    """The coverage map under an answer was added below the visible area (seen under Xvfb);
    a reader who scrolled up must not be pulled down by streaming tokens."""
    w = make_window()
    w.resize(1000, 600)
    w.show()
    cid = send(qtbot, w, "A long question " * 200).conversation_id
    bar = w.chat_view.verticalScrollBar()
    engine.play(ConversationEvent(cid, TokenEmitted("An answer. " * 40, 0)))
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    bar.setValue(0)  # the reader scrolls up
    engine.play(ConversationEvent(cid, TokenEmitted("More of it. " * 40, 1)))
    qtbot.wait(300)
    assert bar.value() == 0
    bar.setValue(bar.maximum())  # back at the bottom: the view follows again, coverage map included
    engine.play(
        ConversationEvent(cid, TurnFinished("done", [0], metrics(prefill_method="uniprefill", coverage=COVERAGE)))
    )
    cover = w.chat_view.messages[-1].coverage
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    assert cover.geometry().bottom() <= w.chat_view.widget().height()


def test_kv_choices_show_this_models_self_test_and_map_to_settings(qtbot, make_window, engine, db_path):
    """Each packed precision carries what the model's fidelity self-test said; auto and
    K8/V4 become the settings they name, and survive a restart."""
    from PySide6.QtCore import Qt

    w = make_window()
    cid = w.controller.current
    panel = w.settings_panel
    results = {
        "K4/V4 g32": {
            "top1_agreement": 0.86,
            "mean_kl": 0.3,
            "generated": 64,
            "passed": False,
            "why": "changed 9 of 64 next-token choices",
        },
        "K8/V4 g32": {
            "top1_agreement": 1.0,
            "mean_kl": 0.01,
            "generated": 64,
            "passed": True,
            "why": "kept 64 of 64 next-token choices (KL 0.010)",
        },
    }
    panel.kv_results = lambda model_id: results
    panel.refresh_kv()
    index = lambda label: panel.kv_bits.findData(label)  # noqa: E731
    tip = lambda label: panel.kv_bits.itemData(index(label), Qt.ToolTipRole)  # noqa: E731
    text = lambda label: panel.kv_bits.itemText(index(label))  # noqa: E731
    assert tip("4").startswith("FAILED") and "changed 9 of 64" in tip("4") and text("4") == "4: changes answers"
    assert tip("K8/V4").startswith("Passed") and text("K8/V4") == "K8/V4: keeps answers"
    assert tip("8").startswith("Not tested") and text("8") == "8"
    assert "K8/V4" in tip("auto") and text("auto") == "auto: K8/V4"
    panel.kv_bits.setCurrentIndex(index("K8/V4"))
    s = panel.settings()
    assert (s.kv_precision(), s.kv_auto) == ((8, 4), False)
    panel.kv_bits.setCurrentIndex(index("auto"))
    assert panel.settings().kv_auto
    again = make_window(db_path)
    again.controller.open(cid)
    assert again.settings_panel.settings().kv_auto and again.settings_panel.kv_bits.currentData() == "auto"


def test_the_dashboard_keeps_its_width_through_a_turn(qtbot, make_window, engine):
    """Long status lines and the wait for the first token wrap instead of widening the
    column (it grew from 382 to 579 px and squeezed the chat)."""
    w = make_window()
    width = w.tabs.width()
    w.dashboard.set_model_state(
        "qwen2.5-coder-1.5b-instruct loaded (qwen2, 32,768 tokens of context) after a first-run download and conversion"
    )
    cid = send(qtbot, w).conversation_id
    assert w.dashboard.ttft.text() == "…" and "Waiting for the first token" in w.dashboard.saved.text()
    engine.play(ConversationEvent(cid, PrefillProgressed(0, 900, "draft")))
    qtbot.wait(20)
    assert w.tabs.width() == width
    answer(engine, cid, ["x" * 10])
    qtbot.wait(20)
    assert w.tabs.width() == width and w.dashboard.ttft.text() == "1.25 s"


def test_after_a_new_chat_the_sidebar_highlights_it_and_the_old_chat_opens_on_click(qtbot, make_window, engine):
    """Issue 58 item 5: after Ctrl+N the old chat stayed highlighted, and clicking it did nothing."""
    w = make_window()
    old = send(qtbot, w, "about rivers").conversation_id
    answer(engine, old, ["The Vistula flows north."])
    new = w.controller.new_conversation()
    current = w.sidebar.list.currentItem()
    assert current is not None and current.data(Qt.UserRole) == new
    row = next(i for i in range(w.sidebar.list.count()) if w.sidebar.list.item(i).data(Qt.UserRole) == old)
    rect = w.sidebar.list.visualItemRect(w.sidebar.list.item(row))
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.LeftButton, pos=rect.center())
    assert w.controller.current == old


def test_the_waiting_line_clears_at_the_first_token_and_after_a_failed_turn(qtbot, make_window, engine):
    """Issue 58: 'Waiting for the first token…' stayed while text streamed, and forever after a failure."""
    w = make_window()
    cid = send(qtbot, w).conversation_id
    assert w.dashboard.saved.text() == "Waiting for the first token…" and w.dashboard.ttft.text() == "…"
    engine.play(ConversationEvent(cid, TokenEmitted("Hel", 1)))
    assert w.dashboard.saved.text() == "" and w.dashboard.ttft.text().endswith(" s")
    engine.play(ConversationEvent(cid, EngineErrored("Generation failed: boom", "internal")))
    cid = send(qtbot, w, "again").conversation_id
    engine.play(ConversationEvent(cid, EngineErrored("Model load failed", "model")))
    assert w.dashboard.saved.text() == "" and w.dashboard.ttft.text() == "–"


def test_a_long_file_name_in_the_composers_message_wraps_instead_of_narrowing_the_sidebar(qtbot, make_window):
    """A "does not fit" line quoting a long unbroken file name widened the message label, and
    the splitter took that width from the sidebar (240 -> 132 px at 1000 px wide)."""
    w = make_window()
    w.resize(1000, 700)
    qtbot.wait(20)
    sidebar = w.sidebar.width()
    name = "quarterly_report_" + "with_a_long_name_" * 6 + "final.txt"
    w.composer.show_message(f"{name} is 14,352 tokens; more than the 8,192 this model holds", error=True)
    qtbot.wait(20)
    assert w.sidebar.width() == sidebar
    assert w.composer.message.text().replace("\u200b", "").startswith(name)  # all of it, shown
    # its chip, and the context line a document past the context gives, neither
    w.composer.add_attachment(name, 14352, False, "too big", exact=False)
    w.composer.meter.label.setText("Context: more than 14,383 of 8,192 tokens (175%) · documents more than 14,352")
    qtbot.wait(20)
    assert w.sidebar.width() == sidebar
