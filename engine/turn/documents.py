"""Documents attached to a chat: read them as text, count their tokens, check they fit.

Plain text, Markdown and source code are read as UTF-8; PDFs through `pypdf`. Every way a
file can be unusable (missing, empty, binary, not UTF-8, malformed or encrypted PDF, too
large) is a DocumentError whose message says what is wrong with that file.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from brisk.engine.api.errors import BriskError
from brisk.engine.turn.text_input import count_tokens_bounded, decode_text, max_chars_for

# Beyond this a file is not a document a local model can read in one context anyway, and
# reading it would only cost memory: refuse with the size.
MAX_DOCUMENT_BYTES = 64 * 2**20
# Extracted text beyond this fits no local context (128K tokens is ~0.5 M characters).
MAX_DOCUMENT_CHARS = 8_000_000
CODE_SUFFIXES = {
    ".py",
    ".js",
    ".ts",
    ".tsx",
    ".jsx",
    ".c",
    ".h",
    ".cpp",
    ".hpp",
    ".cc",
    ".rs",
    ".go",
    ".java",
    ".kt",
    ".swift",
    ".rb",
    ".php",
    ".cs",
    ".sh",
    ".sql",
    ".toml",
    ".yaml",
    ".yml",
    ".json",
    ".html",
    ".css",
    ".scss",
    ".lua",
    ".r",
    ".m",
    ".mm",
    ".zig",
    ".ini",
    ".cfg",
}


class DocumentError(BriskError):
    kind = "document"


@dataclass(frozen=True)
class Document:
    name: str
    kind: str  # text | markdown | code | pdf
    text: str
    size_bytes: int
    pages: int | None = None  # a PDF's page count

    def as_prompt(self) -> str:
        return attached_block(self.name, self.text)


def attached_block(name: str, text: str) -> str:
    """How a document enters the conversation: named and fenced, so the model sees where it
    starts and ends (with a fence the text does not hold: ```, else a run of ~ longer than any in it)."""
    fence = "```" if "```" not in text else "~" * max(4, 1 + max(len(r) for r in re.findall("~+", text + "~")))
    return f"[Attached document: {name}]\n{fence}\n{text}\n{fence}"


_ATTACHED = re.compile(r"\[Attached document: ([^\]\n]+)\]\n(```|~{4,})\n(.*?)\n\2(?:\n\n|\Z)", re.S)


def split_attached(content: str) -> tuple[list[tuple[str, str]], str]:
    """A user message's leading attached documents as (name, text), and the typed rest:
    the inverse of joining `attached_block`s and the text with blank lines."""
    documents, at = [], 0
    while match := _ATTACHED.match(content, at):
        documents.append((match.group(1), match.group(3)))
        at = match.end()
    return documents, content[at:]


def join_attached(documents: list[tuple[str, str]], text: str) -> str:
    return "\n\n".join([attached_block(name, body) for name, body in documents] + ([text] if text else []))


def read_document(path) -> Document:
    file = Path(path)
    if file.is_dir():
        raise DocumentError(f"{file.name} is a folder; attach a file")
    if not file.is_file():
        raise DocumentError(f"{file.name}: no such file")
    size = file.stat().st_size
    if size == 0:
        raise DocumentError(f"{file.name} is empty")
    if size > MAX_DOCUMENT_BYTES:
        raise DocumentError(
            f"{file.name} is {size / 2**20:.0f} MiB; documents up to {MAX_DOCUMENT_BYTES // 2**20} MiB can be attached"
        )
    data = file.read_bytes()
    suffix = file.suffix.lower()
    if suffix == ".pdf" or data[:5] == b"%PDF-":
        text, pages = _pdf_text(file.name, data)
        return Document(file.name, "pdf", text, size, pages)
    text = decode_text(file.name, data, error=DocumentError)
    if not text.strip():
        raise DocumentError(f"{file.name} holds only whitespace")
    kind = "markdown" if suffix in (".md", ".markdown") else "code" if suffix in CODE_SUFFIXES else "text"
    return Document(file.name, kind, text, size)


def _pdf_text(name: str, data: bytes) -> tuple[str, int]:
    import io

    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PdfReadError

    # pypdf and fontTools log a warning per object they repair (hundreds in a long damaged
    # PDF, all on stderr); what matters reaches the user as one DocumentError line.
    for noisy in ("pypdf", "fontTools"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    pages, chars = [], 0
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError(f"{name} is an encrypted PDF; remove the password and attach it again")
        for page in reader.pages:  # page by page, so an expanding PDF stops at the cap
            pages.append(page.extract_text() or "")
            chars += len(pages[-1])
            if chars > MAX_DOCUMENT_CHARS:
                raise DocumentError(
                    f"{name} holds more than {MAX_DOCUMENT_CHARS:,} characters of text, more than "
                    "any local model's context; attach the part you need"
                )
    except DocumentError:
        raise
    except LimitReachedError as exc:  # pypdf's own guard against decompression bombs
        raise DocumentError(f"{name} expands beyond pypdf's safety limits (a compression bomb?): {exc}") from exc
    except (PdfReadError, ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        raise DocumentError(f"{name} is not a readable PDF ({exc})") from exc
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise DocumentError(f"{name} has no extractable text (a scanned PDF needs OCR first)")
    return text, len(pages)


# For the message only: a rough tokens-per-character figure for text never tokenized.
MAX_CHARS_FOR_ESTIMATE = 4


@dataclass(frozen=True)
class Fit:
    tokens: int  # the document's own tokens
    conversation_tokens: int  # the conversation with the document in it
    context_length: int
    kv_bytes: int  # KV cache the conversation would need at the chat's KV setting
    kv_bytes_available: int
    fits: bool
    reason: str = ""
    tokens_exact: bool = True  # False: `tokens` is a lower bound (counting stopped past the context)


def check_fit(lm, messages, document: Document, settings, *, memory_available: int) -> Fit:
    """Would the conversation with `document` as the next user message fit the model's
    context and the memory beside the weights, at the chat's KV precision?"""
    from brisk.engine.api.conversation import Message
    from brisk.engine.kv.half import STORED_ITEMSIZE
    from brisk.engine.kv.packed_cache import kv_bytes_per_token, kv_shape
    from brisk.engine.turn.prompt import encode_messages

    limit = lm.context_length
    if len(document.text) > max_chars_for(limit):
        return _too_long(document, lm, len(document.text) // MAX_CHARS_FOR_ESTIMATE)
    doc_tokens, complete = count_tokens_bounded(lm.tokenizer, document.text, limit)
    if not complete:
        return _too_long(document, lm, doc_tokens)
    # past the model's maximum is the answer here (transformers' warning is dropped: text_input.py)
    total = len(encode_messages(lm, [*messages, Message("user", document.as_prompt())])) + 1
    shape = kv_shape(lm.config)
    layers = (lm.config.get("text_config") or lm.config)["num_hidden_layers"]
    k_bits, v_bits = planned_kv_precision(lm, settings)
    per_token = (
        kv_bytes_per_token(
            layers,
            shape["kv_heads"],
            shape["head_dim"],
            k_bits=k_bits,
            v_bits=v_bits,
            group_size=settings.kv_group_size,
            itemsize=STORED_ITEMSIZE,
        )
        if shape
        else 0
    )
    need = per_token * total
    if total > lm.context_length:
        reason = (
            f"{document.name} is {doc_tokens:,} tokens; with the conversation that is {total:,}, "
            f"but {lm.id} holds {lm.context_length:,}"
        )
    elif need > memory_available:
        precision = f"{k_bits} bits" if k_bits == v_bits else f"K {k_bits} / V {v_bits} bits"
        reason = (
            f"{document.name} needs {need / 2**30:.1f} GiB of KV cache at {precision}; "
            f"{memory_available / 2**30:.1f} GiB is free beside the weights (try 4-bit KV)"
        )
    else:
        reason = ""
    return Fit(doc_tokens, total, lm.context_length, int(need), memory_available, not reason, reason)


def planned_kv_precision(lm, settings) -> tuple[int, int]:
    """The K and V bits a turn will use: under `auto`, what the model's self-test chose
    (16-bit until it has run, the safe assumption)."""
    if not settings.kv_auto:
        return settings.kv_precision()
    from brisk.engine.kv.fidelity import FidelityStore, auto_precision

    return auto_precision(FidelityStore(lm.path).load(), settings.kv_group_size)


def _too_long(document: Document, lm, tokens: int) -> Fit:
    """A document past the context, found without tokenizing all of it."""
    reason = (
        f"{document.name} is more than {tokens:,} tokens "
        f"({len(document.text):,} characters), but {lm.id} holds {lm.context_length:,}"
    )
    return Fit(tokens, tokens, lm.context_length, 0, 0, False, reason, tokens_exact=False)
