"""Draft-free proposals: continuations already in the context (prompt lookup decoding,
Saxena 2023; the suffix matching of SuffixDecoding, Oliaro et al. 2024).

A chat about a document quotes it; a code edit repeats most of the file; a follow-up
restates an earlier answer. `ContextIndex` holds every token of the conversation (prompt,
attached documents, earlier turns, the answer so far) in n-gram tables, kept incrementally:
a new turn trims it to the tokens it shares with the new prompt and adds the rest, so an
edit or a regenerate drops what they replaced and nothing is rebuilt per token.

`propose` finds where the most recent tokens occurred before, extends each candidate match
backwards to its true length, and proposes what followed the longest one (the most recent
on ties). The proposal is deterministic (q is one-hot), so the decoder's `match` rule is
the exact one: the target samples its own token t ~ p and the proposal is kept while it
equals t, i.e. accepted with probability p(x), and on a rejection t is distributed as p with
x removed and renormalized.
"""

from __future__ import annotations

from dataclasses import dataclass

# Tables keyed on the last n tokens, longest first: a long key finds the quoted passage
# among thousands of tokens at once; the short ones catch a name or an identifier.
KEY_LENGTHS = (8, 4, 2)
MIN_MATCH = 2  # one shared token ("the", ",") predicts nothing
CANDIDATES = 24  # recent occurrences of a key extended to their true match length
MAX_MATCH = 64  # extending further tells nothing more
# Match-length classes (in tokens) that the autopilot measures acceptance for separately:
# a 16-token match is a quote in progress, a 2-token one often a coincidence.
MATCH_CLASSES = (2, 4, 8, 16)


def match_class(length: int) -> int:
    """Index into MATCH_CLASSES of the longest class `length` reaches."""
    return max(i for i, floor in enumerate(MATCH_CLASSES) if length >= floor)


@dataclass(frozen=True)
class LookupOffer:
    tokens: list[int]  # what followed the match in the context
    match: int  # tokens of the current suffix the match covers


class ContextIndex:
    """Every token of one conversation, and where each n-gram of it ended."""

    def __init__(self):
        self.tokens: list[int] = []
        self._tables: dict[int, dict[tuple, list[int]]] = {n: {} for n in KEY_LENGTHS}

    def __len__(self) -> int:
        return len(self.tokens)

    def sync(self, tokens: list[int]) -> int:
        """Hold exactly `tokens`: keep the shared prefix, drop the rest, add the new tail.
        Returns how many tokens were kept."""
        common = 0
        limit = min(len(self.tokens), len(tokens))
        while common < limit and self.tokens[common] == tokens[common]:
            common += 1
        self.truncate(common)
        self.extend(tokens[common:])
        return common

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n, table in self._tables.items():
                if end + 1 >= n:
                    table.setdefault(tuple(self.tokens[end + 1 - n :]), []).append(end)

    def truncate(self, length: int) -> None:
        """Forget every token from `length` on (positions are appended in order, so each
        forgotten n-gram is the last entry of its list)."""
        while len(self.tokens) > length:
            end = len(self.tokens) - 1
            for n, table in self._tables.items():
                if end + 1 >= n:
                    key = tuple(self.tokens[end + 1 - n :])
                    ends = table[key]
                    ends.pop()
                    if not ends:
                        del table[key]
            self.tokens.pop()

    def propose(self, k: int) -> LookupOffer | None:
        """Up to k tokens that followed the longest earlier occurrence of the current suffix."""
        tokens, end = self.tokens, len(self.tokens) - 1
        for n in KEY_LENGTHS:
            if end + 1 < n:
                continue
            ends = self._tables[n].get(tuple(tokens[end + 1 - n :]))
            if not ends or (len(ends) == 1 and ends[0] == end):
                continue
            best, best_len = -1, 0
            for start in reversed(ends[-CANDIDATES - 1 :]):
                if start == end:
                    continue  # the suffix itself
                length = n
                while length < MAX_MATCH and start - length >= 0 and tokens[start - length] == tokens[end - length]:
                    length += 1
                if length > best_len:
                    best, best_len = start, length
            if best_len >= MIN_MATCH:
                return LookupOffer(tokens[best + 1 : best + 1 + k], best_len)
        return None
