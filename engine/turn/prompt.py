"""Turn a conversation into prompt tokens: chat template, system prompt, overflow policy."""

from __future__ import annotations

from dataclasses import dataclass

from brisk.engine.api.errors import ContextOverflow, ConversationTooLong
from brisk.engine.turn.chat_template import encode_chat
from brisk.engine.turn.text_input import max_chars_for

# With no chat template (base models), turns are joined as plain paragraphs.
PLAIN_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class RenderedPrompt:
    tokens: list[int]
    dropped_messages: int  # oldest turns left out under the truncate_oldest policy


def encode_messages(lm, messages, *, cancelled=lambda: False, template: bool = True) -> list[int]:
    """Prompt tokens for `messages`: the chat template (rendered in a bounded sandbox, control
    tokens inside messages kept as text, see engine/turn/chat_template.py), or plain paragraphs
    for base models and raw completions."""
    tokenizer = lm.tokenizer
    dicts = [{"role": m.role, "content": m.content} for m in messages]
    if tokenizer.chat_template and template:
        return encode_chat(tokenizer, dicts, model_id=lm.id, cancelled=cancelled)
    text = PLAIN_SEPARATOR.join(m["content"] for m in dicts)
    return list(tokenizer.encode(text))


def render_prompt(lm, messages, settings, *, cancelled=lambda: False) -> RenderedPrompt:
    """Tokens for the next answer. Never drops anything silently: either every message
    is in, or the caller hears how many of the oldest were dropped (or gets ContextOverflow)."""
    from brisk.engine.api.conversation import Message

    system = [Message("system", settings.system_prompt)] if settings.system_prompt else []
    history = list(messages)
    history, dropped = _fit_characters(lm, system, history, settings)
    tokens = encode_messages(lm, system + history, cancelled=cancelled, template=settings.chat_template)
    limit = lm.context_length - 1  # room for at least one answer token
    if len(tokens) <= limit:
        return RenderedPrompt(tokens, dropped)
    if settings.context_overflow != "truncate_oldest":
        raise ContextOverflow(len(tokens) + 1, lm.context_length, lm.id)
    while len(history) > 1:
        dropped += _drop_oldest_turn(history)
        tokens = encode_messages(lm, system + history, cancelled=cancelled, template=settings.chat_template)
        if len(tokens) <= limit:
            return RenderedPrompt(tokens, dropped)
    raise ContextOverflow(len(tokens) + 1, lm.context_length, lm.id)


def _fit_characters(lm, system, history, settings):
    """Refuse (or, under truncate_oldest, drop the oldest turns of) a conversation whose
    characters alone cannot fit the context: the tokenizer never sees text that large."""
    cap = max_chars_for(lm.context_length)
    chars = lambda: sum(len(m.content) for m in system + history)  # noqa: E731
    if chars() <= cap:
        return history, 0
    if settings.context_overflow != "truncate_oldest":
        raise ConversationTooLong(chars(), lm.context_length, lm.id, cap)
    dropped = 0
    while len(history) > 1 and chars() > cap:
        dropped += _drop_oldest_turn(history)
    if chars() > cap:
        raise ConversationTooLong(chars(), lm.context_length, lm.id, cap)
    return history, dropped


def _drop_oldest_turn(history: list) -> int:
    """Drop the oldest message and whatever follows it up to the next user message (so the
    conversation still starts with a user); the newest message always stays. Returns how
    many were dropped."""
    dropped = 0
    while len(history) > 1 and (dropped == 0 or history[0].role != "user"):
        history.pop(0)
        dropped += 1
    return dropped
