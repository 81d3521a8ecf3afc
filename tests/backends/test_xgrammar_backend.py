"""The xgrammar backend: what its checker accepts is really enforced, tokenizer wiring, caching."""
import json

import pytest
from guided_helpers import admit_and_compile

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend, choice_ebnf
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

XGRAMMAR = GuidedConfig(backend="xgrammar")
COMPACT = {"disable_any_whitespace": True}


def xgr_spec(fields):
    """Admission through the xgrammar checker (the default backend is auto)."""
    return parse_guided_request(fields, XGRAMMAR)


@pytest.fixture(scope="module")
def backend():
    backend = XGrammarBackend(load_tokenizer("deepseek"), vocab_size=129_280, config=GuidedConfig(cache_limit_bytes=64 << 20))
    yield backend
    backend.close()


def accepts(backend, spec, text: str) -> bool:
    """Feed `text` character-exactly through a fresh matcher and ask whether it is a complete match."""
    grammar = backend.new_grammar(backend.compile(spec))
    return grammar.matcher.accept_string(text) and grammar.matcher.is_completed()


# (schema, an instance that must be accepted, an instance that must be rejected)
ENFORCED = [
    ({"type": "integer", "multipleOf": 3}, 9, 4),
    ({"type": "string", "format": "email"}, "a@b.co", "nope"),
    ({"type": "string", "format": "date"}, "2024-01-02", "2024-13-02x"),
    ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "123"),
    ({"type": "string", "format": "ipv4"}, "10.2.3.4", "10.02.3.4"),  # xgrammar alone admits leading zeros
    ({"type": "string", "format": "date"}, "2024-02-29", "2023-02-29"),  # and days a month lacks
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}, {"a": 1}, {}),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}, {"a": 1}, {"a": 1, "b": 2}),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, [1], [1, 2]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [1, 2], [1, 2, 3, 4]),
    ({"type": "integer", "exclusiveMinimum": 0}, 1, 0),
    ({"type": "number", "minimum": 1.5}, 2.0, 1.0),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "anyOf": [{"required": ["a"]}]}, {"a": 1}, {}),
    ({"type": "string", "minLength": 2, "maxLength": 4}, "abc", "abcdef"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, {"b": [1]}, {"a": 1}),
    ({"not": {"type": "string"}, "type": ["string", "integer"]}, 3, "s"),
    ({"type": "string", "pattern": "^[a-z]+$"}, "abc", "aB"),
    ({"enum": ["a", 1, None]}, None, "b"),
    ({"const": {"a": [1]}}, {"a": [1]}, {"a": [2]}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1}, {"a": 1, "b": 1}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}, {}),
    ({"$defs": {"a": {"type": "integer"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}, {"x": 1}, {"x": "s"}),
    ({"allOf": [{"type": "object", "properties": {"z": {"type": "integer"}}, "required": ["z"]}]}, {"z": 1}, {}),
]


@pytest.mark.parametrize("schema, good, bad", ENFORCED, ids=[json.dumps(s)[:40] for s, _, _ in ENFORCED])
def test_every_accepted_keyword_is_enforced(backend, schema, good, bad):
    spec = xgr_spec({"guided_json": schema, **COMPACT})  # the checker lets it through
    assert accepts(backend, spec, json.dumps(good, separators=(",", ":")))
    assert not accepts(backend, spec, json.dumps(bad, separators=(",", ":")))


def test_length_bounded_strings_are_plain_json_and_exact(backend):
    # xgrammar's own maxLength string admits raw control characters; the pattern rewrite does not
    # (it admits no escapes either: a subset, so auto prefers llguidance for such schemas).
    spec = xgr_spec({"guided_json": {"type": "string", "minLength": 1, "maxLength": 5}, **COMPACT})
    assert accepts(backend, spec, '"a"') and accepts(backend, spec, '"é中文ab"')
    assert not accepts(backend, spec, '"a\x01"')
    assert not accepts(backend, spec, '""') and not accepts(backend, spec, '"abcdef"')
    with pytest.raises(InvalidGrammarError, match="past 128") as caught:  # would fail xgrammar's compile
        xgr_spec({"guided_json": {"type": "string", "maxLength": 256}})
    assert caught.value.feature


@pytest.mark.parametrize("schema, feature", [
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"type": "string", "format": "email", "maxLength": 20}, "minLength/maxLength"),
    ({"type": "string", "pattern": "^x((?!org\\.)[a-z.])+$"}, "look-ahead"),  # xgrammar would drop the lookahead
    ({"type": "string", "pattern": "^(a)\\1$"}, "back-references"),
    ({"type": "object", "properties": {"a\"b": {"type": "integer"}}}, "property names"),
])
def test_constructs_xgrammar_mis_enforces_are_refused(schema, feature):
    # Keyword refusals come at admission; what xgrammar's own regex parser refuses, at its compile.
    with pytest.raises(InvalidGrammarError, match=feature) as caught:
        admit_and_compile({"guided_json": schema}, "xgrammar")
    assert caught.value.feature is not None


def test_strict_false_allows_undeclared_properties(backend):
    spec = xgr_spec({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}}, "guided_strict": False, **COMPACT})
    assert accepts(backend, spec, '{"a":1,"b":"x"}')


def test_whitespace_is_bounded_by_default(backend):
    spec = xgr_spec({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}})
    assert accepts(backend, spec, '{ "a" : 1 }')
    assert not accepts(backend, spec, '{' + ' ' * 10 + '"a":1}')


def test_compact_separators_allow_no_spaces(backend):
    spec = xgr_spec({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}, **COMPACT})
    assert accepts(backend, spec, '{"a":1,"b":2}')
    assert not accepts(backend, spec, '{"a": 1, "b": 2}')


def test_json_object_accepts_any_object_only(backend):
    spec = xgr_spec({"response_format": {"type": "json_object"}})
    assert accepts(backend, spec, '{"x": [1, {"y": null}]}')
    assert not accepts(backend, spec, "[1]")


def test_choice_ebnf_escapes_control_and_unicode_characters(backend):
    choices = ["a\x00f", 'say "hi"', "back\\slash", "是", "tab\tx", "emoji 😀"]
    assert "\\x" not in choice_ebnf(choices)
    spec = xgr_spec({"guided_choice": choices})
    for choice in choices:
        assert accepts(backend, spec, choice), choice
    assert not accepts(backend, spec, "a\x0f")


def test_lark_and_ebnf(backend):
    lark = xgr_spec({"guided_grammar": 'start: "hi " NAME\nNAME: /[a-z]{2,4}/'})
    assert lark.kind == "lark"
    assert accepts(backend, lark, "hi bob") and not accepts(backend, lark, "hi b")
    ebnf = xgr_spec({"guided_grammar": 'root ::= [0-9]+ ("." [0-9]+)?'})
    assert accepts(backend, ebnf, "3.14") and not accepts(backend, ebnf, "3.")


def test_structural_tag_legacy_form(backend):
    spec = xgr_spec({"structural_tag": {
        "structures": [{"begin": "<f>", "schema": {"type": "object", "properties": {"c": {"enum": ["x"]}}, "required": ["c"]}, "end": "</f>"}],
        "triggers": ["<f"]}})
    assert accepts(backend, spec, 'free text <f>{"c": "x"}</f> more')
    assert not accepts(backend, spec, 'text <f>{"c": "y"}</f>')


def test_padded_vocab_and_engine_stop_tokens():
    tokenizer = load_tokenizer("deepseek")
    backend = XGrammarBackend(tokenizer, vocab_size=129_536, stop_token_ids=[1, 128_822])
    assert backend.tokenizer_info.vocab_size == 129_536
    assert sorted(backend.tokenizer_info.stop_token_ids) == [1, 128_822]
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        XGrammarBackend(tokenizer, vocab_size=1000)


def test_compile_error_is_invalid_grammar(backend):
    from fd_guided.spec import GrammarSpec

    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        backend.compile(GrammarSpec("json_schema", '{"type":"array","items":{"type":"integer","maximum":5},"uniqueItems":true}', xgr_spec({"guided_json": {}}).json_format))


def test_qwen_tiktoken_vocabulary():
    tokenizer = load_tokenizer("qwen")
    backend = XGrammarBackend(tokenizer, vocab_size=151_936)
    spec = xgr_spec({"guided_regex": "(yes|no)"})
    assert accepts(backend, spec, "yes") and not accepts(backend, spec, "maybe")
    assert backend.tokenizer_info.stop_token_ids == list(tokenizer.eos_token_ids)


def allowed_ids(grammar, vocab_size: int):
    import numpy as np
    import torch

    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    return np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab_size]


def test_special_tokens_spell_no_text(backend):
    # xgrammar's from_huggingface reads deepseek's 1,283 added/special tokens as their literal text, so
    # `<think>`, BOS or a placeholder was allowed inside any JSON string (the host drops their text:
    # a minLength string came out shorter). The bundle, llguidance and the guard read them as no text.
    tokenizer = backend.tokenizer
    special = tokenizer.special_token_ids()
    assert {0, 128_016, 128_821, 128_822, 129_080} <= set(special)
    decoded = backend.tokenizer_info.decoded_vocab
    assert all(decoded[i] == b"" for i in special)
    assert all(decoded[i] == text for i, text in enumerate(tokenizer.token_bytes) if text is not None)
    grammar = backend.new_grammar(backend.compile(xgr_spec({"guided_json": {"type": "string", "minLength": 20}})))
    assert grammar.accept_token(tokenizer.encode('"')[0])
    inside = allowed_ids(grammar, backend.vocab_size)
    assert inside[tokenizer.encode("a")[0]] and not any(inside[i] for i in special)
    for token in tokenizer.encode("a" * 20 + '"'):
        assert grammar.accept_token(token)
    end = allowed_ids(grammar, backend.vocab_size)
    assert end[1] and [i for i in special if end[i]] == [1]  # only the stop token


# Objects with chains of optional properties (xgrammar's `part_k` rules), factored by
# fd_guided.backends.xgrammar_ebnf: masks must equal those of xgrammar's own grammar at every step.
EIGHT = {"type": "object", "properties": {k: {"type": "string"} for k in "abcdefgh"}}
CHAINS = [
    (EIGHT, {}),
    (EIGHT, COMPACT),
    (EIGHT, {"max_whitespace_cnt": None}),  # unbounded: [ \n\r\t]* separators
    (EIGHT, {"any_whitespace": False, "separators": [", ", ": "]}),
    (EIGHT, {"guided_strict": False}),  # chains ending in the additional properties' rule
    ({"type": "object", "properties": {k: {"type": "string"} for k in "abcdef"}, "required": ["c"]}, {}),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "additionalProperties": {"type": "integer"}}, {}),
    ({"type": "object", "properties": {"a) | (b": {"type": "string"}, "[k]{z}": {"type": "string"}, "é€😀": {"type": "string"},
                                       "n": {"type": "object", "properties": {"x": {"type": "null"}, "y": {"type": "null"}, "z": {"type": "number"}}}}}, {}),
    ({"type": "array", "items": {"type": "object", "properties": {k: {"type": ["string", "integer"]} for k in "abcd"}}}, {}),
]


@pytest.mark.parametrize("schema, fields", CHAINS, ids=[str(i) for i in range(len(CHAINS))])
def test_factored_chains_give_xgrammars_masks(backend, schema, fields):
    import random

    import jsonschema
    import torch
    import xgrammar as xgr

    from fd_guided.backends import xgrammar_ebnf
    from fd_guided.backends.xgrammar_input import _json_options, enforced_schema

    spec = xgr_spec({"guided_json": schema, **fields})
    options = _json_options(spec)
    assert xgrammar_ebnf.factored(str(xgr.Grammar.from_json_schema(enforced_schema(spec), **options))) is not None
    factored = backend.compile(spec)
    plain = backend.compiler.compile_json_schema(enforced_schema(spec), **options)
    tokenizer, size = backend.tokenizer, backend.vocab_size
    theirs_bitmask = torch.zeros((1, (size + 31) // 32), dtype=torch.int32)
    completed = 0
    for seed in range(4):
        rng = random.Random(seed)
        ours, theirs = backend.new_grammar(factored), xgr.GrammarMatcher(plain)
        out = []
        for _ in range(80):
            mask = allowed_ids(ours, size)
            theirs.fill_next_token_bitmask(theirs_bitmask, 0)
            assert (allowed_ids_of(theirs_bitmask, size) == mask).all(), tokenizer.decode(out)
            choices = [int(i) for i in mask.nonzero()[0]]
            if rng.random() < 0.6:  # often a token that closes something: walks complete their documents
                closing = [t for t in choices if t in tokenizer.eos_token_ids or set(tokenizer.token_bytes[t] or b"") & set(b'"}]')]
                choices = closing or choices
            token = rng.choice(choices)
            if token in tokenizer.eos_token_ids:
                break
            assert ours.accept_token(token) and theirs.accept_token(token)
            out.append(token)
        if ours.matcher.is_completed():
            completed += 1
            validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            validator.validate(json.loads(tokenizer.decode(out)))
    assert completed, "no walk completed a document"


def allowed_ids_of(bitmask, vocab_size: int):
    import numpy as np

    return np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab_size]


@pytest.mark.parametrize(
    "schema, fields",
    [
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {}),
        ({"type": "array", "items": {"type": "string", "maxLength": 4}}, COMPACT),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, {}),  # one optional property: no chain
    ],
)
def test_a_schema_without_chains_compiles_to_xgrammars_own_grammar(backend, schema, fields):
    """With nothing to factor, the grammar converted to look for chains is compiled as it is (not
    converted again): the compiled grammar is the one `compile_json_schema` gives."""
    import xgrammar as xgr

    from fd_guided.backends import xgrammar_ebnf
    from fd_guided.backends.xgrammar_input import _json_options, enforced_schema

    spec = xgr_spec({"guided_json": schema, **fields})
    source, options = enforced_schema(spec), _json_options(spec)
    assert xgrammar_ebnf.factored(str(xgr.Grammar.from_json_schema(source, **options))) is None
    ours = xgrammar_ebnf.compile_json_schema(backend.compiler, source, options)
    assert str(ours.grammar) == str(backend.compiler.compile_json_schema(source, **options).grammar)


def test_factoring_leaves_other_grammars_alone():
    from fd_guided.backends.xgrammar_ebnf import factored

    assert factored('root ::= (("a"))\n') is None
    w = 'whitespace{0, 2} "," whitespace{0, 2}'
    chain = f'root ::= (("{{" p_0 "}}"))\np_0 ::= ((p_1) | ({w} "\\"a\\"" p_1))\np_1 ::= ("" | ({w} "\\"b\\""))\n'
    assert "p_0_alt ::= ((\"\\\"a\\\"\" p_1) | (p_1_alt))" in factored(chain)
    # three alternatives, or a body with its own top-level alternation, is not a chain link
    odd = chain.replace(f'p_0 ::= ((p_1) | ({w} "\\"a\\"" p_1))', f'p_0 ::= ((p_1) | ({w} "x") | ({w} "\\"a\\"" p_1))')
    assert factored(odd) is None
    assert factored(chain + "p_1_alt ::= (\"z\")\n") is None  # a name it would write is taken
