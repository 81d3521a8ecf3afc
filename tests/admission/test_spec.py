"""Admission: every request form parses to the right frozen spec; every bad input is refused by name."""
import json

import pydantic
import pytest
from guided_helpers import admit_and_compile

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.spec import COMPACT_SEPARATORS, GrammarSpec, grammar_is_lark

pytestmark = pytest.mark.cpu

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_guided_json_forms_give_the_same_spec():
    as_dict = parse_guided_request({"guided_json": PERSON})
    as_text = parse_guided_request({"guided_json": json.dumps(PERSON, indent=2)})
    via_openai = parse_guided_request({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})
    assert as_dict == as_text == via_openai
    assert as_dict.kind == "json_schema" and as_dict.schema == PERSON
    assert hash(as_dict) == hash(as_text)


def test_property_order_is_preserved():
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}}
    assert list(parse_guided_request({"guided_json": schema}).schema["properties"]) == ["z", "a"]


def test_pydantic_model_class():
    spec = parse_guided_request({"guided_json": Person})
    assert spec.schema["required"] == ["name", "age"]


def test_spec_is_frozen():
    spec = parse_guided_request({"guided_regex": "a+"})
    with pytest.raises(AttributeError):
        spec.source = "b"


@pytest.mark.parametrize(
    "fields, kind",
    [
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"guided_json_object": True}, "json_object"),
        ({"guided_regex": "[a-z]+"}, "regex"),
        ({"guided_choice": ["a", "b"]}, "choice"),
        ({"guided_grammar": 'root ::= "a"'}, "ebnf"),
        ({"guided_grammar": 'start: "a" | "b"'}, "lark"),
        ({"structural_tag": {"structures": [{"begin": "<f>", "schema": PERSON, "end": "</f>"}], "triggers": ["<f"]}}, "structural_tag"),
        ({"response_format": {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": PERSON, "end": "</f>"}], "triggers": ["<f"]}}, "structural_tag"),
    ],
)
def test_each_kind(fields, kind):
    assert parse_guided_request(fields).kind == kind


def test_text_and_empty_requests_are_unconstrained():
    assert parse_guided_request({}) is None
    assert parse_guided_request({"prompt": "hi"}) is None
    assert parse_guided_request({"response_format": {"type": "text"}}) is None


def test_whitespace_options():
    compact = parse_guided_request({"guided_json": PERSON, "disable_any_whitespace": True})
    assert compact.json_format.any_whitespace is False
    assert compact.json_format.separators == COMPACT_SEPARATORS
    assert compact.json_format.max_whitespace_cnt is None
    default = parse_guided_request({"guided_json": PERSON})
    assert default.json_format.any_whitespace and default.json_format.max_whitespace_cnt == GuidedConfig().max_whitespace_cnt
    spaced = parse_guided_request({"guided_json": PERSON, "any_whitespace": False, "separators": [", ", ": "]})
    assert spaced.json_format.separators == (", ", ": ")
    assert compact != default  # options are part of the cache key


def test_strictness_from_openai_flag_and_field():
    loose = parse_guided_request({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": False}}})
    assert loose.json_format.strict is False
    assert parse_guided_request({"guided_json": PERSON, "guided_strict": False}).json_format.strict is False
    assert parse_guided_request({"guided_json": PERSON}).json_format.strict is True


@pytest.mark.parametrize(
    "fields, part, words",
    [
        ({"guided_json": PERSON, "guided_regex": "a"}, "request", "only one kind"),
        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "request", "only one kind"),
        ({"guided_choice": []}, "guided_choice", "at least one"),
        ({"guided_choice": "abc"}, "guided_choice", "list of strings"),
        ({"guided_choice": ["a", 3]}, "guided_choice[1]", "must be a string"),
        ({"guided_json": "{not json"}, "guided_json", "malformed JSON"),
        ({"guided_json": "[1, 2]"}, "guided_json", "must be an object"),
        ({"guided_json": {"type": "strng"}}, "guided_json.type", "not a valid JSON schema"),
        ({"guided_json": {"$ref": "#/$defs/missing"}}, "guided_json", "does not resolve"),
        ({"guided_json": {"$ref": "https://example.com/s.json"}}, "guided_json", "remote references are not fetched"),
        ({"guided_regex": "[a-z"}, "guided_regex", "not a valid regular expression"),
        ({"guided_regex": ""}, "guided_regex", "non-empty"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "must be one of"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema", "missing 'schema'"),
        ({"structural_tag": {"structures": [{"begin": "<f>", "end": "</f>"}]}}, "structural_tag", "triggers"),
        ({"structural_tag": {"structures": [{"begin": "<g>", "end": "</g>"}], "triggers": ["<f"]}}, "structural_tag.structures[0]", "starts with none"),
        ({"guided_json": PERSON, "max_whitespace_cnt": 0}, "max_whitespace_cnt", "positive"),
        ({"guided_json": PERSON, "separators": [";", ":"]}, "separators", "item_separator"),
        ({"guided_json": PERSON, "any_whitespace": "yes"}, "any_whitespace", "boolean"),
    ],
)
def test_rejections_name_the_offending_part(fields, part, words):
    with pytest.raises(InvalidGrammarError) as caught:
        parse_guided_request(fields)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.part == part or error.part.startswith(part + ".")
    assert words in str(error)


@pytest.mark.parametrize(
    "schema, location, feature",
    [
        ({"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}, "$.uniqueItems", "uniqueItems"),
        ({"type": "array", "contains": {"type": "integer"}}, "$.contains", "contains"),
        ({"type": "number", "multipleOf": 0.5}, "$.multipleOf", "multipleOf 0.5"),
        ({"type": "string", "format": "credit-card"}, "$.format", "format 'credit-card'"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "$", "must be absent"),
        ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "$.patternProperties", "patternProperties"),
        ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "$.maxLength", "minLength/maxLength"),
        ({"type": "string", "pattern": "^(a(?!a))+b$"}, "$.pattern", "look-ahead"),
        ({"$defs": {"x": {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}}, "$ref": "#/$defs/x"}, "$.$defs.x.uniqueItems", "uniqueItems"),
    ],
)
def test_keywords_xgrammar_cannot_enforce_are_refused(schema, location, feature):
    with pytest.raises(InvalidGrammarError) as caught:
        parse_guided_request({"guided_json": schema}, GuidedConfig(backend="xgrammar"))
    assert caught.value.part.startswith(f"json schema {location}")
    assert feature in str(caught.value) and caught.value.feature


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
    {"type": "object", "properties": {"a": {}, "b": {}}, "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    {"type": "object", "properties": {"n": {"multipleOf": 2}}},
    {"allOf": [{"type": "object", "properties": {"a": {}}}, {"required": ["a"]}]},
    {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
])
def test_keywords_xgrammar_ignores_are_rewritten_for_it(schema):
    """Once refused, now rewritten into what xgrammar enforces (tests/schema checks the matchers)."""
    parse_guided_request({"guided_json": schema}, GuidedConfig(backend="xgrammar"))


def test_uniqueitems_false_and_integer_multipleof_are_fine():
    parse_guided_request({"guided_json": {"type": "array", "uniqueItems": False}})
    parse_guided_request({"guided_json": {"type": "integer", "multipleOf": 3}})


def test_structural_tag_schema_keywords_are_checked():
    bad = {"structures": [{"begin": "<f>", "schema": {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}, "end": "</f>"}], "triggers": ["<f"]}
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        admit_and_compile({"structural_tag": bad})  # neither engine enforces uniqueItems


@pytest.mark.parametrize("grammar", ["start: a b\nb: ", "root ::= missing_rule"])
def test_grammar_syntax_errors_fail_the_compile_with_the_part_named(grammar):
    # Grammar syntax is judged by the engines' parsers, which run in compile workers, not at admission.
    with pytest.raises(InvalidGrammarError) as caught:
        admit_and_compile({"guided_grammar": grammar})
    assert caught.value.part == "guided_grammar"


def test_lark_detection():
    assert grammar_is_lark('start: "a"\nfoo: /b+/')
    assert not grammar_is_lark('root ::= "a" | b\nb ::= "c"')
    assert not grammar_is_lark('root ::= "a:b"')


def test_unknown_backend_is_a_typed_error():
    from fd_guided import BackendNotFoundError

    with pytest.raises(BackendNotFoundError, match="no guided-decoding backend named 'nope'"):
        parse_guided_request({"guided_regex": "a"}, GuidedConfig(backend="nope"))


def test_spec_rejects_unknown_kind():
    with pytest.raises(InvalidGrammarError):
        GrammarSpec("xml", "<a/>")


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_properties_named_like_keywords_and_root_refs_are_admitted(backend):
    schema = {"type": "object", "properties": {"format": {"type": "object", "properties": {"a": {"type": "integer"}}},
                                                 "minLength": {"type": "integer"}, "pattern": {"type": "string"},
                                                 "child": {"$ref": "#"}}}
    spec = parse_guided_request({"guided_json": schema}, GuidedConfig(backend=backend))
    assert spec.schema == schema


class BrokenChecker:
    name = "broken"

    @classmethod
    def check(cls, spec):
        raise TypeError("unhashable type: 'dict'")


def test_a_checker_bug_fails_only_that_request_with_a_typed_error():
    from fd_guided.spec import check_with_backend

    with pytest.raises(InvalidGrammarError, match="broken checker could not check") as caught:
        check_with_backend(BrokenChecker, parse_guided_request({"guided_regex": "a+"}))
    assert caught.value.part == "guided_regex"


# Meta-validation: jsonschema-rs may only speed up acceptance; the verdict and the message stay
# those of `jsonschema` (fd_guided.admission.meta._fast_meta_valid).
META_VERDICT_CASES = [
    ({"type": "object", "properties": {"v": {"type": "string", "pattern": "^[a-z]+$"}}}, None),
    ({"type": "object", "default": {"pattern": "("}, "properties": {"pattern": {"type": "string"}}}, None),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {"type": "integer"}}, "$ref": "#/definitions/a"}, None),
    ({"type": "strng"}, "guided_json.type"),
    ({"type": "array", "minItems": -1}, "guided_json.minItems"),
    ({"type": "object", "required": "name"}, "guided_json.required"),
    # Valid ECMA-262 but not Python `re` (named group, \p class): jsonschema-rs accepts these,
    # `jsonschema` (and our output validation) cannot, so they are refused as before.
    ({"type": "string", "pattern": "^(?<year>[0-9]{4})$"}, "guided_json.pattern"),
    ({"type": "object", "patternProperties": {"^[\\p{Letter}]+$": {"type": "integer"}}}, "guided_json.patternProperties"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}, "guided_json.properties.a.pattern"),
]


def _admission_verdict(schema):
    from fd_guided.admission import cache

    cache.PARSED.clear()  # each verdict decided afresh, not remembered from the previous call
    cache.CHECKED.clear()
    try:
        parse_guided_request({"guided_json": schema}, GuidedConfig(backend="llguidance"))
    except InvalidGrammarError as error:
        return error.part, str(error)
    return None


@pytest.mark.parametrize("schema, refused_part", META_VERDICT_CASES)
def test_fast_meta_validation_keeps_jsonschemas_verdict(schema, refused_part, monkeypatch):
    from fd_guided.admission import meta as meta_module

    assert meta_module._jsonschema_rs is not None, "jsonschema-rs is a dependency: the fast path must be tested"
    fast = _admission_verdict(schema)
    monkeypatch.setattr(meta_module, "_jsonschema_rs", None)  # jsonschema alone
    assert _admission_verdict(schema) == fast
    if refused_part is None:
        assert fast is None
    else:
        assert fast[0].startswith(refused_part) and "not a valid JSON schema" in fast[1]


def test_fast_meta_validation_never_accepts_what_jsonschema_refuses():
    import jsonschema

    from fd_guided.admission.meta import _fast_meta_valid
    from corpus import SCHEMAS

    schemas = list(SCHEMAS.values()) + [schema for schema, _ in META_VERDICT_CASES]
    for schema in schemas:
        if _fast_meta_valid(schema):
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)


def nested_arrays(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema, "maxItems": 1}
    return schema


DEEP_REQUESTS = {  # built in the test: json.dumps cannot serialise 5000 levels either
    "dict": lambda: {"guided_json": nested_arrays(5000)},
    "text-overflowing-json": lambda: {"guided_json": '{"items":' * 5000 + "{}" + "}" * 5000},
    "text": lambda: {"guided_json": json.dumps(nested_arrays(200))},  # parses, but deeper than the limit
    "structural_tag": lambda: {"structural_tag": {"structures": [{"begin": "<f>", "schema": nested_arrays(300), "end": "</f>"}],
                                                  "triggers": ["<f>"]}},
}


@pytest.mark.parametrize("name", DEEP_REQUESTS)
def test_documents_nested_too_deeply_are_refused_not_crashing(name):
    with pytest.raises(InvalidGrammarError, match="nested more than 128 levels deep"):
        parse_guided_request(DEEP_REQUESTS[name]())


def test_cyclic_schema_is_refused():
    schema: dict = {"type": "array"}
    schema["items"] = schema
    with pytest.raises(InvalidGrammarError, match="nested more than"):
        parse_guided_request({"guided_json": schema})


def test_deep_but_reasonable_schema_is_admitted():
    spec = parse_guided_request({"guided_json": nested_arrays(60)})  # 61 levels; SchemaStore's deepest: 27
    assert spec.kind == "json_schema"
