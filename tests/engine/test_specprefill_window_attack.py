"""SpecPrefill's scoring with the 128-token observation window, attacked as a user would
meet it: long prompts, memory, multi-turn drafts (engine/accel/specprefill/scoring.py)."""

import mlx.core as mx

from brisk.engine.accel.specprefill.scoring import OBSERVATION_WINDOW, DraftScorer, capture_attention, score_tokens
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model_by_key


def _peak_mb(fn):
    """Peak memory above what was allocated before `fn` ran (MB)."""
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    mx.eval(fn())
    mx.synchronize()
    return (mx.get_peak_memory() - before) / 1e6


def _read_all_but_the_window(scorer, prompt):
    list(scorer.cache.sync(prompt[:-OBSERVATION_WINDOW], 4096))
    mx.eval([c.state for c in scorer.cache.layers])


def test_scoring_keeps_no_second_copy_of_the_drafts_keys(tmp_path):
    """The window's attention calls hand over the cache's keys as views of its buffers;
    held through the lookahead, the first step's write into those buffers had to copy
    every layer's keys (at 32K a Qwen-0.5B draft's keys are ~200 MB, beside the scoring's
    own ~340 MB). The scorer's peak is that of reading the window or of scoring, not
    their sum with a copy of the keys. Wide K (8 heads of 256) so the keys dominate; 2000
    tokens fill no 256-token step of the cache buffers, so no growth copies anything."""
    lm = load_folder(
        make_tiny_model_by_key(
            tmp_path / "wide",
            "llama",
            seed=1,
            context_length=4096,
            num_attention_heads=8,
            num_key_value_heads=8,
            head_dim=256,
            num_hidden_layers=4,
        )
    )
    prompt = [3 + (7 * i) % 200 for i in range(2000)]

    scorer = DraftScorer(lm)
    _read_all_but_the_window(scorer, prompt)
    whole = _peak_mb(lambda: scorer.importance(prompt, 0, 4096))
    keys_mb = sum(c.keys.nbytes for c in scorer.cache.layers) / 1e6

    # the same two phases run apart, nothing held between them but the window's queries
    apart = DraftScorer(lm)
    _read_all_but_the_window(apart, prompt)
    captured: list = []

    def read_window():
        with capture_attention(lm.model, captured):
            return lm.model(mx.array(prompt[-OBSERVATION_WINDOW:])[None], cache=apart.cache.layers)

    reading = _peak_mb(read_window)
    observed = [q for q, _, _ in captured]
    mx.eval(observed)
    captured.clear()
    scoring = _peak_mb(lambda: score_tokens(lm.model, apart.cache.layers, 5, 0, len(prompt), observed=observed))

    assert keys_mb > 30  # 4 layers x 8 heads x 2048 slots x 256 x float16
    # measured: 36 MB with the views dropped, 70 MB holding them (reading 23, scoring 32)
    assert whole < max(reading, scoring) + keys_mb / 2


def test_the_windows_logits_are_not_held_while_scoring(tmp_path, monkeypatch):
    """The window pass's logits cover all of its 128 rows (only the last one gives the first
    lookahead token): ~78 MB at a Qwen draft's 152K vocabulary, four times the 32-row
    window's. Held through the scoring they added to its peak. When scoring starts the
    scorer holds what it held before (the cache) and the window's queries, nothing more."""
    from brisk.engine.accel.specprefill import scoring

    lm = load_folder(make_tiny_model_by_key(tmp_path / "vocab", "llama", seed=1, context_length=4096, vocab_size=65536))
    prompt = [3 + (7 * i) % 200 for i in range(2000)]
    scorer = DraftScorer(lm)
    _read_all_but_the_window(scorer, prompt)
    at_entry = []

    def measured(*args, **kwargs):
        mx.synchronize()
        at_entry.append(mx.get_active_memory())
        return score_tokens(*args, **kwargs)

    monkeypatch.setattr(scoring, "score_tokens", measured)
    mx.synchronize()
    before = mx.get_active_memory()
    scorer.importance(prompt, 0, 4096)
    logits_bytes = OBSERVATION_WINDOW * 65536 * 4  # float32 logits of every window row: 33.5 MB
    held = at_entry[0] - before  # the window's keys and values fit the buffers already there
    assert held < logits_bytes / 4
