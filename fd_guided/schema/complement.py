"""The complement of a normalised union, written positively (for ``not``, ``if``/``else``, ``oneOf``).

¬(L1 ∨ L2) = ¬L1 ∧ ¬L2, and a typed leaf ``T ∧ c1 ∧ c2`` has the complement
``(every other type) ∨ (T ∧ ¬c1) ∨ (T ∧ ¬c2)``. Each ¬c below is exact where JSON Schema can say
it (bounds flip, ``required`` becomes "absent", ``properties`` becomes "present and ¬value",
a finite set of strings becomes a pattern that excludes them, ...). Where it cannot
(``pattern``, ``format``, ``multipleOf``, ``additionalProperties``, ``uniqueItems``, the
non-integer numbers of ``¬integer``), that part is *dropped*: the result is a subset of the true
complement and is marked inexact. A subset is sound wherever it is used positively; the
complement of an inexact union would be a superset, so `complement` refuses one.
"""

from __future__ import annotations

import re

from .intersection import Context, intersect
from .leaves import ANY, BARE_KINDS, NONE, Leaf, U, unique_values, value_kind
from .refusal import Refusal

MAX_EXCLUDED_NUMBERS = 16
MAX_COMPLEMENT_DEPTH = 16  # nested property/item complements; deeper parts are dropped (a subset)
MAX_EXCLUDED_TEXT = 4000
MAX_EXCLUDED_LENGTH = 200


def complement(u: U, ctx: Context, location: str) -> U:
    if u.negation_of is not None and not any(leaf.kind == "ref" for leaf in u.negation_of.leaves or ()):
        # (A top-level ref would carry its target's annotations into an unevaluated* reading.)
        # u is (a subset of) ¬V for an exact V: ¬u is V (or, u being a subset, contains V). Given
        # back as leaves a complement made, so an engine that cannot take one may drop it.
        original = u.negation_of
        given = U(
            None if original.leaves is None else [_unannotated(leaf) for leaf in original.leaves],
            original.exact and u.exact,
        )
        given.negation_of = u if u.exact else None
        return given
    if not u.exact:
        raise Refusal("a not/if/oneOf over a schema that could only be approximated", location)
    if u.leaves is None:  # u.is_any
        return NONE
    if u.is_none:
        return ANY
    depth = ctx.complement_depth
    if depth >= MAX_COMPLEMENT_DEPTH:
        return U((), exact=False)
    ctx.complement_depth = depth + 1
    try:
        result = ANY
        for leaf in u.leaves:
            result = intersect(result, complement_leaf(leaf, ctx, location), ctx)
    finally:
        ctx.complement_depth = depth
    negated = U(
        None if result.leaves is None else [Leaf(part.kind, part.kw, part.origin, True) for part in result.leaves],
        result.exact,
    )
    negated.negation_of = u
    return negated


def _unannotated(leaf: Leaf) -> Leaf:
    """`leaf` as a complement gives it: weak, evaluating nothing (``not`` drops annotations, so
    ``not: {not: X}`` is X for validation but evaluates no property or item of X)."""
    kw = leaf.kw
    if leaf.kind == "object":
        kw = {**kw, "ann": frozenset(), "ann_pp": frozenset(), "ann_rest": False}
    elif leaf.kind == "array":
        kw = {**kw, "ann_prefix": 0, "ann_items": False}
    return Leaf(leaf.kind, kw, leaf.origin, True)


def _others(kind: str, origin: str) -> list[Leaf]:
    covered = {"integer": "number"}.get(kind, kind)
    return [Leaf(k, None, origin) for k in BARE_KINDS if k != covered]


def complement_leaf(leaf: Leaf, ctx: Context, location: str) -> U:
    kind, kw, origin = leaf.kind, leaf.kw, leaf.origin
    if kind == "ref":
        active = ctx.complementing
        key = leaf.kw["target"]
        if key in active:  # a recursive schema: its complement at this depth is left out (a subset)
            return U((), exact=False)
        active.add(key)
        try:
            try:
                target = ctx.expand(leaf)
            except Refusal:
                # The target cannot be normalised here (it is the definition being normalised,
                # reached again through a oneOf/not inside it): its complement is left out, a
                # subset as above. Sound where used positively; complementing it again is refused.
                return U((), exact=False)
            return complement(target, ctx, location)
        finally:
            active.discard(key)
    if kind == "enum":
        return _complement_enum(kw["values"], origin)
    parts: list[Leaf] = _others(kind, origin)
    exact = True
    if kind == "integer":
        exact = False  # non-integer numbers are not expressible: dropped
    builder = _COMPLEMENTS.get(kind)
    if builder is not None:
        more, more_exact = builder(kw, origin, ctx, location)
        parts.extend(more)
        exact = exact and more_exact
    return U(parts, exact)


def _numbers(kw: dict, origin: str, ctx, location):
    kind_leaf = []
    lo, hi = kw["lo"], kw["hi"]
    if lo is not None:
        kind_leaf.append({"lo": None, "hi": (lo[0], not lo[1]), "steps": ()})
    if hi is not None:
        kind_leaf.append({"lo": (hi[0], not hi[1]), "hi": None, "steps": ()})
    return kind_leaf, not kw["steps"]


def _integer(kw: dict, origin: str, ctx, location):
    parts, exact = _numbers(kw, origin, ctx, location)
    from .intersection import make_integer

    leaves = [Leaf("integer", k, origin) for k in (make_integer(p) for p in parts) if k is not None]
    return leaves, exact


def _number(kw: dict, origin: str, ctx, location):
    parts, exact = _numbers(kw, origin, ctx, location)
    return [Leaf("number", p, origin) for p in parts], exact


def _string(kw: dict, origin: str, ctx, location):
    leaves = []
    if kw["min"] > 0:
        leaves.append(Leaf("string", {"min": 0, "max": kw["min"] - 1, "patterns": (), "formats": ()}, origin))
    if kw["max"] is not None:
        leaves.append(Leaf("string", {"min": kw["max"] + 1, "max": None, "patterns": (), "formats": ()}, origin))
    return leaves, not kw["patterns"] and not kw["formats"]


def _array(kw: dict, origin: str, ctx, location):
    leaves, exact = [], True
    base = Leaf("array").kw
    if kw["min"] > 0:
        leaves.append(Leaf("array", {**base, "max": kw["min"] - 1}, origin))
    if kw["max"] is not None:
        leaves.append(Leaf("array", {**base, "min": kw["max"] + 1}, origin))
    for index, child in enumerate(kw["prefix"]):
        negated = complement(child, ctx, location) if child.exact else NONE
        exact = exact and child.exact and negated.exact  # a part left out below is a subset
        if not negated.is_none:
            prefix = (ANY,) * index + (negated,)
            leaves.append(Leaf("array", {**base, "prefix": prefix, "min": index + 1}, origin))
    if kw["items"] is not None and not kw["items"].is_any:
        if not kw["prefix"] and kw["items"].exact:
            negated = complement(kw["items"], ctx, location)
            exact = exact and negated.exact
            if not negated.is_none:
                leaves.append(Leaf("array", {**base, "contains": ((negated, 1, None),)}, origin))
        else:
            exact = False
    for child, low, high in kw["contains"]:
        if low >= 1 and high is None and not kw["prefix"] and child.exact:
            negated = complement(child, ctx, location)
            exact = exact and negated.exact
            leaves.append(Leaf("array", {**base, "items": negated}, origin))
        else:
            exact = False
    if kw["unique"]:
        exact = False
    return leaves, exact


def _object(kw: dict, origin: str, ctx, location):
    leaves, exact = [], True
    base = Leaf("object").kw
    negated_props = {}
    for name, child in kw["props"].items():
        if child.is_any:
            continue
        if not child.exact:
            exact = False
            continue
        negated = complement(child, ctx, location)
        exact = exact and negated.exact
        negated_props[name] = negated
    for name in kw["required"]:
        # "absent" and "present with a value outside" are one leaf: the property's schema is
        # the complement, the key optional (an absent key satisfies ``properties``). One leaf
        # per required property, not two, keeps a oneOf of branches that each require their
        # own key (``{required: [node], properties: {node: ...}}``) from multiplying out.
        leaves.append(Leaf("object", {**base, "props": {name: negated_props.pop(name, NONE)}}, origin))
    for name, negated in negated_props.items():
        if not negated.is_none:
            leaves.append(Leaf("object", {**base, "props": {name: negated}, "required": (name,)}, origin))
    if kw["min"] > 0:
        leaves.append(Leaf("object", {**base, "max": kw["min"] - 1}, origin))
    if kw["max"] is not None:
        leaves.append(Leaf("object", {**base, "min": kw["max"] + 1}, origin))
    additional = kw["additional"]
    if additional is not None and additional.is_none and additional.exact and not kw["pprops"]:
        # Closed: a value outside is one with a key beyond the declared ones. More keys than
        # declared certainly has one (exactly that set when nothing is declared).
        leaves.append(Leaf("object", {**base, "min": len(kw["props"]) + 1}, origin))
        exact = exact and not kw["props"]
    elif kw["pprops"] or (additional is not None and not additional.is_any):
        # Includes strict mode's closure (`NONE_APPROX`): JSON Schema admits the extra keys, so
        # an object with one is not outside; nothing is added and the result is a subset.
        exact = False
    if kw["names"]:
        exact = False
    return leaves, exact


_COMPLEMENTS = {"integer": _integer, "number": _number, "string": _string, "array": _array, "object": _object}


def _complement_enum(values: tuple, origin: str) -> U:
    """Every value not in `values`: exact for null, booleans, numbers and strings; arrays and
    objects equal to a listed one cannot be excluded, so those types are dropped (inexact)."""
    by_kind: dict[str, list] = {}
    for value in unique_values(values):
        kind = value_kind(value)
        by_kind.setdefault("number" if kind == "integer" else kind, []).append(value)
    leaves, exact = [], True
    for kind in BARE_KINDS:
        listed = by_kind.get(kind)
        if not listed:
            leaves.append(Leaf(kind, None, origin))
        elif kind == "null":
            continue  # its one value is listed: no null is left, exactly
        elif kind == "boolean":
            rest = [b for b in (True, False) if not any(v is b for v in listed)]
            if rest:
                leaves.append(Leaf("enum", {"values": tuple(rest)}, origin))
        elif kind == "number" and len(listed) <= MAX_EXCLUDED_NUMBERS:
            points = sorted(set(listed))
            edges = [None] + points + [None]
            for low, high in zip(edges, edges[1:]):
                kw = {
                    "lo": None if low is None else (low, True),
                    "hi": None if high is None else (high, True),
                    "steps": (),
                }
                leaves.append(Leaf("number", kw, origin))
        elif (
            kind == "string"
            and sum(map(len, listed)) <= MAX_EXCLUDED_TEXT
            and max(map(len, listed)) <= MAX_EXCLUDED_LENGTH
        ):
            leaves.append(
                Leaf("string", {"min": 0, "max": None, "patterns": (excluding_pattern(listed),), "formats": ()}, origin)
            )
        else:
            exact = False
    return U(leaves, exact)


def excluding_pattern(strings: list[str]) -> str:
    """A Python regex (for ``re.search``) matching exactly the strings not in `strings`.

    Built on the trie of the strings: at each node a string may end (if the node is not a listed
    string), continue into a child, or leave the trie with any other character and then anything.
    """
    trie: dict = {}
    for text in strings:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = True
    return r"\A(?:" + _trie_regex(trie) + r")\Z"


def _trie_regex(node: dict) -> str:
    branches = []
    if "" not in node:
        branches.append("")
    children = [c for c in node if c != ""]
    for char in children:
        branches.append(re.escape(char) + "(?:" + _trie_regex(node[char]) + ")")
    excluded = "".join(re.escape(c) for c in children)
    branches.append((f"[^{excluded}]" if excluded else "[\\s\\S]") + "[\\s\\S]*")
    return "|".join(branches)
