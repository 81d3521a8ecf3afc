"""Hostile schemas meet a bounded, typed refusal (or a correct rewrite): never RecursionError, never a hang.

All of this is pure Python (the normaliser never calls an engine), so no subprocess is needed.
"""
import time

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.schema import for_engine

pytestmark = pytest.mark.cpu

HOSTILE = {
    "500 nested groups": {"type": "string", "pattern": "(" * 500 + "a" + ")" * 500},
    "8000 patternProperties": {"type": "object", "patternProperties": {f"^p{i}_[a-z]+$": {"type": "integer"} for i in range(8000)}},
    "2000-branch anyOf": {"anyOf": [{"type": "object", "properties": {"k": {"const": i}, "x": {"minimum": i}}} for i in range(2000)]},
    "20 dependencies": {"type": "object", "dependentRequired": {f"a{i}": [f"b{i}"] for i in range(20)}},
    "not of an approximation": {"not": {"not": {"not": {"not": {"type": "string", "pattern": "a"}}}}},
    "allOf of recursive definitions": {
        "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}},
                  "b": {"type": "object", "properties": {"x": {"$ref": "#/$defs/b"}, "y": {"type": "integer"}}}},
        "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]},
    "not of a recursive definition": {"$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}, "required": ["k"]}},
                                      "not": {"$ref": "#/$defs/t"}, "type": "object"},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_admission_is_typed_and_bounded(name):
    start = time.perf_counter()
    try:
        parse_guided_request({"guided_json": HOSTILE[name], "guided_strict": False}, GuidedConfig(backend="auto"))
    except InvalidGrammarError:
        pass
    assert time.perf_counter() - start < 20  # generous on a loaded 2-core machine; typically well under 1 s


def test_an_identifier_that_is_not_a_string_is_a_typed_refusal():
    """Draft 4 reads "id" as the base URI; an object there made the reference library raise
    AttributeError through `for_engine` (jsonschema fails on the same schema)."""
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"a": {"type": "object", "id": {"type": "string"}}}}
    with pytest.raises(InvalidGrammarError, match="identifier"):
        for_engine("llguidance", schema)
    later = {"type": "object", "properties": {"a": {"type": "object", "id": {"type": "string"}}}}  # 2020-12: not an identifier
    assert for_engine("llguidance", later)["properties"]["a"]["type"] == "object"


@pytest.mark.parametrize("schema", [{"type": "string", "minLength": "#/x"}, {"type": "object", "required": 5},
                                    {"type": "array", "maxItems": [1]}, {"enum": 3}])
def test_malformed_keyword_values_are_typed_refusals_even_past_admission(schema):
    """Admission meta-validates; `for_engine` called directly must not raise ValueError/TypeError."""
    for engine in ("llguidance", "xgrammar"):
        try:
            for_engine(engine, schema)
        except InvalidGrammarError:
            pass


def test_a_3000_link_reference_chain_is_followed_without_recursion():
    chain = {"$defs": {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(3000)}, "$ref": "#/$defs/a0"}
    chain["$defs"]["a3000"] = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}
    out = for_engine("llguidance", chain)
    assert out["$ref"] == "#/$defs/n0" and "patternProperties" in out["$defs"]["n0"]


def test_deeply_nested_properties_are_refused_not_crashed():
    schema: dict = {"type": "integer"}
    for _ in range(60):  # 120 JSON levels: under the admission depth cap, deep for the normaliser
        schema = {"type": "object", "properties": {"a": schema}}
    try:
        for_engine("xgrammar", schema)
    except InvalidGrammarError as refused:
        assert refused.feature
