"""Render a model's chat template as the untrusted program it is: with a time budget, an
output cap and the user's Stop.

A template is Jinja code shipped with the model. transformers runs it in Jinja's sandbox,
which stops attribute escapes but not work: nested `range(99999)` loops ran 47 s and
grew to 7.4 GB. Jinja compiles a template to Python functions whose code is named
"<template>", so a trace function installed for the rendering thread sees every line
they run and every piece of text the root function yields, and can abandon the render
by raising. Rendering stays transformers' own (`apply_chat_template(tokenize=False)`),
so prompts are byte-identical to what the model was trained on; tokenizing follows with
`add_special_tokens=False`, as transformers does when it tokenizes a rendered chat.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from engine.errors import BriskError

# Real templates render a long chat in milliseconds; a second is far beyond any of them.
DEFAULT_TEMPLATE_SECONDS = 2.0
# A template adds role markers and separators to the messages, not text of its own
# making: beyond twice the messages plus this much it is generating, not formatting.
TEMPLATE_OVERHEAD_CHARS = 256 * 1024
TEMPLATE_CODE = "<template>"


class TemplateError(BriskError):
    kind = "chat_template"


class _Abandon(Exception):
    """Raised inside the template's frames to stop it; turned into TemplateError outside."""


def render_guarded(
    render: Callable[[], str],
    *,
    model_id: str,
    max_chars: int,
    seconds: float = DEFAULT_TEMPLATE_SECONDS,
    cancelled: Callable[[], bool] = lambda: False,
) -> str:
    """`render()` with the template's own frames limited in time and output."""
    deadline = time.monotonic() + seconds
    state = {"chars": 0, "why": ""}

    def stop(why: str):
        state["why"] = why
        raise _Abandon(why)

    def local(frame, event, arg):
        if event == "line":
            if time.monotonic() > deadline:
                stop(f"ran longer than {seconds:g} s")
            if cancelled():
                stop("cancelled")
        elif event == "return" and frame.f_code.co_name == "root" and isinstance(arg, str):
            state["chars"] += len(arg)  # the root function yields the output piece by piece
            if state["chars"] > max_chars:
                stop(f"produced more than {max_chars:,} characters")
        return local

    def call(frame, event, arg):
        return local if frame.f_code.co_filename == TEMPLATE_CODE else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        text = render()
    except _Abandon:
        text = None
    finally:
        sys.settrace(previous)
    if text is None or state["why"]:
        if state["why"] == "cancelled":
            from engine.errors import TurnCancelled

            raise TurnCancelled()
        raise TemplateError(
            f"The chat template of {model_id} {state['why']} and was stopped. The template is "
            "broken or hostile: reinstall the model, or use one whose template renders normally."
        )
    if len(text) > max_chars:  # output built in one expression, after the last yield we saw
        raise TemplateError(
            f"The chat template of {model_id} produced {len(text):,} characters for "
            f"{max_chars:,} of messages and was refused"
        )
    return text


def max_template_chars(messages: list[dict]) -> int:
    return 2 * sum(len(str(m.get("content", ""))) for m in messages) + TEMPLATE_OVERHEAD_CHARS
