"""The llguidance backend: what its checker accepts is really enforced, what it refuses is named.

Every probe goes through a real LLMatcher (no mocks): the valid instance must be a complete match
(the stop token is accepted after it) and the invalid one must not be.
"""
import json

import pytest
from guided_helpers import admit_and_compile
import torch

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.backends.llguidance import LLGuidanceBackend
from fd_guided.kernels import allocate_pinned_bitmask
from fd_guided.spec import GrammarSpec
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

LLG = GuidedConfig(backend="llguidance")
COMPACT = {"disable_any_whitespace": True}


@pytest.fixture(scope="module")
def backend():
    tokenizer = load_tokenizer("deepseek")
    backend = LLGuidanceBackend(tokenizer, vocab_size=tokenizer.padded_vocab_size)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def qwen_backend():
    tokenizer = load_tokenizer("qwen")
    backend = LLGuidanceBackend(tokenizer, vocab_size=tokenizer.padded_vocab_size)
    yield backend
    backend.close()


def accepts(backend, spec, text: str) -> bool:
    """Feed `text` through a fresh matcher; True iff every token and then a stop token is accepted."""
    grammar = backend.new_grammar(backend.compile(spec))
    for token in backend.tokenizer.encode(text):
        if not grammar.accept_token(token):
            return False
    return grammar.accept_token(backend.stop_token_ids[0]) and grammar.is_terminated()


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT4 = "http://json-schema.org/draft-04/schema#"

# (schema, an instance that must be accepted, an instance that must be rejected)
ENFORCED = [
    # what xgrammar enforces too
    ({"type": "integer", "multipleOf": 3}, 9, 4),
    ({"type": "string", "format": "email"}, "a@b.co", "nope"),
    ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "123"),
    ({"type": "string", "format": "ipv4"}, "10.2.3.4", "10.02.3.4"),
    ({"type": "string", "format": "date"}, "2024-02-29", "2023-02-29"),  # llguidance alone admits it
    ({"type": "string", "format": "date-time"}, "2024-02-29T10:00:00Z", "2023-02-29T10:00:00Z"),
    ({"type": "string", "format": "date", "pattern": "^2024"}, "2024-01-31", "2024-02-30"),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}, {"a": 1}, {}),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, [1], [1, 2]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [1, 2], [1, 2, 3, 4]),
    ({"type": "integer", "exclusiveMinimum": 0}, 1, 0),
    ({"type": "number", "minimum": 1.5}, 2.0, 1.0),
    ({"type": "string", "minLength": 2, "maxLength": 4}, "abc", "abcdef"),
    ({"type": "string", "maxLength": 2}, "😀😀", "😀😀😀"),  # code points, as Python counts
    ({"type": "string", "pattern": "^[a-z]+$"}, "abc", "aB"),
    ({"type": "string", "pattern": "b"}, "abc", "ac"),  # unanchored, as re.search
    ({"enum": ["a", 1, None]}, None, "b"),
    ({"const": {"a": [1]}}, {"a": [1]}, {"a": [2]}),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 1, None),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1}, {"a": 1, "b": 1}),  # strict by default
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}, {}),
    ({"$defs": {"a": {"type": "integer"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}, {"x": 1}, {"x": "s"}),
    ({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}, {"k": {"k": {}}}, {"k": {"j": {}}}),
    # what xgrammar cannot enforce and llguidance does
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}, {"a": 1}, {}),
    ({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}]}, 5, 10),
    ({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "additionalProperties": False}]}, {"b": 1}, {"a": 1}),
    ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}, {"x-a": 1}, {"y": 1}),
    ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}}, {"x-a": 1}, {"x-a": "s"}),
    ({"type": "object", "properties": {"ab": {"type": "integer"}}, "patternProperties": {"^a": {"minimum": 5}}}, {"ab": 7}, {"ab": 1}),
    ({"type": "number", "multipleOf": 0.5}, 2.5, 2.25),
    ({"type": "integer", "format": "int32"}, 7, "7"),  # format on a non-string is an annotation
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "minProperties": 1}, {"b": 1}, {}),
    ({"$schema": DRAFT7, "type": "array", "items": [{"type": "integer"}], "additionalItems": False}, [1], [1, 2]),
    ({"$schema": DRAFT7, "type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}}, [1, "a"], [1, 2]),
    ({"$schema": DRAFT4, "type": "integer", "minimum": 1, "exclusiveMinimum": True}, 2, 1),
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"const": "b"}, "n": {"type": "integer"}}, "required": ["k", "n"]}]},
     {"k": "b", "n": 1}, {"k": "b"}),
    # what neither engine enforces natively, rewritten (fd_guided.schema)
    ({"not": {"type": "integer"}}, "x", 1),
    ({"if": {"type": "integer"}, "then": {"minimum": 1}}, 2, 0),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, {"ab": 1}, {"b": 1}),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1, "b": 2}, {"a": 1}),
    ({"$schema": DRAFT7, "type": "object", "dependencies": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    ({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}, {"a": 1}, {"b": 1}),
    ({"type": "string", "pattern": "^[[:alpha:]]+$"}, "a]", "a"),  # Python reads a class [[:alph] then "]+"
    # character classes mean what they mean to Python's re
    ({"type": "string", "pattern": r"^\S+$"}, "ab", "a\u001cb"),
    ({"type": "string", "pattern": r"^\W+$"}, "!?", "é"),
    ({"type": "string", "pattern": r"^\D$"}, "x", "٣"),
    ({"type": "string", "pattern": r"^[^\d]$"}, "x", "٣"),
    ({"type": "string", "pattern": r"^\w+$"}, "abc_1", "a-b"),
]


@pytest.mark.parametrize("schema, good, bad", ENFORCED, ids=[json.dumps(s)[:50] for s, _, _ in ENFORCED])
def test_every_accepted_keyword_is_enforced(backend, schema, good, bad):
    spec = parse_guided_request({"guided_json": schema, **COMPACT}, LLG)  # the checker lets it through
    assert accepts(backend, spec, compact(good))
    assert not accepts(backend, spec, compact(bad))


REFUSED = [
    ({"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    ({"type": "string", "format": "uri-template"}, "format 'uri-template'"),
    ({"type": "string", "format": "int32"}, "format 'int32'"),
    ({"type": "number", "multipleOf": 0.1}, "multipleOf 0.1"),
    ({"type": "string", "pattern": "^(b(?=a))+a+$"}, "look-ahead"),  # inside a repetition: refused
    ({"type": "integer", "enum": [9007199254740993]}, "integers beyond"),
    ({"type": "object", "patternProperties": {"^a": {}, "b$": {}, "c": {}, "d": {}, "e": {}}}, "patternProperties"),  # more than 4 overlapping
    # regions whose patterns llguidance could not prove disjoint at compile (measured): refused at admission
    ({"type": "object", "patternProperties": {".*": {"type": "integer"}, "additionalProperties": {"minimum": 5}}}, "too long for llguidance"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": {}, "minProperties": 2}, "minProperties"),
]


@pytest.mark.parametrize("schema, feature", REFUSED, ids=[name for _, name in REFUSED])
def test_refused_features_are_named(schema, feature):
    with pytest.raises(InvalidGrammarError, match=feature.replace("(", r"\(")) as caught:
        parse_guided_request({"guided_json": schema}, LLG)
    assert caught.value.feature


def test_lenient_cannot_be_switched_on_from_inside_the_schema():
    schema = {"type": "array", "x-guidance": {"lenient": True, "coerce_one_of": True}, "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        parse_guided_request({"guided_json": schema}, LLG)


def test_syntax_errors_have_no_feature():
    with pytest.raises(InvalidGrammarError) as caught:
        parse_guided_request({"guided_regex": "(unclosed"}, LLG)
    assert caught.value.feature is None and caught.value.part == "guided_regex"
    with pytest.raises(InvalidGrammarError) as caught:
        admit_and_compile({"guided_grammar": "root ::= missing_rule"}, "llguidance")
    assert caught.value.feature is None


def test_guided_regex_gets_pythons_exact_reading():
    from fd_guided.schema import regex_for_engine

    assert regex_for_engine("llguidance", r"^a\.b[\]x]$") == r"a\x{2e}b[\x{5d}x]"
    assert regex_for_engine("llguidance", r"\d+") == "[0-9]+"  # ASCII: a subset of Python's Unicode \d
    assert regex_for_engine("llguidance", r"\S").startswith("[\\x{0}-\\x{8}\\x{e}-\\x{1b}")  # Python's exact set
    with pytest.raises(InvalidGrammarError, match="matches no string"):
        regex_for_engine("llguidance", r"[^\s\S]")  # llguidance's own negation admitted U+E000 here


def test_whitespace_is_bounded_by_default(backend):
    spec = parse_guided_request({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}, LLG)
    assert accepts(backend, spec, '{ "a" : 1 }')
    assert accepts(backend, spec, '{\n "a": 1\n}')
    assert not accepts(backend, spec, "{" + " " * 3 + '"a":1}')
    wider = parse_guided_request({"guided_json": {"type": "array"}, "max_whitespace_cnt": 4}, LLG)
    assert accepts(backend, wider, "[    1]") and not accepts(backend, wider, "[     1]")


def test_compact_and_custom_separators(backend):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    spec = parse_guided_request({"guided_json": schema, **COMPACT}, LLG)
    assert accepts(backend, spec, '{"a":1,"b":2}') and not accepts(backend, spec, '{"a": 1, "b": 2}')
    spaced = parse_guided_request({"guided_json": schema, "any_whitespace": False, "separators": [", ", ": "]}, LLG)
    assert accepts(backend, spaced, '{"a": 1, "b": 2}') and not accepts(backend, spaced, '{"a":1,"b":2}')


def test_strict_false_allows_undeclared_properties(backend):
    spec = parse_guided_request({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}}, "guided_strict": False, **COMPACT}, LLG)
    assert accepts(backend, spec, '{"a":1,"b":"x"}')


def test_json_object_regex_choice_and_grammars(backend):
    obj = parse_guided_request({"response_format": {"type": "json_object"}}, LLG)
    assert accepts(backend, obj, '{"x": [1, {"y": null}]}') and not accepts(backend, obj, "[1]")
    regex = parse_guided_request({"guided_regex": r"[a-z]{2}\d"}, LLG)
    assert accepts(backend, regex, "ab1") and not accepts(backend, regex, "ab٣")  # \d as an ASCII subset
    choices = ["a\x00f", 'say "hi"', "back\\slash", "是", "tab\tx", "emoji 😀"]
    choice = parse_guided_request({"guided_choice": choices}, LLG)
    assert all(accepts(backend, choice, c) for c in choices) and not accepts(backend, choice, "a\x0f")
    lark = parse_guided_request({"guided_grammar": 'start: "hi " NAME\nNAME: /[a-z]{2,4}/'}, LLG)
    assert accepts(backend, lark, "hi bob") and not accepts(backend, lark, "hi b")
    ebnf = parse_guided_request({"guided_grammar": 'root ::= [0-9]+ ("." [0-9]+)?'}, LLG)
    assert accepts(backend, ebnf, "3.14") and not accepts(backend, ebnf, "3.")


def test_structural_tag_legacy_form(backend):
    spec = parse_guided_request({"structural_tag": {
        "structures": [{"begin": "<f>", "schema": {"type": "object", "properties": {"c": {"enum": ["x"]}}, "required": ["c"]}, "end": "</f>"}],
        "triggers": ["<f"]}}, LLG)
    assert accepts(backend, spec, 'free text <f>{"c": "x"}</f> more')
    assert not accepts(backend, spec, 'text <f>{"c": "y"}</f>')
    assert not accepts(backend, spec, 'text <f>{"c":     "x"}</f>')  # whitespace bound inside the tag


def test_rejected_token_leaves_the_state_unchanged(backend):
    spec = parse_guided_request({"guided_regex": "(yes|no)"}, LLG)
    grammar = backend.new_grammar(backend.compile(spec))
    tokenizer = backend.tokenizer
    assert not grammar.accept_token(tokenizer.encode("maybe")[0])
    assert not grammar.accept_token(backend.stop_token_ids[0])  # incomplete match: the stop token is refused
    assert not grammar.accept_token(backend.vocab_size + 5)
    for token in tokenizer.encode("yes"):
        assert grammar.accept_token(token)
    assert not grammar.is_terminated()
    assert grammar.accept_token(backend.stop_token_ids[0]) and grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    grammar.reset()
    assert grammar.accept_token(tokenizer.encode("no")[0])


def _allowed(bitmask, row, vocab_size):
    bits = bitmask[row].numpy().view("uint8")
    import numpy as np

    return np.nonzero(np.unpackbits(bits, bitorder="little")[:vocab_size])[0]


@pytest.mark.parametrize("name", ["deepseek", "qwen"])
def test_padded_vocab_and_engine_stop_tokens(name):
    tokenizer = load_tokenizer(name)
    width = tokenizer.padded_vocab_size + 256  # padded wider than the model's own padding
    stops = list(tokenizer.eos_token_ids)
    backend = LLGuidanceBackend(tokenizer, vocab_size=width, stop_token_ids=stops)
    spec = parse_guided_request({"guided_json": {"type": "string", "maxLength": 3}}, LLG)
    grammar = backend.new_grammar(backend.compile(spec))
    bitmask = allocate_pinned_bitmask(2, width)
    grammar.fill_bitmask(bitmask, 1)
    allowed = _allowed(bitmask, 1, width)
    assert len(allowed) > 10 and allowed.max() < tokenizer.vocab_size
    assert not set(tokenizer.special_token_ids()) & set(allowed.tolist())
    assert (bitmask[0] == -1).all()  # other rows untouched
    for token in tokenizer.encode('"ab"'):
        assert grammar.accept_token(token)
    grammar.fill_bitmask(bitmask, 1)
    assert sorted(_allowed(bitmask, 1, width).tolist()) == sorted(stops)
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        LLGuidanceBackend(tokenizer, vocab_size=1000)


def test_parallel_fill_matches_serial_fill(backend):
    config = GuidedConfig(backend="llguidance", parallel_fill_min_rows=2, fill_threads=2)
    parallel = LLGuidanceBackend(backend.tokenizer, vocab_size=backend.vocab_size, config=config)
    specs = [parse_guided_request(fields, LLG) for fields in (
        {"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        {"guided_regex": "[0-9]{3}"}, {"guided_choice": ["red", "green"]}, {"response_format": {"type": "json_object"}})]
    grammars = [parallel.new_grammar(parallel.compile(spec)) for spec in specs]
    rows = [3, 0, 2, 1]
    serial = allocate_pinned_bitmask(4, backend.vocab_size)
    for grammar, row in zip(grammars, rows):
        grammar.fill_bitmask(serial, row)
    batched = allocate_pinned_bitmask(4, backend.vocab_size)
    parallel.fill_bitmasks(grammars, batched, rows)
    assert torch.equal(serial, batched)


def test_qwen_tiktoken_vocabulary(qwen_backend):
    spec = parse_guided_request({"guided_regex": "(yes|no)"}, LLG)
    assert accepts(qwen_backend, spec, "yes") and not accepts(qwen_backend, spec, "maybe")
    schema = parse_guided_request({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}, LLG)
    assert accepts(qwen_backend, schema, '{"a": 12}')
    assert qwen_backend.stop_token_ids == load_tokenizer("qwen").eos_token_ids


def test_compile_errors_are_invalid_grammar(backend):
    fmt = parse_guided_request({"guided_json": {}}, LLG).json_format
    with pytest.raises(InvalidGrammarError, match="admits no value"):
        backend.compile(GrammarSpec("json_schema", '{"type":"string","const":"x","pattern":"^y$"}', fmt))


def test_serialize_round_trip(backend):
    spec = parse_guided_request({"guided_regex": "[ab]{2}"}, LLG)
    data = backend.serialize(backend.compile(spec))
    restored = backend.deserialize(spec, data)
    assert restored.backend_name == "llguidance" and restored.grammar == data.decode()
    grammar = backend.new_grammar(restored)
    assert all(grammar.accept_token(t) for t in backend.tokenizer.encode("ab")) and grammar.accept_token(backend.stop_token_ids[0])
    assert backend.deserialize(spec, b"\xff not a grammar") is None


TAG_SCHEMA = {"type": "object", "properties": {"c": {"enum": ["x", "y"]}}, "required": ["c"]}
FORMAT_TAGS = [
    ({"type": "triggered_tags", "triggers": ["<f="], "tags": [
        {"type": "tag", "begin": "<f=a>", "content": {"type": "json_schema", "json_schema": TAG_SCHEMA}, "end": "</f>"},
        {"type": "tag", "begin": "<f=b>", "content": {"type": "const_string", "value": "hi"}, "end": "</f>"}]},
     ["", "text", 'x <f=a>{"c": "x"}</f> y', "x <f=b>hi</f>", 'x <f=a>{"c":"x"}</f><f=b>hi</f>z'],
     ["x <f=b>ho</f>", "<f=c>", 'x <f=a>{"c": "z"}</f>']),
    ({"type": "triggered_tags", "triggers": ["<f="], "at_least_one": True, "tags": [
        {"type": "tag", "begin": "<f=a>", "content": {"type": "any_text"}, "end": "</f>"}]},
     ["<f=a>any</f>", "<f=a>q</f> y <f=a>q</f>z"], ["", "x <f=a>any</f>"]),
    ({"type": "triggered_tags", "triggers": ["<f="], "at_least_one": True, "stop_after_first": True, "tags": [
        {"type": "tag", "begin": "<f=a>", "content": {"type": "any_text"}, "end": "</f>"}]},
     ["<f=a>a</f>"], ["", "<f=a>a</f>b"]),
    ({"type": "sequence", "elements": [{"type": "const_string", "value": "A:"}, {"type": "regex", "pattern": r"[0-9]{2}/\d"},
                                       {"type": "or", "elements": [{"type": "const_string", "value": "!"}, {"type": "const_string", "value": "?"}]}]},
     ["A:12/3!", "A:12/3?"], ["A:1/3!", "A:12/٣!"]),
    ({"type": "tags_with_separator", "separator": ",", "tags": [
        {"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "</a>"}]},
     ["", "<a>1</a>", "<a>1</a>,<a>2</a>"], ["<a>1</a><a>2</a>", "<a>x</a>"]),
    ({"type": "repeat", "min": 1, "max": 2, "content": {"type": "const_string", "value": "ab"}}, ["ab", "abab"], ["", "ababab"]),
    ({"type": "tag", "begin": "<r>", "content": {"type": "any_text"}, "end": ["</r>", "</s>"]}, ["<r>x</r>", "<r>x</s>", "<r></r>"], ["<r>x</r>y"]),
]


@pytest.mark.parametrize("fmt, good, bad", FORMAT_TAGS, ids=[f["type"] for f, _, _ in FORMAT_TAGS])
def test_format_structural_tags_match_xgrammar(backend, fmt, good, bad):
    import xgrammar as xgr

    from fd_guided.backends.xgrammar import structural_tag_json

    spec = parse_guided_request({"structural_tag": {"format": fmt}}, LLG)
    reference = xgr.Grammar.from_structural_tag(structural_tag_json(spec))
    for text in good + bad:
        expected = text in good
        assert xgr.testing._is_grammar_accept_string(reference, text) is expected, text
        assert accepts(backend, spec, text) is expected, text


@pytest.mark.parametrize("fmt, feature", [
    ({"type": "token", "token": 1}, "'token'"),
    ({"type": "json_schema", "json_schema": TAG_SCHEMA, "style": "qwen_xml"}, "qwen_xml"),
    ({"type": "any_text"}, "'any_text'"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text", "excludes": ["x"]}, "end": "</a>"}, "excludes"),
])
def test_inexpressible_structural_tags_are_refused(fmt, feature):
    with pytest.raises(InvalidGrammarError, match=feature) as caught:
        parse_guided_request({"structural_tag": {"format": fmt}}, LLG)
    assert caught.value.part == "structural_tag" and caught.value.feature
