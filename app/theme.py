"""Light, dark, or the system's choice. Colours come from a QPalette on Qt's Fusion style,
so every stock widget (check boxes, spin arrows, disabled fields) is drawn for the theme;
the stylesheets only add Brisk's accents. The choice is kept in BRISK_HOME/app.ini (app/preferences.py)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette

import brisk.resources as resources
from brisk.app.preferences import preferences

THEMES = ("system", "light", "dark")
# (role, colour) of the dark palette; disabled text is dimmed separately below
DARK = {
    QPalette.Window: "#0d1117",
    QPalette.WindowText: "#e6edf3",
    QPalette.Base: "#010409",
    QPalette.AlternateBase: "#161b22",
    QPalette.ToolTipBase: "#161b22",
    QPalette.ToolTipText: "#e6edf3",
    QPalette.Text: "#e6edf3",
    QPalette.Button: "#21262d",
    QPalette.ButtonText: "#e6edf3",
    QPalette.BrightText: "#ff7b72",
    QPalette.Highlight: "#1f6feb",
    QPalette.HighlightedText: "#ffffff",
    QPalette.Link: "#58a6ff",
    QPalette.PlaceholderText: "#8b949e",
    QPalette.Mid: "#484f58",
    QPalette.Dark: "#010409",
    QPalette.Light: "#30363d",
    QPalette.Midlight: "#21262d",
    QPalette.Shadow: "#000000",
}
DISABLED_DARK = {
    QPalette.WindowText: "#6e7681",
    QPalette.Text: "#6e7681",
    QPalette.ButtonText: "#6e7681",
    QPalette.Base: "#161b22",
    QPalette.Button: "#161b22",
}


def is_dark(app, choice: str) -> bool:
    if choice == "system":
        return app.styleHints().colorScheme() == Qt.ColorScheme.Dark
    return choice == "dark"


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in DARK.items():
        palette.setColor(role, QColor(colour))
    for role, colour in DISABLED_DARK.items():
        palette.setColor(QPalette.Disabled, role, QColor(colour))
    return palette


def apply_theme(app, choice: str = "system") -> bool:
    """Apply `choice` (one of THEMES); returns whether the result is dark."""
    dark = is_dark(app, choice if choice in THEMES else "system")
    app.setStyle("Fusion")
    app.setPalette(dark_palette() if dark else app.style().standardPalette())
    qss = resources.path("styles", "dark.qss" if dark else "light.qss")
    # url({icons}/x.svg): Qt resolves a stylesheet's relative urls against the working folder
    icons = resources.path("icons").as_posix()
    app.setStyleSheet(qss.read_text(encoding="utf-8").replace("{icons}", icons) if qss.is_file() else "")
    app.setProperty("briskDark", dark)
    return dark


def saved_theme() -> str:
    choice = preferences().value("theme", "system")
    return choice if choice in THEMES else "system"


def save_theme(choice: str) -> None:
    settings = preferences()
    settings.setValue("theme", choice)
    settings.sync()


# --- the chat's text size (View > Bigger / Smaller / Default text: Ctrl+= / Ctrl+- / Ctrl+0)

# The stylesheets' font-size for every widget (resources/styles/*.qss): the default chat text.
DEFAULT_CHAT_FONT_PX = 13
CHAT_FONT_RANGE = (9, 32)


def saved_chat_font_px() -> int:
    """The chat text size kept in app.ini (a hand-edited value outside the range is clamped)."""
    try:
        px = int(preferences().value("chat_font_px", DEFAULT_CHAT_FONT_PX))
    except (TypeError, ValueError):
        return DEFAULT_CHAT_FONT_PX
    return min(max(px, CHAT_FONT_RANGE[0]), CHAT_FONT_RANGE[1])


def save_chat_font_px(px: int) -> None:
    settings = preferences()
    settings.setValue("chat_font_px", int(px))
    settings.sync()


def chat_font_sheet(px: int) -> str:
    """A stylesheet for the chat's text boxes (answers, questions, the editors): the app's
    stylesheet sets every widget's size, so the size must be set in a stylesheet too."""
    return f"QTextBrowser, QPlainTextEdit {{ font-size: {px}px; }}"
