"""The shortest spelling of a JSON number within a schema's bounds and ``multipleOf`` (`number`):
a start plan's number (`instance.Writer`). Zero when it fits, else the values nearest zero on the
range's side: the first multiples of the step, or the first decimals of each precision up to
`MAX_DIGITS`; spelled without an exponent, shortest first."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

MAX_DIGITS = 12  # decimals tried for a number between two bounds


def number(node: dict, integer: bool) -> str | None:
    """The shortest spelling of a number in `node`'s bounds and ``multipleOf`` (an integer one for
    `integer`), None if none is found."""
    lo = _bound(node, "minimum", "exclusiveMinimum", max)
    hi = _bound(node, "maximum", "exclusiveMaximum", min)
    step = _fraction(node["multipleOf"]) if "multipleOf" in node else None
    if step is not None and step <= 0:
        return None
    if integer:
        step = Fraction(step.numerator) if step is not None else Fraction(1)  # integer multiples of p/q: of p
    inside = lambda v: (
        (lo is None or v > lo[0] or (v == lo[0] and not lo[1]))
        and (hi is None or v < hi[0] or (v == hi[0] and not hi[1]))
    )
    candidates = [Fraction(0)] if inside(Fraction(0)) else _near_zero(lo, hi, step)
    fitting = [v for v in candidates if inside(v) and (step is None or (v / step).denominator == 1)]
    spelled = [text for text in map(_spell, fitting) if text is not None]
    return min(spelled, key=lambda text: (len(text), text), default=None)


def _near_zero(lo, hi, step: Fraction | None) -> list[Fraction]:
    """Values of the range nearest zero on its side: the first multiples of `step`, or the first
    decimals of each precision."""
    positive = lo is not None and lo[0] >= 0
    edge = lo[0] if positive else hi[0] if hi is not None else None
    if edge is None:
        return []
    sign = 1 if positive else -1
    magnitude = abs(edge)
    if step is not None:
        first = math.floor(magnitude / step) * step
        return [sign * (first + k * step) for k in range(0, 9)]
    out = []
    for digits in range(MAX_DIGITS + 1):
        unit = Fraction(1, 10**digits)
        first = math.floor(magnitude / unit) * unit
        out += [sign * first, sign * (first + unit)]
    return out


def _bound(node: dict, inclusive: str, exclusive: str, pick) -> tuple[Fraction, bool] | None:
    bounds = []
    if inclusive in node:
        bounds.append((_fraction(node[inclusive]), False))
    if exclusive in node:
        bounds.append((_fraction(node[exclusive]), True))
    if not bounds:
        return None
    if len(bounds) == 2 and bounds[0][0] == bounds[1][0]:
        return (bounds[0][0], True)
    return pick(bounds, key=lambda b: b[0])


def _fraction(value) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _spell(value: Fraction) -> str | None:
    """`value` as a JSON number without an exponent; None when its decimal expansion does not end."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for factor in (2, 5):
        while denominator % factor == 0:
            denominator //= factor
    if denominator != 1:
        return None
    text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
