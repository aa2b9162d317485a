"""A target and its draft, with what follows from the two decided once.

Whether they share a tokenizer decides how the draft scores a prompt (its own token ids,
or projected onto the target's through shared text) and how it drafts (exact rejection
sampling on its own tokens, or re-tokenized text matched against the target's samples).
That used to be re-checked wherever a draft was used; here it is a field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from brisk.engine.accel.specprefill.scoring import DraftScorer
from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.controller import PairCosts
from brisk.engine.accel.speculative.decoder import SpeculativeDecoder
from brisk.engine.accel.speculative.device_costs import cost_key, verify_cost
from brisk.engine.accel.speculative.drafters import SameTokenizerDrafter, TranslatingDrafter, cost_ratio
from brisk.engine.accel.speculative.lookup import ContextIndex
from brisk.engine.decode.sampling import TokenDistribution
from brisk.engine.kv import PromptCache

if TYPE_CHECKING:
    from brisk.engine.models.loader import LoadedModel


def position_cost(target: LoadedModel) -> float:
    """A verify pass's cost per extra position, in plain steps, before a conversation times
    one: for the device the kernel plan names (device_costs.py)."""
    return verify_cost(target.id, target.model).extra_position


@dataclass
class DraftPair:
    target: LoadedModel
    draft: LoadedModel
    same_tokenizer: bool
    # The draft's prompt cache serves SpecPrefill scoring and speculative drafting alike,
    # so a prompt is prefilled into the draft once per conversation.
    cache: PromptCache = field(repr=False)
    # The autopilot, kept across turns (acceptance and timings carry over) while the
    # mode, k and lookup setting stay the same.
    controller: SpeculationAutopilot | None = field(default=None, repr=False)
    controller_key: tuple | None = None

    @classmethod
    def make(cls, target, draft) -> "DraftPair":
        same = draft.info.tokenizer_fingerprint == target.info.tokenizer_fingerprint
        return cls(target, draft, same, PromptCache(draft.model))

    def importance_steps(self, tokens: list[int], start: int, step: int):
        """SpecPrefill importance of target `tokens[start:]`, in the target's token positions:
        a generator of the draft's progress events that returns the scores."""
        scorer = DraftScorer(self.draft, self.cache)
        if self.same_tokenizer:
            return (yield from scorer.importance_steps(tokens, start, step))
        return (yield from scorer.importance_across_steps(self.target.tokenizer, tokens, start, step))

    def make_drafter(self, dist, settings):
        """The drafter for speculative decoding with this pair."""
        if self.same_tokenizer:
            return SameTokenizerDrafter(self.draft, dist, self.cache, settings.prefill_step_size)
        return TranslatingDrafter(
            self.draft,
            self.target.tokenizer,
            dist,
            self.cache,
            settings.prefill_step_size,
            prefix=settings.translation_prefix,
        )

    def make_decoder(
        self, target_cache: PromptCache, settings, *, max_tokens: int, costs: PairCosts, index: ContextIndex | None
    ) -> SpeculativeDecoder:
        """The speculative decoder for one turn over `target_cache` (lookup too, with `index`)."""
        dist = TokenDistribution(settings)
        key = (settings.spec_decode, settings.num_draft, index is not None)
        if self.controller is None or self.controller_key != key:
            self.controller = SpeculationAutopilot(
                settings.spec_decode,
                settings.num_draft,
                has_draft=True,
                lookup=index is not None,
                cost_ratio=cost_ratio(self.draft, self.target),
                pair=(self.target.id, self.draft.id, cost_key(self.target.model)),
                costs=costs,
                position_cost=position_cost(self.target),
            )
            self.controller_key = key
        return SpeculativeDecoder(
            target_cache.model_view(),
            target_cache,
            self.make_drafter(dist, settings),
            self.controller,
            dist,
            rule=settings.spec_rule,
            max_tokens=max_tokens,
            index=index,
        )


@dataclass
class LookupOnly:
    """Speculation with no draft model: the context's continuations only. Holds the
    autopilot across turns like DraftPair does."""

    target: LoadedModel
    controller: SpeculationAutopilot | None = field(default=None, repr=False)
    controller_key: tuple | None = None

    def make_decoder(
        self, target_cache: PromptCache, settings, *, max_tokens: int, costs: PairCosts, index: ContextIndex
    ) -> SpeculativeDecoder:
        key = (settings.spec_decode, settings.num_draft)
        if self.controller is None or self.controller_key != key:
            # verify costs are the target's: shared with every chat on this model
            self.controller = SpeculationAutopilot(
                settings.spec_decode,
                settings.num_draft,
                has_draft=False,
                lookup=True,
                pair=(self.target.id, None, cost_key(self.target.model)),
                costs=costs,
                position_cost=position_cost(self.target),
            )
            self.controller_key = key
        return SpeculativeDecoder(
            target_cache.model_view(),
            target_cache,
            None,
            self.controller,
            TokenDistribution(settings),
            rule=settings.spec_rule,
            max_tokens=max_tokens,
            index=index,
        )
