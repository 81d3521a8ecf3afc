"""Walking JSON schemas: which values of a schema are subschemas, and visiting them.

Shared by the backends' checkers and rewriters, so they agree on what counts as a subschema
(a property may be called "format" or "minLength"; ``const``/``enum``/... values are data).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

# Keywords whose values are data, not subschemas: never visited.
DATA_KEYWORDS = ("const", "enum", "default", "examples")
# Keywords whose values map names to subschemas: the map itself is not a schema.
SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LIST_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SCHEMA_KEYWORDS = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains",
                   "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def subschemas(node: Any, path: str = "") -> Iterator[tuple[Any, str]]:
    """The direct subschemas of `node` with their paths (``path.properties.a``, ``path.anyOf[0]``)."""
    if not isinstance(node, dict):
        return
    for keyword in SCHEMA_MAP_KEYWORDS:
        children = node.get(keyword)
        if isinstance(children, dict):
            for name, child in children.items():
                yield child, f"{path}.{keyword}.{name}"
    for keyword in SCHEMA_LIST_KEYWORDS:
        children = node.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield child, f"{path}.{keyword}[{index}]"
    for keyword in SCHEMA_KEYWORDS:
        if isinstance(node.get(keyword), dict):
            yield node[keyword], f"{path}.{keyword}"
    dependencies = node.get("dependencies")
    if isinstance(dependencies, dict):
        for name, child in dependencies.items():
            if isinstance(child, dict):
                yield child, f"{path}.dependencies.{name}"


# For rewriting, every object that is not data is visited (unknown keywords included).
_REWRITE_MAP_KEYWORDS = SCHEMA_MAP_KEYWORDS + ("dependencies",)


def for_each_schema_node(node: Any, visit: Callable[[dict], None]) -> None:
    """Call `visit` on every subschema of a schema (in place, parents first), skipping data values."""
    if isinstance(node, list):
        for child in node:
            for_each_schema_node(child, visit)
        return
    if not isinstance(node, dict):
        return
    visit(node)
    for key, child in node.items():
        if key in DATA_KEYWORDS:
            continue
        if key in _REWRITE_MAP_KEYWORDS and isinstance(child, dict):
            for subschema in child.values():
                for_each_schema_node(subschema, visit)
        else:
            for_each_schema_node(child, visit)
