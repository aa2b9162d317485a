"""Streaming text is exact: deltas concatenate to the full decode, no half characters."""

import random

from brisk.engine.turn.detokenize import StreamingText

HARD_TEXTS = [
    "Zażółć gęślą jaźń, w Warszawie",
    "東京は日本の首都です。",
    "Emoji 🙂🚀 end",
    "def main():\n\treturn 42",
    " leading space",
    "numbers 1234567890",
]


def stream(tokenizer, ids, seed=()):
    st = StreamingText(tokenizer, seed=seed)
    deltas = [st.add(t) for t in ids]
    deltas.append(st.flush())
    return deltas


def test_deltas_concatenate_to_the_full_decode(tiny_llama):
    tok = tiny_llama.tokenizer
    for text in HARD_TEXTS:
        ids = tok.encode(text)
        deltas = stream(tok, ids)
        assert "".join(deltas) == tok.decode(ids) == text
        assert not any("\ufffd" in d for d in deltas)  # never half a character


def test_byte_tokens_of_a_multibyte_character_wait_for_completion(tiny_llama):
    tok = tiny_llama.tokenizer
    vocab = tok._tokenizer.get_vocab() if hasattr(tok, "_tokenizer") else tok.get_vocab()
    # "🙂" is 4 UTF-8 bytes; with byte-level BPE each byte is a token "Ġ"-style symbol.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spell = bytes_to_unicode()
    byte_ids = [vocab[spell[b]] for b in "🙂".encode()]
    deltas = stream(tok, byte_ids)
    assert deltas[:3] == ["", "", ""] and deltas[3] == "🙂"


def test_first_token_keeps_its_leading_space(tiny_llama):
    tok = tiny_llama.tokenizer
    prompt = tok.encode("The quick brown")
    answer = tok.encode(" fox jumps")
    deltas = stream(tok, answer, seed=prompt)
    assert "".join(deltas) == " fox jumps"
    assert deltas[0].startswith(" ")


def test_random_token_streams_match_decode(tiny_llama):
    tok = tiny_llama.tokenizer
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(3, 384) for _ in range(rng.randrange(1, 30))]
        seed = [rng.randrange(3, 384) for _ in range(4)]
        joined = "".join(stream(tok, ids, seed=seed))
        assert joined == tok.decode(seed + ids)[len(tok.decode(seed)) :]
