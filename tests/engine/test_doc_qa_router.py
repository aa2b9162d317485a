"""`auto` keeps answers: the doc-qa evidence table, the question's own passages, the
coverage flag, and the doc-qa suite's documents and scoring (no model timing here)."""

import numpy as np
import pytest

from brisk.bench.doc_corpus import Question, callers_of, score
from brisk.bench.doc_qa import add_auto
from brisk.engine.accel import quality_table as qt
from brisk.engine.accel.coverage import coverage_map
from brisk.engine.accel.question_focus import MAX_HITS, question_regions, read_share
from brisk.engine.accel.router import route_prefill, with_runs
from brisk.engine.accel.specprefill.scoring import Selection
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model_by_key

ALL_KINDS = frozenset(qt.OTHER + ("aggregation", "quote", "code"))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_folder(
        make_tiny_model_by_key(tmp_path_factory.mktemp("dq") / "llama", "llama", seed=3, context_length=4096)
    )


def greedy(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "max_tokens": 2, "prefill_step_size": 128, **kw})


# --- the table ---------------------------------------------------------------------------


def test_auto_may_read_sparsely_only_where_the_table_shows_the_kind_kept():
    spec = qt.Evidence("specprefill", 0.2, "llama-135", frozenset({"fact", "two_hop"}))
    uni = qt.Evidence("uniprefill", kinds=frozenset({"fact", "two_hop", "code"}))
    table = {"qwen2-494": {"8K": (spec, uni)}}
    ask = lambda kind, **kw: qt.allowed("qwen2-494", 8000, kind, table=table, **kw)  # noqa: E731
    assert ask(None, draft="llama-135") is spec  # facts and two hops: the first row that covers both
    assert ask(None, draft="gemma-268") is uni  # SpecPrefill's row holds for its own draft only
    assert ask("code", draft="llama-135") is uni
    assert ask("aggregation", draft="llama-135") is None  # no row covers counting: dense
    assert ask("quote", draft=None) is None
    assert ask(None, draft="llama-135", methods={"uniprefill"}) is uni  # SpecPrefill not on (or below threshold)
    assert qt.allowed("qwen2-494", 3000, None, draft="llama-135", table=table) is None  # another band
    assert qt.allowed("llama-135", 8000, None, draft=None, table=table) is None  # another model
    half = {"m": {"4K": (qt.Evidence("uniprefill", kinds=frozenset({"fact"})),)}}
    assert qt.allowed("m", 4000, None, draft=None, table=half) is None  # two-hop unshown


def test_question_kinds_from_words():
    assert qt.question_kind("How many inspectors signed?") == "aggregation"
    assert qt.question_kind("List every inspector's name.") == "aggregation"
    assert qt.question_kind("Quote the keepers' motto exactly, word for word.") == "quote"
    assert qt.question_kind("Which function calls `_fold`?") == "code"
    assert qt.question_kind("Which method calls _split_chunks?") == "code"
    assert qt.question_kind("Which function calls os.path.join?") == "code"
    assert qt.question_kind("Which function is called by wrap()?") == "code"
    # code words alone are prose: `auto` may read code questions sparsely, these densely
    assert qt.question_kind("What is the function of the NOTICE file?") is None
    assert qt.question_kind("What class of works does the licence cover, e.g. source forms?") is None
    assert qt.question_kind("Who calls the shots in section 4?") is None
    assert qt.question_kind("What is the storage code of the Heron ledger?") is None
    assert [qt.length_band(n) for n in (4000, 8192, 16000, 30000, 90000)] == ["4K", "8K", "16K", "32K", "longer"]


def rows(method, kind, rights):
    return [{"method": method, "kind": kind, "right": r} for r in rights]


def test_evidence_needs_97_percent_of_dense_and_dense_answering():
    data = (
        rows("dense", "fact", [1, 1, 1])
        + rows("dense", "code", [0, 0])
        + rows("dense", "quote", [1, 0, 1])
        + rows("dense", "two_hop", [1, 1])
        + rows("specprefill 0.2", "fact", [1, 1, 1])
        + rows("specprefill 0.2", "code", [0, 0])  # both fail: shows nothing
        + rows("specprefill 0.2", "quote", [1, 1, 1])
        + rows("specprefill 0.2", "two_hop", [1, 1])  # two questions: too few to show anything
        + rows("specprefill 0.1", "fact", [1, 1, 0])  # 0.67 of dense
        + rows("uniprefill", "fact", [1, 0, 1])
        + rows("uniprefill", "quote", [1, 0, 1])
    )
    found = {(e.method, e.keep): e for e in qt.evidence_from(data, draft="llama-135")}
    assert found[("specprefill", 0.2)].kinds == {"fact", "quote"} and found[("specprefill", 0.2)].draft == "llama-135"
    assert ("specprefill", 0.1) not in found
    assert found[("uniprefill", None)].kinds == {"quote"} and found[("uniprefill", None)].draft == ""


def test_the_shipped_table_names_only_kinds_the_suite_asks():
    for bands in qt.TABLE.values():
        for evidence in (e for row in bands.values() for e in row):
            assert evidence.kinds <= ALL_KINDS and evidence.method in ("specprefill", "uniprefill")


# --- the router ----------------------------------------------------------------------------


def prompt_tokens(lm, marker_at: int = 70):
    words = ("pipes reservoirs districts engineers auditors figures hearing budget mayor " * 15).split()
    words.insert(marker_at, "Zanzibarx")
    doc = " ".join(words)
    return lm.tokenizer.encode(doc + "\n\nWhat does Zanzibarx mean?")


def test_auto_reads_densely_without_evidence_and_sparsely_with_it(lm, monkeypatch):
    tokens = prompt_tokens(lm)
    settings = greedy(uniprefill="auto", uniprefill_threshold=256)
    dense = route_prefill(None, lm, None, tokens, 0, settings)
    assert dense.method == "dense" and "no doc-qa evidence" in dense.reason and "fact and two_hop" in dense.reason
    key = qt.model_key(lm.config, lm.info.parameters)
    monkeypatch.setitem(qt.TABLE, key, {"4K": (qt.Evidence("uniprefill", kinds=ALL_KINDS),)})
    sparse = route_prefill(None, lm, None, tokens, 0, settings)
    assert (
        sparse.method == "uniprefill"
        and sparse.keep_focus
        and "auto: doc-qa evidence for fact and two_hop" in sparse.reason
    )
    # the question's rare word: its passage is in focus, where the document names it
    text = lm.tokenizer.decode(tokens)
    at = text.index("Zanzibarx")
    assert any(lm.tokenizer.decode(tokens[s:e]).find("Zanzibarx") >= 0 for s, e in sparse.focus)
    assert all(e <= len(tokens) for _, e in sparse.focus) and at > 0
    forced = route_prefill(None, lm, None, tokens, 0, greedy(uniprefill="on"))
    assert forced.method == "uniprefill" and not forced.keep_focus  # `on` is the user's choice: flagged, not kept


def test_under_auto_uniprefill_reads_the_questions_passage_in_full(lm, monkeypatch):
    key = qt.model_key(lm.config, lm.info.parameters)
    monkeypatch.setitem(qt.TABLE, key, {"4K": (qt.Evidence("uniprefill", kinds=ALL_KINDS),)})
    text = lm.tokenizer.decode(prompt_tokens(lm))

    def coverage(mode):
        settings = greedy(uniprefill=mode, uniprefill_threshold=256, uniprefill_p=0.05)
        done = [e for e in Session(lm, settings).send(text) if isinstance(e, TurnFinished)][0]
        return done.metrics.coverage

    auto = coverage("auto")
    assert auto["method"] == "uniprefill" and auto["read_share"] < 0.6  # p 0.05 drops most of it
    assert auto["question_regions"] and auto["question_read"] == 1.0 and not auto["question_dropped"]
    on = coverage("on")
    assert on["question_regions"] == auto["question_regions"]
    assert on["question_dropped"] == (on["question_read"] < 0.5)


def test_specprefill_selection_gains_the_focus_runs():
    sel = Selection([(0, 32), (288, 320)], 64, 320, 0.2)
    grown = with_runs(sel, [(100, 140), (300, 330), (400, 420)])
    assert grown.runs == [(0, 32), (100, 140), (288, 320)] and grown.kept == 104 and grown.total == 320


# --- the question's passages and the coverage flag ----------------------------------------


def spans_of(words):
    spans, at = [], 0
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    return " ".join(words), spans


def test_question_regions_find_rare_words_and_skip_common_ones():
    words = ["filler"] * 200 + ["Heron", "ledger"] + ["filler"] * 200 + ["What", "about", "Heron", "filler?"]
    text, spans = spans_of(words)
    regions = question_regions(text, spans, 402)
    assert len(regions) == 1 and regions[0][0] <= 200 < regions[0][1] <= 402  # "filler" occurs 400 times
    many = ["Heron"] * (MAX_HITS + 1) + ["x"] * 50 + ["Heron?"]
    text, spans = spans_of(many)
    assert question_regions(text, spans, len(many) - 1) == []


def test_coverage_flags_a_dropped_question_passage():
    tokens = list(range(1000))
    kept = [(0, 100), (900, 1000)]
    dropped = coverage_map(_Tok(), tokens, [(-1, kept)], method="specprefill", focus=[(480, 520)])
    assert dropped["question_dropped"] and dropped["question_read"] == 0.0 and dropped["method"] == "specprefill"
    read = coverage_map(_Tok(), tokens, [(-1, kept + [(470, 530)])], focus=[(480, 520)])
    assert not read["question_dropped"] and read["question_read"] == 1.0
    assert not coverage_map(_Tok(), tokens, [(-1, kept)])["question_dropped"]  # no focus: nothing to flag
    assert read_share([(0, 10)], [(5, 20)]) == 0.5


class _Tok:
    def decode(self, ids):
        return " ".join(map(str, ids))


# --- the suite's scoring and its `auto` column ------------------------------------------------


def test_scoring_exact_quotes_and_every_fact():
    quote = Question("quote", "q", ["salt before oar, ink before dusk"], exact=True)
    assert score(quote, 'The motto is "Salt before oar, ink before dusk."')["right"]
    assert not score(quote, "salt before oar, ink before moss")["right"]
    agg = Question("aggregation", "q", ["Szabo", "Petrakis", "Adeyemi"])
    assert score(agg, "Szabo and Petrakis") == {"right": False, "share": pytest.approx(2 / 3)}
    code = Question("code", "q", ["html"])
    assert not score(code, "xhtml_escape")["right"] and score(code, "`html`")["right"]


def test_code_question_candidates_are_called_from_one_function():
    source = "def a():\n    helper_one()\n\ndef b():\n    helper_one()\n    helper_two(1)\n\ndef c():\n    len([])\n"
    assert callers_of(source) == [("b", "helper_two")]


def test_auto_column_takes_the_allowed_rows_answer_or_denses():
    base = {"seed": 1, "length": 4096, "depth": 0.5, "cold": True, "scoring_s": 2.0, "read_share": 0.2}
    question = {"question": "What is the storage code of the Heron ledger?", "kind": "fact"}
    data = [
        {**base, **question, "method": "dense", "right": True, "ttft_s": 40.0, "flagged": False},
        {**base, **question, "method": "specprefill 0.2", "right": False, "ttft_s": 10.0, "flagged": True},
        {**base, **question, "method": "uniprefill", "right": True, "ttft_s": 30.0, "flagged": False},
    ]
    assert add_auto(data, "k", None, table={})[0]["chosen"] == "dense"
    spec = {"k": {"4K": (qt.Evidence("specprefill", 0.2, "d", frozenset(qt.OTHER)),)}}
    guarded = add_auto(data, "k", "d", table=spec)[0]
    assert guarded["chosen"] == "dense" and guarded["ttft_s"] == 42.0  # flagged: read densely after scoring
    uni = {"k": {"4K": (qt.Evidence("uniprefill", kinds=frozenset(qt.OTHER)),)}}
    chosen = add_auto(data, "k", "d", table=uni)[0]
    assert chosen["chosen"] == "uniprefill" and chosen["right"] and chosen["ttft_s"] == 30.0
    assert np.isclose(chosen["read_share"], 0.2)


def test_the_drafts_cache_carries_over_between_questions_about_one_document(lm):
    """An empty PromptCache is falsy: the scorer made a fresh one, so the draft re-read the
    whole document for every question (29 s each for SmolLM2 at 1K tokens, not 3 s)."""
    from brisk.engine.accel.speculative.pair import DraftPair
    from brisk.engine.api.events import result_of

    pair = DraftPair.make(lm, lm)
    tokens = prompt_tokens(lm)
    result_of(pair.importance_steps(tokens, 0, 128))
    assert len(pair.cache) == len(tokens)
    progress = list(pair.importance_steps(tokens[:-3] + tokens[-2:], 0, 128))
    read = [p.total for p in progress if getattr(p, "phase", "") == "draft"]
    assert read and max(read) <= 4  # only the changed tail is read again


def test_the_question_is_what_follows_the_documents_last_blank_line():
    from brisk.engine.accel.question_focus import question_start, question_text

    doc_end = "def helper():\n    return build_class()\n\n"  # code words at the end of the document
    assert qt.question_kind(question_text(doc_end + "What is the Heron code?<|im_end|>\n")) is None
    assert question_text("no blank line here") == "no blank line here"
    words = ["w"] * 100 + ["end.\n\n", "What", "is", "it?"]
    text, spans = spans_of(words)
    assert question_start(text, spans) == 101


def test_under_auto_specprefill_keeps_the_questions_passage_and_says_so(lm, monkeypatch):
    from brisk.engine.accel.speculative.pair import DraftPair

    key = qt.model_key(lm.config, lm.info.parameters)
    evidence = qt.Evidence("specprefill", 0.1, key, ALL_KINDS)  # measured with this very draft
    monkeypatch.setitem(qt.TABLE, key, {"4K": (evidence,)})
    tokens = prompt_tokens(lm)
    pair = DraftPair.make(lm, lm)
    route = route_prefill(pair, lm, [], tokens, 0, greedy(sparse_prefill="auto", sparse_threshold=0))
    assert route.method == "specprefill" and route.keep_focus and route.focus
    runs = route.spec.selection.runs
    assert all(any(s <= fs and fe <= e for s, e in runs) for fs, fe in route.focus)
    assert "the question's passages included" in route.spec.note and "auto: doc-qa evidence" in route.reason
    other = qt.Evidence("specprefill", 0.1, "another-draft", ALL_KINDS)
    monkeypatch.setitem(qt.TABLE, key, {"4K": (other,)})
    assert route_prefill(pair, lm, [], tokens, 0, greedy(sparse_prefill="auto", sparse_threshold=0)).method == "dense"


def test_the_shipped_table_reads_sparsely_only_where_the_128_row_scorer_kept_answers():
    """The one row: Qwen-1.5B with Qwen-0.5B drafting, 12K-24K new tokens, SpecPrefill at keep
    0.2 for two-hop and code questions (tuning seeds 2-4, 16K; quotes are out, see the table).
    It lost a fact, so a question whose words do not say its kind reads densely; so does every
    other model, band, draft and kind (the rows measured with the 32-row scorer are out)."""
    for kind in (None, "fact", "two_hop", "aggregation", "quote", "code"):
        assert qt.allowed("qwen2-630", 4000, kind, draft="llama-135") is None
        assert qt.allowed("llama-135", 4000, kind, draft="llama-135") is None
        assert qt.allowed("qwen2-1777", 8000, kind, draft="qwen2-630") is None
        assert qt.allowed("qwen2-1777", 16000, kind, draft="llama-135") is None  # another draft
        assert qt.allowed("qwen2-1777", 30000, kind, draft="qwen2-630") is None  # the 32K band
        row = qt.allowed("qwen2-1777", 16000, kind, draft="qwen2-630")
        if kind in ("code", "two_hop"):
            assert row is not None and (row.method, row.keep) == ("specprefill", 0.2)
        else:
            assert row is None
    # a conversation that also asked for a list reads densely
    assert qt.allowed("qwen2-1777", 16000, "code", draft="qwen2-630", also=("aggregation",)) is None
    assert qt.question_kind("Quote the keepers' motto word for word.") == "quote"
    assert qt.question_kind("Which function calls `rstrip`?") == "code"


def test_where_the_table_allows_a_sparse_read_the_suite_runs_the_turn_auto_really_runs(lm, monkeypatch):
    """The auto column was put together from the fixed-setting rows, but under `auto` the engine
    also keeps the question's own passages (and applies its thresholds): another method."""
    from types import SimpleNamespace

    from brisk.bench import doc_qa

    key = qt.model_key(lm.config, lm.info.parameters)
    question = Question("fact", "What is the storage code of the Heron ledger?", ["amber-otter"], depth=0.5)
    text = " ".join(f"Line {i} of the ledger notes." for i in range(120)) + " The Heron code is amber-otter."
    doc = SimpleNamespace(seed=1, text=text, questions=[question])
    ask = lambda: doc_qa.ask_all(lm, lm, doc, ["dense", "auto"], held_out=False, tokens=1000, log=lambda *a, **k: None)  # noqa: E731

    monkeypatch.setitem(qt.TABLE, key, {})
    assert [r["method"] for r in ask()] == ["dense"]  # no row: auto reads densely, dense's row stands for it
    monkeypatch.setitem(qt.TABLE, key, {"4K": (qt.Evidence("specprefill", 0.2, key, ALL_KINDS),)})
    rows = ask()
    assert [r["method"] for r in rows] == ["dense", "auto"]
    assert rows[1]["route"] and rows[1]["cold"]  # the engine's own route, read cold
    assert add_auto(rows, key, key) == []  # the measured turn is the auto column's row


def test_a_method_set_to_auto_beside_one_forced_on_still_needs_the_tables_word(lm, monkeypatch):
    """SpecPrefill on with no draft and UniPrefill auto ran UniPrefill on every long prompt:
    the `auto` half was never checked against the table."""
    key = qt.model_key(lm.config, lm.info.parameters)
    tokens = prompt_tokens(lm)
    mixed = greedy(sparse_prefill="on", uniprefill="auto", uniprefill_threshold=0)
    monkeypatch.setitem(qt.TABLE, key, {})
    assert route_prefill(None, lm, [], tokens, 0, mixed).method == "dense"
    monkeypatch.setitem(qt.TABLE, key, {"4K": (qt.Evidence("uniprefill", kinds=ALL_KINDS),)})
    assert route_prefill(None, lm, [], tokens, 0, mixed).method == "uniprefill"


def test_a_column_run_later_merges_with_the_saved_run_it_completes(tmp_path, capsys):
    """`--only uniprefill` adds the column a long run left out; `--rescore a --rescore b`
    reports both as one run (its accuracy beside the dense rows of the other file)."""
    import json

    from brisk.bench.doc_qa import rescore
    from brisk.engine.api.errors import BriskError

    base = {"seed": 3, "length": 16384, "depth": 0.5, "cold": True, "scoring_s": 0.0, "read_share": 1.0}
    question = {"question": "Which licence covers the archive?", "kind": "fact", "held_out": True, "answer": "MIT"}
    run = {"target": "t", "draft": "d", "model_key": "k", "draft_key": "dk", "methods": ["dense"], "held_out": [3]}
    wrong = {**question, "question": "Which licence covers the docs?", "depth": 0.9}
    first = {
        **run,
        "rows": [
            {**base, **question, "method": "dense", "right": True, "ttft_s": 500.0, "flagged": False},
            {**base, **wrong, "method": "dense", "right": False, "ttft_s": 1.0, "flagged": False, "cold": False},
        ],
    }
    later = {
        **run,
        "methods": ["uniprefill"],
        "rows": [{**base, **question, "method": "uniprefill", "right": True, "ttft_s": 200.0, "flagged": False}],
    }
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(later))
    merged = rescore([str(tmp_path / "a.json"), str(tmp_path / "b.json")], as_json=False)
    assert merged["methods"] == ["dense", "uniprefill"] and len(merged["rows"]) == 3
    uni = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("uniprefill"))
    # n, accuracy, ratio to dense on the one question both answered (not to dense's 1 of 2)
    assert uni.split()[1:4] == ["1", "1.000", "1.000"]
    (tmp_path / "c.json").write_text(json.dumps({**later, "target": "other"}))
    with pytest.raises(BriskError, match="not of one target and draft"):
        rescore([str(tmp_path / "a.json"), str(tmp_path / "c.json")], as_json=False)
