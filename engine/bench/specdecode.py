"""`brisk bench specdecode`: decode tok/s of speculative decoding vs plain decoding.

For each kind of content (structured, code, prose) every variant (plain, fixed k, auto,
and for a same-tokenizer pair mlx-lm's `speculative_generate_step`) answers the same
prompt from a cold session, interleaved round by round. Reported: answer tok/s, all answer
tokens over the time from the prompt read to the last token, less the draft's own prompt
prefill (a TTFT cost, reported by the specprefill and overhead benches). First-to-last
token rates would flatter drafting: a cycle yields its first token together with the
rest. Then the paired ratio to plain decoding, acceptance, tokens per target pass, mean k,
and whether the output equals plain decoding's (greedy: it must). Variants marked "blas
verify" run with the few-row native matmul off (kernels/skinny_matmul.py): its A/B.
"""

from __future__ import annotations

import time

from engine.bench.common import interleave, median, paired_ratio, print_table, with_blas_verify

CONTENTS = {
    "structured": "Write a JSON array with one object per month of the year, each with the fields "
                  "\"month\", \"number\" and \"days\". Output only the JSON.",
    "code": "Write a Python class LRUCache with get and put methods, using collections.OrderedDict, "
            "with a docstring on each method.",
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def _brisk(target, draft, prompt: str, *, mode: str, k: int, rule: str, gen: int, temp: float, seed: int) -> dict:
    from engine.events import TurnFinished
    from engine.session import Session
    from engine.settings import ChatSettings

    settings = ChatSettings(model=target.id, temperature=temp, max_tokens=gen, spec_decode=mode, num_draft=k,
                            spec_rule=rule, seed=seed)
    for event in Session(target, settings, draft=draft if mode != "off" else None).send(prompt):
        if isinstance(event, TurnFinished):
            m = event.metrics
            tps = m.generated_tokens / max(m.generation_s - m.draft_prefill_s, 1e-9)
            return {"decode_tps": tps, "tokens": m.generated_tokens, "acceptance": m.acceptance_rate,
                    "tokens_per_pass": m.tokens_per_cycle or 1.0, "mean_k": m.mean_k, "ids": event.token_ids,
                    "draft_share": m.draft_time_share}
    raise RuntimeError("turn did not finish")


def _mlx_lm(target, draft, prompt: str, *, k: int, gen: int) -> dict:
    """mlx-lm's own speculative decoding (greedy), timed like Brisk's: both models have read
    the prompt but its last token before the clock starts."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from engine.prompt import encode_messages
    from engine.session import Message

    tokens = encode_messages(target, [Message("user", prompt)])
    caches = make_prompt_cache(target.model), make_prompt_cache(draft.model)
    for lm, cache in zip((target, draft), caches):
        lm.model(mx.array(tokens[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    eos = set(target.tokenizer.eos_token_ids)
    ids, accepted = [], 0
    started = time.perf_counter()
    for token, _, from_draft in speculative_generate_step(mx.array(tokens[-1:]), target.model, draft.model,
                                                          num_draft_tokens=k, max_tokens=gen,
                                                          prompt_cache=caches[0] + caches[1]):
        if token in eos:
            break
        ids.append(token)
        accepted += bool(from_draft)
    elapsed = time.perf_counter() - started
    return {"decode_tps": len(ids) / elapsed, "tokens": len(ids),
            "acceptance": float("nan"), "tokens_per_pass": len(ids) / max(1, len(ids) - accepted), "mean_k": k,
            "ids": ids, "draft_share": float("nan")}


def run_specdecode(target_id: str, draft_id: str, ks: list, *, contents: list[str], runs: int, gen: int,
                   temp: float, rules: list[str], mlx_lm_ks: list[int], as_json: bool,
                   blas_ks: list = ()) -> dict:
    from engine.models.loader import load_model

    target, draft = load_model(target_id), load_model(draft_id)
    same = target.info.tokenizer_fingerprint == draft.info.tokenizer_fingerprint
    payload = {"target": target_id, "draft": draft_id, "same_tokenizer": same, "temperature": temp,
               "runs": runs, "gen": gen, "rows": []}
    _brisk(target, draft, "Hi", mode="on", k=2, rule="rejection", gen=4, temp=temp, seed=0)  # warm-up
    rows = []
    for content in contents:
        prompt = CONTENTS[content]
        variants = {"plain": lambda: _brisk(target, None, prompt, mode="off", k=3, rule="rejection", gen=gen,
                                            temp=temp, seed=0)}
        for rule in rules:
            for k in ks:
                name = f"{'auto' if k == 'auto' else f'k={k}'}" + (f" {rule}" if len(rules) > 1 else "")
                variants[name] = lambda k=k, rule=rule: _brisk(
                    target, draft, prompt, mode="auto" if k == "auto" else "on", k=3 if k == "auto" else k,
                    rule=rule, gen=gen, temp=temp, seed=0)
        for k in blas_ks:
            variants[f"{'auto' if k == 'auto' else f'k={k}'} blas verify"] = with_blas_verify(
                lambda k=k: _brisk(target, draft, prompt, mode="auto" if k == "auto" else "on",
                                   k=3 if k == "auto" else k, rule=rules[0], gen=gen, temp=temp, seed=0),
                target.model, draft.model)
        if same and temp == 0:
            for k in mlx_lm_ks:
                # Stock mlx-lm verifies through BLAS: so does this baseline.
                variants[f"mlx-lm k={k}"] = with_blas_verify(lambda k=k: _mlx_lm(target, draft, prompt, k=k, gen=gen),
                                                             target.model, draft.model)
        res = interleave(runs, variants)
        plain = res["plain"]
        for name, got in res.items():
            entry = {"content": content, "variant": name, "decode_tps": median(got, "decode_tps"),
                     "ratio": paired_ratio(got, plain, "decode_tps"), "tokens": got[0]["tokens"],
                     "acceptance": median(got, "acceptance"), "tokens_per_pass": median(got, "tokens_per_pass"),
                     "mean_k": median(got, "mean_k"), "draft_share": median(got, "draft_share"),
                     "same_output": temp == 0 and all(r["ids"] == plain[0]["ids"] for r in got)}
            payload["rows"].append(entry)
            rows.append([content, name, entry["tokens"], entry["decode_tps"], entry["ratio"], entry["acceptance"],
                         entry["tokens_per_pass"], entry["mean_k"], entry["draft_share"],
                         entry["same_output"] if temp == 0 else "-"])
    print_table(f"brisk bench specdecode: target {target_id}, draft {draft_id} "
                f"({'same' if same else 'cross'} tokenizer), temperature {temp}, medians of {runs}",
                ["content", "variant", "tokens", "answer tok/s", "vs plain", "acceptance", "tok/pass", "mean k",
                 "draft share", "= plain"], rows, payload, as_json)
    return payload


def run_acceptance(target_id: str, draft_id: str, *, contents: list[str], gen: int, temp: float, seed: int,
                   as_json: bool) -> dict:
    """Expected per-token acceptance of both exact rules on the same positions: the target
    samples a continuation; at each position Σ min(p, q) (rejection sampling) and Σ p·q
    (matching the target's own sample, mlx-lm's rule) are computed from the two
    distributions under the same sampling settings. No sampling noise between the rules."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.models.loader import load_model
    from engine.prompt import encode_messages
    from engine.sampling import TokenDistribution, sample
    from engine.session import Message
    from engine.settings import ChatSettings

    target, draft = load_model(target_id), load_model(draft_id)
    if target.info.tokenizer_fingerprint != draft.info.tokenizer_fingerprint:
        raise SystemExit("spec-acceptance compares rules over one vocabulary: use a same-tokenizer pair")
    dist = TokenDistribution(ChatSettings(model=target_id, temperature=temp))
    payload = {"target": target_id, "draft": draft_id, "temperature": temp, "gen": gen, "rows": []}
    rows = []
    mx.random.seed(seed)
    for content in contents:
        tokens = encode_messages(target, [Message("user", CONTENTS[content])])
        t_cache, d_cache = make_prompt_cache(target.model), make_prompt_cache(draft.model)
        feed, rejection, match = tokens, [], []
        for _ in range(gen):
            p = dist.probs(target.model(mx.array(feed)[None], cache=t_cache)[0, -1:], tokens, [])
            q = dist.probs(draft.model(mx.array(feed)[None], cache=d_cache)[0, -1:], tokens, [])
            width = min(p.shape[-1], q.shape[-1])
            p_, q_ = p[:, :width], q[:, :width]
            rejection.append(float(mx.minimum(p_, q_).sum().item()))
            match.append(float((p_ * q_).sum().item()))
            token = int(sample(p).item())
            if token in target.tokenizer.eos_token_ids:
                break
            tokens, feed = tokens + [token], [token]
        entry = {"content": content, "positions": len(rejection), "rejection": sum(rejection) / len(rejection),
                 "match": sum(match) / len(match)}
        payload["rows"].append(entry)
        rows.append([content, entry["positions"], entry["rejection"], entry["match"],
                     entry["rejection"] / max(entry["match"], 1e-9)])
    print_table(f"brisk bench spec-acceptance: {target_id} <- {draft_id}, temperature {temp}",
                ["content", "positions", "Σmin(p,q) rejection", "Σp·q match", "ratio"], rows, payload, as_json)
    return payload
