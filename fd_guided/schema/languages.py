"""Questions about regular languages that a regex tree alone cannot answer, asked of automata.

Neither engine has look-around, yet a look-ahead at the start of a pattern only intersects two
regular languages: ``^(?!N)R`` accepts the strings of ``R`` that do not begin with a match of ``N``
(``R`` minus ``N.*``; minus ``N`` alone when ``N`` ends in ``$``), ``^(?=N)R`` those that do
(`combine`). Overlapping ``patternProperties`` become disjoint regions (`regions`), two patterns
are proved disjoint (`disjoint`), a pattern is checked never to dead-end (`extendable`), and
word boundaries are written out (`without_boundaries`).
Each builds automata (`fd_guided.schema.automaton`) within a step budget and is exact; past a
bound the answer is a Refusal (or False), never an approximation.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from .automaton import Alphabet, Dfa, Work, minimise, product, state_of, to_dfa, to_tree
from .refusal import Refusal


def extendable(tree: tuple, plain: tuple) -> bool:
    """True when every prefix of a string `tree` matches goes on to infinitely many matched strings
    by characters of `plain` alone (the ones every engine writes raw in a JSON string): from every
    state reachable on the way to a match, a cycle of `plain` edges that can still reach a match
    is reachable by `plain` edges. Exact for the tree; False past the automaton's bounds."""
    try:
        alphabet = Alphabet([tree, ("set", plain)])
        work = Work()
        dfa = to_dfa(tree, alphabet, work)
    except Refusal:
        return False
    reverse_all: list[list[int]] = [[] for _ in dfa.moves]
    for state, row in enumerate(dfa.moves):
        for target in row.values():
            reverse_all[target].append(state)
    live = _backward(dfa.accepting, reverse_all)
    good = _infinitely_many(dfa, alphabet.classes(plain))
    return all(state in good for state in _forward(0, dfa.moves) & live)


def _infinitely_many(dfa: Dfa, plain_classes) -> set[int]:
    """States from which a cycle of plain edges that can still reach a match is reachable by
    plain edges: infinitely many plain completions."""
    plain_edges = [[t for cls, t in row.items() if cls in plain_classes] for row in dfa.moves]
    reverse_plain: list[list[int]] = [[] for _ in dfa.moves]
    for state, targets in enumerate(plain_edges):
        for target in targets:
            reverse_plain[target].append(state)
    plain_live = _backward(dfa.accepting, reverse_plain)
    on_cycle = {s for s in plain_live if _on_plain_cycle(s, plain_edges, plain_live)}
    return _backward(on_cycle, [[a for a in sources if a in plain_live] for sources in reverse_plain])


def _backward(targets: Iterable[int], reverse: list[list[int]]) -> set[int]:
    seen = set(targets)
    stack = list(seen)
    while stack:
        for source in reverse[stack.pop()]:
            if source not in seen:
                seen.add(source)
                stack.append(source)
    return seen


def _forward(start: int, moves: list[dict[int, int]]) -> set[int]:
    seen, stack = {start}, [start]
    while stack:
        for target in moves[stack.pop()].values():
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def _on_plain_cycle(state: int, plain_edges: list[list[int]], allowed: set[int]) -> bool:
    """Can `state` reach itself again by plain edges through `allowed` states?"""
    seen, stack = set(), [t for t in plain_edges[state] if t in allowed]
    while stack:
        current = stack.pop()
        if current == state:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(t for t in plain_edges[current] if t in allowed)
    return False


def regions(trees: list[tuple], any_char: tuple) -> dict[frozenset, tuple]:
    """The strings each non-empty combination of `trees` (full-match trees) shares and no other
    tree matches: subset of indexes -> a tree, for the subsets where some string exists. Together
    the regions are disjoint and cover the union of the trees (patternProperties made disjoint)."""
    alphabet = Alphabet(list(trees) + [("set", any_char)])
    work = Work()
    dfas = [to_dfa(tree, alphabet, work) for tree in trees]
    index = {(0,) * len(dfas): 0}
    order = [(0,) * len(dfas)]
    moves: list[dict[int, int]] = []
    for states in order:
        row: dict[int, int] = {}
        classes: set[int] = set()
        for dfa, state in zip(dfas, states):
            if state is not None:
                classes.update(dfa.moves[state])
        work.spend(len(classes) * len(dfas))
        for cls in classes:
            target = tuple(None if state is None else dfa.moves[state].get(cls) for dfa, state in zip(dfas, states))
            row[cls] = state_of(target, index, order)
        moves.append(row)
    members = [
        frozenset(i for i, (dfa, state) in enumerate(zip(dfas, states)) if state is not None and state in dfa.accepting)
        for states in order
    ]
    out: dict[frozenset, tuple] = {}
    for subset in sorted(set(members) - {frozenset()}, key=sorted):
        accepting = {state for state, member in enumerate(members) if member == subset}
        tree = to_tree(minimise(Dfa(moves, accepting), work), alphabet, work)
        if tree is not None:
            out[subset] = tree
    return out


def disjoint(first: tuple, second: tuple, any_char: tuple) -> bool:
    """No string matches both full-match trees (False when it cannot be decided within bounds)."""
    return no_common_string([first, second], any_char)


def combine(rest: tuple, ahead: tuple, negative: bool, any_char: tuple) -> tuple:
    """`rest`'s strings that begin (`negative` False) or do not begin (True) with a string of
    `ahead`; both are full-match trees, `ahead` already extended by ``.*`` where it is a prefix.
    Returns ``("set", ())`` when none is left."""
    try:
        return _product_tree(rest, ahead, not negative, any_char)
    except Refusal as refusal:
        raise Refusal(f"a look-ahead in a pattern ({refusal.feature})") from None


def _product_tree(first: tuple, second: tuple, keep_second: bool, any_char: tuple) -> tuple:
    """The strings of `first` that `second` matches too (`keep_second`) or does not, as a tree
    (``("set", ())`` for none); Refusal past the automata's bounds."""
    alphabet = Alphabet([first, second, ("set", any_char)])
    work = Work()
    both = product(to_dfa(first, alphabet, work), to_dfa(second, alphabet, work), keep_second, work)
    result = to_tree(minimise(both, work), alphabet, work)
    return ("set", ()) if result is None else result


def no_common_string(trees: list[tuple], any_char: tuple) -> bool:
    """True when no string matches every full-match tree; False when one does or it cannot be
    decided within bounds."""
    try:
        alphabet = Alphabet(list(trees) + [("set", any_char)])
        work = Work()
        dfa = to_dfa(trees[0], alphabet, work)
        for tree in trees[1:]:
            dfa = minimise(product(dfa, to_dfa(tree, alphabet, work), True, work), work)
        return not dfa.accepting
    except Refusal:
        return False


def intersection(first: tuple, second: tuple, any_char: tuple) -> tuple:
    """The strings both full-match trees match, as a tree (``("set", ())`` for none). Refusal
    past the automata's bounds."""
    return _product_tree(first, second, True, any_char)


def without_boundaries(tree: tuple, any_char: tuple) -> tuple:
    """A full-match tree holding ``\\b`` nodes (``wb``) as one without them, the same strings:
    the automaton tracks whether the previous character was a word character
    (`automaton.to_dfa`), which is all a boundary asks. Returns ``("set", ())`` when no string
    is left; Refusal past the automaton's bounds."""
    alphabet = Alphabet([tree, ("set", any_char)])
    work = Work()
    result = to_tree(minimise(to_dfa(tree, alphabet, work), work), alphabet, work)
    return ("set", ()) if result is None else result


class CountedLanguage:
    """A string language (a full-match tree: a pattern, a format, length bounds intersected) that
    can say how many of its strings begin with a given prefix, counting only strings of `plain`
    characters (the ones every engine writes raw), capped: the uniqueness guard's liveness test for
    items whose strings can run out (`json_tracker._Unique.live`: ``maxLength``, ``^\\d+x$``)."""

    def __init__(self, trees: list[tuple], plain: tuple):
        """`trees`: full-match trees whose intersection is the language (a pattern, a format, the
        length bounds), joined as automata (no tree is written back)."""
        self.alphabet = Alphabet(list(trees) + [("set", plain)])
        work = Work()
        dfa = to_dfa(trees[0], self.alphabet, work)
        for tree in trees[1:]:
            dfa = minimise(product(dfa, to_dfa(tree, self.alphabet, work), True, work), work)
        self.dfa = dfa
        plain_set = self.alphabet.classes(plain)
        bounds = self.alphabet.bounds
        self._weights = {cls: _plain_size(bounds[cls], bounds[cls + 1] - 1, plain) for cls in plain_set}
        self._infinite = _infinitely_many(self.dfa, set(self._weights))
        self._memo: dict[tuple[int, int], int] = {}

    def state_after(self, text: str) -> int | None:
        """The state after `text` from the start, None when no string of the language begins so."""
        if not self.dfa.moves:
            return None
        state = 0
        for char in text:
            cls = self._class_of(ord(char))
            following = self.dfa.moves[state].get(cls) if cls is not None else None
            if following is None:
                return None
            state = following
        return state

    def completions(self, state: int, cap: int) -> int:
        """How many strings (of plain characters, the empty one included) lead from `state` to a
        match, or `cap` if at least that many."""
        if state in self._infinite:
            return cap
        key = (state, cap)
        if key not in self._memo:
            total = 1 if state in self.dfa.accepting else 0
            for cls, target in self.dfa.moves[state].items():
                weight = self._weights.get(cls, 0)
                if weight and total < cap:
                    total += weight * self.completions(target, cap)
            self._memo[key] = min(total, cap)
        return self._memo[key]

    def _class_of(self, point: int) -> int | None:
        index = bisect.bisect_right(self.alphabet.bounds, point) - 1
        return index if 0 <= index < len(self.alphabet.bounds) - 1 else None


def _plain_size(lo: int, hi: int, plain: tuple) -> int:
    return sum(max(0, min(hi, b) - max(lo, a) + 1) for a, b in plain)
