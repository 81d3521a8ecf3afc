"""The last check on an emitted schema: only keywords the engine enforces exactly.

An engine silently ignores a keyword it does not know (xgrammar reads ``{"not": {}}`` as any
value), so `check_emitted` walks every node of what `emit.Emitter` wrote and refuses, as an
internal error, any keyword outside `EMITTED_KEYWORDS` (and the engine's extras).
"""

from __future__ import annotations

from typing import Any

from .refusal import Refusal

# Every keyword the emitter writes, per engine: what each engine enforces exactly (capabilities).
EMITTED_KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "anyOf",
        "$ref",
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "pattern",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)
ENGINE_EXTRA_KEYWORDS = {"xgrammar": frozenset(), "llguidance": frozenset({"allOf"})}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs")
_SCHEMA_LISTS = ("anyOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties")


def check_emitted(document: dict, engine: str) -> None:
    """The last line of defence: every node handed to `engine` uses only `EMITTED_KEYWORDS` (and the
    engine's extras). An engine silently ignores a keyword it does not know (xgrammar reads
    ``{"not": {}}`` as any value), so a node outside the set is refused as an internal error,
    never passed on. Iterative: emitted documents may be large."""
    allowed = EMITTED_KEYWORDS | ENGINE_EXTRA_KEYWORDS[engine]
    stack: list[Any] = [{k: v for k, v in document.items() if k not in ("$defs", "$schema")}]
    stack.extend(document.get("$defs", {}).values())
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise Refusal(f"an internal normaliser error (a schema node of type {type(node).__name__})")
        unknown = set(node) - allowed
        if unknown:
            raise Refusal(f"an internal normaliser error (it emitted {sorted(unknown)} for {engine})")
        for key in _SCHEMA_MAPS:
            if key in node:
                stack.extend(node[key].values())
        for key in _SCHEMA_LISTS:
            stack.extend(node.get(key, ()))
        for key in _SCHEMA_VALUES:
            if key in node:
                stack.append(node[key])
