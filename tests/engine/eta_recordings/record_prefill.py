"""Record one real prefill's progress events with their times, as a JSON fixture for
tests/engine/test_eta_replay.py (run under `nice -n 15`; minutes on a 2-core CPU):

    BRISK_HOME=~/.cache/brisk-test-models nice -n 15 .venv/bin/python \
        tests/engine/eta_recordings/record_prefill.py MODEL TOKENS OUT.json [--uniprefill | --specprefill DRAFT]

Only what the estimator sees is kept: per event (seconds since the turn began, done, total,
phase, and this process's CPU seconds), when the first token came, and the models' shapes
(the estimator's prior; SpecPrefill's draft phase runs the draft's)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import time

WORDS = (
    "the model reads each token of the prompt once and keeps its keys and values so that later "
    "tokens attend to everything before them which is why a long document costs more per token "
    "near its end than near its start river stone market lantern quiet harbor winter letter "
    "garden engine signal paper window orchard bridge valley copper thread mirror compass"
).split()


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def prompt_text(tokenizer, tokens: int) -> str:
    rng = random.Random(58)
    words = [rng.choice(WORDS) for _ in range(tokens * 2)]
    ids = tokenizer.encode(" ".join(words))[:tokens]
    return tokenizer.decode(ids)


SHAPE_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


def shape(config: dict) -> dict:
    args = config.get("text_config") or config
    return {key: args[key] for key in SHAPE_KEYS if key in args}


def main() -> None:
    from brisk.engine.api.conversation import Message
    from brisk.engine.api.events import PrefillProgressed, TokenEmitted
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.models.loader import load_model

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens", type=int)
    ap.add_argument("out")
    ap.add_argument("--uniprefill", action="store_true")
    ap.add_argument("--specprefill", metavar="DRAFT", help="SpecPrefill scored by this draft (keep 0.2)")
    args = ap.parse_args()
    lm = load_model(args.model)
    draft = load_model(args.specprefill) if args.specprefill else None
    settings = ChatSettings(
        model=args.model,
        max_tokens=1,
        kv_bits=16,
        uniprefill="on" if args.uniprefill else "off",
        draft=args.specprefill,
        sparse_prefill="on" if args.specprefill else "off",
        spec_decode="off",
    )
    session = Session(lm, settings, draft=draft)
    text = prompt_text(lm.tokenizer, args.tokens)
    events, first_token, metrics = [], None, {}
    start, cpu_start = time.perf_counter(), time.process_time()
    for event in session.answer([Message("user", text)]):
        now = round(time.perf_counter() - start, 4)
        if isinstance(event, PrefillProgressed):
            # and this process's CPU seconds: on a machine shared with other work, the wall
            # clock also measures the others (a chunk took 2x its neighbours at load 16)
            events.append([now, event.done, event.total, event.phase, round(time.process_time() - cpu_start, 4)])
        elif isinstance(event, TokenEmitted) and first_token is None:
            first_token = now
        elif hasattr(event, "metrics"):
            metrics = event.metrics.to_dict()
    record = {
        "model": args.model,
        "method": metrics.get("prefill_method", "dense"),
        "prompt_tokens": metrics.get("prompt_tokens"),
        "prefill_step_size": settings.prefill_step_size,
        "drops": metrics.get("drops"),
        "kept_tokens": metrics.get("kept_tokens"),
        "config": shape(lm.config),
        "draft": args.specprefill,
        "draft_config": shape(draft.config) if draft is not None else None,
        "first_token_s": first_token,
        "machine": f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} cores, under nice -n 15 beside other work",
        "date": datetime.date.today().isoformat(),
        "load_average": os.getloadavg()[0],  # the machine's 1-minute load when the run ended
        "events": events,  # [seconds since the turn began, done, total, phase, CPU seconds of this process]
    }
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=None, separators=(",", ":"))
        fh.write("\n")
    print(args.out, record["method"], record["prompt_tokens"], "tokens,", len(events), "events,", first_token, "s")


if __name__ == "__main__":
    main()
