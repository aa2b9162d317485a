"""The `brisk` command, run as a user runs it (a subprocess), on a tiny model."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from brisk.engine.models.store import ModelStore
from tests import cli_here


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory, tiny_llama_dir):
    home = tmp_path_factory.mktemp("cli-home")
    ModelStore(home).install_folder(tiny_llama_dir, model_id="tiny", source="test")
    return home


@pytest.fixture(scope="module")
def roomy_home(tmp_path_factory):
    """A tiny model with room for a document (the `tiny` one holds 512 tokens)."""
    from tests.tiny_models import make_tiny_model

    home = tmp_path_factory.mktemp("roomy-home")
    roomy = make_tiny_model(tmp_path_factory.mktemp("roomy") / "roomy", "qwen2", context_length=4096)
    ModelStore(home).install_folder(roomy, model_id="roomy", source="test")
    return home


def brisk(home, *args, input=None):
    env = dict(os.environ, BRISK_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "brisk.engine.host.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        input=input,
        timeout=300,
    )


# What the command refuses, and the model store's commands, are checked through the CLI's entry
# point in this process (tests/cli_here.py; a subprocess costs ~2.5 CPU-s); the turns, `chat`,
# `info` and `--version` above and below run as a user runs them.
brisk_here = cli_here.brisk_here


def test_run_json_prints_the_documented_object(cli_home):
    out = brisk(
        cli_home,
        "run",
        "--model",
        "tiny",
        "--prompt",
        "The quick brown fox",
        "--temp",
        "0",
        "--max-tokens",
        "8",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"model", "text", "token_ids", "metrics", "settings"}
    assert len(result["token_ids"]) <= 8 and result["settings"]["temperature"] == 0
    for key in (
        "ttft_s",
        "prompt_tokens",
        "cached_tokens",
        "prefilled_tokens",
        "prefill_tps",
        "generated_tokens",
        "decode_tps",
        "kv_bytes",
        "peak_memory_bytes",
        "finish_reason",
    ):
        assert key in result["metrics"]
    # Same seed-free greedy request twice: same answer.
    again = json.loads(
        brisk(
            cli_home,
            "run",
            "--model",
            "tiny",
            "--prompt",
            "The quick brown fox",
            "--temp",
            "0",
            "--max-tokens",
            "8",
            "--json",
        ).stdout
    )
    assert again["token_ids"] == result["token_ids"]
    # lookup decoding is on by default (auto, no draft); --no-lookup decodes plainly, same tokens
    assert result["settings"]["lookup"] and result["metrics"]["spec_decode"] == "auto (lookup)"
    plain = json.loads(
        brisk(
            cli_home,
            "run",
            "--model",
            "tiny",
            "--prompt",
            "The quick brown fox",
            "--temp",
            "0",
            "--max-tokens",
            "8",
            "--no-lookup",
            "--json",
        ).stdout
    )
    assert not plain["settings"]["lookup"] and plain["metrics"]["spec_decode"] == "off"
    assert plain["token_ids"] == result["token_ids"]


def test_run_streams_text_and_reports_metrics(cli_home):
    out = brisk(cli_home, "run", "--model", "tiny", "--prompt", "hello", "--temp", "0", "--max-tokens", "5")
    assert out.returncode == 0 and "ttft" in out.stderr and "decode" in out.stderr


def test_run_rejects_binary_and_missing_prompt_files(cli_home, tmp_path):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x89PNG\x00\x00\x01")
    out = brisk_here(cli_home, "run", "--model", "tiny", "--prompt-file", str(binary))
    assert out.returncode == 1 and "binary file" in out.stderr
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café".encode("latin-1"))
    out = brisk_here(cli_home, "run", "--model", "tiny", "--prompt-file", str(latin))
    assert out.returncode == 1 and "not UTF-8" in out.stderr
    out = brisk_here(cli_home, "run", "--model", "tiny", "--prompt-file", str(tmp_path / "nope.txt"))
    assert out.returncode == 1 and "not found" in out.stderr


def test_run_on_a_missing_model_lists_what_is_installed(cli_home):
    out = brisk_here(cli_home, "run", "--model", "ghost", "--prompt", "hi")
    assert out.returncode == 1 and "'ghost' is not installed (installed: tiny)" in out.stderr


def test_run_refuses_an_oversized_prompt_with_both_numbers(cli_home):
    out = brisk_here(cli_home, "run", "--model", "tiny", "--prompt", "fox " * 700)
    assert out.returncode == 1 and "holds at most 512" in out.stderr


def test_chat_reuses_the_prompt_cache_across_turns(cli_home):
    out = brisk(
        cli_home, "chat", "--model", "tiny", "--temp", "0", "--max-tokens", "4", input="hello there\nand again\n/quit\n"
    )
    assert out.returncode == 0, out.stderr
    cached = [line for line in out.stdout.splitlines() if "cached" in line]
    assert len(cached) == 2
    assert cached[0].split("cached ")[1].startswith("0/") and not cached[1].split("cached ")[1].startswith("0/")


def test_info_reports_blas_and_dtype(cli_home):
    out = brisk(cli_home, "info", "--json", "--model", "tiny")
    info = json.loads(out.stdout)
    from brisk.kernels import plan

    here = plan.current()  # the subprocess decides the same plan from the same environment
    assert info["compute_dtype"] == here.compute_dtype and info["kernel_plan"] == here.describe()
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not here.native:  # BRISK_KERNELS=off: MLX's own paths, as on a GPU
        assert info["packed_kv_attention"] == "portable MLX (turned off by BRISK_KERNELS=off)"
    else:
        assert info["compute_dtype"] == "float32"
        assert info["packed_kv_attention"].startswith("native" if compiler else "portable MLX (no C++ compiler")
        assert info["few_row_matmul"].startswith("native" if compiler else "portable MLX (no C++ compiler")
    if here.native and compiler and os.uname().machine == "x86_64":
        flags = set(open("/proc/cpuinfo").read().split())
        vnni = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags
        assert info["quantized_products"].startswith("VNNI-512" if vnni else "AVX2" if "avx2" in flags else "float x")
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64":
        # Which library answers is checked by name; its measured speed depends on the machine's
        # load, so it is only checked to be a measurement.
        assert info["blas"] == "mkl" and info["sgemm_gflops"] > 0
    # tiny: 2 layers, 2 kv heads, head_dim 16 (not divisible by group 32: no packed rows)
    assert info["model"]["kv"] == [
        {
            "k_bits": 16,
            "v_bits": 16,
            "kv_bits": 16,
            "bytes_per_token": 2 * 2 * 2 * 16 * 2,  # K and V stored float16
            "max_context": info["model"]["free_bytes_beside_weights"] // 256,
        }
    ]


def test_info_plans_memory_with_the_chosen_key_and_value_bits(cli_home):
    """Keys are packed per channel (any head dim); values per token need the group to divide it."""
    out = brisk(cli_home, "info", "--json", "--model", "tiny", "--k-bits", "4", "--v-bits", "16")
    rows = json.loads(out.stdout)["model"]["kv"]
    # 2 layers, 2 kv heads: keys 16·4/8 bytes + a float16 scale and bias per 32 tokens, values float16
    assert rows[-1]["k_bits"] == 4 and rows[-1]["v_bits"] == 16
    assert rows[-1]["bytes_per_token"] == 2 * 2 * (16 * 4 / 8 + 16 / 32 * 4 + 16 * 2)
    text = brisk(cli_home, "info", "--model", "tiny", "--k-bits", "4", "--v-bits", "16").stdout
    assert "K bits" in text and "V bits" in text


def test_models_list_and_rm(cli_home, tiny_llama_dir):
    ModelStore(cli_home).install_folder(tiny_llama_dir, model_id="spare", source="test")
    listed = json.loads(brisk_here(cli_home, "models", "list", "--json").stdout)
    assert {e["id"] for e in listed} == {"tiny", "spare"}
    assert brisk_here(cli_home, "models", "rm", "spare").returncode == 0
    assert "spare" not in brisk_here(cli_home, "models", "list").stdout
    out = brisk_here(cli_home, "models", "rm", "spare")
    assert out.returncode == 1 and "not installed" in out.stderr


def test_import_gguf_command(cli_home, tmp_path, tiny_llama_dir):
    from tests.gguf_writer import write_gguf

    gguf_file = write_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    out = brisk_here(cli_home, "models", "import-gguf", str(gguf_file), "--id", "from-gguf")
    assert out.returncode == 0, out.stderr
    out = brisk(
        cli_home, "run", "--model", "from-gguf", "--prompt", "hello", "--temp", "0", "--max-tokens", "4", "--json"
    )
    assert out.returncode == 0, out.stderr
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model")
    out = brisk_here(cli_home, "models", "import-gguf", str(notes), "--id", "bad")
    assert out.returncode == 1 and "not a GGUF file" in out.stderr
    assert "bad" not in brisk_here(cli_home, "models", "list").stdout


# The whole benchmarks above run under `pytest -m bench` (pyproject.toml); the default run keeps
# these cheaper checks of what only they tested: `brisk bench` dispatches and refuses bad
# arguments in one line, and every specdecode variant (BLAS verify, mlx-lm) is plain greedy's.


def test_bench_refuses_unknown_engines_and_content_kinds_in_one_line(cli_home):
    out = brisk_here(cli_home, "bench", "peers", "--model", "tiny", "--engines", "brisk,ollama")
    assert out.returncode == 2 and "subset of brisk,mlx_lm,llama_cpp" in out.stderr
    out = brisk_here(cli_home, "bench", "specdecode", "--target", "tiny", "--contents", "poem", "--runs", "1")
    assert out.returncode != 0 and "unknown content kind 'poem'" in out.stderr
    assert "Traceback" not in out.stderr


def test_bench_comes_from_the_benchmarks_own_distribution():
    """Brisk's wheel leaves the benchmarks out: `brisk bench` is the command bench/ registers."""
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="brisk.commands", name="bench")
    assert entry.value == "brisk.bench.cli:add_bench_parser" and entry.dist.name == "brisk-bench"


@pytest.mark.parametrize("args", [[], ["--help"], ["doc-qa", "--help"], ["kv", "--model", "tiny", "--json"]])
def test_bench_without_the_benchmarks_installed_says_how_to_get_them_in_one_line(cli_home, monkeypatch, args):
    from brisk.engine.host import cli_extensions

    monkeypatch.setattr(cli_extensions, "entry_points", lambda group: [])  # as from Brisk's wheel alone
    out = brisk_here(cli_home, "bench", *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "brisk bench: the benchmarks are not installed: "
        "from Brisk's source checkout, pip install -e ./bench (brisk-bench is not on PyPI; "
        "where it is published beside Brisk, pip install 'brisk[bench]')"
    ]


def test_a_bench_that_does_not_import_leaves_the_other_commands_running(cli_home, monkeypatch):
    """A broken install (the package gone, its entry point left): one line for `brisk bench`."""
    from importlib.metadata import EntryPoint

    from brisk.engine.host import cli_extensions

    gone = EntryPoint(name="bench", value="brisk.bench_gone.cli:add_bench_parser", group="brisk.commands")
    monkeypatch.setattr(cli_extensions, "entry_points", lambda group: [gone])
    out = brisk_here(cli_home, "bench", "kv", "--model", "tiny")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("brisk bench: brisk.bench_gone.cli:add_bench_parser does not load: No module named")
    assert brisk_here(cli_home, "models", "list").returncode == 0


def test_every_specdecode_variant_gives_plain_greedys_output(cli_home, monkeypatch, capsys):
    """What `brisk bench specdecode` runs, in this process: a model drafting for itself, with
    the native and the BLAS verify pass, and stock mlx-lm's speculative decoding."""
    from brisk.bench.specdecode import run_specdecode

    monkeypatch.setenv("BRISK_HOME", str(cli_home))
    payload = run_specdecode(
        "tiny",
        "tiny",
        [2],
        contents=["code"],
        runs=1,
        gen=8,
        temp=0.0,
        rules=["rejection"],
        mlx_lm_ks=[2],
        as_json=True,
        blas_ks=[2],
    )
    rows = {r["variant"]: r for r in payload["rows"]}
    assert list(rows) == ["plain", "lookup", "k=2", "auto+lookup", "k=2 blas verify", "mlx-lm k=2"]
    assert all(r["same_output"] and r["tokens"] > 0 for r in rows.values())
    assert rows["k=2"]["acceptance"] == 1.0  # a model drafting for itself is always right
    assert len(json.loads(capsys.readouterr().out)["rows"]) == len(rows)  # --json prints the payload
    with pytest.raises(SystemExit, match="tiny could not answer: The conversation is"):  # 512 tokens hold no file
        run_specdecode(
            "tiny",
            None,
            [],
            contents=["code-edit"],
            runs=1,
            gen=8,
            temp=0.0,
            rules=["rejection"],
            mlx_lm_ks=[],
            as_json=True,
        )


@pytest.mark.bench
def test_bench_verify_and_specdecode_run_their_ab_variants(cli_home):
    """The benchmarks behind the speculative numbers run end to end: the verify pass with and
    without the native matmul, and every specdecode variant (native and BLAS verify, mlx-lm)
    giving the plain greedy output."""
    out = brisk(
        cli_home, "bench", "verify", "--model", "tiny", "--rows", "2,5", "--context", "40", "--runs", "1", "--json"
    )
    assert out.returncode == 0, out.stderr
    verify = json.loads(out.stdout)
    assert [r["rows"] for r in verify["rows"]] == [2, 5]
    assert all(r["native_ms"] > 0 and r["blas_ms"] > 0 and r["one_row_ms"] > 0 for r in verify["rows"])
    out = brisk(
        cli_home,
        "bench",
        "specdecode",
        "--target",
        "tiny",
        "--draft",
        "tiny",
        "--num-draft",
        "2,auto",
        "--blas-verify",
        "2",
        "--mlx-lm",
        "2",
        "--contents",
        "code",
        "--gen",
        "8",
        "--runs",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert [r["variant"] for r in rows] == [
        "plain",
        "lookup",
        "k=2",
        "auto",
        "auto+lookup",
        "k=2 blas verify",
        "mlx-lm k=2",
    ]
    assert all(r["same_output"] for r in rows)
    assert rows[2]["acceptance"] == 1.0  # a model drafting for itself is always right


@pytest.mark.bench
def test_bench_specdecode_without_a_draft_runs_the_grounded_kinds(cli_home, roomy_home):
    """No draft model: plain vs lookup, on conversations built from a document, a source
    file and the target's own earlier answer."""
    out = brisk(
        roomy_home,
        "bench",
        "specdecode",
        "--target",
        "roomy",
        "--contents",
        "quote,code-edit,follow-up",
        "--gen",
        "8",
        "--runs",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert [(r["content"], r["variant"]) for r in rows] == [
        (kind, variant) for kind in ("quote", "code-edit", "follow-up") for variant in ("plain", "lookup")
    ]
    assert all(r["same_output"] and r["tokens"] > 0 for r in rows)
    out = brisk(cli_home, "bench", "specdecode", "--target", "tiny", "--contents", "poem", "--runs", "1")
    assert out.returncode != 0 and "unknown content kind 'poem'" in out.stderr
    out = brisk(cli_home, "bench", "specdecode", "--target", "tiny", "--contents", "code-edit", "--runs", "1")
    assert out.returncode != 0 and "tiny could not answer: The conversation is" in out.stderr


@pytest.mark.bench
def test_bench_peers_runs_each_engine_in_its_own_process_and_says_what_it_skipped(cli_home):
    out = brisk(
        cli_home,
        "bench",
        "peers",
        "--model",
        "tiny",
        "--prompt-tokens",
        "40,80",
        "--runs",
        "1",
        "--gen-tokens",
        "4",
        "--engines",
        "brisk,mlx_lm,llama_cpp",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert [e["requested_tokens"] for e in payload["lengths"]] == [40, 80]
    for entry in payload["lengths"]:
        for engine in ("brisk", "mlx_lm"):
            assert entry[f"{engine}_prefill_tps"] > 0 and entry[f"{engine}_decode_tps"] > 0
            assert entry[f"{engine}_peak_rss"] > 10e6 and entry[f"{engine}_ttft_s"] > 0
        # the same text for both; Brisk's turn wraps it in the chat template
        assert entry["requested_tokens"] <= entry["mlx_lm_prompt_tokens"] < entry["brisk_prompt_tokens"]
        assert "llama_cpp_prefill_tps" not in entry
    assert any("llama.cpp skipped" in note for note in payload["notes"])  # a folder install keeps no GGUF
    out = brisk(cli_home, "bench", "peers", "--model", "tiny", "--engines", "brisk,ollama")
    assert out.returncode == 2 and "subset of brisk,mlx_lm,llama_cpp" in out.stderr


@pytest.mark.bench
def test_bench_uniprefill_and_its_quality_run_end_to_end(cli_home, tmp_path):
    """The benchmarks behind UniPrefill's numbers: p = 1 keeps every token at every drop
    layer, a low p drops some, and the quality bench scores needle, counting and perplexity."""
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. def main(): return 42\n" * 60)
    out = brisk(
        cli_home,
        "bench",
        "uniprefill",
        "--model",
        "tiny",
        "--prompt-tokens",
        "400",
        "--top-p",
        "0.3,1.0",
        "--runs",
        "1",
        "--text-file",
        str(text),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rows = {r["p"]: r for r in json.loads(out.stdout)["rows"]}
    assert all(k == n for _, n, k in rows[1.0]["kept_per_drop"]) and rows[1.0]["flops_saved"] == 0.0
    assert any(k < n for _, n, k in rows[0.3]["kept_per_drop"]) and rows[0.3]["bound"] > 1.0
    assert all(r["speedup"] > 0 and r["dense_ttft_s"] > 0 for r in rows.values())
    out = brisk(
        cli_home,
        "bench",
        "uniprefill-quality",
        "--model",
        "tiny",
        "--top-p",
        "0.5",
        "--tokens",
        "350",
        "--depths",
        "0.5",
        "--entries",
        "8",
        "--green",
        "2",
        "--seeds",
        "1",
        "--text-file",
        str(text),
        "--context",
        "300",
        "--continuation",
        "16",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    quality = json.loads(out.stdout)
    assert len(quality["needle"]) == 1 and len(quality["counting"]) == 1
    assert quality["ppl"][0]["ppl_dense"] > 1 and quality["ppl"][0]["ratio"] > 0


def test_version_names_brisk_mlx_mlx_lm_and_the_blas(tmp_path):
    import mlx.core as mx
    import mlx_lm

    from brisk.engine.version import __version__

    out = brisk(tmp_path, "--version")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith(f"Brisk {__version__} ")
    assert f"mlx {mx.__version__}" in line and f"mlx-lm {mlx_lm.__version__}" in line and "BLAS: " in line


def test_the_package_version_is_the_one_in_engine_version():
    from importlib.metadata import version

    from brisk.engine.version import __version__

    assert version("brisk") == __version__


def test_bench_overhead_time_split_says_how_the_pieces_compare_with_the_measured_time():
    """Pieces timed alone can sum to more than the measured step (each pays its own
    dispatch): the line gave that as a negative "other" share; now it is a plain ratio."""
    from brisk.bench.overhead import split_line

    over = split_line("decode", "ms/token", 1000.0, {"measured_total": 0.010, "mlp": 0.008, "lm_head": 0.004})
    assert "mlp 8 (67%)" in over and "lm_head 4 (33%)" in over
    assert "sum to 120% of the measured time" in over and "-" not in over
    under = split_line("prefill", "s", 1.0, {"measured_total": 2.0, "mlp": 1.0, "projections": 0.5})
    assert "sum to 75% of the measured time" in under


def test_sparse_ppl_cuts_spread_from_a_texts_start_to_the_last_window_that_fits():
    from brisk.bench.specprefill import cut_offsets

    assert cut_offsets(10_000, 6144, 256, 1) == [0]
    spread = cut_offsets(10_000, 6144, 256, 3)
    assert spread == [0, 1800, 3600] and spread[-1] + 6144 + 256 == 10_000
    assert cut_offsets(6400, 6144, 256, 4) == [0]  # one window fits, once
    assert cut_offsets(6399, 6144, 256, 2) == []


@pytest.mark.bench
def test_bench_sparse_ppl_cuts_every_text_and_ends_with_the_geometric_mean(cli_home, tmp_path):
    import math

    prose = tmp_path / "prose.txt"
    prose.write_text(" ".join(f"Line {i} says the river {i % 7} runs north." for i in range(200)))
    code = tmp_path / "code.py"
    code.write_text("\n".join(f"def f{i}(x):\n    return x * {i} + g{i % 5}(x)" for i in range(200)))
    args = ["bench", "sparse-ppl", "--target", "tiny", "--draft", "tiny", "--context", "256", "--cuts", "3"]
    out = brisk(cli_home, *args, "--text-file", str(prose), "--text-file", str(code), "--continuation", "16", "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert [(r["text"], r["context"]) for r in payload["rows"]] == [("prose.txt", 256)] * 3 + [("code.py", 256)] * 3
    assert len({r["at"] for r in payload["rows"][:3]}) == 3
    ratios = [r["ratio"] for r in payload["rows"]]
    assert payload["geomean"]["256"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 6))
    short = tmp_path / "short.txt"
    short.write_text("too short")
    out = brisk(cli_home, *args, "--text-file", str(short))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "short.txt has" in out.stderr and "too few for a 256-token context" in out.stderr
