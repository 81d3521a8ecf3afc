"""The normal form itself, judged without any engine: its own validator against the suite's verdicts.

For every case of the JSON-Schema-Test-Suite the normaliser handles, a value the normalised union
accepts must be valid (the union is never looser), and where the normaliser claims exactness a
valid value must be accepted. Then the named rules, one by one.
"""
import json

import jsonschema
import pytest

from fd_guided.harness.conformance import load_cases, suite_root
from fd_guided.schema import for_engine
from fd_guided.schema.complement import excluding_pattern
from fd_guided.schema.normalise import Normaliser
from fd_guided.schema.refusal import Refusal, Unsatisfiable
from fd_guided.errors import InvalidGrammarError
from fd_guided.spec import JsonFormat

pytestmark = pytest.mark.cpu
OPEN = JsonFormat(False, None, None, False)
# Where outputs are judged as fd_guided.harness.validate judges them, not as the suite expects: formats are
# asserted (format checker on); an unknown custom meta-schema is read as 2020-12 (jsonschema's default).
JUDGED_OTHERWISE = ("format.json", "vocabulary.json")


@pytest.mark.parametrize("draft", ["draft2020-12", "draft7"])
def test_normal_form_agrees_with_the_suite(draft):
    root = suite_root()
    if root is None:
        pytest.skip("JSON-Schema-Test-Suite not found (set FD_GUIDED_JSON_SCHEMA_SUITE)")
    normalised = 0
    for case in load_cases(root, draft):
        try:
            normaliser = Normaliser(case.schema, strict=False)
            union = normaliser.root()
        except Refusal:
            continue
        except Unsatisfiable:
            assert not any(test["valid"] for test in case.tests), case.description
            continue
        normalised += 1
        for test in case.tests:
            try:
                accepted = normaliser.accepts(union, test["data"])
            except Refusal:  # a reference normalised lazily that the engines would refuse too
                break
            where = (case.file, case.description, test["description"])
            if accepted:
                assert test["valid"], where
            elif union.exact and case.file not in JUDGED_OTHERWISE:
                assert not test["valid"], where
    assert normalised > 200


def value_of(schema, **options):
    return json.loads(json.dumps(for_engine("llguidance", schema, JsonFormat(False, None, None, **{"strict": False, **options}))))


def test_untyped_keywords_get_a_type():
    out = value_of({"minimum": 1.1})
    assert {"type": "number", "minimum": 1.1} in out["anyOf"]
    assert {"type": ["null", "boolean", "string", "array", "object"]} in out["anyOf"]


def test_enum_absorbs_its_siblings():
    assert value_of({"enum": ["a", "b", {"k": 1}], "type": "object"})["enum"] == [{"k": 1}]
    assert value_of({"const": 1.0, "type": "integer"})["enum"] == [1, 1.0]
    with pytest.raises(InvalidGrammarError, match="admits no value"):
        value_of({"enum": ["a"], "type": "integer"})


def test_not_is_written_positively():
    out = value_of({"type": "integer", "not": {"minimum": 10}})
    assert out["type"] == "integer" and out["maximum"] == 9


def test_if_then_else_with_a_decidable_condition():
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
              "required": ["kind"], "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["n"]}}
    out = value_of(schema)
    required_sets = sorted(tuple(branch.get("required", ())) for branch in out["anyOf"])
    assert ("kind", "n") in required_sets


def test_one_of_with_discriminators_becomes_any_of():
    branches = [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"const": "b"}, "n": {"type": "integer"}}, "required": ["k", "n"]}]
    out = value_of({"oneOf": branches})
    assert len(out["anyOf"]) == 2 and "oneOf" not in json.dumps(out)


def test_one_of_branches_are_judged_inside_what_the_parent_requires():
    """The discriminator is required by the parent (here through a $ref), the branches only give it
    a const: without the parent they overlap (an object without ``kind`` matches both), inside it
    they are disjoint, so no branch needs another's complement."""
    branch = lambda kind, name, kind_of: {"properties": {"kind": {"const": kind}, name: {"type": kind_of}}}  # noqa: E731
    schema = {"$defs": {"base": {"type": "object", "required": ["kind"], "properties": {"kind": {"type": "string"}}}},
              "$ref": "#/$defs/base", "oneOf": [branch(f"k{i}", f"p{i}", "integer") for i in range(12)]}
    out = value_of(schema)
    assert len(out["anyOf"]) == 12 and all(part["required"] == ["kind"] for part in out["anyOf"])
    validator = jsonschema.Draft202012Validator(out)
    assert validator.is_valid({"kind": "k3", "p3": 1}) and not validator.is_valid({"kind": "k3", "p3": "x"})
    assert not validator.is_valid({"p3": 1}) and not validator.is_valid({"kind": "other"})


def test_bare_leaves_absorb_what_they_cover():
    """Untyped ``required`` alternatives normalise to one leaf per type each; the repeats go, so
    20 of them fit in the alternatives budget, and the union is the same."""
    schema = {"anyOf": [{"required": [f"p{i}"]} for i in range(20)] + [{"enum": [1, "x", None]}, {"type": "integer"}]}
    out = value_of(schema)
    validator, original = jsonschema.Draft202012Validator(out), jsonschema.Draft202012Validator(schema)
    for value in (None, True, 1, 2.5, "x", "y", [], {}, {"p3": 0}, {"q": 1}):
        assert validator.is_valid(value) == original.is_valid(value), value


def test_long_any_of_lists_are_admitted_and_consts_join_one_enum():
    consts = value_of({"anyOf": [{"const": f"v{i}"} for i in range(200)]})
    assert consts["enum"] == [f"v{i}" for i in range(200)]
    tasks = {"anyOf": [{"type": "object", "properties": {"type": {"const": f"t{i}"}, "arg": {"type": "integer"}},
                        "required": ["type"]} for i in range(150)]}
    assert len(value_of(tasks)["anyOf"]) == 150
    with pytest.raises(InvalidGrammarError, match="more than 64 alternatives"):  # products keep the smaller cap
        value_of({"allOf": [{"anyOf": [{"type": "object", "required": [f"a{i}"]} for i in range(9)]},
                            {"anyOf": [{"type": "object", "required": [f"b{i}"]} for i in range(9)]}]})


def test_a_complement_of_a_complement_gives_the_schema_back():
    """``if: {properties: {rule: {not: {const: A}}}}``: its else side needs ¬¬const, which written
    out again would be a pattern's complement (only in part); the union it came from is exact."""
    schema = {"type": "object", "required": ["rule"], "properties": {"rule": {"enum": ["A", "B"]}},
              "if": {"properties": {"rule": {"not": {"const": "A"}}}}, "then": {"properties": {"x": {"type": "null"}}}}
    out = value_of(schema)
    validator, original = jsonschema.Draft202012Validator(out), jsonschema.Draft202012Validator(schema)
    for value in ({"rule": "A"}, {"rule": "A", "x": 1}, {"rule": "B"}, {"rule": "B", "x": None}, {"rule": "B", "x": 1}):
        assert validator.is_valid(value) == original.is_valid(value), value


def test_dependent_required_and_dependencies():
    out = value_of({"type": "object", "dependentRequired": {"a": ["b"]}})
    assert {"type": "object", "properties": {"a": False}} in out["anyOf"]
    draft7 = value_of({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "dependencies": {"a": ["b"]}})
    assert draft7["anyOf"] == out["anyOf"]


def test_required_names_are_declared():
    out = value_of({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"],
                    "additionalProperties": {"type": "string"}})
    assert out["properties"]["b"] == {"type": "string"}


def test_strict_mode_closes_an_all_of_over_what_every_part_declares():
    """Strict mode closes the merged object, not each conjunct: an extension that narrows a
    nested property of a closed base (``referent.type``) keeps the base's other properties
    (``referent.id``), and the merged object still admits no undeclared one."""
    base = {"type": "object", "additionalProperties": False, "required": ["type", "referent"],
            "properties": {"type": {"enum": ["reference"]},
                           "referent": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}}}
    schema = {"$defs": {"base": base, "section": {"type": "object", "required": ["type"], "properties": {"type": {"const": "section"}}}},
              "oneOf": [{"$ref": "#/$defs/section"},
                        {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"referent": {"properties": {"kind": {"const": "section"}}}}}]}]}
    out = for_engine("llguidance", schema)  # strict: the default
    valid = lambda value: jsonschema.Draft202012Validator(out).is_valid(value)  # noqa: E731
    assert valid({"type": "reference", "referent": {"id": "x"}})
    assert valid({"type": "reference", "referent": {"id": "x", "kind": "section"}})
    assert not valid({"type": "reference", "referent": {"id": "x", "kind": "story"}})
    assert not valid({"type": "reference", "referent": {"id": "x", "other": 1}})  # closed over id and kind
    assert valid({"type": "section"}) and not valid({"type": "section", "more": 1})
    merged = for_engine("llguidance", {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "string"}}}], "type": "object"})
    assert jsonschema.Draft202012Validator(merged).is_valid({"a": 1, "b": "x"})
    assert not jsonschema.Draft202012Validator(merged).is_valid({"a": 1, "c": "x"})


def test_a_one_of_alone_in_an_all_of_part_is_judged_beside_the_other_parts():
    """``allOf: [{$ref: base}, {oneOf: [...]}]``: the base requires ``type`` and each branch gives
    it a ``const``, so the branches are disjoint inside the base (alone, each admits objects
    without ``type``, and six such branches subtracting one another multiply past the cap)."""
    names = ["docker", "exec", "ssh", "kube", "vm", "mac"]
    branch = lambda n: {"type": "object", "properties": {  # noqa: E731
        "type": {"const": n}, f"{n}_opts": {"type": "object", "required": ["a"],
                                             "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "string", "maxLength": 5}}}}}
    schema = {"$defs": {"base": {"type": "object", "required": ["type", "name"], "properties": {"name": {"type": "string"}, "type": {"enum": names}}}},
              "allOf": [{"$ref": "#/$defs/base"}, {"oneOf": [branch(n) for n in names]}]}
    out = value_of(schema)
    probes = [{"type": "docker", "name": "x"}, {"type": "docker", "name": "x", "docker_opts": {"a": 1}}, {"type": "exec", "name": "x", "docker_opts": {"a": 1}},
              {"type": "exec", "name": "x", "exec_opts": {"a": -1}}, {"type": "other", "name": "x"}, {"name": "x"}, {"type": "vm"}, {"type": "mac", "name": "", "mac_opts": {"a": 0, "b": "abcdef"}}]
    for probe in probes:
        assert jsonschema.Draft202012Validator(out).is_valid(probe) == jsonschema.Draft202012Validator(schema).is_valid(probe), probe


def test_one_of_branches_closed_to_their_own_keys_are_exactly_one_key():
    """Traefik's middlewares: ``oneOf`` of objects each closed to one optional key. Every pair
    shares ``{}``, so each branch subtracts all the others: inside a branch (closed to ``a``) "a
    key ``b``'s branch does not declare" is "has ``a``" (`one_of._relative_complement`), exactly. The
    result is one object per key with that key required; ``{}`` matches every branch and is out."""
    names = [f"m{i}" for i in range(20)]
    schema = {"type": "object", "oneOf": [{"properties": {n: {"type": "integer"}}, "additionalProperties": False} for n in names]}
    out = value_of(schema)
    assert len(out["anyOf"]) == 20 and all(branch["required"] == [branch_name] for branch, branch_name in zip(out["anyOf"], names))
    for probe in [{}, {"m0": 1}, {"m19": 2}, {"m0": 1, "m1": 1}, {"m0": "x"}, {"zz": 1}]:
        assert jsonschema.Draft202012Validator(out).is_valid(probe) == jsonschema.Draft202012Validator(schema).is_valid(probe), probe


def test_unevaluated_properties_with_a_static_evaluated_set():
    out = value_of({"allOf": [{"properties": {"a": {"type": "integer"}}}], "properties": {"b": {}}, "unevaluatedProperties": False})
    objects = [o for o in out.get("anyOf", [out]) if o.get("type") == "object"]
    assert objects and all(o["additionalProperties"] is False and set(o["properties"]) == {"a", "b"} for o in objects)


def test_draft_7_items_array_is_prefix_items():
    out = value_of({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                    "items": [{"type": "integer"}], "additionalItems": False})
    assert out["prefixItems"] == [{"type": "integer"}] and out["maxItems"] == 1


def test_unique_items_over_a_finite_domain_is_enumerated():
    out = value_of({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True})
    assert sorted(map(json.dumps, out["enum"])) == sorted(map(json.dumps, [[], [True], [False], [True, False], [False, True]]))


def test_property_names_become_declared_names_or_a_pattern():
    names = value_of({"type": "object", "propertyNames": {"enum": ["x", "y"]}, "additionalProperties": {"type": "integer"}})
    assert names["properties"] == {"x": {"type": "integer"}, "y": {"type": "integer"}} and names["additionalProperties"] is False
    pattern = value_of({"type": "object", "propertyNames": {"pattern": "^a"}})
    assert list(pattern["patternProperties"].values()) == [{}] and pattern["additionalProperties"] is False


def test_decimal_multiple_of_over_a_bounded_range_is_an_exact_enum():
    out = value_of({"type": "number", "minimum": 0, "maximum": 0.1, "multipleOf": 0.01})
    from fd_guided.schema.instance import is_multiple

    assert out["enum"] and all(is_multiple(v, 0.01) for v in out["enum"])  # what jsonschema accepts, and only that


def test_excluding_pattern_is_the_exact_complement():
    import re

    pattern = excluding_pattern(["foo", "fo", ""])
    for text, excluded in [("foo", True), ("fo", True), ("", True), ("f", False), ("food", False), ("x", False)]:
        assert (re.search(pattern, text) is None) is excluded, text


def test_ref_chains_are_followed_in_a_loop_and_cycles_are_unsatisfiable():
    chain = {"$defs": {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(3000)}, "$ref": "#/$defs/a0"}
    chain["$defs"]["a3000"] = {"type": "integer"}
    out = value_of(chain)
    assert list(out["$defs"].values()) == [{"type": "integer"}] and out["$ref"] == "#/$defs/n0"
    for cyclic in ({"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}):
        with pytest.raises(InvalidGrammarError, match="admits no value") as caught:
            value_of(cyclic)
        assert caught.value.feature is None


def test_output_is_deterministic():
    schema = {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}], "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}}}
    assert json.dumps(value_of(schema)) == json.dumps(value_of(json.loads(json.dumps(schema))))


def test_unknown_formats_are_refused_unless_annotated():
    with pytest.raises(InvalidGrammarError, match="format 'topic'") as caught:
        value_of({"type": "string", "format": "topic"})
    assert caught.value.feature and caught.value.part.endswith("$.format")
    assert value_of({"type": "string", "format": "topic"}, unknown_formats="annotate") == {"type": "string", "$schema": value_of({"type": "string"})["$schema"]}
    with pytest.raises(InvalidGrammarError, match="format 'uri-template'"):  # jsonschema checks it: never dropped
        value_of({"type": "string", "format": "uri-template"}, unknown_formats="annotate")


def test_the_emitter_never_hands_an_engine_a_keyword_outside_its_set():
    """`check_emitted` refuses (never passes on) a node an engine would silently ignore."""
    from fd_guided.schema.emitted import check_emitted
    from fd_guided.schema.refusal import Refusal

    check_emitted({"$ref": "#/$defs/n0", "$defs": {"n0": {"type": "array", "items": False}}}, "xgrammar")
    for bad in ({"anyOf": [{"type": "integer"}, {"not": {}}]},
                {"$ref": "#/$defs/n0", "$defs": {"n0": {"type": "object", "properties": {"a": {"if": {}}}}}},
                {"type": "string", "allOf": [{"pattern": "a"}]}):
        with pytest.raises(Refusal, match="internal normaliser error"):
            check_emitted(bad, "xgrammar")
    check_emitted({"type": "string", "allOf": [{"pattern": "a"}, {"pattern": "b"}]}, "llguidance")
