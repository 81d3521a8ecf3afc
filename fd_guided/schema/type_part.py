"""A node's type part: one leaf per type it allows, each carrying only that type's keywords.

`type_part` reads ``type`` (every bare kind when it is absent but a type-specific keyword is
present) and builds each leaf from the node's keywords: number bounds and ``multipleOf``, string
lengths, ``pattern`` and ``format``, array and object children (normalised at value positions by
the normaliser, `ctx.value`). A leaf with no value is left out (numbers, strings) or becomes the
normaliser's empty union (`intersection.emptied`: arrays, objects).
"""

from __future__ import annotations

import math

from .formats import ANNOTATION_FORMATS, FORMAT_PATTERNS, UNSUPPORTED_FORMATS
from .intersection import bounds_empty, check_array, check_object, emptied, make_integer
from .leaves import ANY, BARE_KINDS, Leaf, U
from .refusal import Refusal
from .rules import check_pattern

MAX_PATTERN_PROPERTIES = 64  # no engine takes more (pattern_properties.py): refused before any is compiled
# Formats JSON Schema names (a validator may check them): never dropped as annotations.
STANDARD_FORMATS = frozenset(FORMAT_PATTERNS) | frozenset(UNSUPPORTED_FORMATS)
NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
STRING_KEYS = ("minLength", "maxLength", "pattern", "format")
ARRAY_KEYS = ("prefixItems", "items", "minItems", "maxItems", "uniqueItems", "contains")
OBJECT_KEYS = (
    "properties",
    "patternProperties",
    "additionalProperties",
    "required",
    "minProperties",
    "maxProperties",
    "propertyNames",
)


def type_part(kw: dict, resolver, ctx, path: str) -> U:
    """The union of the leaves of the types `kw` allows (ANY when it says nothing about types).
    `ctx` is the normaliser (`normalise.Normaliser`): its ``value`` normalises the children of
    arrays and objects, its ``unknown_formats`` decides an unknown ``format``, and it is the
    `intersection.Context` that judges whether an array or object leaf has a value."""
    declared = kw.get("type")
    if declared is None:
        present = [k for k in NUMBER_KEYS + STRING_KEYS + ARRAY_KEYS + OBJECT_KEYS if k in kw]
        if not present:
            return ANY
        kinds = list(BARE_KINDS)
    else:
        kinds = [declared] if isinstance(declared, str) else list(declared)
        if "number" in kinds and "integer" in kinds:
            kinds.remove("integer")
    leaves, exact = [], True
    for kind in dict.fromkeys(kinds):
        leaf = _leaf(kind, kw, resolver, ctx, path)
        if isinstance(leaf, U):  # an array or object with no value (`emptied`)
            exact = exact and leaf.exact
        elif leaf is not None:
            leaves.append(leaf)
    return U(leaves, exact)


def _leaf(kind: str, kw: dict, resolver, ctx, path: str) -> Leaf | U | None:
    if kind in ("null", "boolean"):
        return Leaf(kind, None, path)
    if kind in ("integer", "number"):
        return _number_leaf(kind, kw, path)
    if kind == "string":
        return _string_leaf(kw, ctx.unknown_formats, path)
    if kind == "array":
        return _array_leaf(kw, resolver, ctx, path)
    if kind == "object":
        return _object_leaf(kw, resolver, ctx, path)
    raise Refusal(f"type {kind!r}", path)


def _number_leaf(kind: str, kw: dict, path: str) -> Leaf | None:
    lo = hi = None
    for key, lower, exclusive in (
        ("minimum", True, False),
        ("exclusiveMinimum", True, True),
        ("maximum", False, False),
        ("exclusiveMaximum", False, True),
    ):
        if key in kw:
            value = kw[key]
            if isinstance(value, float) and not math.isfinite(value):
                raise Refusal(f"{key} that is not a finite number", f"{path}.{key}")
            bound = (value, exclusive)
            if lower:
                lo = bound if lo is None or value > lo[0] or (value == lo[0] and exclusive) else lo
            else:
                hi = bound if hi is None or value < hi[0] or (value == hi[0] and exclusive) else hi
    steps = (kw["multipleOf"],) if "multipleOf" in kw else ()
    given_kw = {"lo": lo, "hi": hi, "steps": steps}
    leaf_kw = make_integer(given_kw) if kind == "integer" else given_kw
    if leaf_kw is None or bounds_empty(leaf_kw["lo"], leaf_kw["hi"]):
        return None
    return Leaf(kind, leaf_kw, path)


def _string_leaf(kw: dict, unknown_formats: str, path: str) -> Leaf | None:
    formats: tuple = ()
    fmt = kw.get("format")
    if isinstance(fmt, str) and fmt not in ANNOTATION_FORMATS:
        if fmt in FORMAT_PATTERNS:
            formats = (fmt,)
        elif fmt in STANDARD_FORMATS:
            raise Refusal(f"format {fmt!r} ({UNSUPPORTED_FORMATS.get(fmt, 'not enforceable')})", f"{path}.format")
        elif unknown_formats != "annotate":
            raise Refusal(f"format {fmt!r} (unknown; set unknown_formats='annotate' to ignore it)", f"{path}.format")
    patterns = (kw["pattern"],) if isinstance(kw.get("pattern"), str) else ()
    for pattern in patterns:
        check_pattern(pattern, f"{path}.pattern")
    low, high = int(kw.get("minLength", 0)), kw.get("maxLength")
    high = None if high is None else int(high)
    if high is not None and low > high:
        return None
    return Leaf("string", {"min": low, "max": high, "patterns": patterns, "formats": formats}, path)


def _array_leaf(kw: dict, resolver, ctx, path: str) -> Leaf | U:
    prefix = tuple(
        ctx.value(child, resolver, f"{path}.prefixItems[{i}]") for i, child in enumerate(kw.get("prefixItems") or [])
    )
    items = ctx.value(kw["items"], resolver, f"{path}.items") if "items" in kw else None
    contains: tuple = ()
    if "contains" in kw:
        high = kw.get("maxContains")
        contains = (
            (
                ctx.value(kw["contains"], resolver, f"{path}.contains"),
                int(kw.get("minContains", 1)),
                None if high is None else int(high),
            ),
        )
    high = kw.get("maxItems")
    leaf_kw = {
        "prefix": prefix,
        "items": items,
        "min": int(kw.get("minItems", 0)),
        "max": None if high is None else int(high),
        "unique": kw.get("uniqueItems") is True,
        "contains": contains,
        "ann_prefix": len(prefix),
        "ann_items": "items" in kw,
        "declared": "prefixItems" in kw,
    }
    checked = check_array(leaf_kw)
    return emptied(leaf_kw, ctx) if checked is None else Leaf("array", checked, path)


def _object_leaf(kw: dict, resolver, ctx, path: str) -> Leaf | U:
    props = {
        name: ctx.value(child, resolver, f"{path}.properties.{name}")
        for name, child in (kw.get("properties") or {}).items()
    }
    pprops = {}
    if len(kw.get("patternProperties") or ()) > MAX_PATTERN_PROPERTIES:  # before compiling them all
        raise Refusal(f"more than {MAX_PATTERN_PROPERTIES} patternProperties", f"{path}.patternProperties")
    for pattern, child in (kw.get("patternProperties") or {}).items():
        check_pattern(pattern, f"{path}.patternProperties")
        pprops[pattern] = ctx.value(child, resolver, f"{path}.patternProperties")
    additional = (
        ctx.value(kw["additionalProperties"], resolver, f"{path}.additionalProperties")
        if "additionalProperties" in kw
        else None
    )
    names = (ctx.value(kw["propertyNames"], resolver, f"{path}.propertyNames"),) if "propertyNames" in kw else ()
    high = kw.get("maxProperties")
    leaf_kw = {
        "props": props,
        "pprops": pprops,
        "additional": additional,
        "required": tuple(dict.fromkeys(kw.get("required") or ())),
        "min": int(kw.get("minProperties", 0)),
        "max": None if high is None else int(high),
        "names": names,
        "ann": frozenset(props),
        "ann_pp": frozenset(pprops),
        "ann_rest": "additionalProperties" in kw,
        "declared": "properties" in kw or "patternProperties" in kw,
    }
    checked = check_object(leaf_kw, ctx)
    return emptied(leaf_kw, ctx) if checked is None else Leaf("object", checked, path)
