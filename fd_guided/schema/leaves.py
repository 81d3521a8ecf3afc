"""The normal form: a union of typed leaves (the intersection of two: `intersection`).

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
from typing import Any

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

    def replace(self, **changes) -> Leaf:
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
        self.negation_of: U | None = None

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
# No value *as far as a subset knows*: an emptiness that rests on an inexact part. It behaves as
# NONE for emission, but a complement or a disjointness proof must not read it as "truly no value".
NONE_APPROX = U((), exact=False)
# Strict mode's closure of an object (``additionalProperties`` absent read as false) or a tuple
# (no items past the declared ones): a NONE_APPROX that says where it came from, so that an
# intersection closes the merged object over every conjunct's declared properties instead of
# each conjunct's closure forbidding the others' (`intersection._merge_objects`).
STRICT_CLOSED = U((), exact=False)


def defaults(kind: str) -> dict:
    if kind in ("integer", "number"):
        return {"lo": None, "hi": None, "steps": ()}
    if kind == "string":
        return {"min": 0, "max": None, "patterns": (), "formats": ()}
    if kind == "array":
        return {
            "prefix": (),
            "items": None,
            "min": 0,
            "max": None,
            "unique": False,
            "contains": (),
            "ann_prefix": 0,
            "ann_items": False,
            "declared": False,
        }
    if kind == "object":
        return {
            "props": {},
            "pprops": {},
            "additional": None,
            "required": (),
            "min": 0,
            "max": None,
            "names": (),
            "ann": frozenset(),
            "ann_pp": frozenset(),
            "ann_rest": False,
            "declared": False,
        }
    if kind == "enum":
        return {"values": ()}
    return {}


def bare_leaves(kinds=BARE_KINDS, origin: str = "$") -> tuple[Leaf, ...]:
    """The leaves of `bare` (typed as a tuple: a union's ``leaves`` may be None)."""
    return tuple(Leaf(kind, None, origin) for kind in kinds)


def bare(kinds=BARE_KINDS, origin: str = "$") -> U:
    return U(bare_leaves(kinds, origin))


def union(parts, limit: int = MAX_LEAVES) -> U:
    leaves, exact = [], True
    for part in parts:
        if part.is_any:
            return U(None, exact and all(p.exact for p in parts))
        leaves.extend(part.leaves)
        exact = exact and part.exact
    leaves = _enums_joined(_absorbed(leaves))
    check_size(leaves, limit)
    return U(leaves, exact)


def _enums_joined(leaves: list) -> list:
    """The enum leaves of a union as one, where the first stood (``anyOf`` of 200 ``const``s is one
    enum of 200 values, not 200 alternatives). Exact."""
    enums = [leaf for leaf in leaves if leaf.kind == "enum"]
    if len(enums) < 2:
        return leaves
    joined = Leaf(
        "enum",
        {"values": unique_values(v for leaf in enums for v in leaf.kw["values"])},
        enums[0].origin,
        all(leaf.weak for leaf in enums),
    )
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
            values = tuple(
                v for v in leaf.kw["values"] if value_kind(v) not in bare_kinds and kind_of(v) not in bare_kinds
            )
            if values:
                out.append(leaf if len(values) == len(leaf.kw["values"]) else leaf.replace(values=values))
        elif leaf.kind in ("array", "object", "ref") or leaf.kind not in bare_kinds:
            out.append(leaf)
    return out


def check_size(leaves, limit: int = MAX_LEAVES) -> None:
    """Refuses a union of more than `limit` alternatives."""
    if len(leaves) > limit:
        raise Refusal(f"a combination of anyOf/oneOf/not/if/dependencies with more than {limit} alternatives")


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


def item_at(kw: dict, index: int) -> U:
    """The schema of item `index` of an array leaf's keywords: its prefix item, else its items."""
    if index < len(kw["prefix"]):
        return kw["prefix"][index]
    return ANY if kw["items"] is None else kw["items"]
