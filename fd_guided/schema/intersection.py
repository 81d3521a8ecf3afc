"""The intersection of two normalised unions (`leaves.U`), leaf by leaf, and when an array or
object leaf has no value.

`intersect` merges every pair of leaves (`merge`): numbers and strings tighten their bounds, arrays
and objects intersect their children position by position and property by property, an enum keeps
the values the other leaf accepts, a ref is expanded (a bounded number of times: intersecting
recursive definitions would need a new recursive definition). `check_array`/`check_object` find
leaves with no value (a required property or a needed position that admits nothing, counts that
clash).

Exactness travels with the result: an emptiness found by judging a subset (strict mode's closure,
a complement written only in part) is only `leaves.NONE_APPROX`, never NONE (`emptied`); an enum
value dropped against a leaf that is not exact all the way down (`deeply_exact`) makes the result
inexact. A complement or a disjointness proof can then tell "no value" from "no value the subset
knows of".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .leaves import ALL_KINDS, ANY, NONE, NONE_APPROX, STRICT_CLOSED, Leaf, U, check_size
from .refusal import Refusal

MAX_MERGE_EXPANSIONS = 24


class Context:
    """What merging needs from the normaliser: expanding refs, checking enum values, a work budget."""

    merge_expansions = 0  # refs expanded by the merges in progress (see `merge`)
    # Kept by the normaliser (`normalise.Normaliser`) for `complement`: no default here.
    complement_depth: int
    complementing: set[tuple]
    unique_guard = False  # the runtime uniqueness guard will run (`unique_items.finish_unique`)

    def ref_kinds(self, key: tuple) -> frozenset:
        """The types a reference target's values may have (an over-approximation)."""
        return ALL_KINDS

    ordered_objects = True  # engines write an object's properties in the schema's order

    def in_progress(self, key: tuple) -> bool:
        """True while the definition `key` is being normalised (expanding it now would recurse)."""
        return False

    def expand(self, leaf: Leaf) -> U:  # pragma: no cover - interface
        raise NotImplementedError

    def accepts(self, u: U, value: Any) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def spend(self, amount: int = 1) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def intersect(a: U, b: U, ctx: Context) -> U:
    if a.leaves is None:  # a.is_any, spelled so that the type checker narrows `leaves`
        return b
    if b.leaves is None:
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
            assert merged.leaves is not None  # a merge of two leaves is never ANY
            out.extend(merged.leaves)
            exact = exact and merged.exact
    check_size(out)
    return U(out, exact)


def merge(a: Leaf, b: Leaf, ctx: Context) -> U:
    """The intersection of two leaves, as a union (refs expand into several leaves)."""
    if a.kind == "ref" or b.kind == "ref":
        # Intersecting recursive definitions would need a new recursive definition: nested
        # expansions are bounded instead, and past the bound the schema is refused.
        if ctx.merge_expansions >= MAX_MERGE_EXPANSIONS:
            raise Refusal(
                "the intersection of recursive $ref definitions (allOf or siblings of recursive schemas)", a.origin
            )
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
    return {
        "min": low,
        "max": high,
        "patterns": tuple(dict.fromkeys(a["patterns"] + b["patterns"])),
        "formats": tuple(dict.fromkeys(a["formats"] + b["formats"])),
    }


def _min_max(a: dict, b: dict):
    low = max(a["min"], b["min"])
    high = a["max"] if b["max"] is None else b["max"] if a["max"] is None else min(a["max"], b["max"])
    return low, high


def _position(kw: dict, index: int) -> U:
    prefix = kw["prefix"]
    if index < len(prefix):
        return prefix[index]
    return ANY if kw["items"] is None else kw["items"]


def _merge_arrays(a: dict, b: dict, ctx: Context) -> dict | U:
    a, b, closed = _opened(a, b, "items")
    low, high = _min_max(a, b)
    length = max(len(a["prefix"]), len(b["prefix"]))
    prefix = tuple(intersect(_position(a, i), _position(b, i), ctx) for i in range(length))
    if a["items"] is None and b["items"] is None:
        items = STRICT_CLOSED if closed else None
    else:
        items = intersect(ANY if a["items"] is None else a["items"], ANY if b["items"] is None else b["items"], ctx)
    kw = {
        "prefix": prefix,
        "items": items,
        "min": low,
        "max": high,
        "unique": a["unique"] or b["unique"],
        "contains": a["contains"] + b["contains"],
        "ann_prefix": max(a["ann_prefix"], b["ann_prefix"]),
        "ann_items": a["ann_items"] or b["ann_items"],
        "declared": a["declared"] or b["declared"],
    }
    checked = check_array(kw)
    return emptied(kw, ctx) if checked is None else checked


def check_array(kw: dict) -> dict | None:
    """None when no array fits: too few positions can hold a value for ``minItems``. Otherwise
    the keywords with ``max`` tightened by the positions that *exactly* admit nothing; one that
    admits nothing only as far as a subset knows (strict closure, a `NONE_APPROX`) bounds the
    length too, but a complement must not read that bound as the schema's (`array_max`)."""
    high, exact_high = _length_bounds(kw)
    if high is not None and kw["min"] > high:
        return None
    return {**kw, "max": exact_high}


def array_max(kw: dict) -> int | None:
    """An array leaf's length bound: its ``maxItems`` and the first position that admits nothing
    (a prefix item or ``items``; ``false``, or strict mode's closure, which `check_array` keeps
    out of ``max``)."""
    return _length_bounds(kw)[0]


def _length_bounds(kw: dict) -> tuple[int | None, int | None]:
    """(``maxItems`` tightened by the first position, a prefix item or ``items``, that admits no
    value; the same counting only positions that *exactly* admit none)."""
    high = exact_high = kw["max"]
    positions = list(kw["prefix"]) + ([kw["items"]] if kw["items"] is not None else [])
    for index, position in enumerate(positions):
        if position.is_none:
            high = index if high is None else min(high, index)
            if position.exact:
                exact_high = index if exact_high is None else min(exact_high, index)
    return high, exact_high


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


def with_required_declared(props: dict, required, pprops: dict) -> dict:
    """`props` with each required name that neither it nor a pattern declares added as any value:
    what strict mode's closure keeps open (a required name counts as declared)."""
    missing = [name for name in required if name not in props and not any(re.search(p, name) for p in pprops)]
    return {**props, **dict.fromkeys(missing, ANY)} if missing else props


def _opened(a: dict, b: dict, key: str) -> tuple[dict, dict, bool]:
    """`a` and `b` with strict mode's closure (`STRICT_CLOSED` at `key`) taken off, and whether
    either had it. The merge is closed again over what both declare: ``close(A) ∧ close(B)``
    becomes ``close(A ∧ B)``, a superset of it and still a subset of ``A ∧ B`` (sound), so that
    ``allOf: [{$ref: base}, {properties: {extra: ...}}]`` does not lose every property of one
    conjunct to the other's closure."""
    closed = a[key] is STRICT_CLOSED or b[key] is STRICT_CLOSED
    if not closed:
        return a, b, False
    return (
        ({**a, key: None} if a[key] is STRICT_CLOSED else a),
        ({**b, key: None} if b[key] is STRICT_CLOSED else b),
        True,
    )


def _merge_objects(a: dict, b: dict, ctx: Context) -> dict | U:
    a, b, closed = _opened(a, b, "additional")
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
    required = tuple(dict.fromkeys(a["required"] + b["required"]))
    if a["additional"] is None and b["additional"] is None:
        additional = None
        if closed and not (a["ann_rest"] or b["ann_rest"]):
            additional, props = STRICT_CLOSED, with_required_declared(props, required, pprops)
    else:
        additional = intersect(a["additional"] or ANY, b["additional"] or ANY, ctx)
    low, high = _min_max(a, b)
    kw = {
        "props": props,
        "pprops": pprops,
        "additional": additional,
        "required": required,
        "min": low,
        "max": high,
        "names": a["names"] + b["names"],
        "ann": a["ann"] | b["ann"],
        "ann_pp": a["ann_pp"] | b["ann_pp"],
        "ann_rest": a["ann_rest"] or b["ann_rest"],
        "declared": a["declared"] or b["declared"],
    }
    checked = check_object(kw, ctx)
    return emptied(kw, ctx) if checked is None else checked


def check_object(kw: dict, ctx: Context) -> dict | None:
    """None when no object fits (a required property that can have no value, counts that clash)."""
    return kw if _object_emptiness(kw, ctx) is None else None


def _object_emptiness(kw: dict, ctx: Context) -> U | None:
    """None when some object fits; NONE when an exact part proves none does (counts that clash, a
    required property that truly admits nothing), NONE_APPROX when only a subset says so."""
    if kw["max"] is not None and (kw["min"] > kw["max"] or len(kw["required"]) > kw["max"]):
        return NONE
    found = None
    for name in kw["required"]:
        schema = schema_for(kw, name, ctx)
        if schema.is_none:
            if schema.exact:
                return NONE
            found = NONE_APPROX
    return found


_MERGERS: dict[str, Callable] = {
    "integer": lambda a, b, ctx: (lambda kw: kw and make_integer(kw))(_merge_numbers(a, b, ctx)),
    "number": _merge_numbers,
    "string": _merge_strings,
    "array": _merge_arrays,
    "object": _merge_objects,
}


# ----- exactness of an emptiness -------------------------------------------------------------------


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


def emptied(kw: dict, ctx: Context) -> U:
    """The union for an array or object leaf that `check_array`/`check_object` found to have no
    value: exactly empty (NONE) when an exact part proves it (counts that clash, a required
    property or a needed position that truly admits nothing), else empty only as far as the
    subsets it was judged by know (`NONE_APPROX`)."""
    if "props" in kw:
        return _object_emptiness(kw, ctx) or NONE_APPROX
    exact_high = _length_bounds(kw)[1]
    return NONE if exact_high is not None and kw["min"] > exact_high else NONE_APPROX


def deeply_exact(u: U, ctx: Context, seen: set | None = None) -> bool:
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
