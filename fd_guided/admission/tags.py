"""Structural tags at admission: the legacy ``structures``/``triggers`` form and the ``format`` form.

Every constraint a tag carries is checked as its own field would be: a tag's JSON schemas against
their meta-schema with resolvable references, its regexes by Python's ``re`` and its grammars
(``{"type": "grammar"}``, xgrammar's EBNF) by `syntax.check_syntax`, each error naming the tag's path
(``structural_tag.format.tags[1].content.pattern``). Tool calling reaches the engines as such tags.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidGrammarError
from ..limits import AdmissionLimits, check_schema, check_size
from .documents import as_dict, load_json, load_schema
from .meta import check_json_schema
from .spec import GrammarSpec, JsonFormat
from .syntax import check_regex_syntax, check_syntax

# Keys of a format node whose values are format nodes (or lists of them).
_CHILDREN = ("content", "elements", "tags")


def parse_structural_tag(value: Any, json_format: JsonFormat, limits: AdmissionLimits, *, part: str) -> GrammarSpec:
    if isinstance(value, (str, bytes)):
        value = load_json(value, part)
    value = as_dict(value, part)
    if "format" in value:
        source = json.dumps({"type": "structural_tag", "format": value["format"]}, ensure_ascii=False)
        check_size(source, limits.max_constraint_bytes, part, "structural tag")
        check_schema(value["format"], limits, part)
        check_format(value["format"], limits, f"{part}.format")
        return GrammarSpec("structural_tag", source, json_format)
    structures = value.get("structures")
    triggers = value.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise InvalidGrammarError("needs a non-empty 'structures' list (or a 'format')", part=part)
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise InvalidGrammarError("needs a non-empty 'triggers' list of non-empty strings", part=part)
    normalised = []
    for index, structure in enumerate(structures):
        where = f"{part}.structures[{index}]"
        structure = as_dict(structure, where)
        begin, end = structure.get("begin"), structure.get("end")
        if not isinstance(begin, str) or not begin or not isinstance(end, str):
            raise InvalidGrammarError("needs string 'begin' (non-empty) and 'end'", part=where)
        if not any(begin.startswith(trigger) for trigger in triggers):
            raise InvalidGrammarError(f"begin {begin!r} starts with none of the triggers {triggers}", part=where)
        schema = load_schema(structure.get("schema", {"type": "object"}), f"{where}.schema")
        check_schema(schema, limits, f"{where}.schema")
        check_json_schema(schema, f"{where}.schema")
        normalised.append({"begin": begin, "schema": schema, "end": end})
    canonical = {"structures": normalised, "triggers": triggers}
    source = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    check_size(source, limits.max_constraint_bytes, part, "structural tag")
    return GrammarSpec("structural_tag", source, json_format)


def check_format(node: Any, limits: AdmissionLimits, part: str) -> None:
    """Check every schema, regex and grammar inside a ``format`` tree. Iterative (the tree's depth is
    bounded by `documents.MAX_NESTING` already, but nothing here recurses)."""
    stack = [(node, part)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((child, f"{where}[{index}]") for index, child in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        if kind == "json_schema" and "json_schema" in node:
            schema = load_schema(node["json_schema"], f"{where}.json_schema")
            check_json_schema(schema, f"{where}.json_schema")
        elif kind == "regex":
            pattern = node.get("pattern")
            if not isinstance(pattern, str) or not pattern:
                raise InvalidGrammarError("a regex format needs a non-empty 'pattern' string", part=f"{where}.pattern")
            try:
                check_regex_syntax(pattern, limits, f"{where}.pattern")
            except InvalidGrammarError as error:
                if error.feature is None:
                    raise  # a \p{...} class is Rust's syntax, which llguidance reads exactly: its backend decides
        elif kind == "grammar":
            grammar = node.get("grammar")
            if not isinstance(grammar, str) or not grammar.strip():
                raise InvalidGrammarError(
                    "a grammar format needs a non-empty 'grammar' string", part=f"{where}.grammar"
                )
            check_syntax(grammar, False, f"{where}.grammar")
        for key in _CHILDREN:
            if key in node:
                stack.append((node[key], f"{where}.{key}"))
