"""The shortest output of a constraint, written from the constraint itself: a start plan's candidate.

A start plan needs a completion of the grammar's start state. The best-first search over the
matcher (`search`) finds one by trying bytes, a fill each, and on large schemas (a ~70-byte
shortest document through nested required objects, patterns and formats) it runs out first. The
constraint says what its shortest output is, so `start_candidates` writes it:

  json_schema  from the schema the engine enforces (`fd_guided.schema.for_engine`: every node
               typed, no combinator but ``anyOf``, patterns and formats as the engine's regexes):
               an object holds its required properties in the schema's order (the order both
               engines write them) and, for ``minProperties``, the cheapest optional ones; an
               array its ``minItems`` items (``prefixItems`` first); a string the cheapest of its
               patterns' and length bounds' language (`shortest_string`: the schema package's own
               automata); a number the shortest spelling in its bounds and ``multipleOf`` (`numbers`); an enum,
               ``anyOf`` or type list its cheapest alternative; ``$ref`` the shortest instance of its
               definition (a fixpoint over recursive definitions); any value the cheapest of
               ``0``, ``""``, ``[]``, ``{}``, ``true``, ``null``
  json_object  ``{}``
  regex        the cheapest full match of its automaton
  choice       the choice spelled in the fewest tokens

"Cheapest" is (tokens of the request's tokenizer, in a value's usual context, then bytes)
wherever there is a choice, bytes elsewhere. JSON is written in the request's layout
(separators; no whitespace where the layout allows none), with the other layouts an engine might
use as further candidates. EBNF, Lark and structural tags have no candidate (the search alone).
A candidate is only a candidate: the search uses it only once the matcher accepted it, then a
stop token (`search.shortest_completion`).
Deterministic (TP ranks write the same text); bounded (`MAX_NODES` nodes written per round,
`MAX_ROUNDS` fixpoint rounds); any refusal of the schema package means no candidate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import InvalidGrammarError
from ..schema import for_engine
from ..schema.deadline import Overrun
from ..schema.refusal import Refusal, Unsatisfiable
from .numbers import number
from .shortest_string import shortest_full_match, shortest_match

MAX_NODES = 50_000  # schema nodes written per round
MAX_ROUNDS = 8  # fixpoint rounds over recursive definitions
VARIANTS = 16  # near-shortest instances written to land on (`start_landmarks`)
_NO_CANDIDATE = (InvalidGrammarError, Refusal, Unsatisfiable, Overrun, RecursionError, ValueError, TypeError)
_STRING_KEYWORDS = frozenset({"type", "minLength", "maxLength", "pattern", "allOf"})
_NUMBER_KEYWORDS = frozenset({"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_ARRAY_KEYWORDS = frozenset({"type", "prefixItems", "items", "minItems", "maxItems"})
_OBJECT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties"}
)
_BARE = {"null": "null", "boolean": "true"}
ANY_VALUES = ("0", '""', "[]", "{}", "true", "null")  # any value: the cheapest of these


def start_candidates(spec, engine: str, tokens_of: Callable[[bytes], int]) -> list[bytes]:
    """Candidate shortest outputs of `spec` under `engine` (``"xgrammar"``/``"llguidance"``), best
    first; [] when there is none to offer. `tokens_of(text)`: the fewest tokens spelling `text`."""
    try:
        texts = _candidates(spec, engine, tokens_of)
    except _NO_CANDIDATE:
        return []
    out: list[bytes] = []
    for text in texts:
        if text is not None and text.encode() not in out:
            out.append(text.encode())
    return out


def _candidates(spec, engine: str, tokens_of: Callable[[bytes], int]) -> list[str | None]:
    kind = spec.kind
    if kind == "regex":
        return [shortest_full_match(spec.source)]
    if kind == "choice":
        return [min(spec.choices, key=lambda c: (tokens_of(c.encode()), len(c.encode())), default=None)]
    if kind == "json_object":
        return ["{}"]
    if kind != "json_schema":
        return []
    document = for_engine(engine, spec.schema, spec.json_format, unique_guard=True)
    return [Writer(document, layout, tokens_of).write() for layout in layouts(spec.json_format, engine)]


def start_landmarks(spec, engine: str, tokens_of: Callable[[bytes], int], limit: int = VARIANTS) -> list[bytes]:
    """Near-shortest outputs of a JSON schema to land on (`search.shortest_completion`'s
    landmarks): the shortest instance with one optional property more, or one array item more,
    each (`variants`), in the request's layout; [] for other kinds or when none can be written."""
    if spec.kind != "json_schema":
        return []
    try:
        document = for_engine(engine, spec.schema, spec.json_format, unique_guard=True)
        return [text.encode() for text in variants(document, layouts(spec.json_format, engine)[0], tokens_of, limit)]
    except _NO_CANDIDATE:
        return []


def variants(document: dict, layout: tuple[str, str], tokens_of: Callable[[bytes], int], limit: int) -> list[str]:
    """Up to `limit` instances that differ from the shortest by one optional property of one
    object node, or one more item of one array node (the nodes in document order, the root's
    first): where a model that left the shortest path usually is. A search from inside such a
    property lands on the rest of its variant."""
    base = Writer(document, layout, tokens_of)
    first = base.write()
    if first is None:
        return []
    out: list[str] = []
    for include, grow in _options(base.root, base.defs):
        if len(out) >= limit:
            break
        writer = Writer(document, layout, tokens_of, include=include, grow=grow, costs=base.costs, root=base.root)
        text = writer.write()
        if text is not None and text != first and text not in out:
            out.append(text)
    return out


def subschemas(node: dict) -> list:
    """The subschemas of `node` that the instance writer follows, in document order: properties,
    definitions, anyOf branches, prefixItems, items, additionalProperties (not dicts included:
    the walks skip them)."""
    return [
        *node.get("properties", {}).values(),
        *node.get("$defs", {}).values(),
        *node.get("anyOf", ()),
        *node.get("prefixItems", ()),
        node.get("items"),
        node.get("additionalProperties"),
    ]


def _options(root: Any, defs: dict):
    """(include, grow) per optional property of every object node and per array node that may hold
    one more item, in document order (the root's nodes, then each definition's)."""
    queue = [root, *defs.values()]
    seen: set[int] = set()
    while queue:
        node = queue.pop(0)
        if not isinstance(node, dict) or id(node) in seen or len(seen) > MAX_NODES:
            continue
        seen.add(id(node))
        if node.get("type") == "object":
            required = set(node.get("required", ()))
            for name in node.get("properties", {}):
                if name not in required:
                    yield frozenset({(id(node), name)}), frozenset()
        elif node.get("type") == "array" and node.get("maxItems", node.get("minItems", 0) + 1) > node.get(
            "minItems", 0
        ):
            yield frozenset(), frozenset({id(node)})
        queue.extend(subschemas(node))


def layouts(json_format, engine: str) -> list[tuple[str, str]]:
    """(item separator, key separator) pairs, the request's own first: compact where whitespace is
    free, else the separators it asked for, else the engine's default (xgrammar's is ``", "``/``": "``)."""
    if json_format is None or json_format.any_whitespace:
        first = (",", ":")
    elif json_format.separators is not None:
        first = tuple(json_format.separators)
    else:
        first = (", ", ": ") if engine == "xgrammar" else (",", ":")
    return [first] + [other for other in ((",", ":"), (", ", ": "), (",", ": ")) if other != first]


class Writer:
    """The shortest instance of an emitted schema (`fd_guided.schema.for_engine`'s document)."""

    def __init__(
        self,
        document: dict,
        layout: tuple[str, str],
        tokens_of: Callable[[bytes], int],
        *,
        include: frozenset[tuple[int, str]] = frozenset(),
        grow: frozenset[int] = frozenset(),
        costs: dict[str, tuple[int, int]] | None = None,
        root: Any = None,
    ):
        """`include`: (id of an object node, an optional property) to write as well; `grow`: ids of
        array nodes to write one item more in (`variants`); `costs`: a cost memo to share; `root`:
        the document without its ``$defs`` (another writer's, so node ids match)."""
        self.document = document
        self.defs: dict[str, Any] = document.get("$defs", {}) if isinstance(document, dict) else {}
        self.root = root
        if root is None:
            self.root = document
            if isinstance(document, dict):
                self.root = {k: v for k, v in document.items() if k not in ("$defs", "$schema")}
        self.include: dict[int, set[str]] = {}
        for node_id, name in include:
            self.include.setdefault(node_id, set()).add(name)
        self.grow = grow
        self.item, self.key = layout
        self.tokens_of = tokens_of
        self.known: dict[str, str | None] = {}  # definition -> its shortest instance so far
        self._memo: dict[str, str | None] = {}
        self._open: set[str] = set()
        self._cut = False  # a definition was met inside itself this round (the fixpoint goes on)
        self._nodes = 0
        self.costs: dict[str, tuple[int, int]] = {} if costs is None else costs

    def write(self) -> str | None:
        """The root's shortest instance (None: none found). Recursive definitions are settled by
        rounds: a definition met inside itself counts as its best instance of the round before."""
        result = None
        for _ in range(MAX_ROUNDS):
            self._memo, self._cut, self._nodes = {}, False, 0
            result = self.value(self.root)
            changed = any(self.known.get(name) != text for name, text in self._memo.items())
            self.known.update(self._memo)
            if not self._cut or not changed:
                break
        return result

    # ----- nodes --------------------------------------------------------------------------------

    def value(self, node: Any) -> str | None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise Refusal("a schema too large to write an instance of")
        if node is True:
            return self.cheapest(ANY_VALUES)
        if node is False or not isinstance(node, dict):
            return None
        if "$ref" in node:
            return self._ref(node["$ref"]) if len(node) == 1 else None
        if "anyOf" in node:
            return self.cheapest(self.value(branch) for branch in node["anyOf"]) if len(node) == 1 else None
        if "enum" in node:
            return self.cheapest(self._dump(v) for v in node["enum"]) if len(node) == 1 else None
        kinds = node.get("type")
        if kinds is None:
            return self.cheapest(ANY_VALUES) if not node else None
        if isinstance(kinds, list):
            return self.cheapest(self._typed(kind, node) for kind in kinds)
        return self._typed(kinds, node)

    def _typed(self, kind: str, node: dict) -> str | None:
        if kind in ("null", "boolean"):
            return _BARE[kind]
        if kind in ("integer", "number"):
            return number(node, kind == "integer") if set(node) <= _NUMBER_KEYWORDS else None
        if kind == "string":
            return self._string(node) if set(node) <= _STRING_KEYWORDS else None
        if kind == "array":
            return self._array(node) if set(node) <= _ARRAY_KEYWORDS else None
        if kind == "object":
            return self._object(node) if set(node) <= _OBJECT_KEYWORDS else None
        return None

    def _ref(self, ref: str) -> str | None:
        name = ref[len("#/$defs/") :] if ref.startswith("#/$defs/") else None
        if name is None or name not in self.defs:
            return None
        if name in self._memo:
            return self._memo[name]
        if name in self._open:
            self._cut = True
            return self.known.get(name)
        self._open.add(name)
        try:
            text = self.value(self.defs[name])
        finally:
            self._open.discard(name)
        known = self.known.get(name)
        if known is not None and (text is None or self.cost(known) < self.cost(text)):
            text = known
        self._memo[name] = text
        return text

    def _string(self, node: dict) -> str | None:
        patterns = [node["pattern"]] if "pattern" in node else []
        for part in node.get("allOf", ()):
            if not isinstance(part, dict) or set(part) != {"pattern"}:
                return None
            patterns.append(part["pattern"])
        text = shortest_match(tuple(patterns), low=int(node.get("minLength", 0)), high=node.get("maxLength"))
        return None if text is None else json.dumps(text, ensure_ascii=False)

    def _array(self, node: dict) -> str | None:
        prefix, items = node.get("prefixItems", []), node.get("items", True)
        values = []
        count = int(node.get("minItems", 0))
        if id(node) in self.grow and node.get("maxItems", count + 1) > count:
            count += 1
        for index in range(count):
            text = self.value(prefix[index] if index < len(prefix) else items)
            if text is None:
                return None
            values.append(text)
        return "[" + self.item.join(values) + "]"

    def _object(self, node: dict) -> str | None:
        props: dict = node.get("properties", {})
        required = set(node.get("required", ()))
        if not required <= set(props):
            return None
        values = {name: self.value(schema) for name, schema in props.items()}
        if any(values[name] is None for name in required):
            return None
        chosen = set(required) | {name for name in self.include.get(id(node), ()) if values.get(name)}
        missing = int(node.get("minProperties", 0)) - len(chosen)
        optional = sorted((self.cost(text), name) for name, text in values.items() if name not in chosen and text)
        chosen.update(name for _, name in optional[: max(0, missing)])
        pairs = [(name, values[name]) for name in props if name in chosen]
        missing -= len(optional)
        if missing > 0:  # keys of additionalProperties: "", "a", "b", ... (none may match a pattern)
            extra = self.value(node.get("additionalProperties", True))
            if extra is None or node.get("patternProperties"):
                return None
            names = [name for name in ("", *map(chr, range(0x61, 0x7B))) if name not in props][:missing]
            if len(names) < missing:
                return None
            pairs += [(name, extra) for name in names]
        body = [json.dumps(name, ensure_ascii=False) + self.key + str(text) for name, text in pairs]
        return "{" + self.item.join(body) + "}"

    # ----- choosing -----------------------------------------------------------------------------

    def _dump(self, value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(self.item, self.key))

    def cost(self, text: str) -> tuple[int, int]:
        """What a choice between instances compares: (the fewest tokens of `text` where a value
        usually stands, after a key and before the next one, and its bytes). In context: a
        tokenizer merges a value with the quotes around it (``":""`` can be one token, ``":0``
        two)."""
        found = self.costs.get(text)
        if found is None:
            data = text.encode()
            context = ('"' + self.key).encode(), (self.item + '"').encode()
            found = self.costs[text] = (self.tokens_of(context[0] + data + context[1]), len(data))
        return found

    def cheapest(self, texts) -> str | None:
        best = None
        for text in texts:
            if text is not None and (best is None or self.cost(text) < self.cost(best)):
                best = text
        return best
