"""Under `auto`, SpecPrefill's kept tokens grow by the question's passages: the route's
reason (what `brisk run` prints after the answer) must count the tokens read, as the
metrics' `sparse_prefill` note does, not the scorer's smaller selection before them."""

import re

from brisk.engine.accel import quality_table as qt
from brisk.engine.accel.router import route_prefill
from brisk.engine.accel.speculative.pair import DraftPair
from tests.engine.test_doc_qa_router import ALL_KINDS, greedy, lm, prompt_tokens  # noqa: F401


def kept_in(text: str) -> int:
    return int(re.search(r"kept (\d+) of", text).group(1))


def test_the_printed_route_counts_the_question_passages_auto_read(lm, monkeypatch):  # noqa: F811
    key = qt.model_key(lm.config, lm.info.parameters)
    monkeypatch.setitem(qt.TABLE, key, {"4K": (qt.Evidence("specprefill", 0.1, key, ALL_KINDS),)})
    # the rare word mid-document, where this scorer's selection misses its passage
    tokens = prompt_tokens(lm, marker_at=60)
    pair = DraftPair.make(lm, lm)
    forced = route_prefill(pair, lm, [], tokens, 0, greedy(sparse_prefill="on", sparse_keep=0.1, sparse_threshold=0))
    auto = route_prefill(pair, lm, [], tokens, 0, greedy(sparse_prefill="auto", sparse_threshold=0))
    assert auto.method == "specprefill"
    assert auto.spec.selection.kept > forced.spec.selection.kept  # the passages added tokens
    assert kept_in(auto.reason) == auto.spec.selection.kept == kept_in(auto.spec.note)
    assert "(auto: doc-qa evidence" in auto.reason
