"""How much one token can lengthen a JSON schema's shortest completion: a request's closing headroom.

Budget steering leaves a row alone while its slack (``left - need``) exceeds its headroom, and
from there allows only the plan's tokens (`steer`). A token taken with slack ``s`` that lengthens
the shortest completion by more than ``s`` overruns. With JSON the tokens that lengthen it are
choices a schema offers: an optional property opened (its key and the shortest value; an
additional property's key at its shortest, ``""``), one more array item, an ``anyOf`` branch,
type or ``enum`` member costlier than the cheapest. `start_growth` bounds what any one of those
adds, over every node of the schema the engine enforces (nested in optional members too), in
tokens of the request's tokenizer (a value in its usual context, `instance.Writer.cost`): a
headroom past it means no such choice is made without room to close it. Not bounded: a string
pattern's own alternatives (``(-[0-9]{3})?``), a key's length, and grammars other than
JSON schema (0: no bound known, the fixed headroom applies).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..schema import for_engine
from .instance import _NO_CANDIDATE, MAX_NODES, Writer, layouts, subschemas


def start_growth(spec, engine: str, tokens_of: Callable[[bytes], int]) -> int:
    """The most tokens one choice of `spec`'s schema adds to a completion (see the module
    docstring), in the request's layout; 0 for other kinds or when no instance can be written."""
    if spec.kind != "json_schema":
        return 0
    try:
        document = for_engine(engine, spec.schema, spec.json_format, unique_guard=True)
        writer = Writer(document, layouts(spec.json_format, engine)[0], tokens_of)
        if writer.write() is None:
            return 0
        return max((_choice_growth(writer, node) for node in _nodes(writer.root, writer.defs)), default=0)
    except _NO_CANDIDATE:
        return 0


def _choice_growth(writer: Writer, node: dict) -> int:
    """The most tokens one choice at `node` adds over not making it (or over its cheapest option)."""
    cost = lambda text: writer.cost(text)[0]  # noqa: E731 - a value's tokens in context
    worst = 0
    if "anyOf" in node or "enum" in node or isinstance(node.get("type"), list):
        if "anyOf" in node:
            texts = [writer.value(branch) for branch in node["anyOf"]]
        elif "enum" in node:
            texts = [writer._dump(value) for value in node["enum"]]
        else:
            texts = [writer._typed(kind, node) for kind in node["type"]]
        costs = [cost(text) for text in texts if text is not None]
        worst = max(costs) - min(costs) if costs else 0
    if node.get("type") == "object":
        required = set(node.get("required", ()))
        for name, schema in node.get("properties", {}).items():
            text = None if name in required else writer.value(schema)
            if text is not None:
                worst = max(worst, cost(writer.item + json.dumps(name, ensure_ascii=False) + writer.key + text))
        extra = node.get("additionalProperties", True)
        text = writer.value(extra) if extra is not False else None
        if text is not None:  # a key of the model's own: at least its quotes
            worst = max(worst, cost(writer.item + '""' + writer.key + text))
    if node.get("type") == "array" and node.get("maxItems", node.get("minItems", 0) + 1) > node.get("minItems", 0):
        index, prefix = int(node.get("minItems", 0)), node.get("prefixItems", [])
        text = writer.value(prefix[index] if index < len(prefix) else node.get("items", True))
        if text is not None:
            worst = max(worst, cost(writer.item + text))
    return worst


def _nodes(root: Any, defs: dict):
    """Every schema node under `root` and the definitions, each once."""
    queue, seen = [root, *defs.values()], set[int]()
    while queue:
        node = queue.pop()
        if not isinstance(node, dict) or id(node) in seen or len(seen) > MAX_NODES:
            continue
        seen.add(id(node))
        yield node
        queue.extend(subschemas(node))
