"""A DFA written back as a regex tree, by state elimination (`to_tree`).

The state with the fewest edges goes first; each path through it is joined onto its neighbours'
edges (unions merge their sets, `_alt`), until one edge from the start to the end holds the
language. Work is spent per path joined (`dfa.Work`) and the tree is bounded (`MAX_TREE_NODES`);
past a bound it is a `Refusal`.
"""

from __future__ import annotations

from .dfa import Alphabet, Dfa, Work
from .refusal import Refusal
from .regex_parse import normalise

MAX_TREE_NODES = 20_000
EPSILON: tuple = ("cat", [])


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
