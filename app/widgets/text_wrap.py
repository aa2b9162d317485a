"""Wrapping that stays linear for text with a long unbroken run (a pasted base64 blob).

Qt's default wrap, at word boundaries or anywhere when a word is wider than the line, looks
for the next word boundary across the rest of the run for every line it breaks: laying out
one 300,000-character run took ~65 CPU-s in the 134-pixel composer (offscreen), a minute of
frozen window. Wrapping anywhere is linear, so text holding such a run wraps anywhere and
prose keeps its word wrap. The mode is chosen before the text is laid out: Qt lays a
document out as the text goes in.
"""

from __future__ import annotations

import re

from PySide6.QtGui import QTextOption

# Longer than any word or URL a person types; a run this long laid out in ~1 ms either way.
LONG_RUN_CHARS = 1000
_LONG_RUN = re.compile(r"\S{%d}" % LONG_RUN_CHARS)
WORDS = QTextOption.WrapAtWordBoundaryOrAnywhere
ANYWHERE = QTextOption.WrapAnywhere


def has_long_run(text: str) -> bool:
    return _LONG_RUN.search(text) is not None


def wrap_for(widget, text: str) -> None:
    """Set `widget`'s (QTextEdit or QPlainTextEdit) wrap mode for showing `text`; unchanged
    modes are left alone, as a change lays the whole document out again."""
    mode = ANYWHERE if has_long_run(text) else WORDS
    if widget.wordWrapMode() != mode:
        widget.setWordWrapMode(mode)


# A label (not a text edit) cannot wrap inside a word: one longer than the label is wide
# widens the label, and the window's splitter takes that width from the sidebar. A
# zero-width space every BREAK_EVERY characters of such a word lets it wrap there.
BREAK_EVERY = 24
_LONG_WORD = re.compile(r"\S{%d,}" % (BREAK_EVERY + 1))
ZERO_WIDTH_SPACE = "\u200b"


def breakable(text: str) -> str:
    """`text` with long words wrappable in a label (shown the same; copied, it holds
    zero-width spaces)."""
    return _LONG_WORD.sub(
        lambda m: ZERO_WIDTH_SPACE.join(m[0][i : i + BREAK_EVERY] for i in range(0, len(m[0]), BREAK_EVERY)), text
    )
