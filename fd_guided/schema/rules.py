"""The named rewrite rules of the normaliser, each exact (or documented as a sound subset).

Combinators (called while a node is normalised, on unions of its parts; ``oneOf`` is `one_of`'s):
  - `if_then_else`: ``(if ∧ then) ∪ (¬if ∧ else)``; a missing ``then``/``else`` is ``true``.
  - `dependent_required`: ``{a: [b, c]}`` = non-objects ∪ objects without ``a`` ∪ objects that
    require ``a``, ``b`` and ``c``. `dependent_schema`: the same with the schema instead of the names.
  - `apply_unevaluated`: on each leaf the evaluated properties/items are now known statically, so
    ``unevaluatedProperties: X`` is the leaf's ``additionalProperties`` (and X also applies to
    properties the leaf only constrains without evaluating, e.g. from a ``not``);
    ``unevaluatedItems`` likewise for ``items``.
Finishing (`finish_leaf`, at value positions, on the final leaf):
  - ``required`` names missing from ``properties`` are declared with the schema the leaf gives
    them (their ``patternProperties`` or ``additionalProperties``): exact, and xgrammar needs it;
  - ``propertyNames``: names that fail it are forbidden; a finite set of names becomes declared
    properties, a single pattern (or length/format) becomes the only ``patternProperties`` key;
  - ``contains`` (+ ``minContains``/``maxContains``): ``true`` bounds the length, a schema disjoint
    from the items forbids (or ignores) it, equal to the items bounds the length, and on arrays of
    at most `MAX_CONTAINS_LENGTH` items it is written out per position; otherwise refused;
  - ``uniqueItems``: at most one item: dropped; items from a finite domain (enums, booleans, null):
    enumerated, or (open domains) left to the runtime guard; otherwise refused (`unique_items`).
"""

from __future__ import annotations

import itertools
import re

from .complement import complement
from .intersection import check_array, check_object, deeply_exact, intersect, schema_for
from .leaves import ANY, BARE_KINDS, MAX_ANY_OF_LEAVES, NONE, Leaf, U, bare, bare_leaves, item_at, union
from .refusal import Refusal
from .unique_items import finish_unique

MAX_ANY_OF_COMBINED = 4
MAX_CONTAINS_LENGTH = 4
_NON_OBJECT = tuple(k for k in BARE_KINDS if k != "object")


def check_pattern(pattern: str, location: str) -> None:
    from .regex import python_compiles

    if not python_compiles(pattern):
        raise Refusal(f"pattern {pattern[:60]!r} that Python's re cannot compile", location)


# ----- combinators -------------------------------------------------------------------------------


def any_of(branches: list[U], ctx, annotations_matter: bool) -> U:
    """The union; when something reads annotations (unevaluated*), instances matching several
    branches carry all their annotations, so the pairwise-and-more intersections are added."""
    if not annotations_matter:
        return union(branches, MAX_ANY_OF_LEAVES)
    # `true` beside an annotating branch must not swallow it: its leaves carry annotations.
    branches = [bare(BARE_KINDS) if branch.is_any else branch for branch in branches]
    if not 1 < len(branches) <= MAX_ANY_OF_COMBINED:
        return union(branches)
    parts = []
    for size in range(1, len(branches) + 1):
        for chosen in itertools.combinations(branches, size):
            part = chosen[0]
            for other in chosen[1:]:
                part = intersect(part, other, ctx)
            parts.append(part)
    return union(parts)


def if_then_else(kw: dict, resolver, ctx, path: str) -> U:
    if "then" not in kw and "else" not in kw:
        if "unevaluatedProperties" not in kw and "unevaluatedItems" not in kw:
            return ANY
        # No constraint, but a successful `if` still annotates what it evaluated.
        condition = ctx.norm(kw["if"], resolver, f"{path}.if")
        try:
            negated = complement(condition, ctx, f"{path}.if")
            return union([bare(BARE_KINDS) if u.is_any else u for u in (condition, negated)])
        except Refusal:
            return ANY
    condition = ctx.norm(kw["if"], resolver, f"{path}.if")
    then = ctx.norm(kw["then"], resolver, f"{path}.then") if "then" in kw else ANY
    otherwise = ctx.norm(kw["else"], resolver, f"{path}.else") if "else" in kw else ANY
    return union([intersect(condition, then, ctx), intersect(complement(condition, ctx, f"{path}.if"), otherwise, ctx)])


def _absent(name: str, origin: str) -> Leaf:
    return Leaf("object", {**Leaf("object").kw, "props": {name: NONE}}, origin)


def dependent_required(name: str, deps, path: str) -> U:
    names = tuple(dict.fromkeys(deps))
    if not names:
        return ANY
    present = Leaf("object", {**Leaf("object").kw, "required": (name,) + names}, path)
    return U(list(bare_leaves(_NON_OBJECT, path)) + [_absent(name, path), present])


def dependent_schema(name: str, schema: U, ctx, path: str) -> U:
    present = intersect(U([Leaf("object", {**Leaf("object").kw, "required": (name,)}, path)]), schema, ctx)
    return union([bare(_NON_OBJECT, path), U([_absent(name, path)]), present])


def apply_unevaluated(kw: dict, result: U, resolver, ctx, path: str) -> U:
    for keyword, kind, apply in (
        ("unevaluatedProperties", "object", _unevaluated_object),
        ("unevaluatedItems", "array", _unevaluated_array),
    ):
        if keyword not in kw or result.is_none:
            continue
        rest = ctx.value(kw[keyword], resolver, f"{path}.{keyword}")
        leaves = bare_leaves(BARE_KINDS, path) if result.leaves is None else result.leaves
        out, exact = [], result.exact
        for leaf in leaves:
            expanded = ctx.expand(leaf).leaves if leaf.kind == "ref" else (leaf,)
            if expanded is None:
                expanded = bare_leaves(BARE_KINDS, path)
            for item in expanded:
                changed = apply(item, rest, ctx, f"{path}.{keyword}") if item.kind in (kind, "enum") else item
                if changed is not None:
                    out.append(changed)
                elif not (deeply_exact(rest, ctx) and deeply_exact(U([item]), ctx)):
                    exact = False  # found empty by judging a subset
        result = U(out, exact)
    return result


def _unevaluated_object(leaf: Leaf, rest: U, ctx, location: str) -> Leaf | None:
    if leaf.kind == "enum":
        values = tuple(
            v for v in leaf.kw["values"] if not isinstance(v, dict) or all(ctx.accepts(rest, x) for x in v.values())
        )
        return leaf.replace(values=values) if values else None
    kw = leaf.kw
    if kw["ann_rest"]:
        return leaf
    if any(pattern not in kw["ann_pp"] for pattern in kw["pprops"]):
        raise Refusal("unevaluatedProperties beside patternProperties that a not/if constrains", location)
    props = {}
    for name, child in kw["props"].items():
        evaluated = name in kw["ann"] or any(re.search(p, name) for p in kw["ann_pp"])
        props[name] = child if evaluated else intersect(child, rest, ctx)
    # `true` constrains nothing but still marks every property evaluated (for an outer unevaluated*).
    additional = (
        (kw["additional"] if rest.is_any else rest)
        if kw["additional"] is None
        else intersect(kw["additional"], rest, ctx)
    )
    checked = check_object(
        {**kw, "props": props, "additional": additional, "ann": kw["ann"] | frozenset(props), "ann_rest": True}, ctx
    )
    return None if checked is None else Leaf("object", checked, leaf.origin, leaf.weak)


def _unevaluated_array(leaf: Leaf, rest: U, ctx, location: str) -> Leaf | None:
    if leaf.kind == "enum":
        values = tuple(v for v in leaf.kw["values"] if not isinstance(v, list) or all(ctx.accepts(rest, x) for x in v))
        return leaf.replace(values=values) if values else None
    kw = leaf.kw
    if kw["ann_items"]:
        return leaf
    if kw["contains"]:
        raise Refusal("unevaluatedItems beside contains", location)
    prefix = tuple(
        child if i < kw["ann_prefix"] else intersect(child, rest, ctx) for i, child in enumerate(kw["prefix"])
    )
    items = (None if rest.is_any else rest) if kw["items"] is None else intersect(kw["items"], rest, ctx)
    checked = check_array({**kw, "prefix": prefix, "items": items, "ann_items": True, "ann_prefix": len(prefix)})
    return None if checked is None else Leaf("array", checked, leaf.origin, leaf.weak)


# ----- finishing ---------------------------------------------------------------------------------


def finish_leaf(leaf: Leaf, ctx) -> list[Leaf]:

    if leaf.kind == "object":
        finished = _finish_object(leaf, ctx)
        return [] if finished is None else [finished]
    if leaf.kind == "array":
        out = []
        for expanded in _finish_contains(leaf, ctx):
            out.extend(finish_unique(expanded, ctx))
        return out
    return [leaf]


def _finish_object(leaf: Leaf, ctx) -> Leaf | None:
    kw = dict(leaf.kw)
    for names in kw["names"]:
        narrowed = _property_names(kw, names, ctx, leaf.origin)
        if narrowed is None:
            return None
        kw = narrowed
    kw["names"] = ()
    props = dict(kw["props"])
    for name in kw["required"]:
        if name not in props:
            props[name] = schema_for(kw, name, ctx)
    kw["props"] = props
    checked = check_object(kw, ctx)
    return None if checked is None else Leaf("object", checked, leaf.origin, leaf.weak)


def _property_names(kw: dict, names: U, ctx, origin: str) -> dict | None:
    strings = intersect(names, bare(("string",), origin), ctx)
    if strings.leaves is None or (len(strings.leaves) == 1 and strings.leaves[0].is_bare()):
        return kw
    if not deeply_exact(strings, ctx):  # names it rejects might be valid ones: no exact rewrite
        raise Refusal(
            "propertyNames that could only be approximated (a not/oneOf inside it)", f"{origin}.propertyNames"
        )
    props = {n: (c if ctx.accepts(strings, n) else NONE) for n, c in kw["props"].items()}
    if strings.is_none:
        return {**kw, "props": props, "pprops": {}, "additional": NONE, "max": 0}
    leaves = strings.leaves
    if all(leaf.kind == "enum" for leaf in leaves):
        allowed = [v for leaf in leaves for v in leaf.kw["values"] if isinstance(v, str)]
        for name in allowed:
            if name not in props:
                props[name] = schema_for(kw, name, ctx)
        return {**kw, "props": props, "pprops": {}, "additional": NONE}
    pattern = _single_pattern(leaves, origin)
    if kw["pprops"]:
        raise Refusal("propertyNames beside patternProperties", f"{origin}.propertyNames")
    rest = ANY if kw["additional"] is None else kw["additional"]
    return {**kw, "props": props, "pprops": {pattern: rest}, "additional": NONE}


def _single_pattern(leaves, origin: str) -> str:
    from .formats import FORMAT_PATTERNS

    if len(leaves) != 1 or leaves[0].kind != "string":
        raise Refusal(
            "propertyNames other than one pattern, length, format or a list of names", f"{origin}.propertyNames"
        )
    kw = leaves[0].kw
    parts = list(kw["patterns"]) + [rf"\A(?:{FORMAT_PATTERNS[f]})\Z" for f in kw["formats"]]
    if kw["min"] > 0 or kw["max"] is not None:
        parts.append(rf"\A[\s\S]{{{kw['min']},{'' if kw['max'] is None else kw['max']}}}\Z")
    if len(parts) != 1:
        raise Refusal("propertyNames combining several of pattern, length and format", f"{origin}.propertyNames")
    return parts[0]


def _finish_contains(leaf: Leaf, ctx) -> list[Leaf]:
    kw = leaf.kw
    if not kw["contains"]:
        return [leaf]
    current = [Leaf("array", {**kw, "contains": ()}, leaf.origin, leaf.weak)]
    for child, low, high in kw["contains"]:
        current = [out for item in current for out in _one_contains(item, child, low, high, ctx)]
    return current


def _one_contains(leaf: Leaf, child: U, low: int, high: int | None, ctx) -> list[Leaf]:
    kw = leaf.kw
    location = f"{leaf.origin}.contains"
    if low == 0 and high is None:
        return [leaf]
    if child.is_any:
        top = high if kw["max"] is None else kw["max"] if high is None else min(kw["max"], high)
        checked = check_array({**kw, "min": max(kw["min"], low), "max": top})
        return [] if checked is None else [Leaf("array", checked, leaf.origin, leaf.weak)]
    if not kw["prefix"] and kw["items"] is not None and intersect(kw["items"], child, ctx).is_none:
        return [leaf] if low == 0 else []
    length_cap = kw["max"]
    if length_cap is None and kw["items"] is not None and kw["items"].is_none:
        length_cap = len(kw["prefix"])
    if length_cap is None or length_cap > MAX_CONTAINS_LENGTH:
        raise Refusal(f"contains on arrays that may hold more than {MAX_CONTAINS_LENGTH} items", location)
    negated = complement(child, ctx, location) if high is not None else ANY
    out: list[Leaf] = []
    for length in range(kw["min"], length_cap + 1):
        positions = [intersect(item_at(kw, i), ANY, ctx) for i in range(length)]
        counts = range(low, length + 1) if high is not None else [low]
        for count in counts:
            if high is not None and count > high:
                break
            for chosen in itertools.combinations(range(length), count):
                prefix = tuple(
                    intersect(p, child, ctx) if i in chosen else intersect(p, negated, ctx)
                    for i, p in enumerate(positions)
                )
                checked = check_array(
                    {
                        **kw,
                        "prefix": prefix,
                        "items": NONE,
                        "min": length,
                        "max": length,
                        "ann_prefix": length,
                        "ann_items": True,
                    }
                )
                if checked is not None:
                    out.append(Leaf("array", checked, leaf.origin, leaf.weak))
                if len(out) > 64:
                    raise Refusal("contains with too many ways to place the matching items", location)
    return out
