"""Which values of a JSON schema are subschemas, and visiting them: the one walker.

A key means a keyword only at keyword position: ``{"properties": {"enum": {...}}}`` declares a
property *named* ``enum`` whose value is a schema, while ``{"enum": [...]}`` holds data. Walking
by keyword position (never by key name anywhere in the document) is what keeps a ``$ref`` or a
``pattern`` under a property called ``enum``/``const``/``default``/``examples`` from being skipped
(or data from being read as a schema). The forms of every draft are covered (``items`` as a list,
``additionalItems``, ``dependencies``, ``definitions``); unknown keywords are not entered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .deadline import checkpoint

# Keywords whose values are data, not subschemas: never entered.
DATA_KEYWORDS = ("const", "enum", "default", "examples")
# Keywords whose values map names to subschemas (the map itself is not a schema).
SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Keywords whose values are lists of subschemas ("items" only in drafts 4-2019-09).
SCHEMA_LIST_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SCHEMA_KEYWORDS = (
    "items",
    "additionalItems",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contentSchema",
)


def subschemas(node: Any, path: str = "$") -> Iterator[tuple[Any, str]]:
    """The direct subschemas (dicts) of `node` with their paths (``$.properties.a``, ``$.anyOf[0]``).

    Every walk over a schema asks this once per node: the admission deadline is checked here."""
    if not isinstance(node, dict):
        return
    checkpoint()
    for keyword in SCHEMA_MAP_KEYWORDS:
        children = node.get(keyword)
        if isinstance(children, dict):
            for name, child in children.items():
                if isinstance(child, dict):
                    yield child, f"{path}.{keyword}.{name}"
    for keyword in SCHEMA_LIST_KEYWORDS:
        children = node.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                if isinstance(child, dict):
                    yield child, f"{path}.{keyword}[{index}]"
    for keyword in SCHEMA_KEYWORDS:
        if isinstance(node.get(keyword), dict):
            yield node[keyword], f"{path}.{keyword}"
    dependencies = node.get("dependencies")
    if isinstance(dependencies, dict):
        for name, child in dependencies.items():
            if isinstance(child, dict):
                yield child, f"{path}.dependencies.{name}"


def schema_nodes(schema: Any, path: str = "$") -> Iterator[tuple[dict, str]]:
    """Every subschema of `schema` (itself included) with its path, parents first; iterative, so
    no document depth can overflow the stack. Shared dict objects are visited once."""
    stack = [(schema, path)]
    seen: set[int] = set()
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node, where
        stack.extend(reversed(list(subschemas(node, where))))


def schema_regexes(schema: Any) -> Iterator[tuple[str, str]]:
    """Every ``pattern`` value and ``patternProperties`` key of a schema, with its location."""
    for node, where in schema_nodes(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            yield pattern, f"{where}.pattern"
        pattern_properties = node.get("patternProperties")
        if isinstance(pattern_properties, dict):
            for key in pattern_properties:
                yield key, f"{where}.patternProperties"
