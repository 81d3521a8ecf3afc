"""Does a normalised union accept a JSON value? The normaliser's own validator.

Used to filter ``enum``/``const`` values against their sibling keywords and to enumerate finite
domains (``uniqueItems``). It follows `jsonschema`'s semantics where they matter for soundness:
``multipleOf`` in binary floating point exactly as jsonschema computes it, ``pattern`` with
``re.search``, formats with jsonschema's format checker, ``1.0`` an integer, ``True`` not a number.
tests/schema/test_normalise.py runs it against the JSON-Schema-Test-Suite's verdicts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from .intersection import schema_for
from .leaves import Leaf, U, json_key


def accepts(u: U, value: Any, expand: Callable[[Leaf], U], format_ok: Callable[[str, str], bool]) -> bool:
    if u.leaves is None:
        return True
    return any(leaf_accepts(leaf, value, expand, format_ok) for leaf in u.leaves)


def leaf_accepts(leaf: Leaf, value: Any, expand, format_ok) -> bool:
    kind, kw = leaf.kind, leaf.kw
    if kind == "enum":
        key = json_key(value)
        return any(json_key(v) == key for v in kw["values"])
    if kind == "ref":
        return accepts(expand(leaf), value, expand, format_ok)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if kind == "integer" and not (isinstance(value, int) or value.is_integer()):
            return False
        return _number_ok(kw, value)
    if kind == "string":
        return isinstance(value, str) and _string_ok(kw, value, format_ok)
    if kind == "array":
        return isinstance(value, list) and _array_ok(kw, value, expand, format_ok)
    if kind == "object":
        return isinstance(value, dict) and _object_ok(kw, value, expand, format_ok)
    return False


def _number_ok(kw: dict, value) -> bool:
    lo, hi = kw["lo"], kw["hi"]
    if lo is not None and (value < lo[0] or (lo[1] and value == lo[0])):
        return False
    if hi is not None and (value > hi[0] or (hi[1] and value == hi[0])):
        return False
    return all(is_multiple(value, step) for step in kw["steps"])


def is_multiple(value, step) -> bool:
    """jsonschema's ``multipleOf`` verdict (binary floating point for float steps)."""
    if isinstance(step, float):
        try:
            quotient = value / step
            return int(quotient) == quotient
        except OverflowError:
            return (Fraction(value) / Fraction(step)).denominator == 1
        except ZeroDivisionError:
            return False
    return not (value % step)


def _string_ok(kw: dict, value: str, format_ok) -> bool:
    if len(value) < kw["min"] or (kw["max"] is not None and len(value) > kw["max"]):
        return False
    if not all(re.search(pattern, value) for pattern in kw["patterns"]):
        return False
    return all(format_ok(value, fmt) for fmt in kw["formats"])


def _array_ok(kw: dict, value: list, expand, format_ok) -> bool:
    if len(value) < kw["min"] or (kw["max"] is not None and len(value) > kw["max"]):
        return False
    for index, item in enumerate(value):
        if index < len(kw["prefix"]):
            child = kw["prefix"][index]
        elif kw["items"] is not None:
            child = kw["items"]
        else:
            continue
        if not accepts(child, item, expand, format_ok):
            return False
    if kw["unique"]:
        keys = [json_key(item) for item in value]
        if len(set(keys)) != len(keys):
            return False
    for child, low, high in kw["contains"]:
        count = sum(1 for item in value if accepts(child, item, expand, format_ok))
        if count < low or (high is not None and count > high):
            return False
    return True


def _object_ok(kw: dict, value: dict, expand, format_ok) -> bool:
    if len(value) < kw["min"] or (kw["max"] is not None and len(value) > kw["max"]):
        return False
    if any(name not in value for name in kw["required"]):
        return False
    for name, item in value.items():
        matched = name in kw["props"]
        if matched and not accepts(kw["props"][name], item, expand, format_ok):
            return False
        for pattern, child in kw["pprops"].items():
            if re.search(pattern, name):
                matched = True
                if not accepts(child, item, expand, format_ok):
                    return False
        if not matched and kw["additional"] is not None and not accepts(kw["additional"], item, expand, format_ok):
            return False
    return all(accepts(names, name, expand, format_ok) for names in kw["names"] for name in value)


__all__ = ["accepts", "leaf_accepts", "is_multiple", "schema_for"]
