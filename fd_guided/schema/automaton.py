"""Finite automata over code-point classes: the machinery under `fd_guided.schema.languages`.

Trees (`fd_guided.schema.regex`'s ``set``/``cat``/``alt``/``rep`` nodes, full-match readings)
become deterministic automata over the coarsest partition of the code points into classes no set
splits (`Alphabet`, `to_dfa`: Thompson's construction, then subsets); `product` pairs two of
them, `minimise` keeps the live states and merges equivalent ones (Moore), `to_tree` writes a
tree again (state elimination). Every step is bounded (`MAX_NFA_STATES`, `MAX_DFA_STATES`,
`MAX_TREE_NODES`, a `Work` budget of steps); past a bound the caller refuses, never approximates.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from .refusal import Refusal
from .regex_parse import nodes, normalise

MAX_NFA_STATES = 20_000
MAX_DFA_STATES = 2_000
MAX_TREE_NODES = 20_000
MAX_WORK = 3_000_000  # elementary steps (moves followed, rows compared, paths joined): about a second
EPSILON: tuple = ("cat", [])


class Work:
    """A step budget for one question (`languages`): a hostile pattern is refused, not computed for minutes."""

    def __init__(self, limit: int = MAX_WORK):
        self.left = limit

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise Refusal("an automaton too costly to build (past its step budget)")


# ----- the alphabet: classes of code points no set of either tree splits ---------------------------


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


# ----- DFA -> tree (state elimination) ---------------------------------------------------------------


def _alt(parts: list) -> tuple | None:
    """The union of `parts` (None = no string); sets merge into one set, duplicates drop."""
    sets: list = []
    others: list = []
    for part in parts:
        if part is None:
            continue
        if part[0] == "alt":
            for child in part[1]:
                (sets if child[0] == "set" else others).append(child)
        elif part[0] == "set":
            sets.append(part)
        elif part not in others:
            others.append(part)
    if sets:
        others.insert(0, ("set", normalise(r for node in sets for r in node[1])))
    unique: list = []
    for part in others:
        if part not in unique:
            unique.append(part)
    if not unique:
        return None
    return unique[0] if len(unique) == 1 else ("alt", unique)


def _cat(parts: list) -> tuple | None:
    flat: list = []
    for part in parts:
        if part is None:
            return None
        flat.extend(part[1] if part[0] == "cat" else [part])
    return flat[0] if len(flat) == 1 else ("cat", flat)


def _star(part: tuple | None) -> tuple:
    return EPSILON if part is None or part == EPSILON else ("rep", 0, None, part)


def _size(node: tuple) -> int:
    count, stack = 0, [node]
    while stack:
        node = stack.pop()
        count += 1
        if node[0] in ("cat", "alt"):
            stack.extend(node[1])
        elif node[0] == "rep":
            stack.append(node[3])
    return count


def to_tree(dfa: Dfa, alphabet: Alphabet, work: Work) -> tuple | None:
    """A tree for `dfa`'s language (None when it is empty), by state elimination: the state with
    the fewest edges goes first, each path through it joined onto its neighbours' edges."""
    if not dfa.accepting:
        return None
    n = len(dfa.moves)
    start, final = n, n + 1
    out: dict[int, dict[int, tuple]] = {state: {} for state in range(n + 2)}
    into: dict[int, set[int]] = {state: set() for state in range(n + 2)}

    def join(a: int, b: int, path: tuple) -> None:
        joined = _alt([out[a].get(b), path])
        assert joined is not None  # `path` is a string set, never None
        out[a][b] = joined
        into[b].add(a)

    for state, row in enumerate(dfa.moves):
        by_target: dict[int, list[int]] = {}
        for cls, target in row.items():
            by_target.setdefault(target, []).append(cls)
        for target, classes in by_target.items():
            join(state, target, ("set", alphabet.ranges(classes)))
    join(start, 0, EPSILON)
    for state in dfa.accepting:
        join(state, final, EPSILON)
    remaining = set(range(n))
    while remaining:
        state = min(remaining, key=lambda s: len(into[s]) * len(out[s]))
        remaining.discard(state)
        loop = _star(out[state].pop(state, None))
        into[state].discard(state)
        sources = [a for a in into[state]]
        targets = list(out[state].items())
        work.spend(1 + len(sources) * len(targets))
        for a in sources:
            into_edge = out[a].pop(state)
            for b, out_edge in targets:
                path = _cat([into_edge, loop, out_edge])
                assert path is not None  # no part is None: each edge is a path, the loop at least EPSILON
                work.spend(_size(path))
                join(a, b, path)
        for b, _ in targets:
            into[b].discard(state)
        out[state] = {}
        into[state] = set()
    result = out[start].get(final)
    if result is not None and _size(result) > MAX_TREE_NODES:
        raise Refusal("an automaton whose regex is too large to write out")
    return result
