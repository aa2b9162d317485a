"""Turns that `auto` must not read sparsely: the doc-qa table's evidence is for a whole
prompt read afresh, with its question at the end (engine/accel/quality_table.py)."""

import pytest

from brisk.engine.accel import quality_table as qt
from brisk.engine.accel.router import route_prefill
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model_by_key

FACTS = frozenset(qt.OTHER)  # facts and two-hop questions, not counting, quoting or code


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_folder(
        make_tiny_model_by_key(tmp_path_factory.mktemp("attack") / "llama", "llama", seed=5, context_length=16384)
    )


def greedy(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "max_tokens": 2, "prefill_step_size": 512, **kw})


def document(repeats: int = 15) -> str:
    words = ("pipes reservoirs districts engineers auditors figures hearing budget mayor " * repeats).split()
    words.insert(70, "Zanzibarx")
    return " ".join(words)


def uniprefill_for_facts(lm, monkeypatch, band: str = "4K") -> None:
    key = qt.model_key(lm.config, lm.info.parameters)
    monkeypatch.setitem(qt.TABLE, key, {band: (qt.Evidence("uniprefill", kinds=FACTS),)})


def finished(events) -> TurnFinished:
    return [e for e in events if isinstance(e, TurnFinished)][0]


def test_a_later_question_is_not_answered_from_an_earlier_turns_sparse_read(lm, monkeypatch):
    """Turn 1 (a fact question the table covers) reads the document sparsely, keeping that
    question's passages. Turn 2 asks a counting question the table does not cover: `auto`
    must read the document densely, not answer from turn 1's sparse cache while its
    metrics say "dense"."""
    uniprefill_for_facts(lm, monkeypatch)
    session = Session(lm, greedy(uniprefill="auto", uniprefill_threshold=256, uniprefill_p=0.05))
    first = finished(session.send(document() + "\n\nWhat does Zanzibarx mean?")).metrics
    assert first.prefill_method == "uniprefill" and first.coverage["read_share"] < 1.0
    second = finished(session.send("How many districts does the document name?")).metrics
    assert second.prefill_method == "dense"
    assert second.cached_tokens == 0  # every token of the document read again, densely
    assert second.prefilled_tokens == second.prompt_tokens
    assert session.cache.dense_from == 0


def test_the_length_band_is_the_whole_prompts_not_the_uncached_parts(lm, monkeypatch):
    """A 4K-band document pasted after a long, densely read conversation: the model reads
    the whole prompt, a length the 4K row never measured."""
    uniprefill_for_facts(lm, monkeypatch)
    tokens = lm.tokenizer.encode(document(120) + "\n\nWhat does Zanzibarx mean?")
    assert len(tokens) > 6 * 1024  # past the 4K band
    cached = len(tokens) - 4000  # 4000 new tokens: the 4K band, were only they counted
    settings = greedy(uniprefill="auto", uniprefill_threshold=256)
    route = route_prefill(None, lm, None, tokens, cached, settings)
    assert route.method == "dense" and "at 8K" in route.reason
    assert route_prefill(None, lm, None, tokens[cached - 100 :], 0, settings).method == "uniprefill"


def test_a_question_asked_before_its_document_keeps_its_kind(lm, monkeypatch):
    """ "How many ...?" above the pasted document: the prompt's end is the document's last
    words, which read as a fact question; the table has no counting row: dense."""
    uniprefill_for_facts(lm, monkeypatch)
    settings = greedy(uniprefill="auto", uniprefill_threshold=256)
    ask = lambda text: finished(Session(lm, settings).send(text)).metrics  # noqa: E731
    assert ask(document() + "\n\nWhat does Zanzibarx mean?").prefill_method == "uniprefill"  # the row holds
    first = ask("How many districts does the document below name?\n\n" + document())
    assert first.prefill_method == "dense" and "aggregation" in first.prefill_route


def test_a_follow_up_keeps_the_kind_of_the_question_it_follows(lm, monkeypatch):
    """ "Are you sure?" after a counting question asks the count again: a chat read from
    its first token (the server's requests, a reopened chat) is not a fact question."""
    from brisk.engine.api.conversation import Message

    uniprefill_for_facts(lm, monkeypatch)
    chat = [
        Message("user", document() + "\n\nHow many districts are named?"),
        Message("assistant", "Nine."),
        Message("user", "Are you sure?"),
    ]
    again = finished(Session(lm, greedy(uniprefill="auto", uniprefill_threshold=256)).answer(chat)).metrics
    assert again.cached_tokens == 0
    assert again.prefill_method == "dense" and "aggregation" in again.prefill_route


def test_a_document_sent_without_a_question_is_read_densely(lm, monkeypatch):
    """An attached document and no words typed (the app sends it, titled by the file): the
    prompt's end is the document's, not a question of any kind the suite measured."""
    from brisk.engine.turn.documents import join_attached

    uniprefill_for_facts(lm, monkeypatch)
    settings = greedy(uniprefill="auto", uniprefill_threshold=256)
    ask = lambda text: finished(Session(lm, settings).send(text)).metrics  # noqa: E731
    assert ask(join_attached([("report.txt", document())], "What does Zanzibarx mean?")).prefill_method == "uniprefill"
    bare = ask(join_attached([("report.txt", document())], ""))
    assert bare.prefill_method == "dense" and "no doc-qa evidence" in bare.prefill_route


def test_a_fact_question_above_its_document_is_read_densely(lm, monkeypatch):
    """The doc-qa suite asks below the document: SpecPrefill's draft scores the prompt by
    what its last tokens attend to, and the question's passages are found from the last
    words. A question above the document leaves both to the document's tail: no evidence."""
    uniprefill_for_facts(lm, monkeypatch)
    settings = greedy(uniprefill="auto", uniprefill_threshold=256)
    first = finished(Session(lm, settings).send("What does Zanzibarx mean?\n\n" + document())).metrics
    assert first.prefill_method == "dense" and "no doc-qa evidence" in first.prefill_route


def test_the_route_says_why_auto_read_densely_without_a_draft(lm):
    """SpecPrefill at auto with no draft loaded: the prompt is long enough, the route must
    not say it was too short."""
    tokens = lm.tokenizer.encode(document() + "\n\nWhat does Zanzibarx mean?")
    route = route_prefill(None, lm, None, tokens, 0, greedy(sparse_prefill="auto", sparse_threshold=256))
    assert route.method == "dense" and "no draft" in route.reason and "<" not in route.reason


def test_auto_runs_uniprefill_as_doc_qa_measured_it_not_at_the_chats_own_p(lm, monkeypatch):
    """doc-qa measured UniPrefill at the model's own p and drop layers: a chat's saved
    p 0.05 (most of the prompt dropped) is not what the row shows keeping answers."""
    from brisk.engine.accel.router import auto_settings

    uniprefill_for_facts(lm, monkeypatch)
    tokens = lm.tokenizer.encode(document() + "\n\nWhat does Zanzibarx mean?")
    chat = greedy(uniprefill="auto", uniprefill_threshold=256, uniprefill_p=0.05, drop_layers=[0])
    chosen, why = auto_settings(None, lm, tokens, 0, chat)
    assert chosen is not None and chosen.uniprefill == "on", why
    assert chosen.uniprefill_p is None and chosen.drop_layers is None


def test_earlier_turns_read_again_are_not_a_measured_prompt(lm, monkeypatch):
    """doc-qa asks one question per prompt, at its end. A chat read from its first token
    (a server request, a reopened chat) whose last words are a follow-up ("Are you sure?")
    steers SpecPrefill's scoring and the question's passages by words that point nowhere:
    dense. A document pasted in a later turn, the earlier ones cached, is still routed."""
    from brisk.engine.api.conversation import Message

    uniprefill_for_facts(lm, monkeypatch)
    settings = greedy(uniprefill="auto", uniprefill_threshold=256)
    chat = [
        Message("user", document() + "\n\nWhat does Zanzibarx mean?"),
        Message("assistant", "A district."),
        Message("user", "Are you sure?"),
    ]
    again = finished(Session(lm, settings).answer(chat)).metrics
    assert again.cached_tokens == 0 and again.prefill_method == "dense"
    assert "no doc-qa evidence" in again.prefill_route
    session = Session(lm, settings)
    finished(session.send("Hello there."))
    later = finished(session.send(document() + "\n\nWhat does Zanzibarx mean?")).metrics
    assert later.cached_tokens > 0 and later.prefill_method == "uniprefill"


def test_listing_counting_and_summing_questions_in_other_words_are_not_fact_questions():
    """The suite's counting question says "List every ... name"; users ask for lists,
    totals and summaries in other words, and a fact row says nothing about those."""
    for question in (
        "List the inspectors who signed off.",
        "Name all the inspectors.",
        "What are the names of all inspectors?",
        "What is the total number of inspectors?",
        "How much did the districts spend altogether?",
        "Summarize the document.",
        "Give me a summary of the hearing.",
        "Enumerate the districts.",
    ):
        assert qt.question_kind(question) == "aggregation", question
    # the suite's own questions keep their kinds
    assert qt.question_kind("What is the storage code of the Heron ledger? Answer with the code only.") is None
    assert (
        qt.question_kind("Who holds the key to the room where the Heron ledger is kept? Answer with the name only.")
        is None
    )
    assert (
        qt.question_kind("In the Python source above, which function calls `f`? Answer with the function's name only.")
        == "code"
    )
    assert qt.question_kind("Quote the keepers' motto exactly, word for word.") == "quote"
