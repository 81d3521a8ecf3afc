"""Emptiness is only proof of disjointness when it is exact.

Each schema below once compiled to something that accepted invalid values: an emptiness found by
judging a *subset* (a `not` that could only be approximated, strict mode's closure of a nested
object or tuple, a `$ref` to such a schema) was read as "no value at all", so its complement
became "any value" or a `oneOf` lost a subtraction. Now each is refused or enforced exactly; the
test checks every probe value the emitted schema accepts against the original schema.
"""
from __future__ import annotations

import pytest

from fd_guided.errors import InvalidGrammarError
from fd_guided.schema import for_engine
from fd_guided.spec import JsonFormat

from engine_probe import valid as _valid

NOT_A = {"type": "string", "not": {"pattern": "^a"}}  # strings not starting with "a": only a subset is written

CASES = {
    "oneOf beside a branch only approximated": {"oneOf": [NOT_A, {"type": "string", "maxLength": 3}]},
    "not of allOf with a ref to an approximation": {"$defs": {"A": NOT_A}, "not": {"allOf": [{"$ref": "#/$defs/A"}, {"type": "string"}]}},
    "not of allOf, the ref beside an untyped keyword": {"$defs": {"A": NOT_A}, "not": {"allOf": [{"$ref": "#/$defs/A"}, {"maxLength": 5}]}},
    "not of an object whose required property is approximated": {"not": {"type": "object", "required": ["a"], "properties": {"a": NOT_A}}},
    "the same through a ref": {"$defs": {"A": NOT_A}, "not": {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/$defs/A"}}}},
    "not of an object whose required tuple strict mode closes": {
        "not": {"type": "object", "required": ["a"], "properties": {"a": {"type": "array", "prefixItems": [{}], "minItems": 2}}}},
    "not of an enum filtered by a closed nested object": {
        "not": {"enum": [{"x": {"a": 1, "b": 2}}], "properties": {"x": {"properties": {"a": {}}}}}},
    "not of allOf merging two closed nested objects": {
        "type": "object", "not": {"allOf": [{"properties": {"a": {"properties": {"b": {}}}}},
                                            {"properties": {"a": {"properties": {"c": {}}}}}], "required": ["a"]}},
    "not of a nested object strict mode closes with no property declared": {
        "type": "object", "required": ["a"], "not": {"required": ["a"], "properties": {"a": {"type": "object", "properties": {}}}}},
    "not of a nested empty tuple strict mode closes": {
        "type": "object", "required": ["a"], "not": {"required": ["a"], "properties": {"a": {"type": "array", "prefixItems": []}}}},
    "not of a recursive array whose items subtract the definition": {
        "not": {"$ref": "#/$defs/d"}, "$defs": {"d": {"type": "array", "items": {"oneOf": [{}, {"$ref": "#/$defs/d"}]}}}},
    "not of an if over a recursive oneOf": {
        "not": {"if": {"$ref": "#/$defs/d"}, "then": {"allOf": [{"type": "null"}, {"type": "string"}]}, "else": {}},
        "$defs": {"d": {"oneOf": [{"type": "array", "items": {"enum": [1, "b", None]}},
                                  {"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}, "required": ["a"]}]}}},
    "oneOf whose branches differ only under closure": {
        "oneOf": [{"type": "object", "required": ["cfg"], "properties": {"cfg": {"type": "object", "properties": {"a": {}}}}},
                  {"type": "object", "required": ["cfg"], "properties": {"cfg": {"type": "object", "properties": {"b": {}}}}}]},
}

PROBES = [None, True, 0, 1.5, [[]], [1, [2]], {"a": []}, {"a": [1]}, {"a": {"a": [1]}}, "", "a", "ab", "abc", "xyz", "xyzw", [], [1], [1, 2], {}, {"a": "xyz"}, {"a": "abc"},
          {"a": 1}, {"a": [1]}, {"a": [1, 2]}, {"a": {}}, {"a": {"x": 1}}, {"a": [0]}, {"a": {"b": 1}}, {"a": {"c": 1}}, {"a": {"b": 1, "c": 1}},
          {"x": {"a": 1, "b": 2}}, {"x": {"a": 1}}, {"cfg": {}}, {"cfg": {"a": 1}}, {"cfg": {"b": 1}}, {"cfg": {"a": 1, "b": 1}}]


@pytest.mark.parametrize("engine", ["llguidance", "xgrammar"])
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("name", sorted(CASES))
def test_what_the_engine_gets_accepts_only_valid_values(name, strict, engine):
    schema = CASES[name]
    try:
        emitted = for_engine(engine, schema, JsonFormat(False, None, None, strict=strict))
    except InvalidGrammarError:
        return  # refused, named: sound
    wrongly_accepted = [value for value in PROBES if _valid(emitted, value) and not _valid(schema, value)]
    assert not wrongly_accepted, (emitted, wrongly_accepted)


def test_closure_does_not_hide_a_real_disjointness():
    """`additionalProperties: false` written in the schema is exact: branches that require a name
    the other forbids stay provably disjoint even beside nested objects strict mode closes."""
    branch = lambda key: {"type": "object", "required": [key], "additionalProperties": False,  # noqa: E731
                          "properties": {key: {"type": "object", "properties": {"url": {"type": "string"}}}}}
    emitted = for_engine("llguidance", {"oneOf": [branch("git"), branch("hosted")]})
    assert _valid(emitted, {"git": {"url": "u"}}) and _valid(emitted, {"hosted": {}})
