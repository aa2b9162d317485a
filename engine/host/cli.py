"""`brisk`: the headless command line. It drives the same Session API as the GUI."""

from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata
from typing import cast

from brisk.engine.api.errors import BriskError
from brisk.engine.api.events import (
    ContextTruncated,
    EngineErrored,
    EngineWarned,
    PrefillProgressed,
    TokenEmitted,
    TurnFinished,
)
from brisk.engine.api.literal_types import AccelMode
from brisk.engine.api.settings import (
    DEFAULT_MODEL_ID,
    OVERFLOW_POLICIES,
    SPEC_MODES,
    SPEC_RULES,
    ChatSettings,
    layer_list,
)

# glibc returns big freed blocks to the OS and page-faults them back on every prefill
# chunk; keeping them cut an elementwise op from 138 to 22 ms here (shared/CPU.md).
MALLOC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL_ID, help="installed model id (brisk models list)")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=ChatSettings.max_tokens)
    p.add_argument("--temp", type=float, default=ChatSettings.temperature)
    p.add_argument("--top-p", type=float, default=ChatSettings.top_p)
    p.add_argument("--top-k", type=int, default=ChatSettings.top_k)
    p.add_argument("--min-p", type=float, default=ChatSettings.min_p)
    p.add_argument("--repetition-penalty", type=float, default=ChatSettings.repetition_penalty)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--overflow",
        choices=OVERFLOW_POLICIES,
        default="refuse",
        help="when the conversation exceeds the context: refuse, or drop the oldest turns",
    )
    p.add_argument("--prefill-step", type=int, default=ChatSettings.prefill_step_size)
    p.add_argument(
        "--kv-bits",
        type=kv_bits_choice,
        default=ChatSettings.kv_bits,
        help="KV cache precision: 16 = unpacked float16, 8/4 = packed with attention on packed data, auto = "
        "the smallest that passes this model's fidelity self-test (run once per model)",
    )
    p.add_argument(
        "--k-bits", type=int, choices=(16, 8, 4), help="key precision (default: --kv-bits); keys are packed per channel"
    )
    p.add_argument(
        "--v-bits",
        type=int,
        choices=(16, 8, 4),
        help="value precision (default: --kv-bits); values are packed per token",
    )
    p.add_argument("--kv-group-size", type=int, choices=(32, 64), default=ChatSettings.kv_group_size)
    p.add_argument("--draft", help="draft model id (SpecPrefill scoring and speculative decoding)")
    p.add_argument(
        "--prefill",
        choices=PREFILL_CHOICES,
        help="prefill method: off (dense), specprefill (needs --draft), uniprefill (no draft), or auto "
        "(long prompts: SpecPrefill with a draft, else UniPrefill from --uniprefill-threshold tokens)",
    )
    p.add_argument(
        "--sparse-prefill",
        choices=("off", "on", "auto"),
        default=None,
        help="SpecPrefill's own mode (--prefill specprefill is `on`)",
    )
    p.add_argument(
        "--top-p-mass",
        type=float,
        default=None,
        help="UniPrefill: attention mass kept at each drop layer (default: the model's)",
    )
    p.add_argument(
        "--drop-layers",
        type=layer_list,
        default=None,
        help="UniPrefill: comma-separated layer indices (default: chosen from the model's depth)",
    )
    p.add_argument(
        "--uniprefill-threshold",
        type=int,
        default=None,
        help="new-token count from which `auto` UniPrefill acts (default: the break-even measured for "
        "the model's architecture)",
    )
    p.add_argument("--keep", type=float, default=ChatSettings.sparse_keep, help="share of 32-token chunks kept (on)")
    p.add_argument(
        "--threshold",
        type=int,
        default=ChatSettings.sparse_threshold,
        help="new-token count from which `auto` sparse prefill acts",
    )
    p.add_argument(
        "--spec-decode",
        choices=SPEC_MODES,
        default=ChatSettings.spec_decode,
        help="speculative decoding: auto picks plain, lookup or --draft, and k, per cycle from "
        "measured costs; on always speculates",
    )
    p.add_argument(
        "--no-lookup",
        dest="lookup",
        action="store_false",
        help="do not propose continuations found in the conversation (lookup decoding)",
    )
    p.add_argument("--num-draft", type=int, default=ChatSettings.num_draft, help="draft tokens per cycle (on)")
    p.add_argument(
        "--spec-rule",
        choices=SPEC_RULES,
        default=ChatSettings.spec_rule,
        help="acceptance: exact rejection sampling, or match the target's own sample (mlx-lm's rule)",
    )


PREFILL_CHOICES = ("off", "specprefill", "uniprefill", "auto")


def prefill_modes(prefill: str | None, sparse_prefill: str | None) -> tuple[AccelMode, AccelMode]:
    """(sparse_prefill, uniprefill) settings for --prefill; --sparse-prefill alone keeps
    its old meaning (SpecPrefill's mode) and UniPrefill stays off."""
    spec: dict[str | None, AccelMode] = {
        "off": "off",
        "specprefill": "on",
        "uniprefill": "off",
        "auto": "auto",
        None: "off",
    }
    uni: dict[str | None, AccelMode] = {
        "off": "off",
        "specprefill": "off",
        "uniprefill": "on",
        "auto": "auto",
        None: "off",
    }
    chosen = cast(AccelMode, sparse_prefill) if sparse_prefill else spec[prefill]  # argparse checked the choice
    return chosen, uni[prefill]


def kv_bits_choice(text: str):
    """16, 8, 4 or auto (an argparse type)."""
    if text == "auto":
        return text
    if text in ("16", "8", "4"):
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 16, 8, 4 or auto (got {text!r})")


def settings_from_args(args) -> ChatSettings:
    sparse, uni = prefill_modes(args.prefill, args.sparse_prefill)
    return ChatSettings(
        model=args.model,
        system_prompt=args.system,
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        context_overflow=args.overflow,
        prefill_step_size=args.prefill_step,
        kv_bits=16 if args.kv_bits == "auto" else args.kv_bits,
        kv_auto=args.kv_bits == "auto",
        k_bits=args.k_bits,
        v_bits=args.v_bits,
        kv_group_size=args.kv_group_size,
        draft=args.draft,
        sparse_prefill=sparse,
        sparse_keep=args.keep,
        sparse_threshold=args.threshold,
        uniprefill=uni,
        uniprefill_p=args.top_p_mass,
        drop_layers=args.drop_layers,
        uniprefill_threshold=args.uniprefill_threshold,
        spec_decode=args.spec_decode,
        num_draft=args.num_draft,
        spec_rule=args.spec_rule,
        lookup=args.lookup,
    ).validate()


def read_prompt_file(path: str) -> str:
    from brisk.engine.turn.text_input import read_text_file

    text = read_text_file(path, what="Prompt file")
    if not text.strip():
        raise BriskError(f"Prompt file {path} is empty")
    return text


def load_pair(settings: ChatSettings):
    """The target and, when set, the draft model."""
    from brisk.engine.accel.speculative.drafters import check_draft_pair
    from brisk.engine.models.loader import load_model

    target = load_for_chat(settings.model)
    draft = load_model(settings.draft) if settings.draft else None
    if draft is not None:
        check_draft_pair(target, draft)
    return target, draft


def load_for_chat(model_id: str):
    from brisk.engine.models.bundled import load_installing_default

    return load_installing_default(model_id, progress=lambda m: print(f"  {m}", file=sys.stderr))


def cmd_run(args) -> int:
    from brisk.engine.api.session import Session
    from brisk.engine.distributed import cli as ranks

    prompt = read_prompt_file(args.prompt_file) if args.prompt_file else args.prompt
    if not prompt.strip():
        raise BriskError("The prompt is empty: give some text with --prompt or --prompt-file")
    settings = settings_from_args(args)
    if ranks.wants_ranks(args):  # this brisk launches the ranks; each runs this command
        return ranks.launch(args, args.argv)
    lm, draft = load_pair(settings)
    session = Session(lm, settings, draft=draft, pair_costs=ranks.pair_costs())
    finished = None
    for event in session.send(prompt):
        if isinstance(event, TokenEmitted) and not args.json:
            print(event.text, end="", flush=True)
        elif isinstance(event, ContextTruncated):
            print(f"[dropped {event.dropped_messages} oldest messages to fit the context]", file=sys.stderr)
        elif isinstance(event, EngineWarned):
            print(f"[warning] {event.message}", file=sys.stderr)
        elif isinstance(event, EngineErrored):
            raise BriskError(event.message)
        elif isinstance(event, TurnFinished):
            finished = event
    if finished is None:  # every turn ends with TurnFinished or raises: a broken promise, said plainly
        raise BriskError("The turn ended without an answer")
    if args.json:
        print(
            json.dumps(
                {
                    "model": lm.id,
                    "text": finished.text,
                    "token_ids": finished.token_ids,
                    "metrics": {**finished.metrics.to_dict(), **ranks.rank_metrics(session)},
                    "settings": settings.to_dict(),
                }
            )
        )
    else:
        print()
        m = finished.metrics
        print(
            f"[ttft {m.ttft_s:.2f}s · prefill {m.prefill_tps:.1f} tok/s · decode {m.decode_tps:.1f} tok/s"
            f" · {m.generated_tokens} tokens · {m.finish_reason} · prefill {m.prefill_route}"
            + (
                f" (kept {', '.join(f'{k}/{n}@{layer}' for layer, n, k in m.drops)}, "
                f"{m.flops_saved:.0%} of FLOPs saved)"
                if m.drops
                else ""
            )
            + (f" · spec {m.spec_decode}: {m.tokens_per_cycle:.2f} tokens/pass" if m.spec_decode != "off" else "")
            + (f", draft kept {m.accepted_tokens}/{m.draft_tokens}" if m.draft_tokens else "")
            + (f", lookup kept {m.lookup_accepted}/{m.lookup_tokens}" if m.lookup_tokens else "")
            + "]",
            file=sys.stderr,
        )
    return 0


def as_text(line: str) -> str:
    """A typed line as text the tokenizer takes: bytes that were not UTF-8 (kept by Python as
    lone surrogates, which the tokenizer refused with a TypeError) become U+FFFD."""
    try:
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate not from a byte: replaced too
        return line.encode("utf-8", "replace").decode("utf-8")


def cmd_chat(args) -> int:
    from brisk.engine.api.session import CancelToken, Session
    from brisk.engine.distributed import cli as ranks

    settings = settings_from_args(args)
    if ranks.wants_ranks(args):  # this brisk launches the ranks and passes them what is typed
        return ranks.launch(args, args.argv, chat=True)
    lm, draft = load_pair(settings)
    session = Session(lm, settings, draft=draft, pair_costs=ranks.pair_costs())
    typed = ranks.chat_input()  # on a rank: the lines the launching brisk passes on
    print(f"Brisk chat with {lm.id} ({lm.compute_dtype}). Ctrl-C stops an answer; Ctrl-D or /quit exits.")
    while True:
        try:
            line = typed.input("\nyou> ") if typed else input("\nyou> ")
        except EOFError:
            print()
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if not line.strip():
            continue
        line = as_text(line)
        cancel = typed.turn() if typed else CancelToken()
        print("brisk> ", end="", flush=True)
        failed = False
        try:
            for event in session.send(line, cancel=cancel):
                if isinstance(event, PrefillProgressed) and event.total > 512 and event.done < event.total:
                    print(f"\r[prefill {100 * event.done // event.total}%]", end="", flush=True)
                elif isinstance(event, TokenEmitted):
                    print(event.text, end="", flush=True)
                elif isinstance(event, EngineWarned):
                    print(f"\n[warning] {event.message}")
                elif isinstance(event, EngineErrored):
                    print(f"\n[error] {event.message}")
                    failed = True
                elif isinstance(event, TurnFinished) and event.metrics.finish_reason == "cancelled":
                    print("\n[stopped]")  # on ranks: Ctrl-C reached them as a cancel (chat_input.py)
                elif isinstance(event, TurnFinished):
                    m = event.metrics
                    print(
                        f"\n[ttft {m.ttft_s:.2f}s · cached {m.cached_tokens}/{m.prompt_tokens} · "
                        f"{m.decode_tps:.1f} tok/s · {m.finish_reason}]"
                    )
        except KeyboardInterrupt:
            cancel.cancel()
            print("\n[stopped]")
        finally:
            if typed:
                typed.turn_ended()
        if failed and session.messages and session.messages[-1].role == "user":
            session.messages.pop()  # a refused line (too long, say) is not kept: the next one is answered


def cmd_info(args) -> int:
    from brisk.engine.runtime.info import engine_info, model_memory_info

    info = engine_info()
    if args.model:
        precision = None
        if args.k_bits or args.v_bits:
            precision = (args.k_bits or args.kv_bits, args.v_bits or args.kv_bits)
        info["model"] = model_memory_info(args.model, precision=precision)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    model = info.pop("model", None)
    plan_lines = info.pop("kernel_plan", [])
    for key, value in info.items():
        print(f"{key:>14}: {value}")
    print("\nkernel plan (kernels/plan.py; BRISK_KERNELS, BRISK_ISA):")
    for line in plan_lines:
        print(f"  {line}")
    if model:
        print(
            f"\n{model['id']}: weights {model['weights_bytes'] / 2**30:.2f} GiB, context {model['context_length']}, "
            f"{model['free_bytes_beside_weights'] / 2**30:.1f} GiB free beside the weights"
        )
        print(f"{'K bits':>7} {'V bits':>7} {'bytes/token':>12} {'max context in free memory':>28}")
        for row in model["kv"]:
            print(f"{row['k_bits']:>7} {row['v_bits']:>7} {row['bytes_per_token']:>12.0f} {row['max_context']:>28}")
    return 0


class VersionAction(argparse.Action):
    """--version: computed only when asked (it imports MLX to name its version)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from brisk.engine.version import version_line

        print(version_line())
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    from brisk.engine.distributed.cli import add_rank_args
    from brisk.engine.host.cli_extensions import add_extension_parsers
    from brisk.engine.host.cli_models import add_models_parser
    from brisk.engine.host.serve.cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="brisk", description="Fast local LLM chat on MLX")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action=VersionAction, help="Brisk's version and MLX's, mlx-lm's and the BLAS")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="one turn: print the answer (or JSON with metrics)")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt")
    source.add_argument("--prompt-file")
    add_sampling_args(run)
    run.add_argument("--json", action="store_true", help="print one JSON object (see README)")
    add_rank_args(run)
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="interactive terminal chat (prompt cache reused across turns)")
    add_sampling_args(chat)
    add_rank_args(chat)
    chat.set_defaults(func=cmd_chat)

    info = sub.add_parser("info", help="backend, BLAS, dtype, memory")
    info.add_argument("--model", help="also show KV bytes per token and context that fits")
    info.add_argument("--kv-bits", type=int, choices=(16, 8, 4), default=16)
    info.add_argument("--k-bits", type=int, choices=(16, 8, 4), help="add a row for these key bits")
    info.add_argument("--v-bits", type=int, choices=(16, 8, 4), help="add a row for these value bits")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_info)

    add_models_parser(sub)
    add_serve_parser(sub)
    add_extension_parsers(sub)  # `brisk bench ...`, from the benchmarks' own distribution

    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what ranks re-run (engine/distributed)
    from brisk.engine.runtime.crash_log import configure_console_logging

    configure_console_logging(verbose=args.verbose)
    from brisk.kernels import compile_notice

    # any command may compile the kernels on a first run (~40 s): never in silence
    compile_notice.listen_always(lambda event: print(f"brisk: {event.message}", file=sys.stderr))
    try:
        return args.func(args)
    except BriskError as exc:
        print(f"brisk: error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbrisk: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as exc:  # a bug (or a library's Rust panic): a sentence and the log's path
        from brisk.engine.runtime.crash_log import user_message

        print(f"brisk: error: {printable(user_message(exc, context=f'brisk {args.command}'))}", file=sys.stderr)
        return 1


def printable(text: str) -> str:
    """`text` with control characters shown as escapes: an error can quote a model's template
    or file, and ESC sequences in it would clear the terminal or retitle the window."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) != "Cc" else ascii(ch)[1:-1] for ch in text)


def console_main() -> None:
    """Entry point: re-exec once with malloc tunables (glibc reads them only at start)."""
    if sys.platform.startswith("linux") and "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = MALLOC_TUNABLES
        # A frozen bundle's executable is Brisk itself, not a Python that takes -m; it
        # tells the app from the CLI by argv[0], which must stay `brisk`.
        if getattr(sys, "frozen", False):
            os.execv(sys.executable, [sys.argv[0], *sys.argv[1:]])
        from brisk.engine.runtime.python_argv import module_argv

        os.execv(sys.executable, module_argv("brisk.engine.host.cli", *sys.argv[1:]))
    sys.exit(main_interruptible())


def main_interruptible(argv: list[str] | None = None) -> int:
    """`main`, with Ctrl-C while the parser and its imports load (the first second) ending
    as quietly as it does later: one line, no traceback."""
    from brisk.engine.runtime.hub_env import hub_endpoint_problem

    problem = hub_endpoint_problem()  # before the parser's imports reach huggingface_hub, which would raise
    if problem:
        print(f"brisk: error: {printable(problem)}", file=sys.stderr)
        return 1
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("\nbrisk: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main_interruptible())
