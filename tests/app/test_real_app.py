"""End to end with the real SmolLM2 behind a real engine thread: the window streams an
answer, shows its metrics, and answers about an attached document."""

import pytest

from brisk.app.main import build_window
from brisk.engine.host.worker import EngineWorker
from brisk.engine.models.loader import load_model

pytestmark = pytest.mark.real_model
MODEL = "smollm2-135m-instruct"


def finished_answers(window):
    return [m for m in window.store.messages(window.controller.current) if m.role == "assistant" and m.finish_reason]


def test_real_model_answers_and_reads_an_attachment(qtbot, real_store, tmp_path):
    worker = EngineWorker(lambda model_id: load_model(model_id, store=real_store))
    window = build_window(model_id=MODEL, store_path=tmp_path / "brisk.db", worker=worker, models=real_store.list())
    qtbot.addWidget(window)
    try:
        qtbot.waitUntil(lambda: "loaded" in window.dashboard.model_state.text(), timeout=120_000)
        window.settings_panel.temperature.setValue(0.0)
        window.settings_panel.max_tokens.setValue(24)
        window.composer.edit.setPlainText("What is the capital of France?")
        window.composer.send_button.click()
        qtbot.waitUntil(lambda: len(finished_answers(window)) == 1, timeout=120_000)
        answer = finished_answers(window)[0]
        assert "Paris" in answer.content and window.chat_view.messages[-1].text == answer.content
        assert window.dashboard.ttft.text().endswith(" s") and window.dashboard.chart.series["decode"][0] > 0

        doc = tmp_path / "memo.txt"
        doc.write_text("Memo to all staff.\nThe new office opens in Gdansk on Monday.\n", encoding="utf-8")
        window.controller.attach(str(doc))
        qtbot.waitUntil(lambda: len(window.composer.attachments) == 1, timeout=60_000)
        assert "fits" in window.composer.attachments[0].label.text()
        window.composer.edit.setPlainText("In which city does the new office open?")
        window.composer.send_button.click()
        qtbot.waitUntil(lambda: len(finished_answers(window)) == 2, timeout=120_000)
        assert "Gdansk" in finished_answers(window)[1].content
    finally:
        window.engine.shutdown()
