"""`brisk bench ...` argument parsing."""

from __future__ import annotations

import argparse

from brisk.engine.api.settings import layer_list


def _positive(text: str) -> int:
    """A count or size: a whole number of at least 1 (argparse reports anything else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _methods(text: str) -> list[str]:
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    known = ("dense", "specprefill", "uniprefill", "auto")
    if not chosen or any(m not in known for m in chosen):
        raise argparse.ArgumentTypeError(f"expected a subset of {','.join(known)}, got {text!r}")
    return chosen


def _kinds(text: str) -> list[str]:
    from brisk.bench.doc_corpus import KINDS

    chosen = [k.strip() for k in text.split(",") if k.strip()]
    if not chosen or any(k not in KINDS for k in chosen):  # an unknown one filtered every question out
        raise argparse.ArgumentTypeError(f"expected a subset of {','.join(KINDS)}, got {text!r}")
    return chosen


def _ints(text: str) -> list[int]:
    values = [_positive(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one number")
    return values


def _engines(text: str) -> tuple[str, ...]:
    known = ("brisk", "mlx_lm", "llama_cpp")
    names = tuple(x.strip().replace("-", "_").replace(".", "_") for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"engines are a comma-separated subset of {','.join(known)}")
    return names


def _fraction(text: str) -> float:
    """A keep fraction: in (0, 1] (0, a negative one or nan kept a few chunks or all of them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in (0, 1]")
    return value


def _fractions(text: str) -> list[float]:
    values = list(dict.fromkeys(_fraction(x.strip()) for x in text.split(",") if x.strip()))
    if not values:
        raise argparse.ArgumentTypeError("give at least one fraction")
    return values


def _ks(text: str) -> list:
    return [x.strip() if x.strip() == "auto" else int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (interleaved A/B, medians)").add_subparsers(
        dest="bench_cmd", required=True
    )
    p = bench.add_parser("overhead", help="Brisk's run path vs bare mlx-lm stream_generate")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[512, 2048])
    p.add_argument("--runs", type=_positive, default=3)
    p.add_argument("--gen-tokens", type=_positive, default=32)
    p.add_argument("--prefill-step", type=_positive, default=512)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _overhead(a))
    p = bench.add_parser("peers", help="Brisk vs llama.cpp (llama-cpp-python) vs bare mlx-lm on the model's GGUF")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[512, 2048, 8192])
    p.add_argument("--runs", type=_positive, default=3)
    p.add_argument("--gen-tokens", type=_positive, default=64)
    p.add_argument("--gguf", help="the GGUF file for llama.cpp (default: a bundled model's kept download)")
    p.add_argument("--threads", type=_positive, default=2)
    p.add_argument(
        "--engines",
        type=_engines,
        default=("brisk", "mlx_lm", "llama_cpp"),
        help="comma-separated subset of brisk,mlx_lm,llama_cpp (bare mlx-lm's quantized prefill "
        "takes minutes at 2K tokens)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _peers(a))
    p = bench.add_parser("serve", help="brisk serve over HTTP vs the engine in process: latency, TTFT, tok/s")
    p.add_argument("--model", required=True)
    p.add_argument("--clients", type=_ints, default=[1, 4])
    p.add_argument("--requests", type=_positive, default=20)
    p.add_argument("--gen-tokens", type=_positive, default=64)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _serve(a))
    p = bench.add_parser("kv", help="int4 KV cache: attention step time, decode tok/s, bytes, prefill peak")
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=_ints, default=[2048, 8192, 32768])
    p.add_argument("--runs", type=_positive, default=5)
    p.add_argument("--steps", type=_positive, default=8, help="decode steps per tok/s sample")
    p.add_argument("--kv-group-size", type=int, choices=(32, 64), default=32)
    p.add_argument("--prefill-tokens", type=int, default=2048, help="0 skips the prefill peak-memory check")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _kv(a))
    p = bench.add_parser("kv-quality", help="int4 vs unquantized KV: top-1 agreement and KL over greedy decoding")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[2048, 8192])
    p.add_argument("--gen", type=_positive, default=256)
    p.add_argument("--kv-group-size", type=int, choices=(32, 64), default=32)
    p.add_argument("--k-bits", type=_ints, default=[4], help="key bits to try, e.g. 4,8")
    p.add_argument("--v-bits", type=_ints, default=[4], help="value bits to try, e.g. 4,8")
    p.add_argument(
        "--key-layouts",
        default="channel",
        help="channel (per-channel keys), token (per-token keys, as before), or both: token,channel",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _kv_quality(a))
    p = bench.add_parser("specprefill", help="TTFT full vs SpecPrefill: speedup, r, 1/(r+k), G")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[2048, 4096, 8192])
    p.add_argument("--keep", type=_fractions, default=[0.1, 0.2, 0.3])
    p.add_argument("--runs", type=_positive, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _specprefill(a))
    p = bench.add_parser("needle", help="retrieve a fact hidden at several depths, full vs sparse prefill")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--tokens", type=_positive, default=4096)
    p.add_argument("--depths", type=_floats, default=[0.1, 0.5, 0.9])
    p.add_argument("--keep", type=_fraction, default=0.2)
    p.add_argument("--k-bits", type=int, choices=(16, 8, 4), default=16, help="KV key precision of both runs")
    p.add_argument("--v-bits", type=int, choices=(16, 8, 4), default=16, help="KV value precision of both runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _needle(a))
    p = bench.add_parser("counting", help="list and count entries spread over a log: full vs fixed keep vs auto")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--entries", type=_positive, default=100)
    p.add_argument("--green", type=_positive, default=6)
    p.add_argument("--seeds", type=_ints, default=[1, 2, 3])
    p.add_argument("--keep", type=_fraction, default=0.2)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _counting(a))
    p = bench.add_parser("sparse-ppl", help="continuation perplexity after sparse vs full prefill of a text")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--text-file", required=True, action="append", help="a long natural text (UTF-8); repeat for more")
    p.add_argument("--context", type=_ints, default=[2048, 4096])
    p.add_argument("--cuts", type=_positive, default=1, help="windows per text, spread from its start to its end")
    p.add_argument("--keep", type=_fraction, default=0.2)
    p.add_argument("--continuation", type=_positive, default=256)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _sparse_ppl(a))
    p = bench.add_parser("doc-qa", help="questions about real documents: dense vs SpecPrefill vs UniPrefill vs auto")
    p.add_argument("--target", help="the model that answers (not needed with --rescore)")
    p.add_argument("--draft", help="SpecPrefill's draft (without one: dense, UniPrefill and auto only)")
    p.add_argument("--lengths", type=_ints, default=[4096, 8192], help="document tokens (capped by the context)")
    p.add_argument("--seeds", type=_ints, default=[1, 2], help="document seeds the router's table may be tuned on")
    p.add_argument("--held-out", type=_ints, default=[3, 4], help="document seeds kept out of tuning")
    p.add_argument("--keep", type=_fractions, default=[0.1, 0.2, 0.3], help="SpecPrefill keep fractions")
    p.add_argument("--kinds", type=_kinds, help="a subset of fact,two_hop,aggregation,quote,code")
    p.add_argument("--no-uniprefill", action="store_true")
    p.add_argument(
        "--only",
        type=_methods,
        help="run just these of dense,specprefill,uniprefill,auto (a missing column; --rescore merges)",
    )
    p.add_argument("--save", help="write every answer to this JSON file as the run goes")
    p.add_argument(
        "--rescore", action="append", help="print the tables of a saved run again (no model runs); repeat to merge"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _doc_qa(a))
    p = bench.add_parser("uniprefill", help="TTFT dense vs UniPrefill: speedup, FLOP bound, kept per drop layer")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[2048, 8192, 16384])
    p.add_argument("--top-p", type=_floats, default=[0.95, 0.99])
    p.add_argument("--drop-layers", type=layer_list, default=None, help="e.g. 7,11,15 (default: the model's)")
    p.add_argument("--text-file", help="a real text as the prompt (default: the bench's filler prose)")
    p.add_argument("--runs", type=_positive, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _uniprefill(a))

    p = bench.add_parser(
        "uniprefill-quality", help="needle, counting recall and continuation perplexity: dense vs UniPrefill"
    )
    p.add_argument("--model", required=True)
    p.add_argument("--top-p", type=float, default=0.99)
    p.add_argument("--drop-layers", type=layer_list, default=None)
    p.add_argument("--tokens", type=_positive, default=4096, help="needle document length")
    p.add_argument("--depths", type=_floats, default=[0.1, 0.5, 0.9])
    p.add_argument("--entries", type=_positive, default=100, help="counting: log entries")
    p.add_argument("--green", type=_positive, default=6)
    p.add_argument("--seeds", type=_ints, default=[1, 2, 3])
    p.add_argument("--text-file", help="a long natural text for the perplexity check (skipped without)")
    p.add_argument("--context", type=_ints, default=[2048, 4096])
    p.add_argument("--continuation", type=_positive, default=256)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _uniprefill_quality(a))

    p = bench.add_parser("specdecode", help="speculative vs plain decoding per content kind: tok/s, acceptance")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", help="a draft model (without one: plain vs lookup decoding only)")
    p.add_argument("--num-draft", type=_ks, default=[1, 2, 3, 4, "auto"], help="e.g. 1,2,3,4,auto")
    p.add_argument(
        "--contents",
        type=lambda t: t.split(","),
        default=["structured", "code", "prose"],
        help="free: structured,code,prose; grounded in the context: quote,summary,code-edit,follow-up",
    )
    p.add_argument("--rules", type=lambda t: t.split(","), default=["rejection"], help="rejection,match")
    p.add_argument(
        "--mlx-lm",
        type=lambda t: _ints(t) if t.strip() else [],
        default=[2, 3],
        help="k values for mlx-lm's speculative decoding ('' for none)",
    )
    p.add_argument(
        "--blas-verify",
        type=_ks,
        default=[],
        help="k values (or auto) also run with the few-row native matmul off, e.g. 4,auto",
    )
    p.add_argument(
        "--cold-costs",
        action="store_true",
        help="every run learns the pair's draft and verify costs afresh (a first conversation with "
        "a pair); by default the runs share what earlier ones measured, as the app's chats do",
    )
    p.add_argument("--gen", type=_positive, default=64)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--runs", type=_positive, default=2)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _specdecode(a))
    p = bench.add_parser("decode-step", help="plain decoding: the compiled step vs mlx-lm's generate_step")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[512, 2048])
    p.add_argument("--runs", type=_positive, default=3)
    p.add_argument("--gen-tokens", type=_positive, default=64)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _decode_step(a))
    p = bench.add_parser("prefill-profile", help="where one real prefill's time goes: each part of every layer timed")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=_ints, default=[2048])
    p.add_argument("--step", type=_positive, default=512, help="prefill chunk size")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _prefill_profile(a))
    p = bench.add_parser("verify", help="a verify pass of R rows, in plain steps: native few-row matmul vs BLAS")
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=_ints, default=[2, 3, 5, 9])
    p.add_argument("--context", type=_positive, default=256)
    p.add_argument("--runs", type=_positive, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _verify(a))
    p = bench.add_parser(
        "spec-acceptance", help="expected acceptance of rejection sampling vs matching, same positions"
    )
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--contents", type=lambda t: t.split(","), default=["structured", "code", "prose"])
    p.add_argument("--gen", type=_positive, default=64)
    p.add_argument("--temp", type=float, default=0.7)
    p.add_argument("--seed", type=_positive, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _spec_acceptance(a))
    p = bench.add_parser("blas", help="MLX matmul GFLOP/s: reference BLAS vs Brisk's")
    p.add_argument("--runs", type=_positive, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _blas(a))
    from brisk.bench.distributed import add_distributed_bench

    add_distributed_bench(bench)  # 1 process vs N loopback ranks (bench/distributed.py)


def _overhead(args) -> int:
    from brisk.bench.overhead import run_overhead

    run_overhead(
        args.model,
        args.prompt_tokens,
        runs=args.runs,
        gen_tokens=args.gen_tokens,
        step=args.prefill_step,
        as_json=args.json,
    )
    return 0


def _serve(args) -> int:
    from brisk.bench.serve import run_serve_bench

    run_serve_bench(
        args.model, clients=args.clients, requests=args.requests, gen_tokens=args.gen_tokens, as_json=args.json
    )
    return 0


def _peers(args) -> int:
    from brisk.bench.peers import run_peers

    run_peers(
        args.model,
        args.prompt_tokens,
        runs=args.runs,
        gen_tokens=args.gen_tokens,
        gguf=args.gguf,
        engines=args.engines,
        threads=args.threads,
        as_json=args.json,
    )
    return 0


def _kv(args) -> int:
    from brisk.bench.kv import run_kv

    run_kv(
        args.model,
        args.context,
        runs=args.runs,
        steps=args.steps,
        group_size=args.kv_group_size,
        prefill_tokens=args.prefill_tokens,
        as_json=args.json,
    )
    return 0


def _kv_quality(args) -> int:
    from brisk.bench.kv_quality import run_kv_quality
    from brisk.engine.kv.fidelity import PackedMode
    from brisk.engine.kv.packed_cache import KEY_LAYOUTS

    layouts = [x.strip() for x in args.key_layouts.split(",") if x.strip()]
    bad = [x for x in layouts if x not in KEY_LAYOUTS] + [b for b in args.k_bits + args.v_bits if b not in (4, 8, 16)]
    if bad or not layouts:
        raise SystemExit(
            f"brisk bench kv-quality: unknown key layout or bits {bad}; layouts are {KEY_LAYOUTS}, bits 4, 8 or 16"
        )
    modes = [
        PackedMode(k, v, layout)
        for layout in layouts
        for k in args.k_bits
        for v in args.v_bits
        if (k, v) != (16, 16) and not (layout == "token" and k == 16)
    ]  # 16-bit keys have no layout
    run_kv_quality(
        args.model, args.prompt_tokens, gen=args.gen, group_size=args.kv_group_size, as_json=args.json, modes=modes
    )
    return 0


def _specprefill(args) -> int:
    from brisk.bench.specprefill import run_specprefill

    run_specprefill(args.target, args.draft, args.prompt_tokens, args.keep, runs=args.runs, as_json=args.json)
    return 0


def _needle(args) -> int:
    from brisk.bench.specprefill import run_needle

    run_needle(
        args.target,
        args.draft,
        args.tokens,
        args.depths,
        args.keep,
        as_json=args.json,
        k_bits=args.k_bits,
        v_bits=args.v_bits,
    )
    return 0


def _counting(args) -> int:
    from brisk.bench.counting import run_counting

    run_counting(args.target, args.draft, args.entries, args.green, args.seeds, args.keep, as_json=args.json)
    return 0


def _sparse_ppl(args) -> int:
    from brisk.bench.specprefill import run_perplexity

    run_perplexity(
        args.target,
        args.draft,
        args.text_file,
        args.context,
        args.keep,
        continuation=args.continuation,
        cuts=args.cuts,
        as_json=args.json,
    )
    return 0


def _doc_qa(args) -> int:
    from brisk.bench.doc_qa import rescore, run_doc_qa

    if args.rescore:
        # the saved runs are reported as they are: a run's own options would be silently ignored
        given = [o for o in ("target", "draft", "kinds", "only", "save", "no_uniprefill") if getattr(args, o)]
        if given:
            raise SystemExit(f"brisk bench doc-qa: --rescore runs no model; drop --{given[0].replace('_', '-')}")
        rescore(args.rescore, as_json=args.json)
        return 0
    if not args.target:
        raise SystemExit("brisk bench doc-qa: give --target (or --rescore FILE)")
    run_doc_qa(
        args.target,
        args.draft,
        args.lengths,
        args.seeds,
        args.held_out,
        keeps=args.keep,
        kinds=args.kinds,
        with_uniprefill=not args.no_uniprefill,
        only=args.only,
        save=args.save,
        as_json=args.json,
    )
    return 0


def _uniprefill(args) -> int:
    from brisk.bench.uniprefill import run_uniprefill

    run_uniprefill(
        args.model,
        args.prompt_tokens,
        args.top_p,
        runs=args.runs,
        drop_layers=args.drop_layers,
        text_file=args.text_file,
        as_json=args.json,
    )
    return 0


def _uniprefill_quality(args) -> int:
    from brisk.bench.uniprefill import run_uniprefill_quality

    run_uniprefill_quality(
        args.model,
        args.top_p,
        tokens=args.tokens,
        depths=args.depths,
        text_file=args.text_file,
        contexts=args.context,
        continuation=args.continuation,
        entries=args.entries,
        green=args.green,
        seeds=args.seeds,
        drop_layers=args.drop_layers,
        as_json=args.json,
    )
    return 0


def _specdecode(args) -> int:
    from brisk.bench.specdecode import run_specdecode

    run_specdecode(
        args.target,
        args.draft,
        args.num_draft,
        contents=args.contents,
        runs=args.runs,
        gen=args.gen,
        temp=args.temp,
        rules=args.rules,
        mlx_lm_ks=args.mlx_lm,
        as_json=args.json,
        blas_ks=args.blas_verify,
        cold_costs=args.cold_costs,
    )
    return 0


def _decode_step(args) -> int:
    from brisk.bench.decode_step import run_decode_step

    run_decode_step(args.model, args.prompt_tokens, runs=args.runs, gen_tokens=args.gen_tokens, as_json=args.json)
    return 0


def _prefill_profile(args) -> int:
    from brisk.bench.prefill_profile import run_prefill_profile

    run_prefill_profile(args.model, args.prompt_tokens, step=args.step, as_json=args.json)
    return 0


def _verify(args) -> int:
    from brisk.bench.verify import run_verify

    run_verify(args.model, args.rows, context=args.context, runs=args.runs, as_json=args.json)
    return 0


def _spec_acceptance(args) -> int:
    from brisk.bench.specdecode import run_acceptance

    run_acceptance(
        args.target, args.draft, contents=args.contents, gen=args.gen, temp=args.temp, seed=args.seed, as_json=args.json
    )
    return 0


def _blas(args) -> int:
    from brisk.bench.blas import run_blas

    run_blas(runs=args.runs, as_json=args.json)
    return 0
