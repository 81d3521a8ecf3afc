"""Random schemas built from the keywords the normaliser rewrites, nested three deep: every value
their normal form accepts must be valid under the original schema (jsonschema, formats on), in
strict and in JSON Schema mode.

The generator leans on the combinations that once went wrong: `not`/`oneOf` over nested objects
and tuples that strict mode closes, patterns a complement can only write in part, `$ref`s to
such schemas, `oneOf` beside sibling keywords. At commit f1abb00 every one of the four runs failed
(seed 0: 14 unsound normal forms of 3,000 schemas, seed 1: 11, in either mode); the shapes are in
tests/schema/test_exactness.py.
"""
from __future__ import annotations

import random

import pytest

from fd_guided.schema.normalise import Normaliser
from fd_guided.schema.refusal import Refusal, Unsatisfiable

from engine_probe import valid as _valid

LEAVES = [{"type": "string"}, {"type": "integer"}, {"type": "string", "maxLength": 2}, {"type": "string", "pattern": "^a"},
          {"const": "a"}, {"enum": [1, "b", None]}, {"type": "integer", "minimum": 1}, {"type": "boolean"}, {"type": "null"},
          {"type": "array", "maxItems": 1}, {"type": "object"}, {"minLength": 1}, {"not": {"pattern": "^a"}}, {},
          {"not": {"const": "a"}}, {"not": {"enum": [1, "b", None]}}, {"not": {"type": "string", "maxLength": 1}}]

PROBES = [None, True, False, 0, 1, 2, -1, 1.5, "", "a", "b", "ab", "ba", "abc", [], [1], ["a"], [1, 2], ["a", "b"], [None],
          [[]], [{}], {}, {"a": 1}, {"a": "a"}, {"a": "b"}, {"b": 1}, {"a": None}, {"c": []}, {"a": {}}, {"a": {"b": 1}},
          {"a": {"x": 1}}, {"a": [1, 2]}, {"a": [1]}, {"a": 1, "b": 2}, {"a": "a", "b": "b"}, {"x": 1}, {"a": {}, "b": {}},
          {"a": [], "c": 1}, {"a": 1, "b": 2, "c": 3}, {"a": "a", "b": []}, {"a": "b", "c": "a"}, {"a": 1, "c": 1}]


def random_schema(rng: random.Random, depth: int):
    if depth <= 0 or rng.random() < 0.25:
        return dict(rng.choice(LEAVES))
    kind = rng.choice(["object", "object", "array", "tuple", "not", "oneOf", "oneOf", "anyOf", "allOf", "ref", "if", "other"])
    if kind == "object":
        props = {name: random_schema(rng, depth - 1) for name in rng.sample(["a", "b", "c"], rng.randint(0, 2))}
        node = {"type": "object", "properties": props}
        if props and rng.random() < 0.6:
            node["required"] = rng.sample(list(props), rng.randint(1, len(props)))
        if rng.random() < 0.3:
            node["additionalProperties"] = rng.choice([False, True, {"type": "integer"}])
        for key in ("minProperties", "maxProperties"):
            if rng.random() < 0.2:
                node[key] = rng.randint(0, 2)
        return node
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth - 1), **({"minItems": 1} if rng.random() < 0.3 else {})}
    if kind == "tuple":
        return {"type": "array", "prefixItems": [random_schema(rng, depth - 1) for _ in range(rng.randint(0, 2))],
                **({"minItems": rng.randint(0, 2)} if rng.random() < 0.5 else {})}
    if kind == "not":
        return {"not": random_schema(rng, depth - 1)}
    if kind in ("oneOf", "anyOf", "allOf"):
        node = {kind: [random_schema(rng, depth - 1) for _ in range(rng.randint(1, 3))]}
        sibling = random_schema(rng, depth - 1)
        if rng.random() < 0.4 and kind not in sibling:  # the context a oneOf is judged in
            node.update(sibling)
        return node
    if kind == "ref":
        return {"$ref": "#/$defs/d"}
    if kind == "if":
        return {"if": random_schema(rng, depth - 1), "then": random_schema(rng, depth - 1), "else": random_schema(rng, depth - 1)}
    return rng.choice([
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        {"type": "object", "properties": {"a": random_schema(rng, depth - 1)}, "unevaluatedProperties": False},
        {"type": "array", "contains": random_schema(rng, depth - 1), "maxItems": 3},
        {"type": "array", "items": {"enum": [1, 2, "a"]}, "uniqueItems": True},
        {"type": "object", "patternProperties": {"^a": random_schema(rng, depth - 1)}},
        {"type": "object", "propertyNames": {"maxLength": 1}},
        {"enum": [{"a": 1}, {"a": "a", "b": 2}, [1], "a"]},
        {"type": "object", "dependentSchemas": {"a": random_schema(rng, depth - 1)}},
        {"oneOf": [{"type": "object", "properties": {"a": {"const": "a"}, "b": random_schema(rng, depth - 1)}, "required": ["a"]},
                   {"type": "object", "properties": {"a": {"enum": rng.choice([["b"], ["a", "b"], [1]])}, "c": random_schema(rng, depth - 1)},
                    "required": rng.choice([["a"], []])}]},
    ])


def random_definition(rng: random.Random):
    """``$defs.d``: plain, or recursive through a oneOf/not (the definition reached again while it
    is being normalised)."""
    inner = random_schema(rng, 1)
    return rng.choice([
        inner,
        {"oneOf": [inner, {"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}, "required": ["a"]}]},
        {"type": "array", "items": {"oneOf": [inner, {"$ref": "#/$defs/d"}]}},
        {"type": "object", "properties": {"a": {"not": {"$ref": "#/$defs/d"}}}},
    ])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("strict", [True, False])
def test_normal_forms_accept_only_valid_values(seed, strict):
    rng = random.Random(seed)
    schemas = ({**random_schema(rng, 3), "$defs": {"d": random_definition(rng)}} for _ in range(3000))
    normalised, unsound = _judge(schemas, strict, PROBES)
    assert normalised > 2000
    assert not unsound, unsound[:3]


def _judge(schemas, strict: bool, probes: list) -> tuple[int, list]:
    """(how many schemas normalised, the (schema, wrongly accepted values) of the unsound ones):
    every probe a normal form accepts is checked with jsonschema."""
    normalised, unsound = 0, []
    for schema in schemas:
        try:
            normaliser = Normaliser(schema, strict=strict)
            union = normaliser.root()
            accepted = [value for value in probes if normaliser.accepts(union, value)]
        except (Refusal, Unsatisfiable):
            continue
        try:
            wrong = [value for value in accepted if not _valid(schema, value)]
        except RecursionError:  # d = oneOf[$ref d, ...]: jsonschema itself never terminates
            continue
        normalised += 1
        if wrong:
            unsound.append((schema, wrong[:3]))
    return normalised, unsound


def shared_base_one_of(rng: random.Random):
    """A oneOf whose branches extend one base object (``allOf: [{$ref: d}, {required: [k], ...}]``),
    the shape `one_of._beyond` subtracts relative to the base; sometimes beside a context, sometimes
    under a ``not``. The base's own properties (shared by every branch) and the branches' may
    close the object."""
    base_names = rng.sample(["a", "b", "c", "x"], rng.randint(1, 3))
    base = {"type": "object", "properties": {name: random_schema(rng, 1) for name in base_names}}
    if rng.random() < 0.6:
        base["required"] = rng.sample(base_names, rng.randint(1, len(base_names)))
    if rng.random() < 0.3:
        base["additionalProperties"] = rng.choice([True, {"type": "integer"}, {"type": "object"}])
    branches = []
    for name in rng.sample(["a", "b", "c", "x"], rng.randint(2, 3)):
        own = {"type": "object", "properties": {name: random_schema(rng, 1)}}
        if rng.random() < 0.3:
            own["properties"].update({other: True for other in base_names})
        if rng.random() < 0.8:
            own["required"] = [name]
        if rng.random() < 0.4:
            own["additionalProperties"] = rng.choice([False, {"type": "integer"}, {"type": "array"}])
        branches.append({"allOf": [{"$ref": "#/$defs/d"}, own]} if rng.random() < 0.8 else own)
    node = {"oneOf": branches, "$defs": {"d": base}}
    if rng.random() < 0.4:
        node.update({key: value for key, value in random_schema(rng, 2).items() if key != "$defs"})
    if rng.random() < 0.4:  # a subset the rule took for exact becomes unsound once complemented
        node = {"not": {key: value for key, value in node.items() if key != "$defs"}, "$defs": node["$defs"]}
    return node


def closed_branches_one_of(rng: random.Random):
    """A oneOf whose branches declare a few keys each and may be closed to them
    (``additionalProperties: false``, or by strict mode), the shape `one_of._relative_complement`
    subtracts as "has a key the other does not declare"; beside a context that may close the
    object itself, sometimes under a ``not``."""
    def branch():
        names = rng.sample(["a", "b", "c", "x"], rng.randint(1, 2))
        node = {"properties": {name: random_schema(rng, 1) for name in names}}
        if rng.random() < 0.5:
            node["type"] = "object"
        if rng.random() < 0.4:
            node["required"] = rng.sample(names, 1)
        if rng.random() < 0.7:
            node["additionalProperties"] = False
        return node
    node = {"oneOf": [branch() for _ in range(rng.randint(2, 4))]}
    if rng.random() < 0.6:
        context = {"type": "object"}
        if rng.random() < 0.6:
            names = rng.sample(["a", "b", "c", "x"], rng.randint(1, 3))
            context["properties"] = {name: rng.choice([True, random_schema(rng, 1)]) for name in names}
            if rng.random() < 0.5:
                context["additionalProperties"] = rng.choice([False, True])
            if rng.random() < 0.4:
                context["required"] = rng.sample(names, 1)
        node.update(context)
    if rng.random() < 0.3:
        node = {"not": node}
    return {**node, "$defs": {"d": random_definition(rng)}}


@pytest.mark.parametrize("make", [shared_base_one_of, closed_branches_one_of])
@pytest.mark.parametrize("strict", [True, False])
def test_one_of_subtracted_relative_to_each_branch(make, strict):
    rng = random.Random(7)
    normalised, unsound = _judge((make(rng) for _ in range(1500)), strict, PROBES + SHARED_BASE_PROBES)
    assert normalised > 800
    assert not unsound, unsound[:3]


SHARED_BASE_PROBES = [{"a": 1, "x": 1}, {"a": "a", "x": "a"}, {"b": 1, "x": 1}, {"a": 1, "b": "a", "x": 1}, {"x": 1, "c": 1},
                      {"a": [], "b": [], "x": []}, {"a": {}, "x": 1}, {"a": 1, "b": 1, "c": 1, "x": 1}, {"a": "a", "c": "a"},
                      {"b": "b", "c": 1}, {"a": None, "b": None}, {"c": [1], "x": {}}]


@pytest.mark.parametrize("backend, count", [("llguidance", 300), ("xgrammar", 120)])
@pytest.mark.parametrize("strict", [True, False])
def test_compiled_grammars_accept_only_valid_values(backend, count, strict):
    """The same schemas end to end: admitted, emitted for the engine, compiled, and every probe fed
    byte by byte through the `Grammar` interface (`fd_guided.harness.conformance`): a probe the grammar
    accepts must be valid under jsonschema."""
    from fd_guided.harness.conformance import Case, run_cases

    rng = random.Random(100 + count)
    cases = []
    for _ in range(count):
        schema = {**random_schema(rng, 3), "$defs": {"d": random_definition(rng)}}
        try:
            tests = [{"description": repr(value), "data": value, "valid": _valid(schema, value)} for value in PROBES]
        except RecursionError:
            continue
        cases.append(Case("fuzz", repr(schema), schema, tests))
    results = run_cases(backend, cases, strict=strict)
    assert sum(result.compiled for result in results) > count // 3
    unsound = [(result.case.schema, result.unsound[:3]) for result in results if result.unsound]
    assert not unsound, unsound[:3]
