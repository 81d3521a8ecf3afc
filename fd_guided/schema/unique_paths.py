"""Where in an instance ``uniqueItems`` may apply: the schema side of the runtime uniqueness guard.

`fd_guided.unique_guard` enforces ``uniqueItems`` that no grammar can (items of an open domain,
e.g. any string) while the output is generated. It needs to know, for each array the output
opens, whether a ``uniqueItems: true`` may apply to it. `UniquePaths` answers that by walking the
schema along the instance path the output took, one step per container:

  - a node set stands for "the subschemas that may apply here": the in-place applicators of each
    node (``allOf``, ``anyOf``, ``oneOf``, ``then``, ``else``, ``dependentSchemas``, ``$ref``) are
    all followed, whichever branch the value ends up matching;
  - a step into property `name` follows ``properties[name]``, every ``patternProperties`` value
    (whether or not its pattern matches: no regex runs on output text), ``additionalProperties``
    when `name` is not declared, and ``unevaluatedProperties``; a step into item `i` follows
    ``prefixItems[i]`` or ``items``, ``contains`` and ``unevaluatedItems`` (older drafts' forms are
    read in 2020-12 terms by `drafts.Document.keywords`).

Soundness: this is an over-approximation of the schemas JSON Schema evaluates at a location
(``if`` and ``not`` are left out on purpose: a ``uniqueItems`` under them is not required of the
value, and the normaliser refuses what it cannot rewrite there), so every array that must be
unique is guarded; an array guarded without need (a ``uniqueItems`` in a branch the value did not
take) only loses duplicate values it could have had. Bounded: a node set holds at most
`MAX_NODES` schemas; past that every array below is guarded.
"""

from __future__ import annotations

import json
from typing import Any

from .drafts import Document, base_uri
from .formats import FORMAT_PATTERNS
from .refusal import Refusal
from .regex import string_language

MAX_NODES = 4096
_STRING_KEYWORDS = frozenset({"type", "pattern", "format", "minLength", "maxLength"})
IN_PLACE = ("allOf", "anyOf", "oneOf")
_ITEM_KEYWORDS = frozenset({"items", "prefixItems", "contains", "unevaluatedItems"})
_JSON_TYPES = {"string": str, "boolean": bool, "null": type(None), "integer": int}
# Keywords that can narrow a literal (string, number, boolean, null) beyond type/enum/const: where
# one appears, `item_domain` does not try to mirror it and says "unknown".
_NARROWING = frozenset(
    {
        "pattern",
        "minLength",
        "maxLength",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "not",
        "if",
        "then",
        "else",
        "contentEncoding",
        "contentMediaType",
        "$dynamicRef",
        "$recursiveRef",
    }
)


class NodeSet(tuple):
    """The schemas that may apply at one instance location, as (node, resolver) pairs.
    `unbounded` marks a set that grew past `MAX_NODES`: everything below it counts as guarded."""

    unbounded = False


_UNBOUNDED = NodeSet()
_UNBOUNDED.unbounded = True


class UniquePaths:
    """Answers "may ``uniqueItems`` apply to this array?" for one schema (module docstring)."""

    def __init__(self, schema: Any):
        self.doc = Document(schema)
        self._root = self._closure([(schema, self.doc.root_resolver)])

    def root(self) -> NodeSet:
        return self._root

    def child(self, nodes: NodeSet, step: str | int) -> NodeSet:
        """The node set of the value at `step` (a property name or an item index) below `nodes`."""
        if nodes.unbounded:
            return nodes
        children: list[tuple] = []
        for node, resolver in nodes:
            kw = self._keywords(node)
            if isinstance(step, str):
                _property_children(kw, step, resolver, children)
            else:
                _item_children(kw, step, resolver, children)
        return self._closure(children)

    def unique(self, nodes: NodeSet) -> bool:
        """True when a ``uniqueItems: true`` may apply to an array at `nodes`."""
        return nodes.unbounded or any(self._keywords(node).get("uniqueItems") is True for node, _ in nodes)

    def item_domain(self, nodes: NodeSet) -> tuple[bytes, ...] | None:
        """The spellings of every value an item of an array at `nodes` may take, when they are a
        finite set of plain literals (`literal_text`); None when unknown or open.

        Known when exactly one schema of the set constrains items, with ``items`` (no
        ``prefixItems``/``contains``), and the item schema fixes its values with ``enum``/``const``
        or a boolean/null ``type``, combined through ``$ref``/``allOf`` (intersection), ``anyOf``
        (union) and ``oneOf`` (values in exactly one branch). A keyword that could narrow a
        literal otherwise (``pattern``, ``maxLength``, ``minimum``, ``not``, ``if``, ...) anywhere
        on the way makes it unknown. The guard uses it to keep a request live (`json_tracker`),
        never to admit a value.
        """
        found = self._items_of(nodes)
        if found is None:
            return None
        values = self._literal_values(found[0], found[1], 0)
        if values is None:
            return None
        texts = [literal_text(value) for value in values]
        plain = [text for text in texts if text is not None]
        return None if len(plain) != len(texts) else tuple(dict.fromkeys(plain))

    def item_strings(self, nodes: NodeSet):
        """The language of the string items of an array at `nodes` (`regex.string_language`) and
        the literals (``"null"``) beside them, when exactly one schema of the set constrains items,
        with ``items``, and the item schema (through plain ``$ref``s) is a string (or
        string-or-null) schema of ``pattern``, ``format``, ``minLength`` and ``maxLength`` only;
        None otherwise. The guard uses it to keep a request live where the strings can run out
        (`json_tracker._Unique.live`)."""
        kw = self._item_schema(nodes)
        if kw is None:
            return None
        types = _types_of(kw)
        if set(kw) - _STRING_KEYWORDS or types is None or "string" not in types or not types <= {"string", "null"}:
            return None
        pattern, fmt = kw.get("pattern"), kw.get("format")
        if (pattern is not None and not isinstance(pattern, str)) or (fmt is not None and fmt not in FORMAT_PATTERNS):
            return None
        low, high = kw.get("minLength", 0), kw.get("maxLength")
        if not isinstance(low, int) or not (high is None or isinstance(high, int)):
            return None
        language = string_language((pattern,) if pattern else (), (FORMAT_PATTERNS[fmt],) if fmt else (), low, high)
        return None if language is None else (language, ("null",) if "null" in types else ())

    def item_integers(self, nodes: NodeSet) -> bool:
        """True when the numbers an item of an array at `nodes` may be are integers only (its
        schema, through plain ``$ref``s, types ``integer`` and not ``number``, with string keywords
        at most beside): a ``0`` item is then final, and the guard refuses to begin one the array
        holds (`json_tracker`)."""
        found = self._item_schema(nodes)
        if found is None:
            return False
        kw = found
        types = _types_of(kw)
        return (
            types is not None
            and "integer" in types
            and "number" not in types
            and not set(kw) - (_STRING_KEYWORDS | {"type"})
        )

    def _items_of(self, nodes: NodeSet) -> tuple | None:
        """(the ``items`` schema, its resolver) when exactly one schema of `nodes` constrains
        items, with ``items`` alone (no ``prefixItems``/``contains``/``unevaluatedItems``)."""
        if nodes.unbounded:
            return None
        constraining = [
            (kw, resolver)
            for kw, resolver in ((self._keywords(node), resolver) for node, resolver in nodes)
            if kw.keys() & _ITEM_KEYWORDS
        ]
        if len(constraining) != 1 or set(constraining[0][0]) & _ITEM_KEYWORDS != {"items"}:
            return None
        return constraining[0][0]["items"], constraining[0][1]

    def _item_schema(self, nodes: NodeSet) -> dict | None:
        """The keywords of the one item schema of an array at `nodes` (through plain ``$ref``s),
        when exactly one schema of the set constrains items, with ``items``; None otherwise."""
        found = self._items_of(nodes)
        if found is None:
            return None
        node, resolver = found
        for _ in range(32):
            if not isinstance(node, dict):
                return None
            resolver = self.doc.enter(node, resolver)
            kw = self._keywords(node)
            if set(kw) != {"$ref"} or not isinstance(kw["$ref"], str):
                return kw
            try:
                node, resolver = self.doc.lookup(kw["$ref"], resolver, "$")
            except Refusal:
                return None
        return None

    def _literal_values(self, node: Any, resolver, depth: int) -> list | None:
        """The values `node` admits when it fixes them to a finite list (see `item_domain`)."""
        if node is False:
            return []
        if not isinstance(node, dict) or depth > 32:
            return None
        resolver = self.doc.enter(node, resolver)
        kw = self._keywords(node)
        if kw.keys() & _NARROWING:
            return None
        values: list | None = None
        if "const" in kw or isinstance(kw.get("enum"), list):
            values = [kw["const"]] if "const" in kw else list(kw["enum"])
        parts = []
        if isinstance(kw.get("$ref"), str):
            try:
                parts.append(self.doc.lookup(kw["$ref"], resolver, "$"))
            except Refusal:
                return None
        if isinstance(kw.get("allOf"), list):
            parts.extend((branch, resolver) for branch in kw["allOf"])
        types = _types_of(kw)
        for part, part_resolver in parts:
            if part is True:
                continue
            fixed = self._literal_values(part, part_resolver, depth + 1)
            if fixed is None:
                part_kw = self._keywords(part) if isinstance(part, dict) else {}
                if not _only_types(part_kw):
                    return None  # an open part that may narrow: unknown
                named = _types_of(part_kw)
                if named is not None:
                    types = named if types is None else types & named
                continue
            values = fixed if values is None else [v for v in values if any(_same(v, w) for w in fixed)]
        for name in ("anyOf", "oneOf"):
            if isinstance(kw.get(name), list):
                branches = [self._literal_values(branch, resolver, depth + 1) for branch in kw[name]]
                known = [branch for branch in branches if branch is not None]
                if len(known) != len(branches):
                    return None
                joined = [v for branch in known for v in branch]
                if name == "oneOf":
                    joined = [v for v in joined if sum(_same(v, w) for w in joined) == 1]
                values = joined if values is None else [v for v in values if any(_same(v, w) for w in joined)]
        if values is None:
            if types is None or not types <= {"boolean", "null"}:
                return None
            values = ([True, False] if "boolean" in types else []) + ([None] if "null" in types else [])
        if types is not None:
            values = [v for v in values if any(_is_type(v, name) for name in types)]
        return values

    def _keywords(self, node: Any) -> dict:
        if not isinstance(node, dict):
            return {}
        try:
            return self.doc.keywords(node, "$")
        except Refusal:
            return {"uniqueItems": True}  # cannot read it: guard (only ever costs duplicates)

    def _closure(self, start: list[tuple]) -> NodeSet:
        """`start` and every schema its in-place applicators reach."""
        seen: set[tuple] = set()
        out: list[tuple] = []
        todo = list(start)
        while todo:
            node, resolver = todo.pop()
            if not isinstance(node, dict):
                continue  # a boolean schema applies nothing below
            resolver = self.doc.enter(node, resolver)
            key = (id(node), base_uri(resolver))
            if key in seen:
                continue
            seen.add(key)
            out.append((node, resolver))
            if len(out) > MAX_NODES:
                return _UNBOUNDED
            kw = self._keywords(node)
            for name in IN_PLACE:
                if isinstance(kw.get(name), list):
                    todo.extend((branch, resolver) for branch in kw[name])
            for name in ("then", "else"):
                if name in kw:
                    todo.append((kw[name], resolver))
            if isinstance(kw.get("dependentSchemas"), dict):
                todo.extend((branch, resolver) for branch in kw["dependentSchemas"].values())
            if isinstance(kw.get("$ref"), str):
                try:
                    todo.append(self.doc.lookup(kw["$ref"], resolver, "$"))
                except Refusal:
                    return _UNBOUNDED  # the normaliser refused it already; guard everything
        return NodeSet(out)


def _property_children(kw: dict, name: str, resolver, out: list) -> None:
    properties = kw["properties"] if isinstance(kw.get("properties"), dict) else {}
    if name in properties:
        out.append((properties[name], resolver))
    elif "additionalProperties" in kw:
        out.append((kw["additionalProperties"], resolver))
    if isinstance(kw.get("patternProperties"), dict):
        out.extend((child, resolver) for child in kw["patternProperties"].values())
    if "unevaluatedProperties" in kw:
        out.append((kw["unevaluatedProperties"], resolver))


def _item_children(kw: dict, index: int, resolver, out: list) -> None:
    prefix = kw["prefixItems"] if isinstance(kw.get("prefixItems"), list) else []
    if index < len(prefix):
        out.append((prefix[index], resolver))
    elif "items" in kw:
        out.append((kw["items"], resolver))
    for name in ("contains", "unevaluatedItems"):
        if name in kw:
            out.append((kw[name], resolver))


def literal_text(value: Any) -> bytes | None:
    """The one JSON spelling of a *plain* literal: a string of printable ASCII without quote or
    backslash, an integer, a boolean or null (an engine writes these exactly so); else None."""
    if value is None or isinstance(value, bool):
        return json.dumps(value).encode()
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, str) and all(" " <= ch <= "~" and ch not in '"\\' for ch in value):
        return b'"' + value.encode() + b'"'
    return None


def _types_of(kw: dict) -> set[str] | None:
    if isinstance(kw.get("type"), str):
        return {kw["type"]}
    if isinstance(kw.get("type"), list):
        return {name for name in kw["type"] if isinstance(name, str)}
    return None


def _only_types(kw: dict) -> bool:
    """A schema that narrows literals by `type` at most (annotations and object/array keywords,
    vacuous for a literal, aside): in an intersection it only filters by type."""
    return not (kw.keys() & (_NARROWING | {"enum", "const", "anyOf", "oneOf", "allOf", "$ref"}))


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _is_type(value: Any, name: str) -> bool:
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    expected = _JSON_TYPES.get(name)
    return expected is not None and isinstance(value, expected) and not (expected is int and isinstance(value, bool))
