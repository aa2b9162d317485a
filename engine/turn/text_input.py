"""Text from users' files and prompts: decoded strictly, and capped before tokenizing.

Tokenizing is where an oversized input costs memory (a 100 MB prompt file reached 12 GB),
so long text is measured in characters first, against a cap derived from the model's
context, and counted in tokens incrementally, stopping as soon as it is past the context.
"""

from __future__ import annotations

import codecs
import logging
from pathlib import Path

from brisk.engine.api.errors import BriskError

# No model's context holds a file this large; reading it would only cost memory.
MAX_TEXT_FILE_BYTES = 64 * 2**20
# A token is 3-5 characters of prose and rarely more than ~16 (runs of spaces, long
# words); 32 is a margin no real text exceeds, so text longer than this per context
# token cannot fit, and is refused before the tokenizer sees it.
MAX_CHARS_PER_TOKEN = 32
# Long text is tokenized in pieces of this many characters, split at whitespace.
TOKENIZE_PIECE_CHARS = 64 * 1024
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_text(name: str, data: bytes, *, error: type[BriskError] = BriskError) -> str:
    """UTF-8 text, or UTF-16/32 with a byte-order mark; binary data is refused by name."""
    for bom, codec in BOMS:
        if data.startswith(bom):
            try:
                return data.decode(codec)
            except UnicodeDecodeError as exc:
                raise error(f"{name} starts like {codec.upper()} text but byte {exc.start} is invalid") from exc
    if b"\x00" in data:
        raise error(f"{name} is a binary file (it contains NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{name} is not UTF-8 text (undecodable byte at offset {exc.start})") from exc


def read_text_file(path, *, what: str = "File", error: type[BriskError] = BriskError) -> str:
    file = Path(path)
    if file.is_dir():
        raise error(f"{what} {file} is a folder, not a file")
    if not file.is_file():
        raise error(f"{what} not found: {file}")
    size = file.stat().st_size
    if size > MAX_TEXT_FILE_BYTES:
        raise error(
            f"{what} {file.name} is {size / 2**20:,.0f} MiB; text files up to "
            f"{MAX_TEXT_FILE_BYTES // 2**20} MiB can be read (no model's context holds more)"
        )
    return decode_text(file.name, file.read_bytes(), error=error)


def max_chars_for(context_length: int) -> int:
    return context_length * MAX_CHARS_PER_TOKEN


def count_tokens_bounded(tokenizer, text: str, limit: int) -> tuple[int, bool]:
    """(tokens, complete): counts piece by piece and stops once past `limit`, so a huge text
    costs one piece of tokenizer memory. Pieces split at whitespace, so the count equals
    whole-text tokenization for byte-level BPE and is within a token per piece otherwise."""
    if len(text) <= TOKENIZE_PIECE_CHARS:
        return len(_encode_as_text(tokenizer, text)), True
    total, start = 0, 0
    while start < len(text):
        end = min(start + TOKENIZE_PIECE_CHARS, len(text))
        if end < len(text):
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            end = cut if cut > start else end
        total += len(_encode_as_text(tokenizer, text[start:end]))
        if total > limit:
            return total, False
        start = end
    return total, True


def _encode_as_text(tokenizer, text: str) -> list[int]:
    # A user's text becomes a message, whose "<|im_start|>" is plain text (see engine/turn/chat_template.py).
    # verbose=False: counting a document longer than the model's maximum is the point here, not
    # the "Token indices sequence length is longer than..." warning transformers prints for it.
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True, verbose=False)


LONG_SEQUENCE_WARNING = "Token indices sequence length is longer than the specified maximum"


class _DropLongSequenceWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(LONG_SEQUENCE_WARNING)


# Dropped for good, not per call: Brisk measures every prompt and document against the
# context itself and says so in its own words (a fit check tokenizes past the maximum on
# purpose), and transformers' chat encoder cannot pass `verbose=False`. The warning leaked
# into `brisk chat` (twice on ranks) after an over-long line.
logging.getLogger("transformers.tokenization_utils_base").addFilter(_DropLongSequenceWarning())
