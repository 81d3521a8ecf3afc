"""What xgrammar is given: a `GrammarSpec` turned into the schema, EBNF, regex or structural-tag
JSON its compiler reads, and the checks that refuse what xgrammar would silently weaken.

Split from `fd_guided.backends.xgrammar` (the backend and its matchers), which re-exports the
names other modules import from there (`choice_ebnf`, `structural_tag_json`,
`has_unicode_property_escape`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import xgrammar as xgr

from ..admission.meta import schema_objects
from ..errors import InvalidGrammarError
from ..schema import for_engine, regex_for_engine
from ..schema.walk import subschemas
from ..spec import FIELD_OF_KIND, GrammarSpec, JsonFormat
from . import xgrammar_ebnf


def json_format_of(spec: GrammarSpec) -> JsonFormat:
    """`spec.json_format` of a JSON kind (json_schema, json_object, structural_tag): admission sets it."""
    assert spec.json_format is not None, f"a {spec.kind} spec without json_format"
    return spec.json_format


def _json_options(spec: GrammarSpec) -> dict[str, Any]:
    fmt = json_format_of(spec)
    # Strictness is already explicit in the normalised schema (additionalProperties/items: false).
    options: dict[str, Any] = {"any_whitespace": fmt.any_whitespace, "strict_mode": False}
    if fmt.any_order:
        options["any_order"] = True
    if fmt.separators is not None:
        options["separators"] = fmt.separators
    if fmt.any_whitespace and fmt.max_whitespace_cnt is not None:
        options["max_whitespace_cnt"] = fmt.max_whitespace_cnt
    return options


# json_object: any JSON object, with the request's whitespace bounds (the builtin JSON grammar
# would allow unbounded whitespace).
_ANY_OBJECT_SCHEMA = '{"type":"object"}'


def enforced_schema(spec: GrammarSpec) -> str:
    """The request's schema as xgrammar must see it (`fd_guided.schema.for_engine`); raises
    InvalidGrammarError naming what xgrammar cannot enforce."""
    return json.dumps(xgrammar_schema(spec.schema, json_format_of(spec), "json schema", unique_guard=True))


def xgrammar_schema(schema: Any, json_format: JsonFormat, part: str, *, unique_guard: bool = False) -> dict:
    """`schema` normalised for xgrammar (`unique_guard`: see `fd_guided.schema.for_engine`); any-order
    needs exact property counts (see below)."""
    normalised = for_engine("xgrammar", schema, json_format, part=part, unique_guard=unique_guard)
    if json_format.any_order and "minProperties" in json.dumps(normalised):
        # With any_order xgrammar admits a repeated key ({"a":1,"a":2}), which parses as one.
        raise InvalidGrammarError(
            "xgrammar cannot count properties in any order (a key may repeat)",
            part=part,
            feature="minProperties with guided_any_order",
        )
    return normalised


def compile_native(compiler: xgr.GrammarCompiler, spec: GrammarSpec) -> xgr.CompiledGrammar:
    """`spec` compiled by `compiler`; xgrammar's own errors propagate (`XGrammarBackend.compile` types them)."""
    kind = spec.kind
    if kind == "json_schema":
        return xgrammar_ebnf.compile_json_schema(compiler, enforced_schema(spec), _json_options(spec))
    if kind == "json_object":
        return compiler.compile_json_schema(_ANY_OBJECT_SCHEMA, **{**_json_options(spec), "strict_mode": False})
    if kind == "regex":
        return compiler.compile_regex(regex_for_engine("xgrammar", spec.source))
    if kind == "choice":
        return compiler.compile_grammar(choice_ebnf(spec.choices))
    if kind == "ebnf":
        return compiler.compile_grammar(spec.source)
    if kind == "lark":
        return compiler.compile_lark(spec.source)
    return compiler.compile_structural_tag(structural_tag_json(spec))


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar matching exactly one of `choices`.

    Every non-printable or non-ASCII character is written as a ``\\uXXXX`` escape: xgrammar reads
    ``\\x`` escapes greedily (``"a\\x00f"`` would parse as ``\\x0f``).
    """
    return "root ::= " + " | ".join(_ebnf_literal(choice) for choice in choices)


def _ebnf_literal(text: str) -> str:
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def structural_tag_json(spec: GrammarSpec) -> str:
    """The spec as xgrammar's structural-tag JSON (legacy structures/triggers become triggered_tags).

    Every JSON schema inside goes through `xgrammar_schema`, legacy structures and the
    ``json_schema`` elements of format-style tags alike: a tag is not a way around the checks.
    """
    tag = spec.structural_tag
    if "format" in tag:
        return json.dumps(
            {**tag, "format": _normalised_format(tag["format"], spec.json_format, "structural_tag.format")}
        )
    tags = [
        {
            "type": "tag",
            "begin": s["begin"],
            "content": {
                "type": "json_schema",
                "json_schema": xgrammar_schema(
                    s["schema"], json_format_of(spec), f"structural_tag.structures[{i}].schema"
                ),
            },
            "end": s["end"],
        }
        for i, s in enumerate(tag["structures"])
    ]
    return json.dumps(
        {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}}
    )


def _normalised_format(node: Any, json_format: JsonFormat | None, where: str) -> Any:
    """A copy of a structural-tag format tree whose ``json_schema`` elements are normalised."""
    if isinstance(node, list):
        return [_normalised_format(item, json_format, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and "json_schema" in node:
        schema = node["json_schema"]
        if schema is True:
            schema = {}
        assert json_format is not None  # admission sets it on every structural tag
        return {**node, "json_schema": xgrammar_schema(schema, json_format, f"{where}.json_schema")}
    return {key: _normalised_format(value, json_format, f"{where}.{key}") for key, value in node.items()}


def regex_texts(spec: GrammarSpec) -> Iterator[str]:
    """Text xgrammar reads with its regex parser, outside JSON schemas (see `_check_pattern`):
    a regex, a Lark grammar (its /.../ terminals) and the regex elements of a structural tag."""
    if spec.kind in ("regex", "lark"):
        yield spec.source
    elif spec.kind == "structural_tag":
        for node, _ in schema_objects(spec.structural_tag):
            if node.get("type") == "regex" and isinstance(node.get("pattern"), str):
                yield node["pattern"]


def has_unicode_property_escape(pattern: str) -> bool:
    """True if `pattern` uses ``\\p``/``\\P``: xgrammar refuses them at top level but, inside a
    character class, silently reads ``[\\p{L}]`` as the characters ``p{L}`` (it admits ``{``)."""
    escaped = False
    for char in pattern:
        if escaped and char in "pP":
            return True
        escaped = not escaped and char == "\\"
    return False


def check_schema_patterns(schema: Any, path: str = "$") -> None:
    """Defence in depth behind the normaliser's regex analysis: inside a JSON schema xgrammar drops
    what its regex parser refuses (lookaround, backreferences) with only a log line, so a pattern
    its parser rejects is refused, not weakened. Native: runs in `compile` (a compile worker)."""
    for node, where in _pattern_nodes(schema, path):
        try:
            xgr.Grammar.from_regex(node["pattern"])
        except (RuntimeError, ValueError) as error:
            feature = f"pattern {node['pattern']!r} ({first_line(error)})"
            raise InvalidGrammarError(
                f"xgrammar cannot enforce {feature}", part=f"json schema {where}.pattern", feature=feature
            ) from None


def _pattern_nodes(schema: Any, path: str) -> Iterator[tuple[dict, str]]:
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("pattern"), str):
        yield schema, path
    for child, child_path in subschemas(schema, path):
        yield from _pattern_nodes(child, child_path)


def part_of(spec: GrammarSpec) -> str:
    """The request field that carried `spec` (an error's `part`)."""
    return FIELD_OF_KIND[spec.kind]


def first_line(error: Exception) -> str:
    """The message of an xgrammar error, without its C++ source prefix."""
    text = str(error).strip().splitlines()
    message = text[0] if text else type(error).__name__
    # xgrammar prefixes C++ errors with "[time] /project/cpp/file.cc:line: "; keep the message.
    if message.startswith("[") and ": " in message:
        message = message.split(": ", 1)[1]
        if ".cc:" in message and ": " in message:
            message = message.split(": ", 1)[1]
    return message
