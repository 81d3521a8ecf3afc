"""Schemas without $schema: each keyword read by the draft that defines it, conflicts refused at
admission naming their path, and outputs judged by every draft the document is valid in."""

from __future__ import annotations

import pytest
from engine_probe import ENGINES, accepts, compact, spec_for

from fd_guided import InvalidGrammarError, parse_guided_request
from fd_guided.schema.drafts import Document, validators_for

DRAFT7 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize(
    "schema, keywords",
    [
        (
            {"dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
            {"dependentRequired": {"a": ["b"]}, "dependentSchemas": {"c": {"required": ["d"]}}},
        ),
        (
            {"items": [{"type": "string"}], "additionalItems": False},
            {"prefixItems": [{"type": "string"}], "items": False},
        ),
        ({"items": {"type": "string"}, "additionalItems": False}, {"items": {"type": "string"}}),
        ({"minimum": 1, "exclusiveMinimum": True}, {"exclusiveMinimum": 1}),
        ({"maximum": 1, "exclusiveMaximum": False}, {"maximum": 1}),
        ({"exclusiveMinimum": 1}, {"exclusiveMinimum": 1}),
        (
            {"$ref": "#/definitions/a", "maxItems": 2, "definitions": {"a": {}}},
            {"$ref": "#/definitions/a", "maxItems": 2},
        ),
    ],
)
def test_every_draft_keyword_is_read(schema, keywords):
    document = Document(schema)
    assert document.keywords(schema, "$") == keywords


@pytest.mark.parametrize(
    "schema, part",
    [
        ({"items": [{}], "prefixItems": [{}]}, "guided_json.items"),
        (
            {"properties": {"a": {"$id": "http://x/a", "$ref": "#/definitions/b"}}, "definitions": {"b": {}}},
            "guided_json.properties.a.$ref",
        ),
        ({"dependencies": {"a": ["b"]}, "dependentRequired": {"a": ["c"]}}, "guided_json.dependencies"),
        (
            {
                "properties": {
                    "a": {
                        "id": "http://x/a",
                        "properties": {"b": {"$ref": "#/definitions/c"}},
                        "definitions": {"c": {"type": "string"}},
                    }
                },
                "definitions": {"c": {"type": "integer"}},
            },
            "guided_json.properties.a.properties.b.$ref",
        ),
    ],
)
def test_conflicting_readings_are_refused_at_admission(schema, part):
    with pytest.raises(InvalidGrammarError) as refused:
        parse_guided_request({"guided_json": schema}, check_backend=False)
    assert refused.value.part == part and "$schema" in str(refused.value)


def test_an_explicit_schema_is_obeyed_as_before():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "dependencies": {"a": ["b"]}}
    assert Document(schema).keywords(schema, "$") == {}  # an annotation in 2020-12
    schema = {"$schema": DRAFT7, "$ref": "#/definitions/a", "maxItems": 2, "definitions": {"a": {}}}
    assert Document(schema).keywords(schema, "$") == {"$ref": "#/definitions/a"}
    assert [cls.__name__ for cls in validators_for(schema)] == ["Draft7Validator"]


def test_outputs_are_judged_by_every_draft_the_document_is_valid_in():
    assert [cls.__name__ for cls in validators_for({"minimum": 1, "exclusiveMinimum": True})] == ["Draft4Validator"]
    assert len(validators_for({"type": "object", "dependencies": {"a": ["b"]}})) == 5


@pytest.mark.parametrize("engine", ENGINES)
def test_older_drafts_keywords_without_schema_are_enforced(engine):
    """The issue's cases: draft 4-7 keywords sent without $schema were dropped as annotations."""
    cases = [
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "dependencies": {"a": ["b"]},
                "additionalProperties": False,
            },
            [{"a": 1}, {"a": 1, "b": 2}, {"b": 2}, {}],
        ),
        ({"type": "array", "items": [{"type": "integer"}], "additionalItems": False, "maxItems": 3}, [[1], [1, 2], []]),
        ({"type": "integer", "minimum": 1, "maximum": 3, "exclusiveMinimum": True}, [1, 2, 3]),
        (
            {
                "type": "object",
                "properties": {"x": {"$ref": "#/definitions/s", "maxLength": 2}},
                "definitions": {"s": {"type": "string"}},
                "required": ["x"],
                "additionalProperties": False,
            },
            [{"x": "ab"}, {"x": "abc"}, {"x": 1}],
        ),
    ]
    for schema, instances in cases:
        spec = spec_for(engine, schema)
        for instance in instances:
            judged = all(
                cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(instance) for cls in validators_for(schema)
            )
            assert accepts(engine, spec, compact(instance)) == judged, (schema, instance, judged)
