"""The shortest string of a regular language, through the schema package's own automata.

`shortest_match` answers for a string schema's patterns and length bounds (a JSON string's
content, costed as its JSON encoding: ``"`` and ``\\`` take two bytes, a control character six) or
for a whole-output regex (``guided_regex``, costed in UTF-8 bytes). Patterns are read exactly as
`fd_guided.schema` reads them (`regex_parse.parse`, `regex_reading.full_match_tree`), turned into
deterministic automata over code-point classes (`automaton.to_dfa`), and the cheapest path to an
accepting state of their product is found by Dijkstra over (the automata's states, the characters
written so far up to ``minLength``). Each class is written with its cheapest character, the first
of `PREFERRED` where there is a choice (``a``, ``0``: short, common tokens).

Patterns handed to an engine come in its dialect: xgrammar's is Python's (``\\uXXXX`` escapes),
llguidance's writes ``\\x{HHHH}`` (`regex.to_text`), rewritten here to Python's ``\\UHHHHHHHH``.
Bounded: `MAX_STATES` product states; past it, or for a pattern the schema package refuses, the
answer is None (the caller then has no candidate, never a wrong one).
"""

from __future__ import annotations

import functools
import heapq
import json
import re

from ..schema.automaton import Alphabet, Dfa, Work, to_dfa
from ..schema.refusal import Refusal, Unsatisfiable
from ..schema.regex_parse import ALL_CHARS, parse
from ..schema.regex_reading import full_match_reading, full_match_tree

MAX_STATES = 20_000  # product states Dijkstra may settle for one string
PREFERRED = "a0A1b2eB-._ "
_LLGUIDANCE_ESCAPE = re.compile(r"\\(x\{([0-9a-fA-F]+)\}|.)", re.DOTALL)
_ERRORS = (Refusal, Unsatisfiable, RecursionError, ValueError)


@functools.lru_cache(maxsize=4096)
def json_char_cost(point: int) -> int:
    """Bytes `chr(point)` takes inside a JSON string (its escape where it needs one)."""
    return len(json.dumps(chr(point), ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def raw_char_cost(point: int) -> int:
    return 1 if point < 0x80 else 2 if point < 0x800 else 3 if point < 0x10000 else 4


def python_pattern(text: str) -> str:
    """An engine's pattern in Python's syntax: llguidance's ``\\x{HH}`` escapes become ``\\UHHHHHHHH``
    (xgrammar's dialect is Python's already); every other escape is kept as it is."""

    def rewrite(match: re.Match) -> str:
        return f"\\U{int(match.group(2), 16):08x}" if match.group(2) else match.group(0)

    return _LLGUIDANCE_ESCAPE.sub(rewrite, text)


@functools.lru_cache(maxsize=1024)
def shortest_match(
    patterns: tuple[str, ...], *, low: int = 0, high: int | None = None, json_string: bool = True
) -> str | None:
    """The cheapest string (see the module docstring) that every one of `patterns` accepts
    (``re.search`` reading, as JSON Schema's ``pattern``) with between `low` and `high` code
    points; None when there is none or it cannot be told within bounds."""
    try:
        trees = [full_match_tree(parse(python_pattern(p))[0], ALL_CHARS) for p in patterns]
    except _ERRORS:
        return None
    return _cheapest(trees or [("rep", 0, None, ("set", ALL_CHARS))], low, high, json_string)


@functools.lru_cache(maxsize=256)
def shortest_full_match(pattern: str) -> str | None:
    """The shortest string `pattern` matches whole (``re.fullmatch``: ``guided_regex``), in UTF-8 bytes."""
    try:
        tree = full_match_reading(pattern)
    except _ERRORS:
        return None
    return _cheapest([tree], 0, None, False)


def _cheapest(trees: list[tuple], low: int, high: int | None, json_string: bool) -> str | None:
    cost = json_char_cost if json_string else raw_char_cost
    if len(trees) == 1:
        # One pattern: its tree alone says its cheapest string (no automaton: an e-mail address's
        # counted repetitions make one of thousands of states); length bounds are checked after.
        try:
            found = _tree_cheapest(trees[0], cost)
        except RecursionError:
            found = None
        if found is not None and low <= len(found[1]) and (high is None or len(found[1]) <= high):
            return found[1]
    try:
        alphabet = Alphabet(trees)
        work = Work()
        dfas = [to_dfa(tree, alphabet, work) for tree in trees]
    except _ERRORS:
        return None
    letters = _letters(alphabet, cost)
    return _dijkstra(dfas, letters, low, high)


def _tree_cheapest(node: tuple, cost) -> tuple[int, str] | None:
    """(cost, string): the cheapest full match of a tree (``set``/``cat``/``alt``/``rep`` nodes)."""
    kind = node[0]
    if kind == "set":
        point = _cheapest_member(node[1], cost)
        return None if point is None else (cost(point), chr(point))
    if kind == "cat":
        parts = [_tree_cheapest(child, cost) for child in node[1]]
        if any(part is None for part in parts):
            return None
        return sum(p[0] for p in parts if p), "".join(p[1] for p in parts if p)
    if kind == "alt":
        options = [found for found in (_tree_cheapest(child, cost) for child in node[1]) if found is not None]
        return min(options, key=lambda found: (found[0], len(found[1]))) if options else None
    if kind == "rep":
        if node[1] == 0:
            return (0, "")
        body = _tree_cheapest(node[3], cost)
        return None if body is None else (body[0] * node[1], body[1] * node[1])
    return None  # an anchor or boundary left in the tree: the automaton's turn


def _cheapest_member(ranges: tuple, cost) -> int | None:
    """The cheapest code point of a set (tuples of (lo, hi)), the first of PREFERRED on a tie."""
    candidates = [ord(c) for c in PREFERRED if any(lo <= ord(c) <= hi for lo, hi in ranges)]
    for lo, hi in ranges:
        candidates += [p for p in (lo, 0x21, 0x61, 0x7F, 0x80, 0x800, 0x10000) if lo <= p <= hi]
    candidates = [p for p in candidates if not 0xD800 <= p <= 0xDFFF]
    return min(candidates, key=lambda p: (cost(p), _rank(p))) if candidates else None


def _letters(alphabet: Alphabet, cost) -> list[tuple[int, int]]:
    """Per class: (its cheapest character's cost, that character), the first of PREFERRED on a tie;
    (0, -1) for a class of surrogates only (never written)."""
    bounds = alphabet.bounds
    out = []
    for index in range(len(bounds) - 1):
        best = _cheapest_member(((bounds[index], bounds[index + 1] - 1),), cost)
        out.append((0, -1) if best is None else (cost(best), best))
    return out


def _rank(point: int) -> int:
    index = PREFERRED.find(chr(point))
    return index if index >= 0 else len(PREFERRED) + point


def _dijkstra(dfas: list[Dfa], letters: list[tuple[int, int]], low: int, high: int | None) -> str | None:
    """The cheapest accepted path through the product of `dfas` with at least `low` characters
    (and at most `high`: a path that would pass it is not extended)."""
    if any(not dfa.moves for dfa in dfas):
        return None
    start = (tuple(0 for _ in dfas), 0)
    best: dict[tuple, int] = {start: 0}
    parent: dict[tuple, tuple[tuple, int]] = {}
    heap: list[tuple[int, int, tuple]] = [(0, 0, start)]
    settled = 0
    while heap:
        spent, size, node = heapq.heappop(heap)
        if spent > best[node]:
            continue
        settled += 1
        if settled > MAX_STATES:
            return None
        states, count = node
        if count >= low and all(s in dfa.accepting for s, dfa in zip(states, dfas)):
            return _spell(parent, node)
        if high is not None and size >= high:
            continue
        for cls, target in sorted(dfas[0].moves[states[0]].items()):
            step, point = letters[cls]
            following = _moved(dfas, states, cls, target) if point >= 0 else None
            if following is None:
                continue
            child = (following, min(count + 1, low))
            if spent + step < best.get(child, spent + step + 1):
                best[child] = spent + step
                parent[child] = (node, point)
                heapq.heappush(heap, (spent + step, size + 1, child))
    return None


def _moved(dfas: list[Dfa], states: tuple, cls: int, first: int) -> tuple | None:
    """The product state after class `cls` (`first`: the first automaton's move), None if one has none."""
    following = [first]
    for dfa, state in zip(dfas[1:], states[1:]):
        moved = dfa.moves[state].get(cls)
        if moved is None:
            return None
        following.append(moved)
    return tuple(following)


def _spell(parent: dict, node: tuple) -> str:
    chars = []
    while node in parent:
        node, point = parent[node]
        chars.append(chr(point))
    return "".join(reversed(chars))


__all__ = ["json_char_cost", "python_pattern", "raw_char_cost", "shortest_full_match", "shortest_match"]
