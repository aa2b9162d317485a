"""A cross-tokenizer draft reads the conversation as its own models read a prompt: after its
BOS when its tokenizer has one (Llama 3, Gemma). SpecPrefill's scorer and the speculative
drafter share the draft's cache, so both must encode the text the same way."""

import json

import pytest

from brisk.engine.accel.specprefill.scoring import DraftScorer
from brisk.engine.accel.speculative.drafters import TranslatingDrafter
from brisk.engine.accel.translate import encode_document, leading_specials
from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode.sampling import TokenDistribution
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model

BOS = "<|endoftext|>"
DOC = "The northern districts used more water while the southern reservoirs stayed full. " * 8


def add_bos(folder):
    """Give a tiny model's tokenizer a BOS its encodings start with, as Llama 3's does."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    bos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == BOS)
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": BOS, "add_bos_token": True}))
    return bos_id


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bos")
    target = load_folder(make_tiny_model(root / "target", "llama", seed=1, context_length=2048))
    folder = make_tiny_model(root / "draft", "qwen2", seed=3, context_length=2048, tokenizer_vocab=300)
    bos_id = add_bos(folder)
    return target, load_folder(folder), bos_id


def test_the_bos_a_tokenizer_puts_first_and_none_where_it_puts_none(pair):
    target, draft, bos_id = pair
    assert leading_specials(draft.tokenizer) == [bos_id]
    assert leading_specials(target.tokenizer) == []
    ids, spans = encode_document(draft.tokenizer, "hello there")
    assert ids[0] == bos_id and spans[0] == (0, 0) and bos_id not in ids[1:]
    again, _ = encode_document(draft.tokenizer, BOS + "hello there")  # already there: not twice
    assert again == ids


def test_the_scorer_reads_after_the_drafts_bos_and_the_drafter_reuses_what_it_read(pair):
    target, draft, bos_id = pair
    tokens = target.tokenizer.encode(DOC)
    scorer = DraftScorer(draft)
    scores = scorer.importance_across(target.tokenizer, tokens, 0, 64)
    assert scores.shape == (len(tokens),)
    assert scorer.cache.tokens[0] == bos_id and scorer.cache.tokens.count(bos_id) == 1
    dist = TokenDistribution(ChatSettings(model="m", temperature=0.0))
    drafter = TranslatingDrafter(draft, target.tokenizer, dist, scorer.cache, 64)
    assert drafter.catch_up(tokens) == 0  # the same draft tokens: nothing to read again
