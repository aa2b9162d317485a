"""Exact streaming detokenization.

mlx-lm's streaming detokenizers drop the leading space of the first token (" Paris"
streams as "Paris"). Here every delta is the difference between decoding a short
window of tokens with and without the newest ones, seeded with the prompt's last
tokens, so the first token keeps its space, a character split across tokens is held
back until complete, and the concatenated deltas equal decoding the whole answer.
"""

from __future__ import annotations

# Prompt tokens used as left context: enough for any tokenizer's word-boundary rules.
SEED_TOKENS = 4
REPLACEMENT = "\ufffd"


class StreamingText:
    def __init__(self, tokenizer, seed: list[int] | tuple[int, ...] = ()):
        self._decode = tokenizer.decode
        self._tokens = list(seed[-SEED_TOKENS:])
        self._prefix = 0  # window start
        self._read = len(self._tokens)  # tokens already turned into text
        self._seed_len = self._read
        self.text = ""

    def _text(self, start: int, end: int | None = None) -> str:
        return self._decode(self._tokens[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, token: int) -> str:
        """Append a token; return the newly completed text (possibly "")."""
        self._tokens.append(token)
        before = self._text(self._prefix, self._read)
        after = self._text(self._prefix)
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""  # incomplete UTF-8 sequence, or a token that adds no text yet
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self._tokens)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is held back at the end (an incomplete character decodes as U+FFFD)."""
        before = self._text(self._prefix, self._read)
        after = self._text(self._prefix)
        delta = after[len(before) :] if len(after) > len(before) else ""
        self._prefix = self._read = len(self._tokens)
        self.text += delta
        return delta
