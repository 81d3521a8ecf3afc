"""Deterministic automata over code-point classes, and what every automaton step shares.

`Alphabet`: the coarsest partition of the code points into classes no set of the trees splits
(disjoint intervals; a set is a frozenset of class indexes). `Dfa`: one row of moves per state,
class -> state, a missing class being the dead state. `state_of` numbers the states a
construction finds (subsets, pairs) and refuses past `MAX_DFA_STATES`; `Work` is the step budget
one question spends. Built and combined by `automaton`, written back as a tree by
`state_elimination`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from .deadline import checkpoint
from .refusal import Refusal
from .regex_parse import nodes

MAX_DFA_STATES = 2_000
MAX_WORK = 3_000_000  # elementary steps (moves followed, rows compared, paths joined): about a second


class Work:
    """A step budget for one question (`languages`): a hostile pattern is refused, not computed for minutes."""

    def __init__(self, limit: int = MAX_WORK):
        self.left = limit

    def spend(self, steps: int) -> None:
        checkpoint()  # admission's deadline (`fd_guided.schema.deadline`)
        self.left -= steps
        if self.left < 0:
            raise Refusal("an automaton too costly to build (past its step budget)")


def _sets(tree: tuple) -> Iterable[tuple]:
    """The code-point sets of `tree` (a boundary's word set too: it splits the alphabet)."""
    return (node[1] for node in nodes(tree) if node[0] in ("set", "wb"))


class Alphabet:
    """Disjoint code-point intervals (`bounds[i]` to `bounds[i + 1] - 1`); a set is a frozenset of
    their indexes."""

    def __init__(self, trees: Iterable[tuple]):
        cuts = {0}
        for tree in trees:
            for ranges in _sets(tree):
                for lo, hi in ranges:
                    cuts.update((lo, hi + 1))
        self.bounds = sorted(cuts)

    def classes(self, ranges: tuple) -> frozenset:
        out: set[int] = set()
        for lo, hi in ranges:
            first = bisect.bisect_right(self.bounds, lo) - 1
            last = bisect.bisect_right(self.bounds, hi) - 1
            out.update(range(first, last + 1))
        return frozenset(out)

    def ranges(self, classes: Iterable[int]) -> tuple:
        out: list[list[int]] = []
        for index in sorted(classes):
            lo, hi = self.bounds[index], self.bounds[index + 1] - 1
            if out and out[-1][1] + 1 == lo:
                out[-1][1] = hi
            else:
                out.append([lo, hi])
        return tuple((lo, hi) for lo, hi in out)


def state_of(key, index: dict, order: list) -> int:
    """The number of the DFA state `key` (a set of NFA states, a tuple of states), a new one at
    the end of `order` the first time; Refusal past `MAX_DFA_STATES`."""
    if key not in index:
        if len(order) >= MAX_DFA_STATES:
            raise Refusal("an automaton past its state bound")
        index[key] = len(order)
        order.append(key)
    return index[key]


class Dfa:
    """`moves[s]`: class -> state (a missing class is the dead state); `accepting`: a set of states."""

    def __init__(self, moves: list[dict[int, int]], accepting: set[int]):
        self.moves = moves
        self.accepting = accepting
