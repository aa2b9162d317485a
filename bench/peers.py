"""`brisk bench peers`: Brisk against llama.cpp and bare mlx-lm on the GGUF a model came from.

Each engine runs in its own process per round (so its peak RSS is its own), rounds
interleaved, medians reported: prefill tok/s, decode tok/s, TTFT, peak RSS, model bytes.
- brisk: a chat turn through Session (the app's path), greedy.
- mlx_lm: the same installed folder loaded by mlx-lm alone (its own quantized kernels).
- llama_cpp: llama-cpp-python on the GGUF file (an optional bench-only install, see
  ../shared/wheels/README.md); skipped with a note when it is not installed.
The prompt is the same text for all; each engine counts it with its own tokenizer.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from brisk.bench.common import filler_text, median, print_table, token_clock
from brisk.engine.runtime.python_argv import module_argv

ENGINES = ("brisk", "mlx_lm", "llama_cpp")


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _brisk(model_id: str, texts: list[str], gen: int) -> list[dict]:
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    rows = []
    for text in texts:
        session = Session(lm, ChatSettings(model=model_id, temperature=0.0, max_tokens=gen, spec_decode="off"))
        m = next(e for e in session.send(text) if isinstance(e, TurnFinished)).metrics
        rows.append(
            {
                "prompt_tokens": m.prompt_tokens,
                "ttft_s": m.ttft_s,
                "prefill_tps": m.prompt_tokens / m.ttft_s,
                "decode_tps": m.decode_tps,
            }
        )
    return rows


def _mlx_lm(folder: str, texts: list[str], gen: int) -> list[dict]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, tokenizer = load(folder)[:2]
    rows = []
    for text in texts:
        tokens = tokenizer.encode(text)
        start = time.perf_counter()
        first, last, count = token_clock(generate_step(mx.array(tokens), model, max_tokens=gen))
        rows.append(
            {
                "prompt_tokens": len(tokens),
                "ttft_s": first - start,
                "prefill_tps": len(tokens) / (first - start),
                "decode_tps": (count - 1) / max(last - first, 1e-9),
            }
        )
        mx.clear_cache()
    return rows


def _llama_cpp(gguf: str, texts: list[str], gen: int, threads: int) -> list[dict]:
    from llama_cpp import Llama

    rows = []
    for text in texts:
        llm = Llama(model_path=gguf, n_ctx=len(text) // 2 + gen + 64, n_threads=threads, n_batch=512, verbose=False)
        tokens = llm.tokenize(text.encode())
        start = time.perf_counter()
        llm.eval(tokens)
        token = llm.sample(temp=0.0)
        first = time.perf_counter()
        for _ in range(gen - 1):
            llm.eval([token])
            token = llm.sample(temp=0.0)
        last = time.perf_counter()
        rows.append(
            {
                "prompt_tokens": len(tokens),
                "ttft_s": first - start,
                "prefill_tps": len(tokens) / (first - start),
                "decode_tps": (gen - 1) / (last - first),
            }
        )
        llm.close()
    return rows


def worker(argv: list[str]) -> None:
    """Child process: run one engine over all prompts, print JSON rows and peak RSS."""
    engine, target, gen, threads = argv[0], argv[1], int(argv[2]), int(argv[3])
    texts = json.loads(sys.stdin.read())
    if engine == "brisk":
        rows = _brisk(target, texts, gen)
    elif engine == "mlx_lm":
        rows = _mlx_lm(target, texts, gen)
    else:
        rows = _llama_cpp(target, texts, gen, threads)
    print(json.dumps({"rows": rows, "peak_rss": _rss_bytes()}))


def _have_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _source_gguf(store, model_id: str) -> Path | None:
    from brisk.engine.models.bundled import BUNDLED

    for folder in (store.cache_dir / "bundled", store.cache_dir):
        candidate = folder / f"{BUNDLED[model_id].id}.gguf" if model_id in BUNDLED else None
        if candidate and candidate.is_file():
            return candidate
    return None


def run_peers(
    model_id: str,
    prompt_tokens: list[int],
    *,
    runs: int,
    gen_tokens: int,
    gguf: str | None,
    threads: int,
    as_json: bool,
    engines: tuple[str, ...] = ENGINES,
) -> dict:
    from brisk.engine.models.loader import load_model
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    lm = load_model(model_id, store=store)
    texts = [filler_text(lm.tokenizer, n) for n in prompt_tokens]
    gguf_path = Path(gguf) if gguf else _source_gguf(store, model_id)
    targets = {"brisk": model_id, "mlx_lm": str(store.path(model_id))}
    notes = []
    if "llama_cpp" not in engines:
        pass
    elif gguf_path is None or not gguf_path.is_file():
        notes.append("llama.cpp skipped: no GGUF (pass --gguf FILE; bundled installs keep it with --keep-download)")
    elif not _have_llama_cpp():
        notes.append("llama.cpp skipped: llama-cpp-python is not installed (see ../shared/wheels/README.md)")
    else:
        targets["llama_cpp"] = str(gguf_path)
    del lm
    targets = {name: target for name, target in targets.items() if name in engines}
    results: dict[str, list[dict]] = {name: [] for name in targets}
    for _ in range(runs):
        for name, target in targets.items():
            done = subprocess.run(
                module_argv("brisk.bench.peers", name, target, str(gen_tokens), str(threads)),
                input=json.dumps(texts),
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{name} failed: {done.stderr.strip()[-800:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    payload: dict[str, Any] = {
        "model": model_id,
        "runs": runs,
        "gen_tokens": gen_tokens,
        "threads": threads,
        "notes": notes,
        "model_bytes": {
            "brisk": store.get(model_id).memory_bytes,
            "gguf": gguf_path.stat().st_size if gguf_path and gguf_path.is_file() else None,
        },
        "lengths": [],
    }
    rows = []
    for i, n in enumerate(prompt_tokens):
        entry: dict[str, float] = {"requested_tokens": n}
        for name, rounds in results.items():
            per = [r["rows"][i] for r in rounds]
            for key in ("prompt_tokens", "ttft_s", "prefill_tps", "decode_tps"):
                entry[f"{name}_{key}"] = median(per, key)
            entry[f"{name}_peak_rss"] = median([{"v": r["peak_rss"]} for r in rounds], "v")
        payload["lengths"].append(entry)
        for name in results:
            rows.append(
                [
                    n,
                    name,
                    entry[f"{name}_prompt_tokens"],
                    entry[f"{name}_prefill_tps"],
                    entry[f"{name}_decode_tps"],
                    entry[f"{name}_ttft_s"],
                    entry[f"{name}_peak_rss"] / 1e6,
                ]
            )
    print_table(
        f"brisk bench peers: {model_id}, {runs} interleaved rounds, {threads} threads, medians",
        ["prompt", "engine", "tokens", "prefill tok/s", "decode tok/s", "ttft s", "peak RSS MB"],
        rows,
        payload,
        as_json,
    )
    if not as_json:
        for note in notes:
            print(note)
        if "llama_cpp" in results:
            for entry in payload["lengths"]:
                print(
                    f"at {entry['requested_tokens']} tokens, brisk / llama.cpp: prefill "
                    f"{entry['brisk_prefill_tps'] / entry['llama_cpp_prefill_tps']:.2f}x, decode "
                    f"{entry['brisk_decode_tps'] / entry['llama_cpp_decode_tps']:.2f}x, peak RSS "
                    f"{entry['brisk_peak_rss'] / entry['llama_cpp_peak_rss']:.2f}x"
                )
    return payload


if __name__ == "__main__":
    worker(sys.argv[1:])
