"""Start plans written from the constraint (`fd_guided.budget.instance`): the shortest instance of the
schema each engine enforces, the cheapest full match of a regex, the cheapest choice. Each one is
checked against the constraint (jsonschema with format checking, `re.fullmatch`) and against the
engine's own matcher (its tokens accepted, then a stop token), on DeepSeek's vocabulary."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from corpus import SCHEMAS
from guided_helpers import in_process_backend

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.budget import token_table
from fd_guided.budget.instance import Writer, number, start_candidates
from fd_guided.budget.shortest_string import shortest_full_match, shortest_match

pytestmark = pytest.mark.cpu

ENGINES = ["xgrammar", "llguidance"]
SHORTEST = [
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 3}}, "required": ["a"]}, '{"a":"aaa"}'),
    ({"type": "integer", "minimum": 3, "maximum": 9}, "3"),
    ({"type": "integer", "exclusiveMinimum": 0}, "1"),
    ({"type": "integer", "maximum": -5}, "-5"),
    ({"type": "integer", "minimum": 10, "maximum": 100, "multipleOf": 7}, "14"),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, "0.1"),
    ({"type": "number", "minimum": 0.3, "maximum": 9, "multipleOf": 0.25}, "1"),
    ({"type": "string", "pattern": "^x[0-9]+$"}, '"x0"'),
    ({"type": "array", "prefixItems": [{"const": "ab"}, {"type": "boolean"}], "minItems": 2}, '["ab",true]'),
    ({"type": "array", "items": {"type": "null"}, "minItems": 2}, "[null,null]"),
    (
        {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "null"}}, "required": ["a", "b"]},
        '{"b":0,"a":null}',
    ),  # the schema's order, which both engines write
    (
        {
            "type": "object",
            "properties": {"x": {"type": "string", "minLength": 6}, "y": {"enum": [12345, 7]}},
            "minProperties": 1,
        },
        '{"y":7}',
    ),
    ({"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1}, '{"":true}'),
    ({"enum": ["a much longer value", "mid one", "s"]}, '"s"'),
    ({"anyOf": [{"type": "string", "minLength": 9}, {"type": "array", "minItems": 1}]}, '[""]'),  # 2 tokens, [0] 3
    (
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                    "required": ["kids"],
                }
            },
            "$ref": "#/$defs/node",
        },
        '{"kids":[]}',
    ),
    (
        {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]},
        '{"next":null}',
    ),
    (
        {
            "type": "object",
            "properties": {"v": {"type": "object", "properties": {"w": {"$ref": "#"}}, "required": ["w"]}},
            "required": [],
        },
        "{}",
    ),
]


def validator(schema):
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def accepted(engine: str, fields: dict, text: bytes) -> bool:
    """Whether the engine's matcher accepts `text` (in its fewest tokens) and then a stop token."""
    backend = in_process_backend(engine)
    spec = parse_guided_request(fields, GuidedConfig(backend=engine))
    grammar = backend.new_grammar(backend.compile_checked(spec))
    tokens = token_table(backend.tokenizer).tokenize(text)
    stop = backend.stop_token_ids[0]
    return tokens is not None and grammar.accept_tokens([*tokens, stop]) == len(tokens) + 1


def candidates(engine: str, fields: dict) -> list[bytes]:
    table = token_table(in_process_backend(engine).tokenizer)
    return start_candidates(parse_guided_request(fields, GuidedConfig(backend=engine)), engine, table.count)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("schema, expected", SHORTEST)
def test_the_shortest_instance_is_written_and_accepted(engine, schema, expected):
    fields = {"guided_json": schema}
    [first, *_] = candidates(engine, fields)
    assert first.decode() == expected
    assert validator(schema).is_valid(json.loads(first))
    assert accepted(engine, fields, first)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_corpus_schema_gets_a_valid_accepted_start(engine):
    for name, schema in SCHEMAS.items():
        fields = {"guided_json": schema}
        texts = candidates(engine, fields)
        assert texts, name
        assert validator(schema).is_valid(json.loads(texts[0])), (name, texts[0])
        assert accepted(engine, fields, texts[0]), (name, texts[0])


@pytest.mark.parametrize("engine", ENGINES)
def test_formats_are_written_through_their_patterns(engine):
    for fmt in ("date", "date-time", "email", "ipv4", "ipv6", "uuid", "time", "hostname", "uri"):
        schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"]}
        [first, *_] = candidates(engine, {"guided_json": schema})
        assert validator(schema).is_valid(json.loads(first)), (fmt, first)


def test_the_layout_asked_for_comes_first():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "integer"}, "minItems": 2}},
        "required": ["a"],
    }
    fields = {"guided_json": schema, "any_whitespace": False, "separators": [", ", ": "]}
    for engine in ENGINES:
        [first, *others] = candidates(engine, fields)
        assert first == b'{"a": [0, 0]}' and b'{"a":[0,0]}' in others
        assert accepted(engine, fields, first) and not accepted(engine, fields, others[0])


@pytest.mark.parametrize("engine", ENGINES)
def test_regexes_and_choices(engine):
    for pattern in (r"[a-z]+@[a-z]+\.com", r"\d{4}-\d{2}-\d{2}( note: [a-z ]+)?", r"(ab|c)d{2,3}"):
        fields = {"guided_regex": pattern}
        [text] = candidates(engine, fields)
        assert re.fullmatch(pattern, text.decode()) and accepted(engine, fields, text)
    assert shortest_full_match(r"(ab|c)d{2,3}") == "cdd"
    fields = {"guided_choice": ["a much longer choice of words", "middle one", "short"]}
    assert candidates(engine, fields) == [b"short"] and accepted(engine, fields, b"short")


def test_strings_cost_their_json_encoding():
    assert shortest_match(('^["a]$',)) == "a"  # a quote needs an escape: two bytes
    assert shortest_match((), low=2, high=2) == "aa"
    assert shortest_match(("^[0-9]{3}$", "^1"), low=0) == "100"  # both patterns: the automata's product
    assert shortest_match(("^x+$",), low=5, high=3) is None


def test_numbers_that_cannot_be_written_give_nothing():
    assert number({"type": "integer", "minimum": 5, "maximum": 4}, True) is None
    assert number({"type": "number", "minimum": 0.5, "maximum": 0.5, "multipleOf": 0.3}, False) is None
    assert Writer({"type": "string", "format": "email"}, (",", ":"), len).write() is None  # not an emitted node
