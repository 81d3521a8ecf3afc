"""``oneOf`` as a union of each branch minus the branches it may share a value with.

Branches proven pairwise disjoint (an exactly empty intersection: different types, different
``const``/``enum`` values on a property one requires, clashing bounds, a required property another
forbids) are an ``anyOf``; otherwise ``oneOf(B1..Bn) = ∪ Bi ∧ ¬Bj (j ≠ i, Bj overlapping Bi)``,
exact when the complements are. Disjointness is judged inside the node's other keywords (the
context), and each subtraction is written relative to the branch it narrows (`_relative_complement`),
so that branches sharing a base or closed to their own keys do not multiply out.
"""

from __future__ import annotations

import itertools

from .complement import complement
from .intersection import intersect, schema_for
from .leaves import ALL_KINDS, ANY, Leaf, U, json_key, kind_of, union
from .refusal import Refusal

MAX_ONE_OF_DISJOINT = 64
MAX_ONE_OF_EXPANDED = 24


def one_of(branches: list[U], ctx, location: str, context: U = ANY) -> U:
    """``context ∧ oneOf(B1..Bn)``, where `context` is what the node's other keywords already
    require (its ``type``, ``required``, ``$ref``, ...), as a union of each branch minus the others.

    Only branches that may overlap need the subtraction: a branch provably disjoint from another
    (their intersection is exactly empty) already excludes it, so ``B_i ∧ ¬B_j`` is ``B_i``.
    Disjointness is judged inside the context: ``S ∧ oneOf(B_i) = oneOf(S ∧ B_i)`` (a value of S
    matches exactly one ``S ∧ B_i`` iff it matches exactly one ``B_i``), so branches that share
    values only outside S (say, a discriminator the branches give a ``const`` while the parent
    makes it ``required``) need no subtraction; where they still may overlap, ``S ∧ B_i ∧ ¬B_j``
    subtracts the plain branch. A branch that may overlap `MAX_ONE_OF_EXPANDED` or more others
    is refused."""
    if len(branches) > MAX_ONE_OF_DISJOINT:
        raise Refusal(f"oneOf with more than {MAX_ONE_OF_DISJOINT} branches", location)
    if len(branches) == 1:
        return intersect(context, branches[0], ctx)
    overlapping = _overlaps(branches, ctx)
    narrowed = branches
    if (overlapping is None or any(overlapping)) and not context.is_any:
        try:
            judged = [intersect(context, branch, ctx) for branch in branches]
            inside = _overlaps(judged, ctx)
            if inside is not None:
                narrowed, overlapping = judged, inside
        except Refusal:
            pass  # the context cannot be merged into the branches: judge them alone
    if overlapping is None:
        raise Refusal(f"oneOf whose branches may overlap (more than {MAX_ONE_OF_EXPANDED} branches)", location)
    negated: dict[int, U] = {}
    parts = []
    for index, branch in enumerate(narrowed):
        part = branch
        for other in overlapping[index]:
            relative = _relative_complement(branches[other], part, ctx, location)
            if relative is None:
                if other not in negated:
                    negated[other] = complement(branches[other], ctx, location)
                relative = negated[other]
            part = intersect(part, relative, ctx)
        parts.append(part)
    result = union(parts)
    return result if narrowed is not branches else intersect(context, result, ctx)


MAX_OUTSIDE_NAMES = 8


def _relative_complement(other: U, given: U, ctx, location: str) -> U | None:
    """A union X with ``given ∧ X = given ∧ ¬other``, simpler than ¬other, or None (use ¬other).

    Steps, each exact inside `given`: references at the top are expanded (`_expanded`); `other`'s
    leaves of types `given` has none of are left out (`_objects_of`); the constraints `given`
    already meets are left out of `other` (`_beyond`). Then, when `other` is one object closed by
    ``additionalProperties: false`` and `given`'s objects admit only a known set of keys G (closed
    too, by the schema or by strict mode):
      - `other` requiring a key outside G shares no value with `given`: X is any value;
      - `other`'s constraints on keys outside G never apply inside `given`: left out;
      - ``other = open ∧ closed``, and inside `given` "a key `other` does not declare" is "one of
        G that `other` does not declare", so ``X = ¬open ∨ (required: [n] for those n)`` (at most
        `MAX_OUTSIDE_NAMES` of them).
    Branches closed to their own keys (``oneOf: [{properties: {a: ...}, additionalProperties:
    false}, {properties: {b: ...}, ...}]``) then subtract one another as "has a" / "has b"
    instead of an inexact "has more keys", and without complementing b's value schema."""
    given = _expanded(given, ctx)
    expanded = _expanded(other, ctx)
    objects = _objects_of(expanded, given)
    beyond = _beyond(objects, given) or objects
    closed, names = _closed_object(beyond), _known_names(given)
    if closed is None or names is None:
        return None if beyond is expanded else complement(beyond, ctx, location)
    kw = closed.kw
    if any(name not in names for name in kw["required"]):
        return ANY
    outside = [name for name in names if name not in kw["props"]]
    if len(outside) > MAX_OUTSIDE_NAMES:
        return None if beyond is expanded else complement(beyond, ctx, location)
    props = {name: child if name in names else ANY for name, child in kw["props"].items()}
    opened = U([Leaf("object", {**kw, "props": props, "additional": None}, closed.origin, closed.weak)], beyond.exact)
    base = Leaf("object").kw
    present = [Leaf("object", {**base, "required": (name,)}, closed.origin, True) for name in outside]
    return union([complement(opened, ctx, location), U(present)])


def _closed_object(u: U) -> Leaf | None:
    """`u`'s one leaf when it is an object closed by a real ``additionalProperties: false``
    (not strict mode's closure: JSON Schema admits those keys) without patternProperties or
    propertyNames, in an exact union; else None."""
    if u.leaves is None or not u.exact or len(u.leaves) != 1 or u.leaves[0].kind != "object":
        return None
    kw = u.leaves[0].kw
    additional = kw["additional"]
    if additional is None or not (additional.is_none and additional.exact) or kw["pprops"] or kw["names"]:
        return None
    return u.leaves[0]


def _known_names(given: U) -> dict | None:
    """The keys `given`'s objects may have (declared or required), when all its leaves are
    objects that admit no other key (closed by the schema or by strict mode, no
    patternProperties); else None."""
    if given.is_any or not given.leaves:
        return None
    names: dict[str, None] = {}
    for leaf in given.leaves:
        g = leaf.kw
        if leaf.kind != "object" or g["additional"] is None or not g["additional"].is_none or g["pprops"]:
            return None
        names.update(dict.fromkeys(list(g["props"]) + list(g["required"])))
    return names


def _expanded(u: U, ctx) -> U:
    """`u` with its top-level references replaced by their targets' unions (the same values),
    so the rules above see the objects a ``oneOf: [{$ref: step}, {$ref: stage}]`` branch stands
    for; `u` itself where a target cannot be expanded here (one being normalised: a recursion)."""
    if u.leaves is None or not any(leaf.kind == "ref" for leaf in u.leaves):
        return u
    leaves, exact = [], u.exact
    for leaf in u.leaves:
        if leaf.kind != "ref":
            leaves.append(leaf)
            continue
        if ctx.in_progress(leaf.kw["target"]):
            return u
        try:
            target = ctx.expand(leaf)
        except Refusal:
            return u
        if target.leaves is None:
            return u
        leaves.extend(target.leaves)
        exact = exact and target.exact
    return U(leaves, exact)


def _objects_of(other: U, given: U) -> U:
    """`other` without its leaves of other types when `given` has only objects (a branch
    without ``type: object`` has a leaf per other type): inside `given` they match nothing."""
    if (
        other.leaves is None
        or given.leaves is None
        or not given.leaves
        or any(leaf.kind != "object" for leaf in given.leaves)
    ):
        return other
    if all(leaf.kind == "object" for leaf in other.leaves) or any(
        leaf.kind in ("ref", "enum") for leaf in other.leaves
    ):
        return other
    return U([leaf for leaf in other.leaves if leaf.kind == "object"], other.exact)


def _beyond(other: U, given: U) -> U | None:
    """`other` less the object constraints every value of `given` already meets, when that drops
    any: then ``given ∧ ¬other = given ∧ ¬beyond`` (other = beyond ∧ R with given ⊆ R, so
    ``given ∧ ¬R`` is empty), and the complement has no "violates R" alternatives that would
    each survive the intersection unproven empty (``x: S ∧ x: ¬S``) and multiply across the
    branches. Branches sharing a base (``allOf: [{$ref: base}, {required: [node], ...}]``) are
    the case: the base's constraints are the same objects in each. None when nothing is dropped.

    Implied constraints, judged per leaf of `given` (all objects): a property ``required`` there,
    a property schema that is the very same union there (identity: equal by construction; the
    same key's patternProperties and additionalProperties apply alike to both)."""
    if other.leaves is None or not other.exact or len(other.leaves) != 1 or other.leaves[0].kind != "object":
        return None
    if given.leaves is None or not given.leaves or any(leaf.kind != "object" for leaf in given.leaves):
        return None
    leaf = other.leaves[0]
    kw = leaf.kw
    required = tuple(name for name in kw["required"] if not all(name in g.kw["required"] for g in given.leaves))
    implied = {
        name
        for name, child in kw["props"].items()
        if not child.is_any and all(g.kw["props"].get(name) is child for g in given.leaves)
    }
    if len(required) == len(kw["required"]) and not implied:
        return None
    # An implied property stays declared (as any value): dropping the name would hand it to
    # additionalProperties.
    props = {name: ANY if name in implied else child for name, child in kw["props"].items()}
    return U([Leaf("object", {**kw, "required": required, "props": props}, leaf.origin, leaf.weak)], other.exact)


def _overlaps(branches: list[U], ctx) -> list[list[int]] | None:
    """For each branch, the other branches it may share a value with; None as soon as one may
    overlap `MAX_ONE_OF_EXPANDED` - 1 others (refused: no need to judge the remaining pairs).
    Disjoint: of different types (read through $refs), or an intersection that is exactly empty;
    an intersection that cannot be computed, or is empty only as far as a subset knows, counts as
    overlap."""
    overlapping: list[list[int]] = [[] for _ in branches]
    kinds = [_kinds(branch, ctx) for branch in branches]
    for first, second in itertools.combinations(range(len(branches)), 2):
        if not kinds[first] & kinds[second] or _discriminated(branches[first], branches[second], ctx):
            continue
        try:
            common = intersect(branches[first], branches[second], ctx)
            overlap = not (common.is_none and common.exact)
        except Refusal:
            overlap = True
        if overlap:
            overlapping[first].append(second)
            overlapping[second].append(first)
            if max(len(overlapping[first]), len(overlapping[second])) >= MAX_ONE_OF_EXPANDED:
                return None
    return overlapping


def _discriminated(a: U, b: U, ctx) -> bool:
    """A quick disjointness proof, before intersecting: every pair of leaves differs in type or
    is a pair of objects where one requires a property both give disjoint finite values (a
    ``kind`` discriminator). Exact unions only (a subset's leaves prove nothing)."""
    if a.leaves is None or b.leaves is None or not (a.exact and b.exact):
        return False
    return all(_leaves_discriminated(left, right, ctx) for left in a.leaves for right in b.leaves)


def _leaves_discriminated(left: Leaf, right: Leaf, ctx) -> bool:
    if "ref" in (left.kind, right.kind):
        return False
    if left.kind != right.kind:
        return {left.kind, right.kind} != {"integer", "number"} and "enum" not in (left.kind, right.kind)
    if left.kind != "object":
        return False
    for name in set(left.kw["required"]) | set(right.kw["required"]):
        mine, theirs = _finite_values(schema_for(left.kw, name, ctx)), _finite_values(schema_for(right.kw, name, ctx))
        if mine is not None and theirs is not None and not mine & theirs:
            return True
    return False


def _finite_values(u: U) -> set | None:
    """The JSON-equality keys of an exact union of enum leaves, else None."""
    if u.leaves is None or not u.exact or any(leaf.kind != "enum" for leaf in u.leaves):
        return None
    return {json_key(value) for leaf in u.leaves for value in leaf.kw["values"]}


def _kinds(u: U, ctx) -> frozenset:
    """The JSON types `u`'s values may have (an over-approximation). An inexact union may have
    left out a type its schema admits, so it may have any."""
    if u.leaves is None or not u.exact:
        return ALL_KINDS
    kinds: set[str] = set()
    for leaf in u.leaves:
        if leaf.kind == "ref":
            kinds |= ctx.ref_kinds(leaf.kw["target"])
        elif leaf.kind == "enum":
            kinds |= {kind_of(value) for value in leaf.kw["values"]}
        else:
            kinds.add("number" if leaf.kind == "integer" else leaf.kind)
    return frozenset(kinds)
