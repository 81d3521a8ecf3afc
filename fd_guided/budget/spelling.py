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

import functools
import heapq
import itertools
from collections.abc import Sequence

import numpy as np

from ..interface import Grammar
from .tokens import UNSPELLED, TokenTable, spelled_from

MAX_LANDINGS = 32  # suffixes a search node tries (each refused within a token or two, no fill)
MAX_SCANNED = 256  # suffixes a node looks at (their first token checked against its row)


def allows(words: np.ndarray, token: int) -> bool:
    return (token >> 5) < words.shape[0] and bool((int(words[token >> 5]) >> (token & 31)) & 1)


def stop_allowed(words: np.ndarray, stops: Sequence[int]) -> bool:
    return any(allows(words, stop) for stop in stops)


def completes(grammar: Grammar, tokens: Sequence[int], stops: Sequence[int]) -> bool:
    """Whether `tokens`, then a stop token, complete the output from the matcher's state: accepts
    and roll-backs only, no fill (a matcher accepts a stop token exactly where its output is
    complete; a stop token rolls back as one token)."""
    accepted = grammar.accept_tokens(tokens)
    try:
        return accepted == len(tokens) and any(grammar.validate_tokens((stop,)) == 1 for stop in stops)
    finally:
        if accepted:
            grammar.rollback(accepted)


def spell_along_rows(
    grammar: Grammar, table: TokenTable, text: bytes, stops: Sequence[int], words: np.ndarray, bitmask, row
) -> tuple[int, ...] | None:
    """The tokens that spell `text` from the matcher's state, each allowed by its row (the fewest
    such, chosen token by token), after which a stop token is allowed; None if there are none.
    One fill per token."""
    best = table.fewest(text)
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


@functools.lru_cache(maxsize=256)
def landing_for(table: TokenTable, texts: tuple[bytes, ...]) -> Landing:
    """The `Landing` of `texts`, built once (a request's landmarks are one tuple, handed down from
    its start plan to every re-plan); read-only, shared by threads."""
    return Landing(table, texts)


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
        # first byte -> [(rank, suffix length, hint, start)], shortest first (rank: its place in
        # that order); one entry per distinct suffix
        self.by_first = {byte: _ranked(found) for byte, found in starts.items()}

    def __bool__(self) -> bool:
        return bool(self.hints)

    def land(
        self,
        grammar: Grammar,
        allowed: np.ndarray,
        stops: Sequence[int],
        words: np.ndarray,
        below: int,
    ) -> bytes | None:
        """A suffix (shorter than `below` bytes) that completes the output from the matcher's state,
        or None. Tried: those whose first token `words` (the state's row) allows, the shortest of
        each first byte first, then the second shortest of each, ... (inside a string nearly every
        byte may come next: shortest first alone would try only endings like ``}]}``)."""
        lists = [self.by_first[b] for b in map(int, allowed) if b in self.by_first]
        tried = 0
        for _, length, index, start in itertools.islice(heapq.merge(*lists), MAX_SCANNED):
            hint, best = self.hints[index]
            if length >= below or not allows(words, best[start][1]):
                continue
            if completes(grammar, spelled_from(self.table, best, start, len(hint)), stops):
                return hint[start:]
            tried += 1
            if tried >= MAX_LANDINGS:
                break
        return None


def _ranked(found: dict[bytes, tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """[(rank, suffix length, hint, start)] of one first byte's suffixes, shortest first."""
    ordered = sorted((len(suffix), index, start) for suffix, (index, start) in found.items())
    return [(rank, length, index, start) for rank, (length, index, start) in enumerate(ordered)]
