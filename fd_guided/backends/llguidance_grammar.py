"""The llguidance grammar for a request (`grammar_text`), the same rewrites and refusals in pure
Python for admission (`static_check`), and llguidance's error messages read as the feature they
refuse (`invalid_grammar`). No tokenizer is needed for any of them."""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance
from llguidance import LLMatcher

from ..errors import InvalidGrammarError
from ..schema import regex_for_engine
from ..spec import FIELD_OF_KIND, GrammarSpec
from .llguidance_schema import Refusal, json_options, llguidance_schema
from .llguidance_tags import format_to_lark


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for `spec` (no tokenizer needed). Raises InvalidGrammarError."""
    try:
        return _GRAMMAR_BUILDERS[spec.kind](spec)
    except (ValueError, TypeError, RuntimeError) as error:
        if isinstance(error, InvalidGrammarError):
            raise
        # llguidance's builders raise on input they cannot read (e.g. integers past 64 bits).
        raise InvalidGrammarError(
            f"llguidance cannot read the grammar: {first_line(error)}",
            part=_part_of(spec),
            feature=f"input llguidance cannot read ({first_line(error)[:80]})"
            if spec.kind in ("json_schema", "structural_tag")
            else None,
        ) from None
    except Refusal as refusal:
        part = _part_of(spec) if refusal.location in ("", "$") else f"json schema {refusal.location}"
        raise InvalidGrammarError(
            f"llguidance cannot enforce {refusal.feature}", part=part, feature=refusal.feature
        ) from None


def _json_schema_grammar(spec: GrammarSpec) -> str:
    schema = llguidance_schema(spec.schema, spec.json_format, "json schema", unique_guard=True)
    layout = spec.json_format
    assert layout is not None  # llguidance_schema has read it (set for the JSON kinds)
    # As text: llguidance's own JSON reader takes numbers that its dict converter refuses.
    return LLMatcher.grammar_from_json_schema(json.dumps(schema, ensure_ascii=False), overrides=json_options(layout))


def _json_object_grammar(spec: GrammarSpec) -> str:
    layout = spec.json_format
    assert layout is not None  # set for the JSON kinds
    return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=json_options(layout))


def _regex_grammar(spec: GrammarSpec) -> str:
    return LLMatcher.grammar_from_regex(regex_for_engine("llguidance", spec.source))


def _choice_grammar(spec: GrammarSpec) -> str:
    # Lark string literals take JSON escapes; non-ASCII text stays literal.
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choices))


def _ebnf_grammar(spec: GrammarSpec) -> str:
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        lark = gbnf_to_lark(spec.source)
    except Exception as error:  # the converter raises plain exceptions on grammars it cannot read
        raise InvalidGrammarError(
            f"llguidance could not convert the EBNF grammar to Lark: {first_line(error)}", part="guided_grammar"
        ) from None
    return LLMatcher.grammar_from_lark(lark)


def _lark_grammar(spec: GrammarSpec) -> str:
    return LLMatcher.grammar_from_lark(spec.source)


def _structural_tag_grammar(spec: GrammarSpec) -> str:
    tag = spec.structural_tag
    if "format" in tag:
        return LLMatcher.grammar_from_lark(format_to_lark(tag["format"], spec.json_format))
    layout = spec.json_format
    assert layout is not None  # set for the JSON kinds
    options = json_options(layout)
    tags = []
    for index, structure in enumerate(tag["structures"]):
        trigger = next(t for t in tag["triggers"] if structure["begin"].startswith(t))
        schema = llguidance_schema(structure["schema"], spec.json_format, f"structural_tag.structures[{index}].schema")
        schema["x-guidance"] = options
        tags.append(
            llguidance.StructTag(trigger=trigger, begin=structure["begin"], grammar=schema, end=structure["end"])
        )
    # Triggers are plain text here (our tokenizers have no special tokens spelled like them).
    return LLMatcher.grammar_from_lark(llguidance.StructTag.to_grammar(tags, assume_special=False))


_GRAMMAR_BUILDERS = {
    "json_schema": _json_schema_grammar,
    "json_object": _json_object_grammar,
    "regex": _regex_grammar,
    "choice": _choice_grammar,
    "ebnf": _ebnf_grammar,
    "lark": _lark_grammar,
    "structural_tag": _structural_tag_grammar,
}


def _check_json_schema(spec: GrammarSpec) -> None:
    llguidance_schema(spec.schema, spec.json_format, "json schema", unique_guard=True)


def _check_regex(spec: GrammarSpec) -> None:
    regex_for_engine("llguidance", spec.source)


def _check_structural_tag(spec: GrammarSpec) -> None:
    tag = spec.structural_tag
    if "format" in tag:
        format_to_lark(tag["format"], spec.json_format)
        return
    for index, structure in enumerate(tag["structures"]):
        llguidance_schema(structure["schema"], spec.json_format, f"structural_tag.structures[{index}].schema")


def _static(builder):
    """A static check that runs `builder`'s Python-only part and turns its Refusals into errors."""

    def check(spec: GrammarSpec) -> None:
        try:
            builder(spec)
        except Refusal as refusal:
            part = _part_of(spec) if refusal.location in ("", "$") else f"json schema {refusal.location}"
            raise InvalidGrammarError(
                f"llguidance cannot enforce {refusal.feature}", part=part, feature=refusal.feature
            ) from None

    return check


def static_check(spec: GrammarSpec) -> None:
    """Pure Python: the rewrites and refusals of `grammar_text` without llguidance's parsers."""
    _STATIC_CHECKS[spec.kind](spec)


_STATIC_CHECKS = {
    "json_schema": _static(_check_json_schema),
    "json_object": _static(lambda spec: None),
    "regex": _static(_check_regex),
    "choice": _static(lambda spec: None),
    "ebnf": _static(lambda spec: None),
    "lark": _static(lambda spec: None),
    "structural_tag": _static(_check_structural_tag),
}


def invalid_grammar(spec: GrammarSpec, message: str) -> InvalidGrammarError:
    """The error for an llguidance message about `spec`: the feature it refuses, or its syntax error."""
    feature = _feature_of(message, spec)
    text = f"llguidance cannot enforce {feature}" if feature else f"rejected by llguidance: {first_line(message)}"
    return InvalidGrammarError(text, part=_part_of(spec), feature=feature)


_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (.*)")


def _feature_of(message: str, spec: GrammarSpec) -> str | None:
    """The unsupported feature an llguidance message names; None for syntax errors in the request."""
    match = _UNIMPLEMENTED.search(message)
    if match:
        keys = [key.strip().strip('"') for key in match.group(1).split(",")]
        return ("keyword " if len(keys) == 1 else "keywords ") + ", ".join(keys)
    match = _UNKNOWN_FORMAT.search(message)
    if match:
        return f"format {match.group(1).strip()!r}"
    if "oneOf constraints are not supported" in message:
        return "oneOf whose subschemas may overlap"
    if "min/maxProperties only supported" in message:
        return "minProperties/maxProperties together with optional properties"
    if "look-around" in message:
        return "regex look-around"
    if "Unsatisfiable schema" in message:
        return None  # the schema admits no instance: a request error, not a missing feature
    if spec.kind in ("json_schema", "structural_tag"):
        # The schema already passed jsonschema's meta-schema check: what llguidance refuses is a limit.
        return first_line(message)
    return None


def _part_of(spec: GrammarSpec) -> str:
    return FIELD_OF_KIND[spec.kind]


def first_line(error: Any) -> str:
    """The line of an engine error that says what went wrong (regex errors: the "error:" line)."""
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__ if isinstance(error, Exception) else "unknown error"
    for line in lines:  # regex errors put the reason on an "error: ..." line after the pattern
        if line.startswith("error:"):
            return f"{lines[0].rstrip(':')}: {line[len('error:') :].strip()}"
    return lines[0]
