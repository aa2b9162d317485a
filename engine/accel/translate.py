"""Moving between two tokenizers through text and character offsets.

Used by SpecPrefill's cross-tokenizer scoring (a draft with another vocabulary reads the
same text, and what it learns per draft token is carried to the target tokens that cover
the same characters) and by cross-tokenizer speculative decoding (engine/accel/speculative/drafters.py).
"""

from __future__ import annotations


def _hf(tokenizer):
    return getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper -> the HF tokenizer


def decode_text(tokenizer, ids: list[int]) -> str:
    """The exact text of `ids`, special tokens included, spaces untouched."""
    return _hf(tokenizer).decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode_with_spans(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = _hf(tokenizer)(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(span) for span in enc["offset_mapping"]]


def leading_specials(tokenizer) -> list[int]:
    """The ids `tokenizer` puts before any text it encodes with its special tokens (a BOS:
    Llama 3's <|begin_of_text|>, Gemma's <bos>); [] for most (Qwen, SmolLM2)."""
    hf = _hf(tokenizer)
    plain = list(hf("a", add_special_tokens=False)["input_ids"])
    full = list(hf("a")["input_ids"])
    lead = next((n for n in range(len(full) - len(plain) + 1) if full[n : n + len(plain)] == plain), 0)
    return full[:lead]


def encode_document(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """`text` (a whole conversation: another tokenizer's prompt as text) in `tokenizer`'s ids,
    as a model of that tokenizer reads a prompt: after its BOS, if it has one and the text
    does not already begin with it (some models, Gemma's above all, read badly without it).
    The BOS spans no characters: (0, 0)."""
    ids, spans = encode_with_spans(tokenizer, text)
    lead = leading_specials(tokenizer)
    if lead and ids[: len(lead)] != lead:
        ids, spans = lead + ids, [(0, 0)] * len(lead) + spans
    return ids, spans


def text_and_spans(tokenizer, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text `ids` spell, and each id's character span in it.

    Spans come from re-encoding the text, which must give back the same ids (chat
    templates are encoded from text, so it does); otherwise ValueError."""
    text = decode_text(tokenizer, ids)
    again, spans = encode_with_spans(tokenizer, text)
    if again != list(ids):
        raise ValueError("the prompt's tokens do not re-encode from their own text")
    return text, spans


def project(values: list[float], source: list[tuple[int, int]], target: list[tuple[int, int]]) -> list[float]:
    """For each target span, the max of `values` over the source spans overlapping it.

    Both span lists are sorted and cover the text left to right (two pointers)."""
    out, i = [], 0
    for start, end in target:
        end = max(end, start + 1)  # a zero-width token takes what covers its position
        while i < len(source) and source[i][1] <= start:
            i += 1
        j, best = i, None
        while j < len(source) and source[j][0] < end:
            best = values[j] if best is None else max(best, values[j])
            j += 1
        out.append(best if best is not None else 0.0)
    return out
