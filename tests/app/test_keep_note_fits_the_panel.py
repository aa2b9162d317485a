"""The keep slider's note under `auto` ("not used by auto") wraps instead of widening the
settings column: unwrapped, the column grew past the panel on the real X server (2026-11-28,
Xvfb + xcb, the default window), and the rows' right edges (the prompt's Delete button, the
combo boxes) were cut off, since the rows never scroll sideways."""

from brisk.app.widgets.settings_panel import SettingsPanel
from brisk.engine.api.settings import ChatSettings


def test_the_auto_note_does_not_widen_the_settings_column_past_the_panel(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.set_settings(ChatSettings(model="qwen2.5-coder-1.5b-instruct", sparse_prefill="auto"))
    panel.resize(380, 700)  # about what the default window gives the panel
    panel.show()
    qtbot.waitExposed(panel)
    assert "not used by auto" in panel.keep_label.text()
    qtbot.waitUntil(lambda: panel.scroll.viewport().width() > 0)
    assert panel.scroll.widget().width() <= panel.scroll.viewport().width()  # nothing cut at the right
