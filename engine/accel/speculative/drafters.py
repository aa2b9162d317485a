"""The draft side of speculative decoding: propose target tokens, then follow what the
target accepted.

`SameTokenizerDrafter` proposes the draft's own tokens with their distributions q (for
exact rejection sampling). `TranslatingDrafter` is Universal Assisted Generation (Hugging
Face, 2024; as ported to MLX in the Polish study): a draft with another vocabulary
proposes text, which is re-tokenized into the target's vocabulary in context, and the
accepted target text is re-tokenized back into the draft's vocabulary to keep its cache
consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from brisk.engine.accel.speculative.rewind import CacheCheckpoint
from brisk.engine.accel.translate import decode_text, encode_document, encode_with_spans
from brisk.engine.decode.dispatch_ahead import dispatching_ahead
from brisk.engine.decode.sampling import TokenDistribution, sample
from brisk.engine.kv import PromptCache
from brisk.engine.runtime.mx_values import item_float, item_int

# Tokens of context re-encoded with a translation, so word boundaries come out as each
# tokenizer would cut them mid-sentence (the UAG port used a few tokens).
DEFAULT_TRANSLATION_PREFIX = 4


class DraftUnavailable(Exception):
    """This draft cannot serve this turn (the reason is shown; decoding goes on plainly)."""


@dataclass
class Proposal:
    tokens: list[int]  # target token ids to verify
    q: mx.array | None  # (len(tokens), V) draft distributions, same tokenizer only
    drafted: int  # draft model steps taken


class _Drafter:
    """A draft model, its PromptCache, and the tokens still to feed it."""

    def __init__(self, draft, dist: TokenDistribution, cache: PromptCache | None, step: int):
        self.draft, self.dist, self.step = draft, dist, step
        self.tc = cache or PromptCache(draft.model)
        self.pending: list[int] = []
        self.target: list[int] = []  # the target's tokens so far (each drafter sets it in start)
        self._mark: tuple[CacheCheckpoint, int] | None = None

    def _follow(self) -> None:
        """Bring the draft's pending tokens up to `self.target`."""
        raise NotImplementedError

    def _sync(self, sequence: list[int]) -> int:
        """Hold `sequence` (its last token pending); returns how many tokens the draft read."""
        if len(sequence) + 1 > self.draft.context_length:
            raise DraftUnavailable(
                f"the draft holds {self.draft.context_length} tokens, this conversation needs {len(sequence)}"
            )
        read = 0
        for read in self.tc.sync(sequence[:-1], self.step):
            pass
        self.pending = sequence[-1:]
        return read

    def _draft(
        self, k: int, history: list[int], eos: set[int], stop_below: float = 0.0
    ) -> tuple[list[int], list[mx.array]]:
        """Feed the pending tokens, then sample up to k draft tokens, stopping after EOS or
        after a token the draft gave less than `stop_below` probability: where the draft
        is unsure the target usually disagrees, and every token drafted past it is wasted."""
        self._mark = (CacheCheckpoint(self.tc.layers, len(self.pending) + k), len(self.tc.tokens))
        feed, drafted, rows = list(self.pending), list[int](), list[mx.array]()
        with dispatching_ahead(self.tc.layers):
            for i in range(k):
                logits = self.draft.model(mx.array(feed)[None], cache=self.tc.layers)[0, -1:]  # (1, V)
                self.tc.tokens += feed
                probs = self.dist.probs(logits, history + drafted, [])
                token = item_int(mx.argmax(probs, axis=-1) if self.dist.greedy else sample(probs))
                drafted.append(token)
                rows.append(probs)
                if token in eos:
                    break
                if (
                    stop_below
                    and i + 1 < k
                    and self.dist.confidence(logits, probs, history + drafted[:-1], token) < stop_below
                ):
                    break
                feed = [token]
        self.pending = []
        return drafted, rows

    def scout(self) -> tuple[float, int]:
        """Read the target's tokens the draft has not seen yet, in one pass, and score the
        draft on them: (Σ q(next token), positions), q being the draft's sampling
        distribution (one-hot when greedy). Its mean estimates acceptance (Σ p·q, the
        match rule's, a lower bound of rejection's) without running the target."""
        feed = self._unseen_feed()
        if not feed:
            return 0.0, 0
        history = self.tc.tokens + feed[:1]
        with dispatching_ahead(self.tc.layers):
            logits = self.draft.model(mx.array(feed)[None], cache=self.tc.layers)[0]  # (n, V)
        self.tc.tokens += feed
        self.pending = self.pending[-1:]
        q = self.dist.probs(logits, history, feed[1:])
        following = mx.array(feed[1:] + self.pending)
        hits = q[mx.arange(len(feed)), following].sum()
        return item_float(hits), len(feed)

    def unseen(self) -> int:
        """Tokens the draft must read before it can propose or scout (missed plain steps),
        besides the last, which a proposal feeds anyway."""
        return max(0, len(self.pending) - 1)

    def read_unseen(self) -> int:
        """Read the unseen tokens in one pass (their keys and values only: no logits);
        returns how many. A proposal would read them in its first step, where their cost
        would count as drafting."""
        feed, layers = self._unseen_feed(), self.tc.layers
        if not feed or layers is None:
            return 0
        with dispatching_ahead(layers):
            self.draft.model(mx.array(feed)[None], cache=layers)
        self.tc.tokens += feed
        self.pending = self.pending[-1:]
        mx.eval([layer.state for layer in layers])
        return len(feed)

    def _unseen_feed(self) -> list[int]:
        """The pending tokens but the last (the next proposal feeds it), if the draft holds them."""
        feed = self.pending[:-1]
        if self.tc.layers is None or not feed:
            return []
        if len(self.tc.tokens) + len(self.pending) + 1 > self.draft.context_length:
            raise DraftUnavailable(
                f"the draft holds {self.draft.context_length} tokens, "
                f"this conversation needs {len(self.tc.tokens) + len(self.pending)}"
            )
        return feed

    def commit(self, proposal: Proposal, accepted: int, token: int) -> None:
        """The target kept `accepted` proposed tokens, then chose `token`."""
        self.target += proposal.tokens[:accepted] + [token]
        self._follow()

    def observe_tokens(self, tokens: list[int]) -> None:
        """The target took `tokens` without this draft (plain steps, or a lookup's proposal)."""
        self.target += tokens
        self._follow()

    def _rewind_to(self, keep: int) -> None:
        """Leave the first `keep` tokens in the draft's cache (through the proposal's
        checkpoint when its layers cannot trim)."""
        self.tc.trim_to(keep, checkpoint=self._mark)
        self._mark = None


class SameTokenizerDrafter(_Drafter):
    same_tokenizer = True

    def catch_up(self, prompt: list[int]) -> int:
        """Prompt tokens the draft has not read yet (its cache is reused across turns)."""
        return len(prompt) - self.tc.common_prefix(prompt)

    def start(self, prompt: list[int]) -> int:
        """Read the prompt (what the cache does not hold yet); returns how many tokens that was."""
        self.target = list(prompt)  # the target's tokens so far (also the draft's, same vocabulary)
        return self._sync(prompt)

    def propose(self, k: int, stop_below: float = 0.0) -> Proposal:
        if self.tc.layers is None:  # reset by a rewind it could not do in place
            self._sync(self.target)
        tokens, rows = self._draft(k, self.target, set(self.draft.tokenizer.eos_token_ids), stop_below)
        return Proposal(tokens, mx.concatenate(rows, axis=0), len(tokens))

    def _follow(self) -> None:
        """Keep the cache on the longest prefix of the sequence it holds; the rest is pending."""
        common = self.tc.common_prefix(self.target[:-1])
        self._rewind_to(common)
        self.pending = self.target[len(self.tc.tokens) :]


class TranslatingDrafter(_Drafter):
    same_tokenizer = False

    def __init__(self, draft, target_tokenizer, dist, cache=None, step=512, *, prefix=DEFAULT_TRANSLATION_PREFIX):
        super().__init__(draft, dist, cache, step)
        self.target_tokenizer, self.prefix = target_tokenizer, max(1, prefix)

    def catch_up(self, prompt: list[int]) -> int:
        base = encode_document(self.draft.tokenizer, decode_text(self.target_tokenizer, prompt))[0]
        return len(base) - self.tc.common_prefix(base)

    def start(self, prompt: list[int]) -> int:
        self.target = list(prompt)  # the target's tokens so far
        self.answer_from = len(prompt)
        self.base = encode_document(self.draft.tokenizer, decode_text(self.target_tokenizer, prompt))[0]
        self.answer_ids: list[int] = []  # the draft's tokens for the answer text so far
        self.answer_spans: list[tuple[int, int]] = []  # their character spans in that text
        return self._sync(self.base)

    def propose(self, k: int, stop_below: float = 0.0) -> Proposal:
        if self.tc.layers is None:
            self._sync(self.base + self.answer_ids)
        sequence = self.base + self.answer_ids
        drafted, _ = self._draft(k, sequence, set(self.draft.tokenizer.eos_token_ids), stop_below)
        eos = set(self.draft.tokenizer.eos_token_ids)
        clean = drafted[: next((i for i, t in enumerate(drafted) if t in eos), len(drafted))]
        text = _continuation(self.draft.tokenizer, sequence[-self.prefix :], clean)
        tokens = _continuation_ids(self.target_tokenizer, self.target[-self.prefix :], text)[:k]
        return Proposal(tokens, None, len(drafted))

    def _follow(self) -> None:
        """Re-tokenize the answer's tail into draft tokens (the last `prefix` draft tokens
        are redone with the new text, so merges across the boundary come out right)."""
        text = decode_text(self.target_tokenizer, self.target[self.answer_from :]).rstrip("\ufffd")
        keep = max(0, len(self.answer_ids) - self.prefix)
        spans = self.answer_spans
        # never cut inside a character: byte-level tokens can split one (their spans overlap)
        while keep and keep < len(spans) and spans[keep][0] < spans[keep - 1][1]:
            keep -= 1
        covered = spans[keep - 1][1] if keep else 0
        ids, new_spans = encode_with_spans(self.draft.tokenizer, text[covered:])
        self.answer_ids = self.answer_ids[:keep] + ids
        self.answer_spans = spans[:keep] + [(covered + a, covered + b) for a, b in new_spans]
        sequence = self.base + self.answer_ids
        self._rewind_to(self.tc.common_prefix(sequence[:-1]))
        self.pending = sequence[len(self.tc.tokens) :]


def draft_compatibility(target, draft) -> tuple[str, str]:
    """("same tokenizer" | "cross tokenizer" | "incompatible", why) for two catalog entries
    (anything with id, parameters and tokenizer_fingerprint)."""
    if draft.id == target.id:
        return "incompatible", "the draft is the target itself: drafting would only add work"
    if draft.parameters >= target.parameters:
        return "incompatible", (
            f"the draft ({draft.parameters / 1e6:.0f}M parameters) is not smaller than the "
            f"target ({target.parameters / 1e6:.0f}M): it could never speed it up"
        )
    if draft.tokenizer_fingerprint == target.tokenizer_fingerprint:
        return "same tokenizer", "exact rejection sampling on the draft's own tokens"
    return "cross tokenizer", "draft text is re-tokenized for the target (acceptance by matching samples)"


def check_draft_pair(target, draft) -> None:
    """InvalidSettings when a loaded draft cannot help this target (the rule the app's
    settings panel applies, enforced where every front end passes: the engine)."""
    from types import SimpleNamespace

    from brisk.engine.api.errors import InvalidSettings

    def entry(lm):
        return SimpleNamespace(
            id=lm.id, parameters=lm.info.parameters, tokenizer_fingerprint=lm.info.tokenizer_fingerprint
        )

    verdict, why = draft_compatibility(entry(target), entry(draft))
    if verdict == "incompatible":
        raise InvalidSettings(f"Draft {draft.id} cannot be used with {target.id}: {why}")


def cost_ratio(draft, target) -> float:
    """Expected draft step cost relative to the target's: decoding streams every weight
    once per step, so the ratio of their bytes (a prior until the draft is measured)."""
    from brisk.engine.runtime.mx_values import tree_leaves

    def weight_bytes(lm) -> int:
        return sum(v.nbytes for v in tree_leaves(lm.model.parameters()))

    return weight_bytes(draft) / max(1, weight_bytes(target))


def _continuation(tokenizer, context: list[int], new: list[int]) -> str:
    """The text `new` adds after `context` (decoded together: some tokenizers drop a
    leading space when a token is decoded alone). Incomplete UTF-8 at the end is held back."""
    before = decode_text(tokenizer, context)
    after = decode_text(tokenizer, context + new)
    text = after[len(before) :] if after.startswith(before) else decode_text(tokenizer, new)
    return text.rstrip("\ufffd")


def _continuation_ids(tokenizer, context: list[int], text: str) -> list[int]:
    """Target tokens for `text` written after `context`: encode them together and strip the
    context's tokens. If the boundary merges (the context's last token would change), the
    text is encoded alone: the target has already committed its side of the boundary."""
    if not text:
        return []  # the context absorbed the draft's characters: nothing to verify
    together = encode_with_spans(tokenizer, decode_text(tokenizer, context) + text)[0]
    if together[: len(context)] == context:
        return together[len(context) :]
    return encode_with_spans(tokenizer, text)[0]
