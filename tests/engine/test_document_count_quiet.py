"""Counting a big document's tokens for the fit check prints nothing: transformers' "Token
indices sequence length is longer than the specified maximum" warning is the count's purpose."""

from brisk.engine.api.settings import ChatSettings
from brisk.engine.turn.chat_template import hf_tokenizer
from brisk.engine.turn.documents import Document, check_fit
from brisk.engine.turn.text_input import count_tokens_bounded

WARNING = "Token indices sequence length is longer"


def test_a_document_past_the_models_maximum_is_counted_quietly(tiny_llama, monkeypatch, caplog, capfd):
    hf = hf_tokenizer(tiny_llama.tokenizer)
    # As shipped by SmolLM2 and others: the tokenizer's maximum is the model's context.
    monkeypatch.setattr(hf, "model_max_length", tiny_llama.context_length)
    monkeypatch.setattr(hf, "deprecation_warnings", {})  # the warning is printed once per tokenizer
    text = "The quick brown fox. " * 700  # under the characters-only refusal, over 512 tokens
    doc = Document(name="big.txt", kind="text", text=text, size_bytes=len(text))
    fit = check_fit(tiny_llama, [], doc, ChatSettings(model="tiny-llama"), memory_available=2**40)
    assert not fit.fits and fit.tokens > tiny_llama.context_length  # it was really tokenized past the max
    tokens, complete = count_tokens_bounded(tiny_llama.tokenizer, text * 6, 10**9)  # in 64K pieces
    assert complete and tokens > tiny_llama.context_length
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
    assert WARNING not in capfd.readouterr().err
