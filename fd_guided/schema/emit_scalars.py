"""The emitter's scalar leaves: enums, numbers and strings as the schema one engine enforces.

Mixed into `emit.Emitter` (which sets `engine` and `narrowed` and dispatches leaves by kind):
integer and number bounds clipped to what each engine compares exactly (`numbers`), ``multipleOf``
as the engine's own keyword or an enum of the multiples, enum numbers in every spelling xgrammar
needs, string patterns and formats translated (`regex.translate`), and (xgrammar) length bounds
as a pattern of characters that need no JSON escape. The limits were measured with real matchers
(tests/schema/test_engine_keywords.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import languages, regex
from .formats import FORMAT_PATTERNS, SUBSET_NOTES
from .intersection import make_integer
from .numbers import (
    LLGUIDANCE_EXACT_LIMIT,
    XGRAMMAR_INT_LIMIT,
    XGRAMMAR_MAX_MULTIPLE_OF,
    binary_fraction,
    bounded,
    enumerate_multiples,
    every_integer_is_multiple,
    has_big_integer,
    spellable,
    spelled_numbers,
    step_feature,
    value_schema,
)
from .refusal import Refusal

MAX_SPELLED_NUMBERS = 16  # enum numbers xgrammar is given as one-value ranges (`ScalarEmitter._xgrammar_enum`)
_XGRAMMAR_PLAIN_CHAR = '[^"\\\\\\x00-\\x1f]'  # a character a JSON string holds without an escape


class ScalarEmitter:
    """Enum, number and string leaves for `engine`; sets `narrowed` where the emitted schema admits
    only a subset (a bounded string without escapes, a format's documented subset)."""

    engine: str
    narrowed: bool

    def _enum(self, values: tuple, origin: str, *, every_spelling: bool = False) -> dict:
        if self.engine == "llguidance" and any(has_big_integer(v) for v in values):
            raise Refusal(
                "enum/const integers beyond 2^53 (llguidance compares them as floating point)", f"{origin}.enum"
            )
        if self.engine == "xgrammar" and every_spelling:
            return self._xgrammar_enum(values)
        out = list(values)
        # 1 and 1.0 are the same JSON Schema value, so both are listed; but both engines (llguidance
        # 1.9.1, xgrammar 0.2.8, measured) write an enum number in one spelling, so this alone does not
        # admit `1.0` for `1`: xgrammar's leaf enums get every spelling from `_xgrammar_enum`.
        out += [
            float(v)
            for v in values
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) < LLGUIDANCE_EXACT_LIMIT
        ]
        return {"enum": out}

    @staticmethod
    def _xgrammar_enum(values: tuple) -> dict:
        """xgrammar writes every enum number in one spelling (``0.0`` as ``0``), yet ``1.0`` equals
        ``1`` in JSON Schema. An integral number up to 2^53 becomes a range of one value, which
        xgrammar matches exactly in any decimal spelling without an exponent (``1``, ``1.0``,
        ``1.00``; measured, neighbours and 2^53 +- 1 included: tests/schema/test_engine_keywords.py),
        and an array holding one a tuple of such items. At most `MAX_SPELLED_NUMBERS` numbers are
        spelled out; past that the enum stays as it is (one spelling each: a subset)."""
        spelled = [v for v in values if spellable(v)]
        if not spelled or sum(spelled_numbers(v) for v in spelled) > MAX_SPELLED_NUMBERS:
            return {"enum": list(values)}
        rest = [v for v in values if not spellable(v)]
        unique = {json.dumps(v, sort_keys=True): v for v in spelled}.values()
        options = ([{"enum": rest}] if rest else []) + [value_schema(v) for v in unique]
        return options[0] if len(options) == 1 else {"anyOf": options}

    # ----- numbers --------------------------------------------------------------------------------

    def _number(self, kind: str, kw: dict, origin: str) -> dict | None:
        steps = kw["steps"]
        if kind == "number" and steps and all(isinstance(s, int) for s in steps):
            integer_kw = make_integer(kw)  # integer multiples only: a subset (4.0 is not produced)
            if integer_kw is None:
                return None
            kw = integer_kw
            kind = "integer"
        if kind == "integer":
            steps = tuple(s for s in steps if not every_integer_is_multiple(s))
            limit = XGRAMMAR_INT_LIMIT if self.engine == "xgrammar" else LLGUIDANCE_EXACT_LIMIT
            lo = None if kw["lo"] is None else max(kw["lo"][0], -limit)
            hi = None if kw["hi"] is None else min(kw["hi"][0], limit)
            if lo is not None and hi is not None and lo > hi:
                raise Refusal(f"integer bounds beyond {limit}", f"{origin}.minimum")
            if steps:
                return self._integer_steps(lo, hi, steps, origin)
            return bounded({"type": "integer"}, lo, hi, False, False)
        lo, hi = kw["lo"], kw["hi"]
        if self.engine == "llguidance":
            lo = None if lo is None else (max(lo[0], -LLGUIDANCE_EXACT_LIMIT), lo[1])
            hi = None if hi is None else (min(hi[0], LLGUIDANCE_EXACT_LIMIT), hi[1])
            if lo is not None and hi is not None and (lo[0] > hi[0] or lo[0] == hi[0] and (lo[1] or hi[1])):
                raise Refusal("number bounds beyond 2^53", f"{origin}.minimum")
        if steps:
            return self._number_steps(lo, hi, steps, origin)
        return bounded(
            {"type": "number"},
            None if lo is None else lo[0],
            None if hi is None else hi[0],
            bool(lo and lo[1]),
            bool(hi and hi[1]),
        )

    def _integer_steps(self, lo, hi, steps, origin: str) -> dict | None:
        if all(isinstance(s, int) for s in steps):
            step = math.lcm(*steps)
            if self.engine == "llguidance" or (step <= XGRAMMAR_MAX_MULTIPLE_OF and lo is None and hi is None):
                return bounded({"type": "integer", "multipleOf": step}, lo, hi, False, False)
        values = enumerate_multiples(lo, hi, steps, True)
        if values is None:
            raise Refusal(step_feature(self.engine, steps), f"{origin}.multipleOf")
        return self._enum(tuple(values), origin) if values else None

    def _number_steps(self, lo, hi, steps, origin: str) -> dict | None:
        if self.engine == "llguidance" and len(steps) == 1 and binary_fraction(steps[0]):
            return bounded(
                {"type": "number", "multipleOf": steps[0]},
                None if lo is None else lo[0],
                None if hi is None else hi[0],
                bool(lo and lo[1]),
                bool(hi and hi[1]),
            )
        values = enumerate_multiples(lo, hi, steps, False)
        if values is None:
            raise Refusal(step_feature(self.engine, steps), f"{origin}.multipleOf")
        return self._enum(tuple(values), origin) if values else None

    # ----- strings --------------------------------------------------------------------------------

    def _string(self, kw: dict, origin: str) -> dict | None:
        patterns = list(kw["patterns"]) + [rf"\A(?:{FORMAT_PATTERNS[f]})\Z" for f in kw["formats"]]
        translated = []
        for pattern in patterns:
            try:
                translated.append(regex.translate(pattern, self.engine))
            except Refusal as refusal:
                raise Refusal(refusal.feature, f"{origin}.pattern") from None
        out: dict[str, Any] = {"type": "string"}
        bounded = kw["min"] > 0 or kw["max"] is not None
        if self.engine == "xgrammar":
            if len(translated) > 1:
                raise Refusal("several patterns/formats on one string", f"{origin}.pattern")
            if bounded:
                return self._xgrammar_bounded_string(kw, translated, origin)
        elif len(patterns) > 1 and self._no_common_string(patterns, kw["formats"]):
            return None
        if kw["min"] > 0:
            out["minLength"] = kw["min"]
        if kw["max"] is not None:
            out["maxLength"] = kw["max"]
        if len(translated) == 1:
            out["pattern"] = translated[0]
        elif translated:
            out["allOf"] = [{"pattern": p} for p in translated]
        return out

    def _no_common_string(self, patterns: list[str], formats: tuple) -> bool:
        """True when no string matches all of `patterns` (``re.search``): the leaf has no value
        and is left out (llguidance refuses a grammar whose patterns have nothing in common,
        "Regex is empty", as a schema with ``format: uri`` and a ``git@host:app.git`` pattern
        does). A format written as a documented subset (`formats.SUBSET_NOTES`) makes that an
        emptiness of a subset: the output is then narrowed, as for a dropped alternative."""
        try:
            trees = [regex.full_match_tree(regex.parse(pattern)[0], regex.ALL_CHARS) for pattern in patterns]
        except Refusal:
            return False
        if not languages.no_common_string(trees, regex.ALL_CHARS):
            return False
        if any(fmt in SUBSET_NOTES for fmt in formats):
            self.narrowed = True
        return True

    def _xgrammar_bounded_string(self, kw: dict, translated: list[str], origin: str) -> dict:
        """Length bounds as a pattern of characters that need no JSON escape: exact in counting, a
        subset in what it admits (no escapes). xgrammar's own bounded string admits raw control
        characters, and its bounded repetitions past 128 fail to compile (per_rule_fsm_hashes)."""
        low, high = kw["min"], kw["max"]
        if translated or max(low, high or 0) > regex.XGRAMMAR_MAX_COUNT:
            raise Refusal(
                f"minLength/maxLength beside a pattern or format, or past {regex.XGRAMMAR_MAX_COUNT}",
                f"{origin}.maxLength",
            )
        self.narrowed = True
        return {"type": "string", "pattern": f"^{_XGRAMMAR_PLAIN_CHAR}{{{low},{'' if high is None else high}}}$"}
