"""Numbers for engines: exact bounds and steps, and their limits (measured with real matchers).

xgrammar ignores ``multipleOf`` past about 1000 (1500 was ignored, 1024 held) and beside any bound,
and fails to build integer ranges past 2^63; llguidance compares numbers as IEEE doubles, so bounds
and enum integers past 2^53 are not exact there. `jsonschema` checks a float ``multipleOf`` in
binary floating point (0.3 is not a multiple of 0.1 to it), so a decimal step is only enforced as
the enumerated values jsonschema accepts.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .instance import is_multiple

XGRAMMAR_INT_LIMIT = 2**63 - 1
LLGUIDANCE_EXACT_LIMIT = 2**53
XGRAMMAR_MAX_MULTIPLE_OF = 1000
MAX_ENUMERATED_NUMBERS = 256


def bounded(out: dict, lo, hi, lo_exclusive: bool, hi_exclusive: bool) -> dict:
    if lo is not None:
        out["exclusiveMinimum" if lo_exclusive else "minimum"] = lo
    if hi is not None:
        out["exclusiveMaximum" if hi_exclusive else "maximum"] = hi
    return out


def has_big_integer(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > LLGUIDANCE_EXACT_LIMIT
    if isinstance(value, list):
        return any(has_big_integer(v) for v in value)
    if isinstance(value, dict):
        return any(has_big_integer(v) for v in value.values())
    return False


def decimal(step) -> Fraction:
    return Fraction(str(step)) if isinstance(step, float) else Fraction(step)


def binary_fraction(step) -> bool:
    """A step whose decimal spelling is a power-of-two fraction (0.5, 0.25, 0.125): exact in binary."""
    denominator = decimal(step).denominator
    return denominator & (denominator - 1) == 0


def every_integer_is_multiple(step) -> bool:
    """True for steps such as 1, 0.5, 0.25: jsonschema finds every integer a multiple of them."""
    if isinstance(step, int):
        return step == 1
    fraction = decimal(step)
    return fraction.numerator == 1 and binary_fraction(step)


def enumerate_multiples(lo, hi, steps, integer: bool) -> list | None:
    """The multiples of every step inside [lo, hi] that jsonschema accepts, or None if unbounded/too many."""
    if lo is None or hi is None:
        return None
    low = Fraction(lo if integer else lo[0])
    high = Fraction(hi if integer else hi[0])
    step = decimal(steps[0])
    first, last = math.ceil(low / step), math.floor(high / step)
    if last - first + 1 > MAX_ENUMERATED_NUMBERS * 4:
        return None
    values = []
    for k in range(first, last + 1):
        exact = k * step
        if not integer and ((lo[1] and exact == low) or (hi[1] and exact == high)):
            continue
        if integer and exact.denominator != 1:
            continue
        value = int(exact) if exact.denominator == 1 else float(exact)
        if all(is_multiple(value, s) for s in steps):
            values.append(value)
    return values if len(values) <= MAX_ENUMERATED_NUMBERS else None


def step_feature(engine: str, steps) -> str:
    if engine == "xgrammar":
        return (
            f"multipleOf {steps[0]!r} (xgrammar enforces only integer steps up to {XGRAMMAR_MAX_MULTIPLE_OF} "
            "without bounds; a bounded range needs at most 256 multiples)"
        )
    return (
        f"multipleOf {steps[0]!r} (a decimal step that binary floating-point validators check inexactly; "
        "bound the range to at most 256 values)"
    )


# ----- integral numbers in every spelling (xgrammar enums) -------------------------------------------


def spellable(value) -> bool:
    """An enum value holding an integral number xgrammar would write in one spelling only."""
    if isinstance(value, list):
        return any(spellable(item) for item in value)
    return integral(value) and abs(value) <= LLGUIDANCE_EXACT_LIMIT


def spelled_numbers(value) -> int:
    return sum(spelled_numbers(item) for item in value) if isinstance(value, list) else int(spellable(value))


def value_schema(value) -> dict:
    """A schema that admits exactly `value`, its integral numbers in every decimal spelling."""
    if isinstance(value, list):
        items = [value_schema(item) if spellable(item) else {"enum": [item]} for item in value]
        return {"type": "array", "prefixItems": items, "items": False, "minItems": len(items), "maxItems": len(items)}
    return {"type": "number", "minimum": int(value), "maximum": int(value)}


def integral(value) -> bool:
    """A JSON number with an integral value (``2`` or ``2.0``), not a boolean."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and math.isfinite(value) and value.is_integer()
