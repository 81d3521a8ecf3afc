"""The guided fields of one request read into a `GrammarSpec`: which kind was given (exactly one),
each kind's own parser (JSON schema, json_object, regex, choice, grammar, structural tag,
``response_format``), and the JSON options (whitespace, separators, strictness, unknown formats,
any order). Split from `parse.py`, which holds admission's entry point, caches and backend checks.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..limits import AdmissionLimits, check_choices, check_size
from ..schema.deadline import Overrun, afford, checkpoint, until
from .deferred import BOUNDS_SECONDS_PER_BYTE, Pending, check_schema_document, count
from .documents import as_dict, check_text, check_text_size, document_of, schema_and_source, surely_too_long
from .spec import GrammarSpec, JsonFormat
from .syntax import check_grammar_text, check_regex_syntax
from .tags import parse_structural_tag
from .unread import unread_schema

KIND_FIELDS = ("guided_json", "guided_json_object", "guided_regex", "guided_choice", "guided_grammar", "structural_tag")
COMPACT_SEPARATORS = (",", ":")
UNKNOWN_FORMAT_POLICIES = ("refuse", "annotate")

# This thread's admission in progress: `deadline` (a perf_counter value, or None) while the fields
# are parsed, `written` (the cache key's JSON text per field, reused as a source); `last` = (the
# spec returned, that deadline) for a `check_with_backend` right after (`parse.py`).
request_state = threading.local()


def as_written(fields: Mapping[str, Any], limits: AdmissionLimits) -> Mapping[str, Any]:
    """`fields` as admission's cache key wrote them (`request_state.written`): each value given as
    objects replaced by its text's document, so every check reads what the key says and one key
    is one verdict (a UUID orjson wrote as a string is that string). A JSON schema object is read
    back by its own parser, only when its checks have time (`_parse_json_schema`); a choice list
    past the limit is refused by its length, which its document shares (not read back)."""
    written = getattr(request_state, "written", {})
    names = [name for name in fields if f"{name}:json" in written and name != "guided_json"]
    if not names:
        return fields
    readable = dict(fields)
    for name in names:
        value = fields[name]
        if name == "guided_choice" and isinstance(value, (list, tuple)) and len(value) > limits.max_choices:
            continue
        readable[name] = document_of(written[f"{name}:json"])
    return readable


def spec_from_fields(fields: Mapping[str, Any], json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec | None:
    if fields.get("guided_json") is False:
        # The schema `false`: nothing is valid. Not "no constraint" (as guided_json_object: false is).
        raise InvalidGrammarError("the schema `false` admits no value", part="guided_json")
    given = [name for name in KIND_FIELDS if _is_set(fields.get(name))]
    response_format = fields.get("response_format")
    if response_format is not None and _response_format_type(response_format) != "text":
        given.append("response_format")
    if len(given) > 1:
        raise InvalidGrammarError(
            f"only one kind of guided decoding per request, got {', '.join(given)}", part="request"
        )
    if not given:
        return None
    name = given[0]
    value = fields[name]
    if name == "response_format":
        return _from_response_format(value, json_format, limits)
    return _FIELD_PARSERS[name](value, json_format, limits)


def _is_set(value: Any) -> bool:
    return value is not None and value is not False


def _response_format_type(response_format: Any) -> str:
    response_format = as_dict(response_format, "response_format")
    kind = response_format.get("type")
    if kind not in ("text", "json_object", "json_schema", "structural_tag"):
        raise InvalidGrammarError(
            f"type must be one of text, json_object, json_schema, structural_tag; got {kind!r}",
            part="response_format.type",
        )
    return kind


def _from_response_format(response_format: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    response_format = as_dict(response_format, "response_format")
    kind = _response_format_type(response_format)
    if kind == "json_object":
        return GrammarSpec("json_object", "", json_format)
    if kind == "structural_tag":
        body = {key: value for key, value in response_format.items() if key != "type"}
        return parse_structural_tag(body, json_format, limits, part="response_format")
    json_schema = as_dict(response_format.get("json_schema"), "response_format.json_schema")
    schema = json_schema.get("schema", json_schema.get("json_schema"))
    if schema is None:
        raise InvalidGrammarError("missing 'schema'", part="response_format.json_schema")
    strict = json_schema.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise InvalidGrammarError("must be a boolean", part="response_format.json_schema.strict")
        json_format = JsonFormat(
            json_format.any_whitespace, json_format.max_whitespace_cnt, json_format.separators, strict
        )
    return _parse_json_schema(schema, json_format, limits, part="response_format.json_schema.schema")


def _parse_guided_json(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    return _parse_json_schema(value, json_format, limits, part="guided_json")


def _parse_json_object(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if value is not True:
        raise InvalidGrammarError("must be true when given", part="guided_json_object")
    return GrammarSpec("json_object", "", json_format)


def _parse_regex(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise InvalidGrammarError("must be a non-empty string", part="guided_regex")
    try:
        with until(getattr(request_state, "deadline", None)):
            check_regex_syntax(value, limits, "guided_regex")
    except Overrun:  # the budget is spent: the compile worker decides (`deferred`)
        count("deferred")
        return GrammarSpec("regex", value, pending=Pending("guided_regex", limits))
    return GrammarSpec("regex", value)


def _parse_choice(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidGrammarError("must be a list of strings", part="guided_choice")
    if not value:
        raise InvalidGrammarError("must offer at least one choice", part="guided_choice")
    if len(value) > limits.max_choices:  # refused by count before any choice is read (or copied)
        check_choices(value if isinstance(value, list) else list(value), limits, "guided_choice")
    for index, choice in enumerate(value):
        if not isinstance(choice, str):
            raise InvalidGrammarError(f"must be a string, got {type(choice).__name__}", part=f"guided_choice[{index}]")
        if not choice:
            raise InvalidGrammarError("must not be empty", part=f"guided_choice[{index}]")
        check_text(choice, f"guided_choice[{index}]")
    check_choices(list(value), limits, "guided_choice")
    return GrammarSpec("choice", json.dumps(list(value), ensure_ascii=False))


def _parse_grammar(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if not isinstance(value, str) or not value.strip():
        raise InvalidGrammarError("must be a non-empty grammar string", part="guided_grammar")
    check_text(value, "guided_grammar")
    kind = "lark" if grammar_is_lark(value) else "ebnf"
    check_size(value, limits.max_constraint_bytes, "guided_grammar", "grammar")
    try:
        with until(getattr(request_state, "deadline", None)):
            check_grammar_text(value, kind == "lark", limits, "guided_grammar")
    except Overrun:  # the budget is spent: the compile worker decides (`deferred`)
        count("deferred")
        return GrammarSpec(kind, value, pending=Pending("guided_grammar", limits))
    return GrammarSpec(kind, value)


def _parse_structural_tag_field(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    return parse_structural_tag(value, json_format, limits, part="structural_tag")


_FIELD_PARSERS = {
    "guided_json": _parse_guided_json,
    "guided_json_object": _parse_json_object,
    "guided_regex": _parse_regex,
    "guided_choice": _parse_choice,
    "guided_grammar": _parse_grammar,
    "structural_tag": _parse_structural_tag_field,
}

_EBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w-]*\s*::=", re.MULTILINE)
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w]*(\.\d+)?\s*:(?!:)", re.MULTILINE)


def grammar_is_lark(text: str) -> bool:
    """True when the grammar uses Lark rule syntax (``name: ...``) rather than EBNF (``name ::= ...``)."""
    if _EBNF_RULE.search(text):
        return False
    return bool(_LARK_RULE.search(text)) or text.lstrip().startswith("%")


def _parse_json_schema(value: Any, json_format: JsonFormat, limits: AdmissionLimits, *, part: str) -> GrammarSpec:
    if isinstance(value, (str, bytes)):
        if surely_too_long(value, limits.max_constraint_bytes):
            check_text_size(value, limits.max_constraint_bytes, part)  # by its length alone
        deadline_at = getattr(request_state, "deadline", None)
        if deadline_at is not None:  # a budget: a large text is read by the compile worker
            spec = unread_schema(value, json_format, limits, part)
            if spec is not None:
                count("deferred")
                return spec
        check_text_size(value, limits.max_constraint_bytes, part)
    # An object admission's cache key wrote already: that text is its source, and its checks read
    # the text's document (read back only when they have the time: a megabyte is ~10 ms).
    written = getattr(request_state, "written", {}).get(f"{part}:json") if isinstance(value, dict) else None
    schema, source = (None, written) if written is not None else schema_and_source(value, part)
    check_size(source, limits.max_constraint_bytes, part, "schema")
    pending = None
    try:
        with until(getattr(request_state, "deadline", None)):
            checkpoint()
            afford(len(source) * BOUNDS_SECONDS_PER_BYTE)  # the first check's cost (`check_schema_document`)
            if schema is None:
                schema = document_of(source)
            check_schema_document(schema, limits, part, source_bytes=len(source))
    except Overrun:  # the budget is spent: the compile worker decides (`deferred`)
        count("deferred")
        pending = Pending(part, limits)
    return GrammarSpec("json_schema", source, json_format, pending)


def json_format_of(fields: Mapping[str, Any], config: GuidedConfig) -> JsonFormat:
    any_whitespace = config.any_whitespace
    if fields.get("disable_any_whitespace") is not None:
        any_whitespace = not _bool_field(fields, "disable_any_whitespace")
    if fields.get("any_whitespace") is not None:
        any_whitespace = _bool_field(fields, "any_whitespace")
    max_ws = config.max_whitespace_cnt
    if "max_whitespace_cnt" in fields:
        max_ws = fields["max_whitespace_cnt"]
        if max_ws is not None and (isinstance(max_ws, bool) or not isinstance(max_ws, int) or max_ws < 1):
            raise InvalidGrammarError("must be a positive integer or null", part="max_whitespace_cnt")
    separators = _separators(fields.get("separators"), config.separators)
    if not any_whitespace and separators is None:
        # xgrammar's default without free whitespace forces ", " and ": " (spaces mandatory);
        # compact separators are what "no whitespace" means to a user.
        separators = COMPACT_SEPARATORS
    strict = config.strict_mode
    if fields.get("guided_strict") is not None:
        strict = _bool_field(fields, "guided_strict")
    unknown_formats = getattr(config, "unknown_formats", "refuse")
    if fields.get("guided_unknown_formats") is not None:
        unknown_formats = fields["guided_unknown_formats"]
        if unknown_formats not in UNKNOWN_FORMAT_POLICIES:
            raise InvalidGrammarError(f"must be one of {UNKNOWN_FORMAT_POLICIES}", part="guided_unknown_formats")
    any_order = getattr(config, "any_order", False)
    if fields.get("guided_any_order") is not None:
        any_order = _bool_field(fields, "guided_any_order")
    return JsonFormat(
        any_whitespace, max_ws if any_whitespace else None, separators, strict, unknown_formats, any_order
    )


def _separators(value: Any, default: tuple[str, str] | None) -> tuple[str, str] | None:
    if value is None:
        return default
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(s, str) and s.strip() in (",", ":") for s in value)
        or value[0].strip() != ","
        or value[1].strip() != ":"
    ):
        raise InvalidGrammarError(
            "must be [item_separator, key_separator], e.g. [',', ':'] or [', ', ': ']", part="separators"
        )
    return (value[0], value[1])


def _bool_field(fields: Mapping[str, Any], name: str) -> bool:
    value = fields[name]
    if not isinstance(value, bool):
        raise InvalidGrammarError(f"must be a boolean, got {type(value).__name__}", part=name)
    return value
