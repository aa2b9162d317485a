"""PromptCache: the one place that knows what a model's cache holds."""

import pytest

from brisk.engine.kv import PromptCache

TOKENS = list(range(10, 40))


@pytest.fixture(params=["float32", "4-bit weights"])
def tiny_llama(request, tiny_llama, tiny_llama_q4):
    """Every test here runs on a float model and on a quantized one."""
    return tiny_llama if request.param == "float32" else tiny_llama_q4


def filled(lm, tokens=TOKENS, step=8):
    cache = PromptCache(lm.model)
    assert list(cache.sync(tokens, step)) == [8, 16, 24, 30]
    return cache


def offsets(cache):
    return {layer.offset for layer in cache.layers}


def test_sync_prefills_in_chunks_and_holds_exactly_the_tokens(tiny_llama):
    cache = filled(tiny_llama)
    assert cache.tokens == TOKENS and offsets(cache) == {30}


def test_reuse_keeps_the_common_prefix_but_not_the_last_token(tiny_llama):
    cache = filled(tiny_llama)
    assert cache.reuse(TOKENS) == 29  # the last token must run again for its logits
    assert offsets(cache) == {29}
    cache = filled(tiny_llama)
    assert cache.reuse(TOKENS[:12] + [999, 998]) == 12 and offsets(cache) == {12}


def test_sync_after_an_edit_prefills_only_what_changed(tiny_llama):
    cache = filled(tiny_llama)
    edited = TOKENS[:20] + [5, 6, 7]
    assert list(cache.sync(edited, 8)) == [3]
    assert cache.tokens == edited and offsets(cache) == {23}


def test_another_kv_mode_starts_over(tiny_llama):
    cache = filled(tiny_llama)
    cache.ensure_mode((16, 32))
    assert cache.layers is None and cache.tokens == [] and cache.mode == (16, 32)
    cache.layers = "kept"
    cache.ensure_mode((16, 32))
    assert cache.layers == "kept"


def test_no_rewinding_into_a_sparsely_prefilled_region(tiny_llama):
    cache = filled(tiny_llama)
    cache.mark_sparse(TOKENS + [1, 2, 3, 4])  # 34 tokens stood for by 30 slots
    assert cache.shift == 4 and cache.dense_from == 34
    cache.trim_to(33)
    assert cache.layers is None and cache.tokens == [] and cache.shift == 0


def test_layers_that_cannot_trim_are_reset_instead_of_left_wrong(tiny_llama, monkeypatch):
    import mlx_lm.models.cache as mlx_cache

    cache = filled(tiny_llama)
    monkeypatch.setattr(mlx_cache, "can_trim_prompt_cache", lambda layers: False)
    cache.trim_to(10)
    assert cache.layers is None and cache.tokens == []


def test_save_and_load_round_trip_and_identity_check(tiny_llama, tmp_path):
    from brisk.engine.api.errors import BriskError

    cache = filled(tiny_llama)
    cache.save(tmp_path / "c.safetensors", {"model": "tiny", "tokenizer": "abc"})
    again = PromptCache(tiny_llama.model)
    again.load(tmp_path / "c.safetensors", {"model": "tiny", "tokenizer": "abc"})
    assert again.tokens == TOKENS and offsets(again) == {30}
    with pytest.raises(BriskError, match="belongs to model tiny"):
        PromptCache(tiny_llama.model).load(tmp_path / "c.safetensors", {"model": "other", "tokenizer": "abc"})


@pytest.mark.parametrize("spec_decode", ["off", "on"])
def test_after_a_turn_the_cache_holds_exactly_the_tokens_it_says(tiny_llama, tmp_path, spec_decode):
    """Plain decoding leaves every yielded token in the cache, drafting all but the last;
    either way the layers' offsets equal the cache's own token count (each decoder keeps it)."""
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    draft = load_folder(make_tiny_model(tmp_path / "d", "llama", hidden_size=32, intermediate_size=64), model_id="d")
    session = Session(
        tiny_llama,
        ChatSettings(model="tiny", temperature=0, max_tokens=9, spec_decode=spec_decode, num_draft=3),
        draft=draft if spec_decode == "on" else None,
    )
    for text in ("The quick brown fox", "jumps over"):
        list(session.send(text))
        assert offsets(session.cache) == {len(session.cache.tokens)}
