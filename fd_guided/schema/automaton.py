"""Finite automata over code-point classes: the machinery under `fd_guided.schema.languages`.

Trees (`fd_guided.schema.regex`'s ``set``/``cat``/``alt``/``rep`` nodes, full-match readings)
become deterministic automata over the coarsest partition of the code points into classes no set
splits (`dfa.Alphabet`, `to_dfa`: Thompson's construction, then subsets); `product` pairs two of
them, `minimise` keeps the live states and merges equivalent ones (Moore), `to_tree` writes a
tree again (`state_elimination`). Every step is bounded (`MAX_NFA_STATES`, `dfa.MAX_DFA_STATES`,
`state_elimination.MAX_TREE_NODES`, a `dfa.Work` budget of steps); past a bound the caller
refuses, never approximates. The DFA types and `to_tree` are re-exported here (`languages`
imports them from this module).
"""

from __future__ import annotations

from collections.abc import Iterable

from .deadline import checkpoint
from .dfa import Alphabet, Dfa, Work, state_of
from .refusal import Refusal
from .state_elimination import to_tree

MAX_NFA_STATES = 20_000


# ----- tree -> NFA -> DFA ----------------------------------------------------------------------------


class _Nfa:
    def __init__(self, alphabet: Alphabet, work: Work):
        self.alphabet = alphabet
        self.work = work
        self.moves: list[list[tuple[frozenset, int]]] = []
        self.empty: list[list[int]] = []
        self.boundaries: dict[int, list[int]] = {}  # ``\b`` edges: state -> targets
        self.word: tuple | None = None  # the word characters those edges test

    def state(self) -> int:
        if len(self.moves) >= MAX_NFA_STATES:
            raise Refusal("an automaton past its state bound")
        if not len(self.moves) & 63:
            # Admission's deadline: a long pattern (a format's, repeated) builds thousands of
            # states before the subset construction spends any work (5.5 ms for `uri`'s).
            checkpoint()
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def build(self, node: tuple) -> tuple[int, int]:
        """A fragment (start, end) accepting exactly `node`'s strings."""
        start, end = self.state(), self.state()
        self._into(node, start, end)
        return start, end

    def _into(self, node: tuple, start: int, end: int) -> None:
        kind = node[0]
        if kind == "set":
            classes = self.alphabet.classes(node[1])
            if classes:
                self.moves[start].append((classes, end))
        elif kind == "cat":
            current = start
            for child in node[1]:
                following = self.state()
                self._into(child, current, following)
                current = following
            self.empty[current].append(end)
        elif kind == "alt":
            for child in node[1]:
                self._into(child, start, end)
        elif kind == "rep":
            self._repeat(node[1], node[2], node[3], start, end)
        elif kind == "wb":
            if self.word is not None and self.word != node[1]:
                raise Refusal("word boundaries of two kinds (ASCII and Unicode) in a pattern")
            self.word = node[1]
            self.boundaries.setdefault(start, []).append(end)
        else:
            raise Refusal(f"a look-ahead beside {kind} in a pattern")

    def _repeat(self, lo: int, hi: int | None, body: tuple, start: int, end: int) -> None:
        current = start
        for _ in range(lo):
            following = self.state()
            self._into(body, current, following)
            current = following
        if hi is None:
            loop = self.state()
            self.empty[current].append(loop)
            self._into(body, loop, loop)
            self.empty[loop].append(end)
            return
        for _ in range(hi - lo):
            following = self.state()
            self.empty[current].append(end)
            self._into(body, current, following)
            current = following
        self.empty[current].append(end)

    def closure(self, states: Iterable[int]) -> frozenset:
        seen = set(states)
        stack = list(seen)
        while stack:
            targets = self.empty[stack.pop()]
            self.work.spend(1 + len(targets))
            for target in targets:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return frozenset(seen)


def to_dfa(tree: tuple, alphabet: Alphabet, work: Work) -> Dfa:
    nfa = _Nfa(alphabet, work)
    start, end = nfa.build(tree)
    if nfa.boundaries:
        return _to_dfa_with_boundaries(nfa, start, end)
    first = nfa.closure([start])
    index = {first: 0}
    order = [first]
    moves: list[dict[int, int]] = []
    for subset in order:  # grows while iterating
        targets: dict[int, set[int]] = {}
        for state in subset:
            for classes, target in nfa.moves[state]:
                work.spend(len(classes))
                for cls in classes:
                    targets.setdefault(cls, set()).add(target)
        row: dict[int, int] = {}
        for cls, reached in targets.items():
            row[cls] = state_of(nfa.closure(reached), index, order)
        moves.append(row)
    return Dfa(moves, {i for i, subset in enumerate(order) if end in subset})


_WORD, _NOT_WORD = "w", "n"  # what the next character must be, once a boundary was crossed


def _to_dfa_with_boundaries(nfa: _Nfa, start: int, end: int) -> Dfa:
    """Subsets for an automaton with ``\\b`` edges: a boundary holds between the previous
    character and the next one when exactly one of them is a word character, the string's
    start and end counting as non-word (Python's reading). A DFA state is a set of (NFA state,
    what the next character must be) pairs and whether the previous character was a word one;
    crossing a boundary fixes what the next character must be, a character that is not that
    ends the path, and the end of the string counts as a non-word character."""
    assert nfa.word is not None  # set by every boundary edge, and this automaton has some
    word = nfa.alphabet.classes(nfa.word)
    work = nfa.work

    def closure(pairs, previous_word: bool) -> frozenset:
        seen = set(pairs)
        stack = list(seen)
        while stack:
            state, need = stack.pop()
            crossed = _NOT_WORD if previous_word else _WORD
            steps = [(t, need) for t in nfa.empty[state]]
            steps += [(t, crossed) for t in nfa.boundaries.get(state, ()) if need in (None, crossed)]
            work.spend(1 + len(steps))
            for pair in steps:
                if pair not in seen:
                    seen.add(pair)
                    stack.append(pair)
        return frozenset(seen)

    first = (closure([(start, None)], False), False)
    index = {first: 0}
    order = [first]
    moves: list[dict[int, int]] = []
    for pairs, _ in order:  # grows while iterating
        targets: dict[int, set] = {}
        for state, need in pairs:
            for classes, target in nfa.moves[state]:
                work.spend(len(classes))
                for cls in classes:
                    if need is None or (need == _WORD) == (cls in word):
                        targets.setdefault(cls, set()).add((target, None))
        moves.append(
            {
                cls: state_of((closure(reached, cls in word), cls in word), index, order)
                for cls, reached in targets.items()
            }
        )
    accepting = {i for i, (pairs, _) in enumerate(order) if any(s == end and need != _WORD for s, need in pairs)}
    return Dfa(moves, accepting)


# ----- product, minimisation ---------------------------------------------------------------------------


def product(first: Dfa, second: Dfa, keep_second: bool, work: Work) -> Dfa:
    """Strings `first` accepts that `second` accepts too (`keep_second`) or does not."""
    index = {(0, 0): 0}
    order = [(0, 0)]
    moves: list[dict[int, int]] = []
    for a, b in order:
        row: dict[int, int] = {}
        second_row = second.moves[b] if b is not None else {}
        work.spend(len(first.moves[a]))
        for cls, target in first.moves[a].items():
            pair = (target, second_row.get(cls))
            if keep_second and pair[1] is None:
                continue
            row[cls] = state_of(pair, index, order)
        moves.append(row)
    accepting = {
        i
        for i, (a, b) in enumerate(order)
        if a in first.accepting
        and ((b in second.accepting) if keep_second else (b is None or b not in second.accepting))
    }
    return Dfa(moves, accepting)


def minimise(dfa: Dfa, work: Work) -> Dfa:
    """Live states only (some accepting state reachable), equivalent states merged (Moore)."""
    live = set(dfa.accepting)
    changed = True
    while changed:
        changed = False
        for state, row in enumerate(dfa.moves):
            if state not in live and any(target in live for target in row.values()):
                live.add(state)
                changed = True
    if 0 not in live:
        return Dfa([{}], set())
    rows = [{cls: t for cls, t in row.items() if t in live} for row in dfa.moves]
    block = {state: int(state in dfa.accepting) for state in live}
    while True:
        work.spend(sum(len(rows[state]) for state in live))
        signatures = {
            state: (block[state], tuple(sorted((cls, block[t]) for cls, t in rows[state].items()))) for state in live
        }
        numbering: dict[tuple, int] = {}
        refined = {state: numbering.setdefault(signatures[state], len(numbering)) for state in sorted(live)}
        if len(numbering) == len(set(block.values())):
            break
        block = refined
    ordered = [block[0]] + sorted(set(block.values()) - {block[0]})  # the start state stays 0
    number = {b: i for i, b in enumerate(ordered)}
    moves: list[dict[int, int]] = [dict() for _ in ordered]
    accepting = set()
    for state in live:
        here = number[block[state]]
        for cls, target in rows[state].items():
            moves[here][cls] = number[block[target]]
        if state in dfa.accepting:
            accepting.add(here)
    return Dfa(moves, accepting)


__all__ = ["Alphabet", "Dfa", "Work", "minimise", "product", "state_of", "to_dfa", "to_tree"]
