"""``patternProperties`` for an engine: each pattern re-printed as the engine's full-match regex
(`regex.translate`), patterns that may overlap rewritten as disjoint regions (llguidance needs
disjoint ones), and the keys a declared property already settles left out of every pattern.

JSON Schema applies every matching pattern's schema (and a declared property's) to a key; a region
of keys matched by the same patterns gets the intersection of their schemas (`languages.regions`).
A declared key whose matching patterns ask nothing its own schema does not (`_settled`) is taken
out of the patterns exactly (an automaton difference, `languages.combine`), so the engine
never has to intersect the two itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from . import languages, regex
from .capabilities import REFUSED, how
from .refusal import Refusal

MAX_PATTERN_PROPERTIES = 64
MAX_OVERLAPPING_PATTERNS = 4  # regions: at most 15
# llguidance proves patternProperties disjoint itself, within a budget: measured, region patterns of
# ~650 characters pass and of ~1,400 fail at compile ("can't determine"), so longer ones are refused here.
MAX_REGION_PATTERN = 1000


def pattern_properties(
    pprops: dict, engine: str, where: str, emit: Callable, intersect: Callable, declared: dict
) -> dict:
    """The engine's ``patternProperties`` for `pprops` (pattern -> normalised union); `emit`
    writes a union for the engine, `intersect` joins two; `declared` holds the object's declared
    properties as emitted, and those the patterns settle (`_settled`) match no pattern."""
    if how("patternProperties", engine) == REFUSED:
        raise Refusal("patternProperties", where)
    if len(pprops) > MAX_PATTERN_PROPERTIES:  # disjointness is checked pairwise
        raise Refusal(f"more than {MAX_PATTERN_PROPERTIES} patternProperties", where)
    written = _Written(emit, where)
    settled = [name for name, schema in declared.items() if _settled(name, schema, pprops, written)]
    keys: dict[str, str | None] = {}
    for pattern in pprops:
        try:
            keys[pattern] = regex.translate(pattern, engine)
            if any(re.search(pattern, name) for name in settled):
                keys[pattern] = _printed(_without(_tree(pattern), settled), engine)
        except Refusal as refusal:
            raise Refusal(refusal.feature, where) from None
    if len(pprops) > 1 and not _disjoint_patterns(list(pprops)):
        return _disjoint_regions(pprops, engine, where, written, intersect, settled)
    return {keys[pattern]: written(child) for pattern, child in pprops.items() if keys[pattern] is not None}


class _Written:
    """Each pattern's schema emitted once (with its JSON text), whether `_settled` compares it
    or the keywords hold it. Keeps every union it wrote, so an id is never reused meanwhile."""

    def __init__(self, emit: Callable, where: str):
        self._emit, self._where = emit, where
        self._done: dict[int, tuple] = {}

    def __call__(self, child) -> object:
        return self._entry(child)[1]

    def text(self, child) -> str:
        return self._entry(child)[2]

    def _entry(self, child) -> tuple:
        if id(child) not in self._done:
            emitted = self._emit(child, self._where)
            self._done[id(child)] = (child, emitted, json.dumps(emitted, sort_keys=True))
        return self._done[id(child)]


def _settled(name: str, emitted, pprops: dict, written: _Written) -> bool:
    """True when every pattern that matches the declared property `name` asks of its value what
    the property's own schema already does (the same emitted schema, or any value): the key can
    leave the patterns, as JSON Schema's meaning is the intersection of them all. Left in,
    llguidance intersects the two itself and cannot where they refer to a recursive definition
    ("circular references with sibling keys"). Judged on the emitted schemas, which stand for
    exactly what the engine enforces."""
    matching = [child for pattern, child in pprops.items() if re.search(pattern, name)]
    if not matching:
        return False
    text = json.dumps(emitted, sort_keys=True)
    return all(child.is_any or written.text(child) == text for child in matching)


def _disjoint_regions(
    pprops: dict, engine: str, where: str, written: _Written, intersect: Callable, settled: list[str]
) -> dict:
    """Overlapping patterns rewritten exactly: one pattern per non-empty region of keys that the
    same patterns match, whose schema is the intersection of theirs."""
    if len(pprops) > MAX_OVERLAPPING_PATTERNS:
        raise Refusal(f"patternProperties whose patterns may overlap (more than {MAX_OVERLAPPING_PATTERNS})", where)
    patterns, children = list(pprops), list(pprops.values())
    try:
        regions = languages.regions([_tree(pattern) for pattern in patterns], regex.ALL_CHARS)
        out = {}
        for subset, tree in regions.items():
            child = children[min(subset)]
            for index in sorted(subset)[1:]:
                child = intersect(child, children[index])
            key = _printed(_without(tree, settled) if settled else tree, engine)
            if key is None:
                continue
            if len(key) > MAX_REGION_PATTERN:
                raise Refusal("a region pattern too long for llguidance to prove the regions disjoint")
            out[key] = written(child)
    except Refusal as refusal:
        raise Refusal(f"patternProperties whose patterns overlap ({refusal.feature})", where) from None
    return out


def _tree(pattern: str) -> tuple:
    return regex.full_match_tree(regex.parse(pattern)[0], regex.ALL_CHARS)


def _without(tree: tuple, names: list[str]) -> tuple:
    """The keys of `tree` but `names` (an exact automaton difference)."""
    literal = ("alt", [("cat", [("set", ((ord(c), ord(c)),)) for c in name]) for name in names])
    return languages.combine(tree, literal, True, regex.ALL_CHARS)


def _printed(tree: tuple, engine: str) -> str | None:
    """`tree` as the engine's regex; None when it matches no key."""
    tree = regex.restrict(tree, regex.ALL_CHARS)
    return None if tree == regex.EMPTY_SET else regex.print_full_match(tree, engine)


def _disjoint_patterns(patterns: list[str]) -> bool:
    """True when no key matches two of the patterns: first by their first characters (anchored at
    the start, never coinciding), else exactly on their automata (`languages.disjoint`)."""
    if _disjoint_first_characters(patterns):
        return True
    try:
        trees = [_tree(pattern) for pattern in patterns]
    except Refusal:
        return False
    return all(languages.disjoint(a, b, regex.ALL_CHARS) for i, a in enumerate(trees) for b in trees[i + 1 :])


def _disjoint_first_characters(patterns: list[str]) -> bool:
    firsts = []
    for pattern in patterns:
        tree, _ = regex.parse(pattern)
        tree = regex.full_match_tree(tree, regex.PLAIN_JSON_CHARS)
        first = _first_set(tree)
        if first is None:
            return False
        firsts.append(first)
    for i in range(len(firsts)):
        for j in range(i + 1, len(firsts)):
            if regex.intersect(firsts[i], firsts[j]):
                return False
    return True


def _first_set(node) -> tuple | None:
    """Characters a non-empty match must start with; None when unknown or the match may be empty."""
    kind = node[0]
    if kind == "set":
        return node[1]
    if kind == "cat":
        return _first_set(node[1][0]) if node[1] else None
    if kind == "alt":
        sets = [_first_set(child) for child in node[1]]
        if any(s is None for s in sets):
            return None
        return regex.normalise(r for s in sets if s is not None for r in s)  # all are sets here
    if kind == "rep":
        return _first_set(node[3]) if node[1] > 0 else None
    return None
