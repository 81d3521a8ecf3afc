"""Known completions checked against the matcher: spelled through its rows, or landed on from a search.

A *hint* is a byte string believed to complete the output from some state: a start plan written
from the constraint (`instance.start_candidates`) or the rest of the plan a request was following
before its output left it. `spell_along_rows` checks one from the matcher's current state: it
accepts, token by token, the tokens that spell it (the fewest, `fewest_tokens`, among those each
row allows: llguidance's rows allow only the canonical token of forced bytes), and the stop token
after them; the result is a real completion whose every token its row allowed. `Landing` offers
a search the suffixes of its hints: from a node whose row allows a suffix's first byte, the suffix
is tried (accept its fewest tokens, one fill for the stop token, roll back), shortest first, so a
search from a state off the plan ends as soon as it has written its way back onto it (the string
it opened closed, the plan's next property follows) instead of searching the rest again.

Every method leaves the matcher in the state it found it in.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import numpy as np

from ..interface import Grammar
from .tokens import UNSPELLED, TokenTable, fewest_tokens, spelled_from

MAX_LANDINGS = 24  # suffixes tried from one search node (each is rejected within a token or two)


def allows(words: np.ndarray, token: int) -> bool:
    return (token >> 5) < words.shape[0] and bool((int(words[token >> 5]) >> (token & 31)) & 1)


def stop_allowed(words: np.ndarray, stops: Sequence[int]) -> bool:
    return any(allows(words, stop) for stop in stops)


def completes(grammar: Grammar, tokens: Sequence[int], stops: Sequence[int], words: np.ndarray, bitmask, row) -> bool:
    """Whether `tokens`, then a stop token, complete the output from the matcher's state (one fill)."""
    accepted = grammar.accept_tokens(tokens)
    try:
        if accepted < len(tokens):
            return False
        grammar.fill_bitmask(bitmask, row)
        return stop_allowed(words, stops)
    finally:
        if accepted:
            grammar.rollback(accepted)


def spell_along_rows(
    grammar: Grammar, table: TokenTable, text: bytes, stops: Sequence[int], words: np.ndarray, bitmask, row
) -> tuple[int, ...] | None:
    """The tokens that spell `text` from the matcher's state, each allowed by its row (the fewest
    such, chosen token by token), after which a stop token is allowed; None if there are none.
    One fill per token."""
    best = fewest_tokens(table, text)
    if best[0][0] >= UNSPELLED:
        return None
    tokens: list[int] = []
    position = 0
    try:
        while True:
            grammar.fill_bitmask(bitmask, row)
            if position == len(text):
                return tuple(tokens) if stop_allowed(words, stops) else None
            choice = _next_token(table, text, position, best, words)
            if choice is None or not grammar.accept_token(choice[0]):
                return None
            tokens.append(choice[0])
            position = choice[1]
    finally:
        if tokens:
            grammar.rollback(len(tokens))


def _next_token(table: TokenTable, text: bytes, position: int, best, words: np.ndarray) -> tuple[int, int] | None:
    """(token, end) of the allowed token at `position` after which the rest needs the fewest tokens."""
    choice = None
    for end in table.ends(text, position):
        token = table.by_bytes.get(text[position:end])
        if token is None or best[end][0] >= UNSPELLED or not allows(words, token):
            continue
        if choice is None or best[end][0] <= best[choice[1]][0]:
            choice = (token, end)
    return choice


class Landing:
    """The suffixes of a search's hints, tried from its nodes (see the module docstring)."""

    def __init__(self, table: TokenTable, hints: Sequence[bytes]):
        self.table = table
        self.hints = [(hint, table.fewest(hint)) for hint in hints if hint]
        starts: dict[int, dict[bytes, tuple[int, int]]] = {}
        for index, (hint, best) in enumerate(self.hints):
            for start in range(len(hint)):
                if best[start][0] < UNSPELLED:
                    starts.setdefault(hint[start], {}).setdefault(hint[start:], (index, start))
        # first byte -> [(suffix length, hint, start)], shortest first; one entry per distinct suffix
        self.by_first = {
            byte: sorted((len(suffix), index, start) for suffix, (index, start) in found.items())
            for byte, found in starts.items()
        }

    def __bool__(self) -> bool:
        return bool(self.hints)

    def land(
        self,
        grammar: Grammar,
        allowed: np.ndarray,
        stops: Sequence[int],
        words: np.ndarray,
        bitmask,
        row,
        below: int,
    ) -> bytes | None:
        """The shortest suffix (shorter than `below` bytes) whose first byte `allowed` holds and that
        completes the output from the matcher's state, or None. `bitmask[row]` is scratch."""
        lists = [self.by_first[b] for b in map(int, allowed) if b in self.by_first]
        tries = itertools.takewhile(lambda entry: entry[0] < below, heapq.merge(*lists))
        for _, index, start in itertools.islice(tries, MAX_LANDINGS):
            hint, best = self.hints[index]
            if completes(grammar, spelled_from(self.table, best, start, len(hint)), stops, words, bitmask, row):
                return hint[start:]
        return None
