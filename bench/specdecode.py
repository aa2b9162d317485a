"""`brisk bench specdecode`: decode tok/s of speculative decoding vs plain decoding.

For each kind of content every variant answers the same conversation from a cold session,
interleaved round by round. Kinds: free (structured, code, prose) and grounded in the
context, where lookup decoding has something to find (quote and summary of an attached
document, a code edit of a 166-line file, a follow-up restating the previous answer).
Variants: plain; `lookup` (the autopilot with no draft model); with `--draft`, the draft
model alone at fixed k and `auto` (lookup off), `auto+lookup` (the autopilot with both),
and for a same-tokenizer pair mlx-lm's `speculative_generate_step`. Reported: answer tok/s, all answer
tokens over the time from the prompt read to the last token, less the draft's own prompt
prefill (a TTFT cost, reported by the specprefill and overhead benches). First-to-last
token rates would flatter drafting: a cycle yields its first token together with the
rest. Then the paired ratio to plain decoding, acceptance, tokens per target pass, mean k,
and whether the output equals plain decoding's (greedy: it must). Variants marked "blas
verify" run with the few-row native matmul off (kernels/skinny_matmul.py): its A/B.
The runs share one PairCosts, as the app's chats do (`--cold-costs`: every run learns the
pair's costs afresh, as the first conversation with a pair on a machine does).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Sequence

from brisk.bench.common import interleave, median, paired_ratio, print_table, with_blas_verify
from brisk.engine.api.literal_types import AccelMode, SpecRule
from brisk.engine.runtime.mx_values import item_float, item_int

FREE = {
    "structured": "Write a JSON array with one object per month of the year, each with the fields "
    '"month", "number" and "days". Output only the JSON.',
    "code": "Write a Python class LRUCache with get and put methods, using collections.OrderedDict, "
    "with a docstring on each method.",
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
GROUNDED = ("quote", "summary", "code-edit", "follow-up")
CONTENTS = tuple(FREE) + GROUNDED


def _python_history() -> str:
    """Section A of the LICENSE file every CPython install carries: ~700 tokens of prose."""
    import sysconfig
    from pathlib import Path

    path = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if not path.is_file():
        raise SystemExit(f"the quote and summary kinds read {path}, which this Python install lacks")
    text = path.read_text(encoding="utf-8")
    return text[: text.find("B. TERMS AND CONDITIONS")].strip()


def conversation(kind: str, target, gen: int) -> list:
    """The messages of one content kind (a follow-up's earlier answer is the target's own)."""
    import colorsys
    import inspect

    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Message, Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.turn.documents import Document

    if kind in FREE:
        return [Message("user", FREE[kind])]
    if kind in ("quote", "summary"):
        text = _python_history()
        doc = Document("python-history.txt", "text", text, len(text)).as_prompt()
        ask = (
            "Quote, word for word, the paragraph of the document that says what happened in May 2000."
            if kind == "quote"
            else "Summarize the document in one paragraph."
        )
        return [Message("user", f"{doc}\n\n{ask}")]
    if kind == "code-edit":
        source = inspect.getsource(colorsys)
        doc = Document("colorsys.py", "code", source, len(source)).as_prompt()
        return [
            Message(
                "user",
                f"{doc}\n\nRename the function rgb_to_hsv to rgb_to_hue_saturation_value "
                "everywhere and return the whole file.",
            )
        ]
    if kind == "follow-up":
        question = Message("user", "Explain what a hash table is and how it handles collisions.")
        session = Session(
            target, ChatSettings(model=target.id, temperature=0.0, max_tokens=2 * gen, spec_decode="off"), [question]
        )
        answer = next(e.text for e in session.answer() if isinstance(e, TurnFinished))
        return [
            question,
            Message("assistant", answer),
            Message("user", "Restate your previous answer word for word, as one paragraph."),
        ]
    raise SystemExit(f"unknown content kind {kind!r}: choose from {', '.join(CONTENTS)}")


def _brisk(
    target,
    draft,
    messages: list,
    *,
    mode: AccelMode,
    k: int,
    rule: SpecRule,
    gen: int,
    temp: float,
    seed: int,
    lookup: bool = False,
    costs=None,
) -> dict:
    from brisk.engine.api.events import EngineErrored, TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings

    settings = ChatSettings(
        model=target.id,
        temperature=temp,
        max_tokens=gen,
        spec_decode=mode,
        num_draft=k,
        spec_rule=rule,
        seed=seed,
        lookup=lookup,
    )
    session = Session(target, settings, draft=draft if mode != "off" else None, pair_costs=costs)
    for event in session.answer(list(messages)):
        if isinstance(event, EngineErrored):
            raise SystemExit(f"{target.id} could not answer: {event.message}")
        if isinstance(event, TurnFinished):
            m = event.metrics
            tps = m.generated_tokens / max(m.generation_s - m.draft_prefill_s, 1e-9)
            return {
                "decode_tps": tps,
                "tokens": m.generated_tokens,
                "acceptance": m.acceptance_rate,
                "lookup_acceptance": m.lookup_acceptance,
                "from_lookup": m.lookup_accepted,
                "tokens_per_pass": m.tokens_per_cycle or 1.0,
                "mean_k": m.mean_k,
                "ids": event.token_ids,
                "draft_share": m.draft_time_share,
            }
    raise RuntimeError("turn did not finish")


def _mlx_lm(target, draft, messages: list, *, k: int, gen: int) -> dict:
    """mlx-lm's own speculative decoding (greedy), timed like Brisk's: both models have read
    the prompt but its last token before the clock starts."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    from brisk.engine.kv.half import make_layers
    from brisk.engine.turn.prompt import encode_messages

    tokens = encode_messages(target, messages)
    caches = make_layers(target.model), make_layers(draft.model)
    for lm, cache in zip((target, draft), caches):
        lm.model(mx.array(tokens[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    eos = set(target.tokenizer.eos_token_ids)
    ids, accepted = [], 0
    started = time.perf_counter()
    for token, _, from_draft in speculative_generate_step(
        mx.array(tokens[-1:]),
        target.model,
        draft.model,
        num_draft_tokens=k,
        max_tokens=gen,
        prompt_cache=caches[0] + caches[1],
    ):
        if token in eos:
            break
        ids.append(token)
        accepted += bool(from_draft)
    elapsed = time.perf_counter() - started
    return {
        "decode_tps": len(ids) / elapsed,
        "tokens": len(ids),
        "acceptance": float("nan"),
        "lookup_acceptance": float("nan"),
        "from_lookup": 0,
        "tokens_per_pass": len(ids) / max(1, len(ids) - accepted),
        "mean_k": k,
        "ids": ids,
        "draft_share": float("nan"),
    }


def run_specdecode(
    target_id: str,
    draft_id: str | None,
    ks: list,
    *,
    contents: list[str],
    runs: int,
    gen: int,
    temp: float,
    rules: list[SpecRule],
    mlx_lm_ks: list[int],
    as_json: bool,
    blas_ks: Sequence[int] = (),
    cold_costs: bool = False,
) -> dict:
    from brisk.engine.accel.speculative.controller import PairCosts
    from brisk.engine.models.loader import load_model

    target = load_model(target_id)
    draft = load_model(draft_id) if draft_id else None
    same = draft is not None and target.info.tokenizer_fingerprint == draft.info.tokenizer_fingerprint
    payload: dict[str, Any] = {
        "target": target_id,
        "draft": draft_id,
        "same_tokenizer": same,
        "temperature": temp,
        "runs": runs,
        "gen": gen,
        "cold_costs": cold_costs,
        "rows": [],
    }
    # One PairCosts for every run, as the app's engine keeps one for all its chats (and
    # across restarts): later runs start from the costs earlier ones measured.
    shared = PairCosts()
    from brisk.engine.api.session import Message

    _brisk(
        target, draft, [Message("user", "Hi")], mode="on", k=2, rule="rejection", gen=4, temp=temp, seed=0, lookup=True
    )  # warm-up
    rows = []
    for content in contents:
        messages = conversation(content, target, gen)

        def brisk(mode, k=3, rule=rules[0], *, with_draft=False, lookup=False):
            return lambda: _brisk(
                target,
                draft if with_draft else None,
                messages,
                mode=mode,
                k=k,
                rule=rule,
                gen=gen,
                temp=temp,
                seed=0,
                lookup=lookup,
                costs=None if cold_costs else shared,
            )

        variants: dict[str, Callable[[], dict]] = {"plain": brisk("off"), "lookup": brisk("auto", lookup=True)}
        if draft is not None:
            for rule in rules:
                for k in ks:
                    name = f"{'auto' if k == 'auto' else f'k={k}'}" + (f" {rule}" if len(rules) > 1 else "")
                    variants[name] = brisk(
                        "auto" if k == "auto" else "on", 3 if k == "auto" else k, rule, with_draft=True
                    )
            variants["auto+lookup"] = brisk("auto", with_draft=True, lookup=True)
            for k in blas_ks:
                variants[f"{'auto' if k == 'auto' else f'k={k}'} blas verify"] = with_blas_verify(
                    brisk("auto" if k == "auto" else "on", 3 if k == "auto" else k, with_draft=True),
                    target.model,
                    draft.model,
                )
            if same and temp == 0:
                for k in mlx_lm_ks:
                    # Stock mlx-lm verifies through BLAS: so does this baseline.
                    variants[f"mlx-lm k={k}"] = with_blas_verify(
                        partial(_mlx_lm, target, draft, messages, k=k, gen=gen), target.model, draft.model
                    )
        res = interleave(runs, variants)
        plain = res["plain"]
        for name, got in res.items():
            entry = {
                "content": content,
                "variant": name,
                "decode_tps": median(got, "decode_tps"),
                "ratio": paired_ratio(got, plain, "decode_tps"),
                "tokens": got[0]["tokens"],
                "acceptance": median(got, "acceptance"),
                "lookup_acceptance": median(got, "lookup_acceptance"),
                "from_lookup": median(got, "from_lookup"),
                "tokens_per_pass": median(got, "tokens_per_pass"),
                "mean_k": median(got, "mean_k"),
                "draft_share": median(got, "draft_share"),
                "same_output": temp == 0 and all(r["ids"] == plain[0]["ids"] for r in got),
            }
            payload["rows"].append(entry)
            rows.append(
                [
                    content,
                    name,
                    entry["tokens"],
                    entry["decode_tps"],
                    entry["ratio"],
                    entry["acceptance"],
                    entry["lookup_acceptance"],
                    entry["from_lookup"],
                    entry["tokens_per_pass"],
                    entry["mean_k"],
                    entry["draft_share"],
                    entry["same_output"] if temp == 0 else "-",
                ]
            )
    pair = f"draft {draft_id} ({'same' if same else 'cross'} tokenizer)" if draft is not None else "no draft model"
    print_table(
        f"brisk bench specdecode: target {target_id}, {pair}, temperature {temp}, medians of {runs}, "
        + ("costs learned afresh every run" if cold_costs else "costs shared across runs"),
        [
            "content",
            "variant",
            "tokens",
            "answer tok/s",
            "vs plain",
            "draft acc",
            "lookup acc",
            "from lookup",
            "tok/pass",
            "mean k",
            "draft share",
            "= plain",
        ],
        rows,
        payload,
        as_json,
    )
    return payload


def run_acceptance(
    target_id: str, draft_id: str, *, contents: list[str], gen: int, temp: float, seed: int, as_json: bool
) -> dict:
    """Expected per-token acceptance of both exact rules on the same positions: the target
    samples a continuation; at each position Σ min(p, q) (rejection sampling) and Σ p·q
    (matching the target's own sample, mlx-lm's rule) are computed from the two
    distributions under the same sampling settings. No sampling noise between the rules."""
    import mlx.core as mx

    from brisk.engine.api.session import Message
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.decode.sampling import TokenDistribution, sample
    from brisk.engine.kv.half import make_layers
    from brisk.engine.models.loader import load_model
    from brisk.engine.turn.prompt import encode_messages

    target, draft = load_model(target_id), load_model(draft_id)
    if target.info.tokenizer_fingerprint != draft.info.tokenizer_fingerprint:
        raise SystemExit("spec-acceptance compares rules over one vocabulary: use a same-tokenizer pair")
    dist = TokenDistribution(ChatSettings(model=target_id, temperature=temp))
    payload: dict[str, Any] = {"target": target_id, "draft": draft_id, "temperature": temp, "gen": gen, "rows": []}
    rows = []
    mx.random.seed(seed)
    for content in contents:
        tokens = encode_messages(target, [Message("user", FREE[content])])
        t_cache, d_cache = make_layers(target.model), make_layers(draft.model)
        feed, rejection, match = tokens, [], []
        for _ in range(gen):
            p = dist.probs(target.model(mx.array(feed)[None], cache=t_cache)[0, -1:], tokens, [])
            q = dist.probs(draft.model(mx.array(feed)[None], cache=d_cache)[0, -1:], tokens, [])
            width = min(p.shape[-1], q.shape[-1])
            p_, q_ = p[:, :width], q[:, :width]
            rejection.append(item_float(mx.minimum(p_, q_).sum()))
            match.append(item_float((p_ * q_).sum()))
            token = item_int(sample(p))
            if token in target.tokenizer.eos_token_ids:
                break
            tokens, feed = tokens + [token], [token]
        entry: dict[str, Any] = {
            "content": content,
            "positions": len(rejection),
            "rejection": sum(rejection) / len(rejection),
            "match": sum(match) / len(match),
        }
        payload["rows"].append(entry)
        rows.append(
            [
                content,
                entry["positions"],
                entry["rejection"],
                entry["match"],
                entry["rejection"] / max(entry["match"], 1e-9),
            ]
        )
    print_table(
        f"brisk bench spec-acceptance: {target_id} <- {draft_id}, temperature {temp}",
        ["content", "positions", "Σmin(p,q) rejection", "Σp·q match", "ratio"],
        rows,
        payload,
        as_json,
    )
    return payload
