"""The normal form: a union of typed leaves, and the intersection of two such unions.

A schema is normalised into a `U`: ANY (no constraint), NONE (no value) or a list of `Leaf`s
whose union is exactly the set of valid values. A leaf is one of
  - a *typed* leaf: one JSON type (``null``, ``boolean``, ``integer``, ``number``, ``string``,
    ``array``, ``object``) and only the keywords of that type, children already normalised;
  - an ``enum`` leaf: a finite list of JSON values;
  - a ``ref`` leaf: a reference to a normalised definition (kept opaque so recursion and sharing
    survive; expanded only when it must be intersected with something).
Every node an engine receives therefore carries an explicit ``type``, no combinator has sibling
keywords and no ``oneOf`` remains: the positions where engines silently drop keywords are gone.

`U.exact` is False when the union is a *subset* of the schema's values (a complement that could
not be written exactly dropped some values). Subsets are sound anywhere except under another
complement, which is why `complement` refuses inexact input.

Annotations (for ``unevaluatedProperties``/``unevaluatedItems``) travel on object and array
leaves: ``ann`` (property names evaluated), ``ann_pp`` (patterns), ``ann_rest`` (additional
properties evaluated), ``ann_prefix``/``ann_items`` for arrays. Leaves made by a complement
evaluate nothing, as JSON Schema's ``not`` drops annotations.
"""
from __future__ import annotations

from decimal import Decimal

import math
import re
from typing import Any, Callable

from .refusal import Refusal

KINDS = ("null", "boolean", "integer", "number", "string", "array", "object")
BARE_KINDS = ("null", "boolean", "number", "string", "array", "object")  # number covers integer
ALL_KINDS = frozenset(BARE_KINDS)


def kind_of(value: Any) -> str:
    """A JSON value's type among `BARE_KINDS` (an integer is a ``number``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, Decimal)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
MAX_LEAVES = 64
MAX_ANY_OF_LEAVES = 256  # a plain anyOf only lists its branches: no product, so a longer list is cheap
MAX_MERGE_EXPANSIONS = 24


class Leaf:
    """One alternative. `weak` marks leaves made by a complement (``not``, the ``else`` side of
    ``if``, a ``oneOf`` branch minus the others): dropping one only drops values, so where a weak
    leaf cannot be expressed for an engine it is dropped instead of refusing the schema."""

    __slots__ = ("kind", "kw", "origin", "weak")

    def __init__(self, kind: str, kw: dict | None = None, origin: str = "$", weak: bool = False):
        self.kind = kind
        self.kw = defaults(kind) if kw is None else kw
        self.origin = origin
        self.weak = weak

    def replace(self, **changes) -> "Leaf":
        return Leaf(self.kind, {**self.kw, **changes}, self.origin, self.weak)

    def is_bare(self) -> bool:
        return self.kind in KINDS and self.kw == defaults(self.kind)

    def __repr__(self) -> str:
        return f"Leaf({self.kind}, {self.kw})"


class U:
    """A union of leaves; ``leaves is None`` means any value, ``()`` no value."""

    __slots__ = ("leaves", "exact", "negation_of")

    def __init__(self, leaves, exact: bool = True):
        self.leaves = None if leaves is None else tuple(leaves)
        self.exact = exact
        # Set by `complement.complement` on what it returns: the (exact) union this one is the
        # complement of, so complementing again gives it back (``not: {not: X}``, an ``if`` over a
        # ``not``) where writing the complement out again could only be done in part.
        self.negation_of: "U | None" = None

    @property
    def is_any(self) -> bool:
        return self.leaves is None

    @property
    def is_none(self) -> bool:
        return self.leaves == ()

    def __repr__(self) -> str:
        return "ANY" if self.leaves is None else f"U{list(self.leaves)}{'' if self.exact else '~'}"


ANY = U(None)
NONE = U(())
# No value *as far as a subset knows*: strict mode's closure of an object (``additionalProperties``
# absent read as false) or a tuple, or an emptiness that rests on an inexact part. It behaves as
# NONE for emission, but a complement or a disjointness proof must not read it as "truly no value".
NONE_APPROX = U((), exact=False)


def defaults(kind: str) -> dict:
    if kind in ("integer", "number"):
        return {"lo": None, "hi": None, "steps": ()}
    if kind == "string":
        return {"min": 0, "max": None, "patterns": (), "formats": ()}
    if kind == "array":
        return {"prefix": (), "items": None, "min": 0, "max": None, "unique": False, "contains": (),
                "ann_prefix": 0, "ann_items": False, "declared": False}
    if kind == "object":
        return {"props": {}, "pprops": {}, "additional": None, "required": (), "min": 0, "max": None, "names": (),
                "ann": frozenset(), "ann_pp": frozenset(), "ann_rest": False, "declared": False}
    if kind == "enum":
        return {"values": ()}
    return {}


def bare(kinds=BARE_KINDS, origin: str = "$") -> U:
    return U([Leaf(kind, None, origin) for kind in kinds])


def union(parts, limit: int = MAX_LEAVES) -> U:
    leaves, exact = [], True
    for part in parts:
        if part.is_any:
            return U(None, exact and all(p.exact for p in parts))
        leaves.extend(part.leaves)
        exact = exact and part.exact
    leaves = _enums_joined(_absorbed(leaves))
    _check_size(leaves, limit)
    return U(leaves, exact)


def _enums_joined(leaves: list) -> list:
    """The enum leaves of a union as one, where the first stood (``anyOf`` of 200 ``const``s is one
    enum of 200 values, not 200 alternatives). Exact."""
    enums = [leaf for leaf in leaves if leaf.kind == "enum"]
    if len(enums) < 2:
        return leaves
    joined = Leaf("enum", {"values": unique_values(v for leaf in enums for v in leaf.kw["values"])}, enums[0].origin,
                  all(leaf.weak for leaf in enums))
    out = []
    for leaf in leaves:
        if leaf is enums[0]:
            out.append(joined)
        elif leaf.kind != "enum":
            out.append(leaf)
    return out


def _absorbed(leaves: list) -> list:
    """The same union without leaves a bare leaf already covers: every other leaf of a scalar type
    (``number`` covers ``integer``), enum values of that type, and repeats of a bare array or
    object leaf (other array/object leaves stay: they may carry annotations). Exact. An untyped
    branch normalises to one leaf per type, so ``anyOf`` of 14 ``required`` alternatives had 13
    copies of each non-object type."""
    bare_kinds = {leaf.kind for leaf in leaves if leaf.is_bare()}
    if not bare_kinds:
        return leaves
    if "number" in bare_kinds:
        bare_kinds.add("integer")
    out, kept_bare = [], set()
    for leaf in leaves:
        if leaf.is_bare():
            if leaf.kind not in kept_bare and not (leaf.kind == "integer" and "number" in bare_kinds):
                kept_bare.add(leaf.kind)
                out.append(leaf)
        elif leaf.kind == "enum":
            values = tuple(v for v in leaf.kw["values"] if value_kind(v) not in bare_kinds and kind_of(v) not in bare_kinds)
            if values:
                out.append(leaf if len(values) == len(leaf.kw["values"]) else leaf.replace(values=values))
        elif leaf.kind in ("array", "object", "ref") or leaf.kind not in bare_kinds:
            out.append(leaf)
    return out


def children(kw: dict):
    """The schemas nested directly in a leaf's keywords (properties, items, contains, ...)."""
    for key in ("props", "pprops"):
        yield from kw.get(key, {}).values()
    for key in ("additional", "items"):
        if kw.get(key) is not None:
            yield kw[key]
    yield from kw.get("prefix", ())
    yield from kw.get("names", ())
    for child, _low, _high in kw.get("contains", ()):
        yield child


def emptied(kw: dict, ctx: "Context") -> U:
    """The union for an array or object leaf that `check_array`/`check_object` found to have no
    value: exactly empty (NONE) when an exact part proves it (counts that clash, a required
    property or a needed position that truly admits nothing), else empty only as far as the
    subsets it was judged by know (`NONE_APPROX`)."""
    if kw["max"] is not None and kw["min"] > kw["max"]:
        return NONE
    if "props" in kw:
        if kw["max"] is not None and len(kw["required"]) > kw["max"]:
            return NONE
        proofs = [schema_for(kw, name, ctx) for name in kw["required"]]
    else:
        proofs = list(kw["prefix"][:kw["min"]])
        if kw["items"] is not None and len(kw["prefix"]) < kw["min"]:
            proofs.append(kw["items"])
    return NONE if any(proof.is_none and proof.exact for proof in proofs) else NONE_APPROX


def deeply_exact(u: U, ctx: "Context", seen: set | None = None) -> bool:
    """True when `u` and every schema nested in it, through refs, is exact: a value `accepts`
    rejects against it is then truly invalid (a closed object's extra key, say, is not)."""
    if not u.exact:
        return False
    if u.leaves is None:
        return True
    seen = set() if seen is None else seen
    for leaf in u.leaves:
        if leaf.kind == "ref":
            key = leaf.kw["target"]
            if key not in seen:
                seen.add(key)
                if not deeply_exact(ctx.expand(leaf), ctx, seen):
                    return False
        elif not all(deeply_exact(child, ctx, seen) for child in children(leaf.kw)):
            return False
    return True


def _check_size(leaves, limit: int = MAX_LEAVES) -> None:
    if len(leaves) > limit:
        raise Refusal(f"a combination of anyOf/oneOf/not/if/dependencies with more than {limit} alternatives")


# ----- intersection --------------------------------------------------------------------------------


class Context:
    """What merging needs from the normaliser: expanding refs, checking enum values, a work budget."""

    merge_expansions = 0  # refs expanded by the merges in progress (see `merge`)
    unique_guard = False  # the runtime uniqueness guard will run (`unique_items.finish_unique`)

    def ref_kinds(self, key: tuple) -> frozenset:
        """The types a reference target's values may have (an over-approximation)."""
        return ALL_KINDS

    ordered_objects = True  # engines write an object's properties in the schema's order

    def expand(self, leaf: Leaf) -> U:  # pragma: no cover - interface
        raise NotImplementedError

    def accepts(self, u: U, value: Any) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def spend(self, amount: int = 1) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def intersect(a: U, b: U, ctx: Context) -> U:
    if a.is_any:
        return b
    if b.is_any:
        return a
    if a.is_none or b.is_none:
        truly_empty = (a.is_none and a.exact) or (b.is_none and b.exact)
        return NONE if truly_empty else NONE_APPROX
    out: list[Leaf] = []
    exact = a.exact and b.exact
    for left in a.leaves:
        for right in b.leaves:
            ctx.spend()
            merged = merge(left, right, ctx)
            out.extend(merged.leaves)
            exact = exact and merged.exact
    _check_size(out)
    return U(out, exact)


def merge(a: Leaf, b: Leaf, ctx: Context) -> U:
    """The intersection of two leaves, as a union (refs expand into several leaves)."""
    if a.kind == "ref" or b.kind == "ref":
        # Intersecting recursive definitions would need a new recursive definition: nested
        # expansions are bounded instead, and past the bound the schema is refused.
        if ctx.merge_expansions >= MAX_MERGE_EXPANSIONS:
            raise Refusal("the intersection of recursive $ref definitions (allOf or siblings of recursive schemas)", a.origin)
        ctx.merge_expansions += 1
        try:
            if a.kind == "ref":
                return intersect(ctx.expand(a), U([b]), ctx)
            return intersect(U([a]), ctx.expand(b), ctx)
        finally:
            ctx.merge_expansions -= 1
    if a.kind == "enum" or b.kind == "enum":
        values, other = (a, b) if a.kind == "enum" else (b, a)
        kept = tuple(v for v in values.kw["values"] if ctx.accepts(U([other]), v))
        # A value the other leaf rejects is truly invalid only when that leaf is exact all the way down.
        exact = len(kept) == len(values.kw["values"]) or deeply_exact(U([other]), ctx)
        if not kept:
            return NONE if exact else NONE_APPROX
        return U([Leaf("enum", {"values": kept}, values.origin, a.weak or b.weak)], exact)
    kinds = {a.kind, b.kind}
    if kinds == {"integer", "number"}:
        kind = "integer"
    elif len(kinds) == 1:
        kind = a.kind
    else:
        return NONE
    merged = _MERGERS.get(kind, lambda x, y, c: {})(a.kw, b.kw, ctx)
    if merged is None:
        return NONE
    if isinstance(merged, U):  # an array or object with no value (`emptied`)
        return merged
    return U([Leaf(kind, merged, a.origin, a.weak or b.weak)])


def _tighter(first, second, lower: bool):
    """The tighter of two bounds (value, exclusive); None is no bound."""
    if first is None:
        return second
    if second is None:
        return first
    if first[0] != second[0]:
        return first if (first[0] > second[0]) == lower else second
    return (first[0], first[1] or second[1])


def integer_bounds(lo, hi):
    """Inclusive integer bounds from (value, exclusive) pairs (exact: integers between them)."""
    if lo is not None:
        value, exclusive = lo
        lo = (math.floor(value) + 1 if exclusive else math.ceil(value), False)
    if hi is not None:
        value, exclusive = hi
        hi = (math.ceil(value) - 1 if exclusive else math.floor(value), False)
    return lo, hi


def bounds_empty(lo, hi) -> bool:
    if lo is None or hi is None:
        return False
    return lo[0] > hi[0] or (lo[0] == hi[0] and (lo[1] or hi[1]))


def _merge_numbers(a: dict, b: dict, ctx: Context) -> dict | None:
    lo, hi = _tighter(a["lo"], b["lo"], True), _tighter(a["hi"], b["hi"], False)
    steps = tuple(dict.fromkeys(a["steps"] + b["steps"]))
    return None if bounds_empty(lo, hi) else {"lo": lo, "hi": hi, "steps": steps}


def make_integer(kw: dict) -> dict | None:
    """A number leaf's keywords restricted to integers (bounds made inclusive integers)."""
    lo, hi = integer_bounds(kw["lo"], kw["hi"])
    return None if bounds_empty(lo, hi) else {**kw, "lo": lo, "hi": hi}


def _merge_strings(a: dict, b: dict, ctx: Context) -> dict | None:
    low = max(a["min"], b["min"])
    high = a["max"] if b["max"] is None else b["max"] if a["max"] is None else min(a["max"], b["max"])
    if high is not None and low > high:
        return None
    return {"min": low, "max": high, "patterns": tuple(dict.fromkeys(a["patterns"] + b["patterns"])),
            "formats": tuple(dict.fromkeys(a["formats"] + b["formats"]))}


def _min_max(a: dict, b: dict):
    low = max(a["min"], b["min"])
    high = a["max"] if b["max"] is None else b["max"] if a["max"] is None else min(a["max"], b["max"])
    return low, high


def _position(kw: dict, index: int) -> U:
    prefix = kw["prefix"]
    if index < len(prefix):
        return prefix[index]
    return ANY if kw["items"] is None else kw["items"]


def _merge_arrays(a: dict, b: dict, ctx: Context) -> "dict | U":
    low, high = _min_max(a, b)
    length = max(len(a["prefix"]), len(b["prefix"]))
    prefix = tuple(intersect(_position(a, i), _position(b, i), ctx) for i in range(length))
    if a["items"] is None and b["items"] is None:
        items = None
    else:
        items = intersect(ANY if a["items"] is None else a["items"], ANY if b["items"] is None else b["items"], ctx)
    kw = {"prefix": prefix, "items": items, "min": low, "max": high, "unique": a["unique"] or b["unique"],
          "contains": a["contains"] + b["contains"], "ann_prefix": max(a["ann_prefix"], b["ann_prefix"]),
          "ann_items": a["ann_items"] or b["ann_items"], "declared": a["declared"] or b["declared"]}
    checked = check_array(kw)
    return emptied(kw, ctx) if checked is None else checked


def check_array(kw: dict) -> dict | None:
    """None when no array fits: too few positions can hold a value for ``minItems``. Otherwise
    the keywords with ``max`` tightened by the positions that *exactly* admit nothing; one that
    admits nothing only as far as a subset knows (strict closure, a `NONE_APPROX`) bounds the
    length too, but a complement must not read that bound as the schema's (`array_max`)."""
    high = exact_high = kw["max"]
    positions = list(kw["prefix"]) + ([kw["items"]] if kw["items"] is not None else [])
    for index, position in enumerate(positions):
        if position.is_none:
            high = index if high is None else min(high, index)
            if position.exact:
                exact_high = index if exact_high is None else min(exact_high, index)
    if high is not None and kw["min"] > high:
        return None
    return {**kw, "max": exact_high}


def array_max(kw: dict) -> int | None:
    """An array leaf's length bound: its ``maxItems`` and the first position that admits nothing
    (a prefix item or ``items``; ``false``, or strict mode's closure, which `check_array` keeps
    out of ``max``)."""
    high = kw["max"]
    positions = list(kw["prefix"]) + ([kw["items"]] if kw["items"] is not None else [])
    for index, position in enumerate(positions):
        if position.is_none:
            return index if high is None else min(high, index)
    return high


def schema_for(kw: dict, name: str, ctx: Context) -> U:
    """What an object leaf requires of the value of property `name`: its ``properties`` entry and
    every matching ``patternProperties`` entry, or else ``additionalProperties``."""
    matching = [child for pattern, child in kw["pprops"].items() if re.search(pattern, name)]
    if name in kw["props"]:
        matching.insert(0, kw["props"][name])
    if not matching:
        return ANY if kw["additional"] is None else kw["additional"]
    result = ANY
    for child in matching:
        result = intersect(result, child, ctx)
    return result


def _merge_objects(a: dict, b: dict, ctx: Context) -> "dict | U":
    for one, other in ((a, b), (b, a)):
        rest_free = other["additional"] is None or other["additional"].is_any
        if not rest_free and any(p not in other["pprops"] for p in one["pprops"]):
            raise Refusal("patternProperties combined (allOf, $ref, ...) with another schema's additionalProperties")
    props = {}
    for name in list(a["props"]) + [n for n in b["props"] if n not in a["props"]]:
        props[name] = intersect(schema_for(a, name, ctx), schema_for(b, name, ctx), ctx)
    pprops = dict(a["pprops"])
    for pattern, child in b["pprops"].items():
        pprops[pattern] = intersect(pprops[pattern], child, ctx) if pattern in pprops else child
    if a["additional"] is None and b["additional"] is None:
        additional = None
    else:
        additional = intersect(a["additional"] or ANY, b["additional"] or ANY, ctx)
    low, high = _min_max(a, b)
    kw = {"props": props, "pprops": pprops, "additional": additional,
          "required": tuple(dict.fromkeys(a["required"] + b["required"])), "min": low, "max": high,
          "names": a["names"] + b["names"], "ann": a["ann"] | b["ann"], "ann_pp": a["ann_pp"] | b["ann_pp"],
          "ann_rest": a["ann_rest"] or b["ann_rest"], "declared": a["declared"] or b["declared"]}
    checked = check_object(kw, ctx)
    return emptied(kw, ctx) if checked is None else checked


def check_object(kw: dict, ctx: Context) -> dict | None:
    """None when no object fits (a required property that can have no value, counts that clash)."""
    if kw["max"] is not None and (kw["min"] > kw["max"] or len(kw["required"]) > kw["max"]):
        return None
    for name in kw["required"]:
        if schema_for(kw, name, ctx).is_none:
            return None
    return kw


_MERGERS: dict[str, Callable] = {
    "integer": lambda a, b, ctx: (lambda kw: kw and make_integer(kw))(_merge_numbers(a, b, ctx)),
    "number": _merge_numbers,
    "string": _merge_strings,
    "array": _merge_arrays,
    "object": _merge_objects,
}


# ----- JSON values ---------------------------------------------------------------------------------


def json_key(value: Any) -> Any:
    """A hashable key under which JSON-Schema-equal values collide (1 == 1.0, True != 1)."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", int(value) if isinstance(value, float) and value.is_integer() else value)
    if isinstance(value, Decimal):  # exact numbers (`fd_guided.json_tracker`): equal ones hash alike
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(json_key(v) for v in value))
    if isinstance(value, dict):
        return ("o", frozenset((k, json_key(v)) for k, v in value.items()))
    raise Refusal(f"a value of type {type(value).__name__} in enum/const")


def unique_values(values) -> tuple:
    seen, out = set(), []
    for value in values:
        key = json_key(value)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return tuple(out)


def value_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def item_at(kw: dict, index: int) -> "U":
    """The schema of item `index` of an array leaf's keywords: its prefix item, else its items."""
    if index < len(kw["prefix"]):
        return kw["prefix"][index]
    return ANY if kw["items"] is None else kw["items"]
