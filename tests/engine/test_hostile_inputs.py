"""Hostile and careless inputs to the engine and the `brisk` command (issue 14): each is
refused with a clear message before it can crash, hang or answer wrongly."""

import os
import subprocess
import sys

import pytest

from brisk.engine.api.errors import BriskError, InvalidSettings
from brisk.engine.api.events import EngineErrored, TurnFinished
from brisk.engine.api.session import Message, Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.store import ModelStore
from brisk.engine.turn.documents import DocumentError, check_fit, read_document
from brisk.engine.turn.text_input import count_tokens_bounded, read_text_file
from tests import cli_here


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory, tiny_llama_dir):
    home = tmp_path_factory.mktemp("hostile-home")
    ModelStore(home).install_folder(tiny_llama_dir, model_id="tiny", source="test")
    return home


def brisk(home, *args):
    env = dict(os.environ, BRISK_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "brisk.engine.host.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


# The refusals below come before any turn runs: checked through the CLI's entry point in this
# process (tests/cli_here.py; a subprocess costs ~2.5 CPU-s). One still runs as a user runs it.
brisk_here = cli_here.brisk_here


# --- 14. values that would be accepted silently -----------------------------------------------


@pytest.mark.parametrize(
    "args,match",
    [
        (["--temp", "nan"], "temperature must be a finite number"),
        (["--temp", "inf"], "temperature must be a finite number"),
        (["--repetition-penalty", "nan"], "repetition_penalty must be a finite number"),
        (["--top-p", "nan"], "top_p must be a finite number"),
        (["--seed", "-1"], "seed must be in"),
        (["--prefill-step", "32768"], "prefill_step_size must be at most"),
        (["--prompt", ""], "prompt is empty"),
        (["--prompt", "   \n"], "prompt is empty"),
    ],
)
def test_cli_refuses_values_that_would_answer_wrongly(cli_home, args, match):
    prompt = [] if "--prompt" in args else ["--prompt", "hi"]
    out = brisk_here(cli_home, "run", "--model", "tiny", "--max-tokens", "2", *prompt, *args)
    assert out.returncode == 1 and match in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_refused_value_is_one_line_from_the_command_a_user_runs(cli_home):
    out = brisk(cli_home, "run", "--model", "tiny", "--max-tokens", "2", "--prompt", "hi", "--temp", "nan")
    assert out.returncode == 1
    said = "brisk: error: Invalid chat settings: temperature must be a finite number (got nan)"
    assert out.stderr.splitlines() == [said]


def test_settings_from_saved_data_with_wrong_types_are_refused():
    with pytest.raises(InvalidSettings, match="temperature must be a number"):
        ChatSettings.from_dict({"temperature": "hot"})
    with pytest.raises(InvalidSettings, match="seed"):
        ChatSettings.from_dict({"seed": 1e23})


# --- 13. bench arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "kv", "--model", "tiny", "--context", "-5"],
        ["bench", "kv", "--model", "tiny", "--context", "0"],
        ["bench", "verify", "--model", "tiny", "--rows", "0"],
        ["bench", "overhead", "--model", "tiny", "--runs", "0"],
    ],
)
def test_bench_refuses_non_positive_sizes_with_a_usage_message(cli_home, args):
    out = brisk_here(cli_home, *args)
    assert out.returncode == 2 and "must be at least 1" in out.stderr and "Traceback" not in out.stderr


# --- 17. prompt files ------------------------------------------------------------------------------


def test_prompt_file_checks(cli_home, tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    out = brisk_here(cli_home, "run", "--model", "tiny", "--prompt-file", str(folder))
    assert out.returncode == 1 and "is a folder" in out.stderr
    late_nul = tmp_path / "late.bin"
    late_nul.write_bytes(b"a" * 10_000 + b"\x00" + b"b" * 10)
    out = brisk_here(cli_home, "run", "--model", "tiny", "--prompt-file", str(late_nul))
    assert out.returncode == 1 and "binary file" in out.stderr


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_text_with_a_byte_order_mark_is_decoded(tmp_path, codec):
    path = tmp_path / "report.txt"
    text = "Zażółć gęślą jaźń — 東京"
    bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-32": b""}[codec]
    path.write_bytes(bom + text.encode(codec))
    assert read_text_file(path) == text
    assert read_document(path).text == text


def test_a_nul_after_the_first_8_kib_marks_a_document_binary(tmp_path):
    path = tmp_path / "tricky.txt"
    path.write_bytes(b"x" * 9000 + b"\x00tail")
    with pytest.raises(DocumentError, match="binary"):
        read_document(path)


def test_a_directory_is_not_a_document(tmp_path):
    with pytest.raises(DocumentError, match="is a folder"):
        read_document(tmp_path)


# --- 11. oversized text never reaches the tokenizer whole -------------------------------------------


def test_a_prompt_larger_than_any_context_is_refused_before_tokenizing(tiny_llama, monkeypatch):
    calls = []
    real = tiny_llama.tokenizer.apply_chat_template
    monkeypatch.setattr(
        type(tiny_llama.tokenizer), "apply_chat_template", lambda self, *a, **k: calls.append(1) or real(*a, **k)
    )
    session = Session(tiny_llama, ChatSettings(model="tiny", max_tokens=2))
    events = list(session.send("word " * 400_000))  # 2 M characters, context 512 tokens
    (error,) = [e for e in events if isinstance(e, EngineErrored)]
    assert "characters" in error.message and error.kind == "context_overflow" and calls == []


def test_truncate_oldest_drops_turns_by_characters_first(tiny_llama):
    history = [Message("user", "old " * 50_000), Message("assistant", "ok"), Message("user", "new question")]
    session = Session(
        tiny_llama,
        ChatSettings(model="tiny", max_tokens=2, temperature=0, context_overflow="truncate_oldest"),
        messages=history[:2],
    )
    events = list(session.send("new question"))
    assert [e for e in events if isinstance(e, TurnFinished)]
    (truncated,) = [e for e in events if type(e).__name__ == "ContextTruncated"]
    assert truncated.dropped_messages == 2  # the whole oldest turn, so the prompt still opens with a user


def test_huge_attachment_is_judged_without_tokenizing_it_all(tiny_llama, tmp_path, monkeypatch):
    from brisk.engine.turn.text_input import TOKENIZE_PIECE_CHARS

    path = tmp_path / "huge.txt"
    path.write_text("lorem ipsum dolor sit amet " * 200_000)  # 5.4 MB
    document = read_document(path)
    tokenized = []  # characters handed to the tokenizer: the work, whatever the machine's speed
    tokenizer_class = type(tiny_llama.tokenizer._tokenizer)
    encode = tokenizer_class.encode
    monkeypatch.setattr(
        tokenizer_class, "encode", lambda self, text, **k: tokenized.append(len(text)) or encode(self, text, **k)
    )
    fit = check_fit(tiny_llama, [], document, ChatSettings(model="tiny"), memory_available=2**34)
    assert not fit.fits and "more than" in fit.reason and sum(tokenized) <= TOKENIZE_PIECE_CHARS


def test_bounded_token_count_stops_past_the_limit_and_equals_whole_text_below_it(tiny_llama):
    text = "The quick brown fox jumps over the lazy dog.\n" * 3000  # 135 K characters, 3 pieces
    whole = len(tiny_llama.tokenizer.encode(text, add_special_tokens=False))
    assert count_tokens_bounded(tiny_llama.tokenizer, text, 10**9) == (whole, True)
    count, complete = count_tokens_bounded(tiny_llama.tokenizer, text, 100)
    assert not complete and 100 < count < whole


def test_a_pdf_bomb_is_a_document_error_not_an_engine_failure(tmp_path, monkeypatch):
    from pypdf.errors import LimitReachedError

    path = tmp_path / "bomb.pdf"
    path.write_bytes(b"%PDF-1.7\n")

    class Bomb:
        is_encrypted = False

        def __init__(self, *_):
            raise LimitReachedError("Limit reached while decompressing: 1.2 GB")

    monkeypatch.setattr("pypdf.PdfReader", Bomb)
    with pytest.raises(DocumentError, match="safety limits"):
        read_document(path)


def test_a_pdf_that_expands_past_the_character_cap_stops_extracting(tmp_path, monkeypatch):
    import brisk.engine.turn.documents as documents

    pages_read = []

    class Page:
        def extract_text(self):
            pages_read.append(1)
            return "x" * 1000

    class Expanding:
        is_encrypted = False

        def __init__(self, *_):
            self.pages = (Page() for _ in range(10**6))

    monkeypatch.setattr("pypdf.PdfReader", Expanding)
    monkeypatch.setattr(documents, "MAX_DOCUMENT_CHARS", 50_000)
    (tmp_path / "a.pdf").write_bytes(b"%PDF-1.7\n")
    with pytest.raises(DocumentError, match="more than 50,000 characters"):
        read_document(tmp_path / "a.pdf")
    assert len(pages_read) == 51


# --- 10. prefill memory ------------------------------------------------------------------------------


def test_a_prefill_step_that_cannot_fit_in_memory_is_refused_with_both_numbers(tiny_llama, monkeypatch):
    import brisk.engine.runtime.info

    monkeypatch.setattr(brisk.engine.runtime.info, "memory_available", lambda: 1_000_000)
    session = Session(tiny_llama, ChatSettings(model="tiny", max_tokens=2, prefill_step_size=4096))
    events = list(session.send("The quick brown fox " * 40))
    (error,) = [e for e in events if isinstance(e, EngineErrored)]
    assert error.kind == "out_of_memory" and "GiB of working memory" in error.message and "is free" in error.message


def test_the_check_counts_the_chunk_not_the_whole_prompt(tiny_llama, monkeypatch):
    import brisk.engine.runtime.info
    from brisk.engine.turn.dense_prefill import prefill_step_bytes

    need_small = prefill_step_bytes(tiny_llama.config, 8, 200)
    assert prefill_step_bytes(tiny_llama.config, 200, 200) > 20 * need_small
    monkeypatch.setattr(brisk.engine.runtime.info, "memory_available", lambda: need_small + 1)
    session = Session(tiny_llama, ChatSettings(model="tiny", max_tokens=2, prefill_step_size=8))
    assert [e for e in session.send("The quick brown fox " * 20) if isinstance(e, TurnFinished)]


# --- 15. drafts that cannot help ---------------------------------------------------------------------


def test_a_draft_equal_to_the_target_is_refused_on_the_cli(cli_home):
    out = brisk_here(cli_home, "run", "--model", "tiny", "--draft", "tiny", "--prompt", "hi", "--max-tokens", "4")
    assert out.returncode == 1 and "the draft is the target itself" in out.stderr


def test_a_draft_bigger_than_the_target_is_refused_by_the_worker(tiny_llama, tmp_path):
    import dataclasses

    from brisk.engine.host.worker import Answer, EngineWorker
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    bigger = load_folder(make_tiny_model(tmp_path / "big", "llama", hidden_size=128), model_id="bigger")
    models = {"tiny-llama": tiny_llama, "bigger": bigger}
    worker = EngineWorker(models.__getitem__, memory_available=lambda: 2**30)
    settings = ChatSettings(model="tiny-llama", draft="bigger", max_tokens=4)
    from brisk.engine.api.session import CancelToken

    events = [e.event for e in worker.handle(Answer(1, settings, [Message("user", "hi")]), CancelToken())]
    (error,) = [e for e in events if isinstance(e, EngineErrored)]
    assert "not smaller than the target" in error.message
    assert dataclasses.replace(settings, draft=None).validate()


def test_a_drafting_turn_reports_a_rate_no_faster_than_its_whole_generation(tiny_llama):
    session = Session(
        tiny_llama,
        ChatSettings(model="tiny", temperature=0, max_tokens=12, spec_decode="on", num_draft=4),
        draft=tiny_llama,
    )
    (done,) = [e for e in session.send("The quick brown fox") if isinstance(e, TurnFinished)]
    m = done.metrics
    assert m.draft_tokens > 0
    assert m.decode_tps == pytest.approx(m.generated_tokens / m.generation_s)


# --- 18. a saved cache spliced from two chats -----------------------------------------------------


def test_a_saved_cache_with_another_chats_kv_is_refused(tiny_llama, tmp_path):
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    settings = ChatSettings(model="tiny", temperature=0, max_tokens=4)
    paris, doc = Session(tiny_llama, settings), Session(tiny_llama, settings)
    list(paris.send("What is the capital of France?"))
    list(doc.send("Summarize the attached quarterly report about turbines and wind."))
    paris.save_cache(tmp_path / "paris.safetensors")
    doc.save_cache(tmp_path / "doc.safetensors")
    kv_of_paris, _ = load_prompt_cache(str(tmp_path / "paris.safetensors"), return_metadata=True)
    _, meta_of_doc = load_prompt_cache(str(tmp_path / "doc.safetensors"), return_metadata=True)
    save_prompt_cache(str(tmp_path / "spliced.safetensors"), kv_of_paris, meta_of_doc)
    with pytest.raises(BriskError, match="does not match its own tokens and KV"):
        Session(tiny_llama, settings).load_cache(tmp_path / "spliced.safetensors")
    Session(tiny_llama, settings).load_cache(tmp_path / "doc.safetensors")  # the genuine one loads


def test_a_sparse_turns_prefill_rate_counts_the_tokens_it_served(tiny_llama):
    """Issue 15: a sparse turn's rate counted only the kept tokens (8 tok/s plotted against
    36 for a slower dense turn); it counts every new prompt token it served."""
    session = Session(
        tiny_llama,
        ChatSettings(model="tiny", temperature=0, max_tokens=2, sparse_prefill="on", sparse_keep=0.3),
        draft=tiny_llama,
    )
    (done,) = [
        e for e in session.send("The quick brown fox jumps over the lazy dog. " * 20) if isinstance(e, TurnFinished)
    ]
    m = done.metrics
    assert m.sparse_outcome == "used" and m.kept_tokens < m.prompt_tokens
    assert m.prefill_tps == pytest.approx((m.prompt_tokens - m.cached_tokens) / m.ttft_s)
