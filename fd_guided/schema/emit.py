"""Normalised unions -> the JSON schema one engine enforces exactly (`capabilities.TABLE`).

Every emitted node has an explicit ``type`` (or is an ``enum``, a lone ``$ref``, or an ``anyOf``
of such nodes); object leaves carry explicit ``additionalProperties``; referenced definitions go
to ``$defs`` under generated names, emitted from a work list (no recursion over reference
chains). A weak leaf (`leaves.Leaf.weak`) the engine cannot take is dropped rather than refused.
The per-keyword engine limits below were measured with real matchers; each one is tested in
tests/schema/test_engine_keywords.py.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from . import languages, regex
from .emitted import check_emitted
from .formats import FORMAT_PATTERNS, SUBSET_NOTES
from .intersection import array_max, intersect
from .leaves import BARE_KINDS, Leaf, U
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
from .pattern_properties import pattern_properties
from .refusal import Refusal, Unsatisfiable
from .unique_items import finish_unique

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
MAX_MIN_ITEMS = 1024
MAX_COUNT = 2**31 - 1
MAX_EMITTED_NODES = 200_000
MAX_SPELLED_NUMBERS = 16  # enum numbers xgrammar is given as one-value ranges (`Emitter._xgrammar_enum`)
_XGRAMMAR_PLAIN_CHAR = '[^"\\\\\\x00-\\x1f]'  # a character a JSON string holds without an escape
_XGRAMMAR_BAD_KEY_CHARS = frozenset('"\\') | frozenset(map(chr, range(0x20)))


class Emitter:
    def __init__(self, normaliser, engine: str):
        self.normaliser = normaliser
        self.engine = engine
        self._names: dict[tuple, str] = {}
        self._pending: list[tuple[tuple, bool, str]] = []
        self._nodes = 0
        self._empty: set[tuple] = set()  # definitions that emitted nothing (see `document`)
        # The emitted schema admits only a subset of the valid values: a weak alternative the engine
        # cannot express was left out, or a bounded string admits no escapes (xgrammar).
        self.narrowed = False

    def document(self) -> dict:
        """The emitted schema. A definition can come out empty only after emission (every leaf it
        had was a weak leaf the engine cannot take), and no engine may be handed an empty
        definition: xgrammar reads ``{"not": {}}`` as *any value*. So emission repeats, each round
        treating references to the definitions found empty so far as absent (as for a target the
        normaliser proved empty), until no new empty one appears: at most one round per definition."""
        empty: set[tuple] = set()
        while True:
            body, defs, newly_empty = self._emit_once(empty)
            if not newly_empty:
                break
            empty |= newly_empty
        out = dict(body)
        if defs:
            out["$defs"] = defs
        if self.engine == "llguidance":
            out["$schema"] = DRAFT_2020_12
        check_emitted(out, self.engine)
        return out

    def _emit_once(self, empty: set[tuple]) -> tuple[dict, dict, set[tuple]]:
        self._names, self._pending, self._nodes, self._empty = {}, [], 0, empty
        self.narrowed = bool(empty)  # an empty definition is a dropped weak alternative
        root = self.normaliser.root()
        if root.is_none and root.exact:
            raise Unsatisfiable("no value is valid")
        body = self.union(root, "$")
        if body is False:
            raise Refusal("not/if/oneOf whose remaining alternatives this engine cannot express")
        defs: dict[str, dict | bool] = {}
        newly_empty: set[tuple] = set()
        while self._pending:
            key, closed, name = self._pending.pop(0)
            target = self.normaliser.expand(Leaf("ref", {"target": key, "closed": closed}))
            emitted = self.union(target, self.normaliser.targets[key][2])
            if emitted is False:
                newly_empty.add((key, closed))
            defs[name] = emitted
        return body, defs, newly_empty

    def _count(self) -> None:
        self._nodes += 1
        if self._nodes > MAX_EMITTED_NODES:
            raise Refusal("a schema too large once normalised")

    # ----- unions and leaves ----------------------------------------------------------------------

    def union(self, u: U, path: str) -> dict | Literal[False]:
        if u.leaves is None:  # u.is_any
            return {}
        out: list[dict] = []
        for leaf in u.leaves:
            try:
                emitted = self.leaf(leaf)
            except Refusal:
                if not leaf.weak:
                    raise
                self.narrowed = True
                continue
            if emitted is not None:
                out.append(emitted)
        if not out:
            return False
        return _combine(out)

    def leaf(self, leaf: Leaf) -> dict | None:
        self._count()
        kind = leaf.kind
        if kind == "ref":
            return self._ref(leaf)
        if kind == "enum":
            return self._enum(leaf.kw["values"], leaf.origin, every_spelling=True)
        if kind in ("null", "boolean"):
            return {"type": kind}
        if kind in ("integer", "number"):
            return self._number(kind, leaf.kw, leaf.origin)
        if kind == "string":
            return self._string(leaf.kw, leaf.origin)
        if kind == "array":
            return self._array(leaf.kw, leaf.origin)
        return self._object(leaf.kw, leaf.origin)

    def _ref(self, leaf: Leaf) -> dict | None:
        key, closed = leaf.kw["target"], leaf.kw["closed"]
        if (key, closed) in self._empty or self.normaliser.expand(leaf).is_none:
            return None
        name = self._names.get((key, closed))
        if name is None:
            name = self._names[(key, closed)] = f"n{len(self._names)}"
            self._pending.append((key, closed, name))
        return {"$ref": f"#/$defs/{name}"}

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
            from .intersection import make_integer

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

    # ----- arrays ---------------------------------------------------------------------------------

    def _array(self, kw: dict, origin: str) -> dict | None:
        if kw["unique"] and not kw["contains"]:
            kw = self._unique_deferred(kw, origin)
        if kw["unique"] or kw["contains"]:
            raise Refusal("uniqueItems/contains that could not be rewritten", origin)
        out: dict[str, Any] = {"type": "array"}
        high = array_max(kw)
        prefix = []
        for index, child in enumerate(kw["prefix"]):
            emitted = self.union(child, f"{origin}.prefixItems[{index}]")
            if emitted is False:
                high = index if high is None else min(high, index)
                break
            prefix.append(emitted)
        if high is not None:
            prefix = prefix[:high]
        if kw["min"] > (high if high is not None else kw["min"]):
            return None
        if prefix:
            out["prefixItems"] = prefix
        if kw["items"] is not None and (high is None or high > len(prefix)):
            out["items"] = self.union(kw["items"], f"{origin}.items")
        if kw["min"] > MAX_MIN_ITEMS:
            raise Refusal(f"minItems above {MAX_MIN_ITEMS}", f"{origin}.minItems")
        if kw["min"]:
            out["minItems"] = kw["min"]
        if high is not None:
            out["maxItems"] = min(high, MAX_COUNT)
        return out

    def _unique_deferred(self, kw: dict, origin: str) -> dict:
        """``uniqueItems`` the normaliser left for now (`unique_items.finish_unique`: its items
        reach a definition that was still being normalised), decided now that all are done. Only
        a verdict that keeps the items as they are is taken (the guard then enforces it): moving
        a property last would inline the definition the array sits in, again at every level."""
        finished = finish_unique(Leaf("array", kw, origin), self.normaliser)
        if (
            len(finished) == 1
            and finished[0].kind == "array"
            and not finished[0].kw["unique"]
            and finished[0].kw["items"] is kw["items"]
            and finished[0].kw["prefix"] == kw["prefix"]
        ):
            return finished[0].kw
        return kw

    # ----- objects --------------------------------------------------------------------------------

    def _object(self, kw: dict, origin: str) -> dict | None:
        out: dict[str, Any] = {"type": "object"}
        closed = kw["additional"] is not None and kw["additional"].is_none
        props = {}
        for name, child in kw["props"].items():
            if self.engine == "xgrammar" and any(c in name for c in _XGRAMMAR_BAD_KEY_CHARS):
                # Measured: xgrammar does not match such keys, so they fall to additionalProperties.
                raise Refusal('property names with ", \\ or control characters', f"{origin}.properties")
            emitted = self.union(child, f"{origin}.properties.{name}")
            if emitted is False:
                if name in kw["required"]:
                    return None
                if self.engine == "xgrammar":
                    if closed and not kw["pprops"]:
                        continue  # absent anyway: nothing else may name it
                    raise Refusal(
                        "a property that must be absent (false) beside open additionalProperties",
                        f"{origin}.properties.{name}",
                    )
            props[name] = emitted
        if props:
            out["properties"] = props
        required = list(kw["required"])
        if any(name not in props for name in required):
            raise Refusal("a required property the normaliser did not declare", f"{origin}.required")
        if required:
            out["required"] = required
        if kw["pprops"]:
            out["patternProperties"] = pattern_properties(
                kw["pprops"],
                self.engine,
                f"{origin}.patternProperties",
                self.union,
                lambda a, b: intersect(a, b, self.normaliser),
                props,
            )
        if kw["additional"] is not None:
            out["additionalProperties"] = self.union(kw["additional"], f"{origin}.additionalProperties")
        self._property_counts(kw, out, origin, closed)
        return out

    def _property_counts(self, kw: dict, out: dict, origin: str, closed: bool) -> None:
        low, high = kw["min"], kw["max"]
        declared = set(out.get("properties", {}))
        required = set(out.get("required", ()))
        open_keys = not closed or bool(kw["pprops"])
        if low > max(1, len(required)):
            if self.engine == "llguidance" or open_keys or low > MAX_MIN_ITEMS:
                raise Refusal(
                    "minProperties above 1 beyond the required properties (additional keys may repeat, "
                    "and llguidance cannot count optional ones)",
                    f"{origin}.minProperties",
                )
            out["minProperties"] = low
        elif low == 1 and not required:
            out["minProperties"] = 1
        if high is not None:
            if self.engine == "llguidance" and high > 1 and not declared <= required:
                raise Refusal("maxProperties above 1 beside optional properties", f"{origin}.maxProperties")
            out["maxProperties"] = min(high, MAX_COUNT)


# ----- helpers -------------------------------------------------------------------------------------


def _combine(leaves: list[dict]) -> dict:
    """One node for a union: plain types merge into one ``type`` list; duplicates go."""
    plain = [leaf["type"] for leaf in leaves if set(leaf) == {"type"}]
    others = [leaf for leaf in leaves if set(leaf) != {"type"}]
    kinds = set(plain)
    if "number" in kinds:
        kinds.discard("integer")
    if kinds >= set(BARE_KINDS):
        return {}
    merged: list[dict] = [{"type": k} for k in BARE_KINDS + ("integer",) if k in kinds]
    if len(merged) > 1:
        merged = [{"type": [m["type"] for m in merged]}]
    unique, seen = [], set()
    for leaf in merged + others:
        text = repr(leaf)
        if text not in seen:
            seen.add(text)
            unique.append(leaf)
    return unique[0] if len(unique) == 1 else {"anyOf": unique}
