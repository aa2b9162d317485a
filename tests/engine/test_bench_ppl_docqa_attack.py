"""`brisk bench sparse-ppl` and `brisk bench doc-qa` (--only, --save, --rescore) given bad or
odd inputs: each refused in one line before any work, or counted right (tiny models)."""

import json
import math
import pathlib
from types import SimpleNamespace

import pytest

from brisk.engine.models.store import ModelStore
from tests.cli_here import brisk_here


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory, tiny_llama_dir):
    home = tmp_path_factory.mktemp("cli-home")
    ModelStore(home).install_folder(tiny_llama_dir, model_id="tiny", source="test")  # holds 512 tokens
    return home


def prose(n: int) -> str:
    return " ".join(f"Line {i} says the river {i % 7} runs north." for i in range(n))


def one_line_error(out) -> str:
    """The error a refused command printed: one line, no traceback, not a crash report."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith("brisk: error:") and "unexpectedly" not in lines[0]
    return lines[0]


PPL = ["bench", "sparse-ppl", "--target", "tiny", "--draft", "tiny", "--continuation", "8"]


def test_sparse_ppl_refuses_a_text_file_it_cannot_read_in_one_line(cli_home, tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.txt").write_bytes("café au lait ".encode("latin-1") * 50)
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 20)
    cases = {"missing.txt": "not found", "folder": "is a folder", "latin1.txt": "not UTF-8", "blob.bin": "binary"}
    for name, says in cases.items():
        error = one_line_error(brisk_here(cli_home, *PPL, "--context", "64", "--text-file", str(tmp_path / name)))
        assert says in error and name in error


def test_sparse_ppl_counts_two_texts_of_one_name_and_a_repeated_file_or_context_once(cli_home, tmp_path):
    """Texts were keyed by their file name: a second `x.txt` from another folder replaced the
    first, and a context given twice counted its windows (and printed its mean) twice."""
    for folder, start in (("a", 0), ("b", 500)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.txt").write_text(prose(start + 60)[start * 8 :])
    first, second = str(tmp_path / "a" / "x.txt"), str(tmp_path / "b" / "x.txt")
    texts = ["--text-file", first, "--text-file", second, "--text-file", first]
    out = brisk_here(cli_home, *PPL, "--context", "64,64", *texts, "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert [r["text"] for r in payload["rows"]] == [first, second] and payload["texts"] == [first, second]
    logs = [math.log(r["ratio"]) for r in payload["rows"]]
    assert list(payload["geomean"]) == ["64"]
    assert payload["geomean"]["64"] == pytest.approx(math.exp(sum(logs) / 2))


def test_sparse_ppl_refuses_what_does_not_fit_before_reading_any_window(cli_home, tmp_path, monkeypatch):
    """A context and continuation past the target's context ran (garbage positions); a text
    too short for the context was found only after every earlier text had been measured."""
    from brisk.bench import specprefill

    reads = []
    real = specprefill._continuation_nll
    monkeypatch.setattr(specprefill, "_continuation_nll", lambda *a: reads.append(1) or real(*a))
    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_text(prose(400))
    short.write_text("Too short for any context.")
    past = brisk_here(cli_home, *PPL[:-1], "60", "--context", "500", "--text-file", str(long))
    assert "tiny holds 512 tokens" in one_line_error(past)
    both = brisk_here(cli_home, *PPL, "--context", "64", "--text-file", str(long), "--text-file", str(short))
    assert "short.txt has" in one_line_error(both) and reads == []


@pytest.mark.parametrize("keep", ["0", "-0.2", "nan", "1.5"])
@pytest.mark.parametrize("command", ["sparse-ppl", "doc-qa"])
def test_a_keep_outside_zero_to_one_is_refused_by_the_parser(cli_home, tmp_path, command, keep):
    """--keep 0 or -0.2 ran (select_chunks kept its sinks, or all chunks but the worst); nan crashed."""
    (tmp_path / "x.txt").write_text(prose(60))
    args = [*PPL, "--context", "64", "--text-file", str(tmp_path / "x.txt")] if command == "sparse-ppl" else []
    out = brisk_here(cli_home, *(args or ["bench", "doc-qa", "--target", "tiny"]), "--keep", keep)
    assert out.returncode == 2 and "is not a fraction in (0, 1]" in out.stderr


def saved_run(**over) -> dict:
    row = {"seed": 3, "length": 4000, "depth": 0.5, "cold": True, "scoring_s": 0.0, "read_share": 1.0, "held_out": True}
    row |= {"question": "Which licence covers the archive?", "kind": "fact", "answer": "MIT", "flagged": False}
    rows = [{**row, "method": m, "right": ok, "ttft_s": 1.0} for m, ok in (("dense", True), ("uniprefill", False))]
    run = {"target": "t", "draft": None, "model_key": "k", "draft_key": None, "methods": ["dense", "uniprefill"]}
    return {**run, "held_out": [3], "rows": rows, **over}


def table_line(out: str, method: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.strip().startswith(method + " "))


def test_rescore_refuses_files_that_are_not_saved_runs_in_one_line(cli_home, tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "cut.json").write_text(json.dumps(saved_run())[:40])  # a run stopped mid-write
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "blob.json").write_bytes(b"\x00\xff" * 100)
    lacking = saved_run()
    del lacking["rows"][0]["right"]
    (tmp_path / "lacking.json").write_text(json.dumps(lacking))
    cases = {"missing.json": "not found", "folder": "is a folder", "cut.json": "not a saved doc-qa run"}
    cases |= {"list.json": "not a saved doc-qa run", "blob.json": "binary", "lacking.json": "lacks right"}
    for name, says in cases.items():
        error = one_line_error(brisk_here(cli_home, "bench", "doc-qa", "--rescore", str(tmp_path / name)))
        assert says in error and name in error


def test_rescore_reads_a_run_saved_without_methods_and_counts_a_file_merged_with_itself_once(cli_home, tmp_path):
    old = saved_run()
    for key in ("methods", "held_out", "draft"):  # what an older run may not have written
        del old[key]
    (tmp_path / "old.json").write_text(json.dumps(old))
    out = brisk_here(cli_home, "bench", "doc-qa", "--rescore", str(tmp_path / "old.json"))
    assert out.returncode == 0, out.stderr
    assert table_line(out.stdout, "uniprefill")[1:3] == ["1", "0.000"]
    (tmp_path / "run.json").write_text(json.dumps(saved_run()))
    twice = ["--rescore", str(tmp_path / "run.json")] * 2
    out = brisk_here(cli_home, "bench", "doc-qa", *twice)
    assert out.returncode == 0, out.stderr
    assert table_line(out.stdout, "dense")[1:3] == ["1", "1.000"] and table_line(out.stdout, "uniprefill")[1] == "1"
    assert "2 answers given twice counted once" in out.stderr


@pytest.mark.parametrize("extra", [["--target", "tiny"], ["--save", "merged.json"], ["--only", "dense"]])
def test_rescore_refuses_a_runs_own_options_it_would_ignore(cli_home, tmp_path, extra):
    (tmp_path / "run.json").write_text(json.dumps(saved_run()))
    out = brisk_here(cli_home, "bench", "doc-qa", "--rescore", str(tmp_path / "run.json"), *extra)
    assert out.returncode == 1 and "--rescore runs no model; drop " + extra[0] in out.stderr and not out.stdout


def test_an_only_column_that_cannot_run_is_refused_before_the_run(cli_home):
    """--only specprefill without a draft ran nothing and saved a run without its column."""
    out = brisk_here(cli_home, "bench", "doc-qa", "--target", "tiny", "--only", "specprefill")
    assert "--only specprefill needs --draft" in one_line_error(out)
    out = brisk_here(cli_home, "bench", "doc-qa", "--target", "tiny", "--only", "uniprefill", "--no-uniprefill")
    assert "leave nothing to run" in one_line_error(out)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model_by_key

    folder = make_tiny_model_by_key(tmp_path_factory.mktemp("dq") / "llama", "llama", seed=3, context_length=4096)
    return load_folder(folder)


def fake_run(lm, monkeypatch, tmp_path, answer):
    """run_doc_qa with `lm` as the model and `answer(doc, tokens, on_row, log)` asking the questions."""
    from brisk.bench import doc_qa

    monkeypatch.setattr("brisk.engine.models.loader.load_model", lambda model_id: lm)
    monkeypatch.setattr(
        doc_qa, "build_document", lambda seed, *a: SimpleNamespace(seed=seed, sources=["x"], questions=[])
    )
    monkeypatch.setattr(
        doc_qa,
        "ask_all",
        lambda target, draft, doc, methods, *, tokens, on_row, log=print, **k: answer(doc, tokens, on_row, log),
    )
    save = tmp_path / "run.json"
    run = lambda lengths: doc_qa.run_doc_qa(  # noqa: E731
        "m", None, lengths, [1], [], keeps=[0.2], only=["dense"], save=str(save), as_json=True
    )
    return run, save


def test_lengths_capped_to_one_size_ask_each_document_once_and_json_is_all_stdout_holds(
    lm, monkeypatch, tmp_path, capsys
):
    asked = []

    def answer(doc, tokens, on_row, log):
        asked.append((doc.seed, tokens))
        log("  seed 1 fact dense right=True")
        on_row({**saved_run()["rows"][0], "seed": doc.seed, "length": tokens, "held_out": False})

    run, _ = fake_run(lm, monkeypatch, tmp_path, answer)
    run([8192, 16384])  # both capped to the 4096-token model's room
    assert asked == [(1, 4096 - 256)]
    out = capsys.readouterr()
    assert json.loads(out.out)["rows"][0]["length"] == 4096 - 256 and "seed 1 fact dense" in out.err


def test_ctrl_c_while_an_answer_is_saved_keeps_the_answers_saved_before(lm, monkeypatch, tmp_path):
    write_text = pathlib.Path.write_text

    def interrupted(self, data, *a, **k):  # Ctrl-C halfway through writing the file
        write_text(self, data[: len(data) // 2], *a, **k)
        raise KeyboardInterrupt

    def answer(doc, tokens, on_row, log):
        row = {**saved_run()["rows"][0], "length": tokens, "held_out": False}
        on_row(row)
        monkeypatch.setattr(pathlib.Path, "write_text", interrupted)
        on_row({**row, "depth": 0.9})

    run, save = fake_run(lm, monkeypatch, tmp_path, answer)
    with pytest.raises(KeyboardInterrupt):
        run([1024])
    monkeypatch.undo()
    assert [r["depth"] for r in json.loads(save.read_text())["rows"]] == [0.5]


def test_an_unknown_question_kind_is_refused_by_the_parser(cli_home):
    """--kinds facts (a typo) filtered every question out: a run that asked nothing."""
    out = brisk_here(cli_home, "bench", "doc-qa", "--target", "tiny", "--kinds", "fact,facts")
    assert out.returncode == 2 and "expected a subset of fact,two_hop" in out.stderr


def test_a_column_run_without_a_draft_merges_with_the_run_of_a_draft(tmp_path):
    """`--only uniprefill` needs no draft, but a run saved without one was refused beside the
    run with one ("not of one target and draft"); two runs of two drafts still are."""
    from brisk.bench.doc_qa import rescore
    from brisk.engine.api.errors import BriskError

    spec = saved_run(draft="d", draft_key="dk", methods=["dense", "specprefill 0.2"])
    spec["rows"][1]["method"] = "specprefill 0.2"
    uni = saved_run(methods=["uniprefill"])
    uni["rows"] = uni["rows"][1:]
    for name, run in (("spec", spec), ("uni", uni), ("other", {**spec, "draft": "e"})):
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    for order in (["spec", "uni"], ["uni", "spec"]):
        merged = rescore([str(tmp_path / f"{name}.json") for name in order], as_json=False)
        assert (merged["draft"], merged["draft_key"], len(merged["rows"])) == ("d", "dk", 3)
    with pytest.raises(BriskError, match="not of one target and draft"):
        rescore([str(tmp_path / "spec.json"), str(tmp_path / "other.json")], as_json=False)


def test_save_refuses_a_file_that_exists_so_a_column_run_later_cannot_replace_the_long_run(lm, monkeypatch, tmp_path):
    def answer(doc, tokens, on_row, log):
        on_row({**saved_run()["rows"][0], "length": tokens, "held_out": False})

    run, save = fake_run(lm, monkeypatch, tmp_path, answer)
    save.write_text(json.dumps(saved_run()))  # hours of answers
    from brisk.engine.api.errors import BriskError

    with pytest.raises(BriskError, match="the file exists"):
        run([1024])
    assert json.loads(save.read_text()) == saved_run()
    save.unlink()
    run([1024])
    assert len(json.loads(save.read_text())["rows"]) == 1
