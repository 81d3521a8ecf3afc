"""Normalised unions -> the JSON schema one engine enforces exactly (`capabilities.TABLE`).

Every emitted node has an explicit ``type`` (or is an ``enum``, a lone ``$ref``, or an ``anyOf``
of such nodes); object leaves carry explicit ``additionalProperties``; referenced definitions go
to ``$defs`` under generated names, emitted from a work list (no recursion over reference
chains). A weak leaf (`leaves.Leaf.weak`) the engine cannot take is dropped rather than refused.
Arrays and objects are emitted here, enums, numbers and strings by `emit_scalars.ScalarEmitter`.
The per-keyword engine limits below were measured with real matchers; each one is tested in
tests/schema/test_engine_keywords.py.
"""

from __future__ import annotations

from typing import Any, Literal

from .emit_scalars import ScalarEmitter
from .emitted import check_emitted
from .intersection import array_max, intersect
from .leaves import BARE_KINDS, Leaf, U
from .pattern_properties import pattern_properties
from .refusal import Refusal, Unsatisfiable
from .unique_items import finish_unique

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
MAX_MIN_ITEMS = 1024
MAX_COUNT = 2**31 - 1
MAX_EMITTED_NODES = 200_000
_XGRAMMAR_BAD_KEY_CHARS = frozenset('"\\') | frozenset(map(chr, range(0x20)))


class Emitter(ScalarEmitter):
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
