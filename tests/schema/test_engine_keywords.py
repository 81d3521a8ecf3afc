"""Every hole of issue #9 §4/§5, and every engine limit `capabilities.TABLE` names, on real matchers.

For each case and each backend the schema is either refused at admission with the feature named,
or compiled and then: every `good` text is a complete match and every `bad` one is not. `auto`
must compile them all (it routes to the engine that enforces the schema).
"""
import json

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request

from engine_probe import accepts, backend, spec_for

pytestmark = pytest.mark.cpu
BACKENDS = ("xgrammar", "llguidance", "auto")

# (name, schema, good texts, bad texts)
CASES = [
    ("optional group with a counted repeat", {"type": "string", "pattern": "^a(b[0-9]{1,6})?$"}, ['"a"', '"ab12"'], ['"a12"', '"ab"']),
    ("decimal pattern", {"type": "string", "pattern": r"^[0-9]{1,4}(\.[0-9]{1,2})?$"}, ['"9946"', '"12.5"'], ['"99460"', '"1."']),
    ("format time", {"type": "string", "format": "time"}, ['"08:30:06Z"', '"23:20:50.52+01:00"'], ['"12:00:00"', '"24:00:00Z"', '"08:30:06 PST"']),
    ("format date-time", {"type": "string", "format": "date-time"}, ['"2024-02-29T10:00:00Z"'], ['"2023-02-29T10:00:00Z"', '"2024-01-01T10:00:00"']),
    ("integer multipleOf 2000", {"type": "integer", "multipleOf": 2000}, ["4000", "0"], ["2001", "-100"]),
    ("multipleOf beside a range", {"type": "integer", "minimum": 0, "multipleOf": 12}, ["24", "0"], ["5", "-12"]),
    ("minProperties past 2^32", {"type": "object", "minProperties": 4294967297}, [], ['{"a":1}', "{}"]),
    ("pattern beside a native format", {"type": "string", "format": "uri", "pattern": "^https:"}, ['"https://a.b/c"'], ['"http://a.b/c"']),
    ("enum of strings with type object", {"enum": ["a", {"k": 1}], "type": "object"}, ['{"k":1}'], ['"a"']),
    ("untyped minimum", {"minimum": 1.1}, ["1.5", '"x"'], ["0.6"]),
    ("untyped maxLength", {"maxLength": 2}, ['"fo"', "3"], ['"foo"']),
    ("untyped format", {"format": "date"}, ['"2020-01-31"', "1"], ['"2020-01-32"']),
    ("integer bound past 2^53", {"type": "integer", "maximum": 9007199254740999}, ["9007199254740992"], ["9007199254741000", "9007199254741001"]),
    ("maxLength 256 with escapes", {"type": "string", "maxLength": 256}, ['"a\\"b"', '"<a href=\\"x\\">"'], ['"' + "x" * 257 + '"']),
    ("not", {"type": "integer", "not": {"enum": [1, 2]}}, ["3", "0"], ["1", "2", '"x"']),
    ("if/then/else", {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer"}}, "required": ["k"],
                      "if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["n"]}},
     ['{"k":"a","n":1}', '{"k":"b"}'], ['{"k":"a"}']),
    ("overlapping oneOf", {"oneOf": [{"type": "integer", "minimum": 5}, {"type": "integer", "maximum": 10}]}, ["3", "11"], ["7"]),
    # Nine branches, only the two integer ranges may overlap: the subtraction stays inside that pair.
    ("oneOf with one overlapping pair among many", {"oneOf": [{"const": c} for c in "abcdefg"] + [{"type": "integer", "minimum": 5},
                                                                                                {"type": "integer", "maximum": 10}]},
     ['"a"', '"g"', "3", "11"], ["7", '"h"', "5.5"]),
    ("negative look-ahead at the start", {"type": "string", "pattern": "^(?!(all|none)$)[a-z]+$"},
     ['"al"', '"alls"', '"nonex"', '"x"'], ['"all"', '"none"', '"A"', '""']),
    ("look-ahead prefix", {"type": "string", "pattern": "^(?!org\\.)[a-z.]+$"}, ['"or.g"', '"orgx"'], ['"org.x"', '"org."']),
    # Overlapping patternProperties (llguidance needs disjoint ones): one pattern per region of
    # keys the same patterns match, with the intersection of their schemas.
    ("overlapping patternProperties", {"type": "object", "patternProperties": {".*": {"type": "integer"}, "Id": {"minimum": 5}}},
     ['{"x":1}', '{"Id":5}', '{"userId":7,"a":-1}', "{}"], ['{"Id":3}', '{"userIdx":1}', '{"x":"s"}', '{"Id":"s"}']),
    ("literal patternProperties (disjoint by their automata)", {"type": "object", "patternProperties": {
        "^WebOptimizer$": {"type": "integer"}, "^webOptimizer$": {"type": "string"}}},
     ['{"WebOptimizer":1}', '{"webOptimizer":"x"}'], ['{"WebOptimizer":"x"}', '{"webOptimizer":1}', '{"other":1}']),
    # oneOf over a recursive definition: the branches are proved disjoint by their types, read
    # through the $refs, where intersecting them would have to expand the recursion
    ("oneOf of a recursive definition and an array of it",
     {"$defs": {"node": {"type": "object", "properties": {"kids": {"oneOf": [{"$ref": "#/$defs/nodes"}, {"type": "boolean"}]}}},
                "nodes": {"oneOf": [{"type": "array", "items": {"$ref": "#/$defs/node"}}, {"$ref": "#/$defs/node"}]}},
      "$ref": "#/$defs/nodes"},
     ['{"kids":[{}]}', '[{"kids":{}},{}]', "[]", '{"kids":true}'], ['"x"', '{"kids":1}', "[1]"]),
    ("format regex", {"type": "string", "format": "regex"}, ['"^a+$"', '"(a|b)*[0-9]{2,3}"', '"[^.]+$"'],
     ['"(a"', '"a{2,1}"', '"[z-a]"', '"(?<n>a)"']),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, ['{"a":1,"b":2}', '{"b":2}', "{}"], ['{"a":1}']),
    ("required name not declared", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"],
                                    "additionalProperties": {"type": "string"}}, ['{"b":"x"}'], ['{"b":1}', '{"a":1}']),
    # Open item domains: the runtime guard (fd_guided.unique_guard) around the engine's matcher.
    ("uniqueItems over strings", {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
     ['["a","b"]', '["a","ab","b"]', "[]", '["\\n","a\\n"]'], ['["a","a"]', '["a","b","a"]', '["a","\\u0061"]']),
    ("uniqueItems over numbers", {"type": "array", "items": {"type": "number"}, "uniqueItems": True},
     ["[1,2]", "[1,1.5,10]", "[0,0.5]"], ["[1,1.0]", "[1,10,1]", "[1e2,100]", "[0,-0]"]),
    ("uniqueItems nested under $ref and anyOf", {"$defs": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                                                "type": "object", "properties": {"t": {"anyOf": [{"$ref": "#/$defs/tags"}, {"type": "null"}]},
                                                                                 "u": {"type": "array", "items": {"type": "string"}}}},
     ['{"t":["a","b"],"u":["x","x"]}', '{"t":null}'], ['{"t":["a","a"]}', '{"u":[],"t":["b","b"]}']),
    ("uniqueItems over objects with an open last property",
     {"type": "array", "uniqueItems": True, "items": {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "string"}}}},
     ['[{"k":"a","v":"x"},{"k":"a","v":"y"}]', '[{},{"k":"a"},{"k":"b","v":"x"}]', '[{"k":"a"},{"k":"a","v":""}]'],
     ['[{"k":"a","v":"x"},{"k":"a","v":"x"}]', '[{},{}]', '[{"k":"b"},{"v":"1"},{"k":"b"}]']),
    ("uniqueItems over booleans", {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, ["[true,false]", "[]"], ["[true,true]"]),
    ("contains with maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 3, "contains": {"minimum": 5}},
     ["[5]", "[1,9]"], ["[1,2]", "[]"]),
    ("propertyNames pattern", {"type": "object", "propertyNames": {"pattern": "^x-"}, "additionalProperties": {"type": "integer"}},
     ['{"x-a":1}', "{}"], ['{"y":1}', '{"x-a":"s"}']),
    ("unevaluatedProperties", {"allOf": [{"properties": {"a": {"type": "integer"}}}], "unevaluatedProperties": False},
     ['{"a":1}'], ['{"a":1,"b":2}', '{"b":2}']),
    ("decimal multipleOf in a range", {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}, ["0.75", "1"], ["0.3", "1.25"]),
    # A definition whose only leaf is a weak one the engine cannot take emits nothing: it must be
    # dropped, never handed over as {"not": {}}, which xgrammar reads as any value (SchemaStore Avro).
    ("oneOf of $refs, one a string with not $ref enum",
     {"$schema": "http://json-schema.org/draft-06/schema#",
      "definitions": {"primitive": {"type": "string", "enum": ["int", "long"]},
                      "custom": {"not": {"$ref": "#/definitions/primitive"}, "type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                      "union": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
      "oneOf": [{"$ref": "#/definitions/primitive"}, {"$ref": "#/definitions/custom"}, {"$ref": "#/definitions/union"}]},
     ['"int"', '["long"]'], ['"{::"', '"in t"', "{}", '[{"a":1}]']),
    ("property named like a keyword", {"type": "object", "properties": {"enum": {"type": "integer"}, "format": {"type": "string"}},
                                       "required": ["enum"]}, ['{"enum":1}'], ['{"enum":"x"}', "{}"]),
]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_hole_is_enforced_or_refused(name, case):
    title, schema, good, bad = case
    try:
        spec = spec_for(name, schema)
    except InvalidGrammarError as refused:
        assert refused.feature, f"{title}: refused without naming a feature: {refused}"
        assert name != "auto" or title == "minProperties past 2^32", f"auto must compile {title}: {refused}"
        return
    for text in good:
        assert accepts(name, spec, text), (title, name, text)
    for text in bad:
        assert not accepts(name, spec, text), (title, name, text)


@pytest.mark.parametrize("fields", [{"guided_json": False}, {"guided_json": {"not": {}}},
                                    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": False}}}])
def test_false_schemas_admit_nothing_and_are_refused(fields):
    with pytest.raises(InvalidGrammarError, match="admits no value") as caught:
        parse_guided_request(fields)
    assert caught.value.feature is None  # a request error, not a missing feature


@pytest.mark.parametrize("keyword", ["enum", "const", "default", "examples"])
def test_remote_ref_under_a_property_named_like_a_data_keyword(keyword):
    schema = {"type": "object", "properties": {keyword: {"$ref": "https://example.com/x.json"}}}
    with pytest.raises(InvalidGrammarError, match="remote references"):
        parse_guided_request({"guided_json": schema})


@pytest.mark.parametrize("name", ("xgrammar", "llguidance"))
def test_format_style_structural_tags_go_through_the_normaliser(name):
    tag = {"format": {"type": "json_schema", "json_schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        parse_guided_request({"structural_tag": tag}, GuidedConfig(backend=name))
    dated = {"format": {"type": "json_schema", "json_schema": {"type": "string", "format": "date"}}}
    spec = parse_guided_request({"structural_tag": dated, "disable_any_whitespace": True}, GuidedConfig(backend=name))
    assert accepts(name, spec, '"2024-02-29"') and not accepts(name, spec, '"2023-02-29"')


@pytest.mark.parametrize("name", ("xgrammar", "llguidance"))
def test_strict_false_is_json_schema_semantics(name):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tuple_schema = {"type": "array", "prefixItems": [{"type": "integer"}]}
    strict, loose = spec_for(name, schema), spec_for(name, schema, guided_strict=False)
    assert not accepts(name, strict, '{"a":1,"b":"x"}') and accepts(name, loose, '{"a":1,"b":"x"}')
    assert not accepts(name, spec_for(name, tuple_schema), "[1,2]") and accepts(name, spec_for(name, tuple_schema, guided_strict=False), '[1,"x"]')


def test_any_order_where_xgrammar_can():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"]}
    ordered, free = spec_for("xgrammar", schema), spec_for("xgrammar", schema, guided_any_order=True)
    assert not accepts("xgrammar", ordered, '{"b":"x","a":1}') and accepts("xgrammar", free, '{"b":"x","a":1}')
    assert not accepts("xgrammar", free, '{"b":"x"}')
    with pytest.raises(InvalidGrammarError, match="schema order"):
        spec_for("llguidance", schema, guided_any_order=True)
    assert json.loads(json.dumps(backend("auto").compile(free).backend_name)) == "xgrammar"


@pytest.mark.parametrize("name", BACKENDS)
def test_the_schema_true_is_any_json_value(name):
    # Default layout: xgrammar's any-value grammar keeps ", " and ": " even under compact separators.
    spec = parse_guided_request({"guided_json": True}, GuidedConfig(backend=name))
    assert all(accepts(name, spec, text) for text in ('{"a":[1,null]}', '"s"', "3", "[]"))


def test_xgrammar_takes_integral_enum_numbers_in_every_decimal_spelling():
    """1.0 equals 1 in JSON Schema; xgrammar writes enum numbers in one spelling, so they are
    given as one-value ranges (exact: the neighbours, 2^53 + 1 and longer fractions stay out)."""
    spec = spec_for("xgrammar", {"enum": [0, 1, -2, 9007199254740992, 2.5, "a"]})
    for text in ("0", "0.0", "1.00", "-2.0", "9007199254740992.0", "2.5", '"a"'):
        assert accepts("xgrammar", spec, text), text
    for text in ("-1", "1.01", "1.0000001", "2", "9007199254740993", "9007199254740991", "2.0", '"b"'):
        assert not accepts("xgrammar", spec, text), text
    nested = spec_for("xgrammar", {"enum": [[0, "x"], [[1]]]})
    for text in ('[0,"x"]', '[0.0,"x"]', "[[1.0]]", "[[1]]"):
        assert accepts("xgrammar", nested, text), text
    for text in ('[0,"y"]', '[0,"x",0]', "[0]", "[[1],[1]]", "[[2]]", "[]"):
        assert not accepts("xgrammar", nested, text), text


def test_a_declared_key_its_patterns_settle_leaves_the_patterns():
    """``properties: {basic: X}`` beside ``patternProperties: {".*": X}``, X recursive: llguidance
    would intersect the two for ``basic`` itself and cannot through the recursion ("circular
    references with sibling keys", WashingtonPost's promo_items). The key leaves the pattern
    (the same schema: nothing is lost) and the grammar compiles and enforces both."""
    node = {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "string"}]}
    schema = {"$defs": {"node": {"type": "object", "properties": {"basic": node}, "patternProperties": {".*": node},
                                 "additionalProperties": False}}, "$ref": "#/$defs/node"}
    spec = spec_for("llguidance", schema)
    assert accepts("llguidance", spec, '{"basic":{"x":"a"},"other":"b"}')
    assert accepts("llguidance", spec, '{"basic":"a"}')
    assert not accepts("llguidance", spec, '{"basic":1}')
    assert not accepts("llguidance", spec, '{"other":{"basic":2}}')


def test_a_string_whose_patterns_share_no_string_is_left_out():
    """``format: uri`` beside ``^git@heroku\\.com:...$`` (no URI starts so): llguidance refuses
    a grammar whose patterns have nothing in common, so the emitter leaves the string out (an
    optional property then cannot appear) instead of failing the compile (Heroku's app schema)."""
    git = {"type": "string", "format": "uri", "pattern": "^git@heroku\\.com:[a-z]+\\.git$"}
    schema = {"$defs": {"git": git}, "type": "object",
              "properties": {"git_url": {"$ref": "#/$defs/git"}, "repo": {"$ref": "#/$defs/git"}, "name": {"type": "string"}}}
    spec = spec_for("llguidance", schema)
    assert accepts("llguidance", spec, '{"name":"x"}')
    assert not accepts("llguidance", spec, '{"git_url":"git@heroku.com:app.git"}')
