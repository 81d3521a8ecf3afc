"""The auto backend: xgrammar when it enforces the whole schema, llguidance otherwise, per request."""
import json

import pytest
import torch
import xgrammar as xgr

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.backends.auto import AutoBackend, choose_backend
from fd_guided.kernels import allocate_pinned_bitmask
from fd_guided.metrics import GuidedMetrics
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output
from fd_guided.harness.engine import ReferenceEngine

from corpus import SCHEMAS
from guided_helpers import admit_and_compile

pytestmark = pytest.mark.cpu

AUTO = GuidedConfig(backend="auto")
PLAIN = SCHEMAS["defs_ref"]
ALL_OF = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]},
                    {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}
PATTERN_PROPERTIES = {"type": "object", "patternProperties": {"^x-[a-z]{1,3}$": {"type": "integer", "minimum": 0, "maximum": 9}},
                      "additionalProperties": False, "maxProperties": 2}
TYPE_BESIDE_ANY_OF = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
NEITHER = {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}
BOUNDED_STRING = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}


def spec_of(schema, **fields):
    return parse_guided_request({"guided_json": schema, **fields}, AUTO)


@pytest.mark.parametrize("schema, expected", [
    (PLAIN, "xgrammar"),
    (SCHEMAS["nested_arrays"], "xgrammar"),
    (SCHEMAS["person"], "llguidance"),  # maxLength: xgrammar cannot bound a string and allow escapes
    (ALL_OF, "xgrammar"),  # merged into one object by the normaliser
    (PATTERN_PROPERTIES, "llguidance"),
    (TYPE_BESIDE_ANY_OF, "xgrammar"),
    ({"type": "number", "multipleOf": 0.5}, "llguidance"),
    ({"type": "integer", "format": "int64"}, "xgrammar"),  # format only constrains strings
    (SCHEMAS["oneof_shape"], "xgrammar"),  # disjoint by its const discriminator: an anyOf
    ({"type": "object", "properties": {"a": {}, "b": {}}, "if": {"required": ["a"]}, "else": {"minProperties": 2}}, "llguidance"),
], ids=["plain", "nested_arrays", "maxLength", "allOf", "patternProperties", "type+anyOf", "multipleOf", "int64", "oneOf",
        "else-xgrammar-would-drop"])
def test_choice_per_schema(schema, expected):
    # The engine that serves it: admission's preference, then the compile-time fallback (xgrammar's
    # own compiler refuses some normalised schemas, e.g. a branch it finds contradictory).
    assert admit_and_compile({"guided_json": schema}).backend_name == expected


def test_other_kinds_stay_on_xgrammar():
    for fields in ({"guided_regex": "[a-z]+"}, {"guided_choice": ["a", "b"]}, {"guided_grammar": 'root ::= "x"'},
                   {"response_format": {"type": "json_object"}}):
        assert choose_backend(parse_guided_request(fields, AUTO)) == "xgrammar"


def test_neither_backend_names_both_features():
    with pytest.raises(InvalidGrammarError, match="uniqueItems") as caught:
        admit_and_compile({"guided_json": NEITHER})
    assert "xgrammar" in str(caught.value) and "llguidance" in str(caught.value)
    assert "uniqueItems" in caught.value.feature


def test_syntax_errors_do_not_fall_back():
    with pytest.raises(InvalidGrammarError, match="guided_regex") as caught:
        parse_guided_request({"guided_regex": "(unclosed"}, AUTO)
    assert caught.value.feature is None and "llguidance" not in str(caught.value)


# xgrammar alone, given these schemas as they are, accepts an instance jsonschema rejects (or
# rejects a valid one); after the normaliser, auto's grammar agrees with jsonschema.
XGRAMMAR_GAPS = [
    ({"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, '"x"'),
    ({"type": "integer", "minimum": 5, "anyOf": [{"maximum": 10}]}, "2"),
    ({"allOf": [{"type": "integer"}], "minimum": 5}, "2"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "integer"}}, "minimum": 5}, "2"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"], "additionalProperties": True}, '{"a":1,"b":1}'),
]


@pytest.mark.parametrize("schema, loose", XGRAMMAR_GAPS, ids=["type+anyOf", "minimum+anyOf", "allOf+minimum", "$ref+minimum", "undeclared-required"])
def test_gaps_of_xgrammar_are_closed(schema, loose, auto_backend):
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    spec = spec_of(schema, disable_any_whitespace=True)
    if "required" in schema:  # xgrammar admits no object at all here, not even the valid one
        assert validate_output(spec, loose).valid and not xgr.testing._is_grammar_accept_string(grammar, loose)
    else:
        assert xgr.testing._is_grammar_accept_string(grammar, loose)  # why auto does not use xgrammar here
        assert not validate_output(spec, loose).valid
    compiled = auto_backend.compile(spec)
    assert accepts(auto_backend, compiled, loose) is validate_output(spec, loose).valid


def accepts(backend, compiled, text: str) -> bool:
    matcher = backend.new_grammar(compiled)
    tokens = backend.tokenizer.encode(text) + [backend.tokenizer.eos_token_ids[0]]
    return all(matcher.accept_token(token) for token in tokens) and matcher.is_terminated()


@pytest.fixture(scope="module")
def auto_backend():
    tokenizer = load_tokenizer("deepseek")
    backend = AutoBackend(tokenizer, vocab_size=tokenizer.padded_vocab_size, config=AUTO)
    backend.metrics = GuidedMetrics()
    yield backend
    backend.close()


def test_compile_dispatch_and_serialization(auto_backend):
    plain, fallback = auto_backend.compile(spec_of(PLAIN)), auto_backend.compile(spec_of(PATTERN_PROPERTIES))
    assert (plain.backend_name, fallback.backend_name) == ("xgrammar", "llguidance")
    for compiled in (plain, fallback):
        restored = auto_backend.deserialize(compiled.spec, auto_backend.serialize(compiled))
        assert restored is not None and restored.backend_name == compiled.backend_name
    assert auto_backend.deserialize(plain.spec, b"nobody\n" + auto_backend.serialize(plain)) is None


def test_mixed_fill_matches_each_backend(auto_backend):
    config = AUTO.replace(parallel_fill_min_rows=2, fill_threads=2)
    backend = AutoBackend(auto_backend.tokenizer, vocab_size=auto_backend.vocab_size, config=config)
    specs = [spec_of(PLAIN), spec_of(ALL_OF), spec_of(PATTERN_PROPERTIES), spec_of(SCHEMAS["enum_status"])]
    grammars = [backend.new_grammar(backend.compile(spec)) for spec in specs]
    rows = [2, 0, 3, 1]
    serial = allocate_pinned_bitmask(4, backend.vocab_size)
    for grammar, row in zip(grammars, rows):
        grammar.fill_bitmask(serial, row)
    grouped = allocate_pinned_bitmask(4, backend.vocab_size)
    backend.fill_bitmasks(grammars, grouped, rows)
    assert torch.equal(serial, grouped)
    backend.close()


def test_one_engine_batch_mixes_backends_per_request():
    metrics = GuidedMetrics()
    # Preference order only (no first-ready race), so which engine serves each request is fixed.
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=16, guided_config=AUTO.replace(auto_first_ready=False), metrics=metrics)
    requests = [
        {"prompt": "plain", "guided_json": PLAIN},
        {"prompt": "falls back", "guided_json": BOUNDED_STRING},
        {"prompt": "plain too", "guided_json": SCHEMAS["enum_status"]},
        {"prompt": "falls back too", "guided_json": PATTERN_PROPERTIES},
        {"prompt": "neither", "guided_json": NEITHER},
        {"prompt": "plain again", "guided_json": SCHEMAS["bounded_array"]},
        {"prompt": "regex", "guided_regex": "[a-f]{4}"},
        {"prompt": "type beside anyOf", "guided_json": TYPE_BESIDE_ANY_OF},
    ]
    results = engine.generate(requests, max_tokens=96, seed=2)
    assert results[4].finish_reason == "error" and "uniqueItems" in results[4].error
    for index, result in enumerate(results):
        if index == 4:
            continue
        assert result.error is None, result.error
        if result.finish_reason == "stop":
            assert validate_output(result.spec, result.text).valid, (requests[index], result.text)
    chosen = {i: engine.manager.compiler.compile_now(results[i].spec).backend_name for i in (0, 1, 2, 3, 5, 6, 7)}
    assert chosen == {0: "xgrammar", 1: "llguidance", 2: "xgrammar", 3: "llguidance", 5: "xgrammar", 6: "xgrammar", 7: "xgrammar"}
    assert metrics.labelled("requests_by_backend_total") == {"xgrammar": 5, "llguidance": 2}
    assert metrics.labelled("compiles_by_engine_total") == {"xgrammar": 5, "llguidance": 2}
    assert 'requests_by_backend_total{backend="llguidance"} 2' in metrics.to_prometheus()
    engine.close()


def test_python_regex_features_work_on_both_engines():
    """guided_regex reaches the engines as Python reads it: named groups (xgrammar's parser refuses
    them) are plain groups by then."""
    spec = parse_guided_request({"guided_regex": "(?P<word>ab)+c"}, AUTO)
    assert admit_and_compile({"guided_regex": "(?P<word>ab)+c"}).backend_name == "xgrammar"
    engine = ReferenceEngine.default(preset="tiny", guided_config=AUTO)
    result = engine.generate([{"prompt": "x", "guided_regex": "(?P<word>ab)+c"}], max_tokens=24)[0]
    engine.close()
    assert result.finish_reason == "stop", result.error
    assert validate_output(spec, result.text).valid, result.text


def test_unicode_property_escapes_are_refused_not_misread():
    """Inside a class xgrammar reads [\\p{L}] as the characters p, {, L, }: refused everywhere."""
    for pattern in (r"[\p{L}]+", r"\p{Lu}x", r"[a-z\P{N}]"):
        with pytest.raises(InvalidGrammarError, match="Unicode property") as caught:
            parse_guided_request({"guided_regex": pattern}, AUTO)
        assert "Unicode property" in caught.value.feature
        with pytest.raises(InvalidGrammarError, match="Unicode property"):
            parse_guided_request({"guided_regex": pattern}, GuidedConfig(backend="xgrammar"))
    assert choose_backend(parse_guided_request({"guided_regex": r"[\\p]+"}, AUTO)) == "xgrammar"  # an escaped backslash


@pytest.mark.parametrize("fields", [
    {"guided_grammar": "start: /[\\p{L}]+/"},
    {"structural_tag": {"format": {"type": "regex", "pattern": "[\\p{L}]+"}}},
], ids=["lark-terminal", "structural-tag-regex"])
def test_property_escapes_in_other_regexes_go_to_llguidance(fields):
    """Lark terminals and structural-tag regexes go through the same xgrammar regex parser."""
    with pytest.raises(InvalidGrammarError, match="Unicode property") as caught:
        parse_guided_request(fields, GuidedConfig(backend="xgrammar"))
    assert "Unicode property" in caught.value.feature
    assert choose_backend(parse_guided_request(fields, AUTO)) == "llguidance"


def test_lark_property_escape_is_enforced_under_auto():
    import unicodedata

    engine = ReferenceEngine.default(preset="tiny", guided_config=AUTO)
    results = engine.generate([{"prompt": "x", "guided_grammar": "start: /[\\p{L}]+/", "seed": seed} for seed in range(3)],
                              max_tokens=10)
    engine.close()
    for result in results:
        assert result.error is None and result.text
        assert all(unicodedata.category(char).startswith("L") for char in result.text), result.text


def test_auto_is_built_through_public_constructors_and_its_recipe_rebuilds_it():
    from fd_guided.backends import composite
    from fd_guided.interface import GuidedBackend

    # The base interface carries no composite members; auto implements the composite protocol.
    assert not any(hasattr(GuidedBackend, name) for name in ("compile_engines", "engine_names", "worker_recipe", "with_config"))
    backend = AutoBackend(load_tokenizer("deepseek"), vocab_size=129_280, config=AUTO)
    recipe = backend.worker_recipe()
    # One config, at the top (pools that differ only in config share a zygote), and one tokenizer.
    assert all("config" not in own and "tokenizer" not in own for _, own in recipe[1]["engines"].values())
    rebuilt = composite.from_recipe(recipe)
    assert isinstance(rebuilt, AutoBackend) and composite.engine_names(rebuilt) == ("xgrammar", "llguidance")
    spec = spec_of(PLAIN)
    for name in composite.engine_names(rebuilt):  # what the worker compiles, the parent loads
        engine = composite.engine(rebuilt, name)
        data = engine.serialize(engine.compile(spec))
        assert composite.engine(backend, name).deserialize(spec, data) is not None
    other = composite.with_config(backend, AUTO.replace(compile_nice=5))
    assert isinstance(other, AutoBackend) and all(b.config.compile_nice == 5 for b in other.backends.values())
    single = composite.engine(backend, "llguidance")
    assert composite.compile_engines(single, spec) == ("llguidance",) and composite.engine_names(single) == ("llguidance",)
    assert composite.expected_gain_s(single, "llguidance", "xgrammar") == 0.0


def test_the_preferred_engines_gain_is_measured_from_real_fills():
    from fd_guided.backends.auto import MaskCosts

    backend = AutoBackend(load_tokenizer("deepseek"), vocab_size=129_280, config=AUTO)
    spec = spec_of(SCHEMAS["nested_arrays"])
    compiled = {name: engine.compile(spec) for name, engine in backend.backends.items()}
    assert backend.expected_gain_s("xgrammar", "llguidance") == 0.0  # nothing measured: no wait
    bitmask = allocate_pinned_bitmask(4, 129_280)
    for _ in range(MaskCosts.MIN_ROWS // 4):
        grammars = [backend.new_grammar(compiled[name]) for name in ("xgrammar", "llguidance") for _ in range(2)]
        backend.fill_bitmasks(grammars, bitmask, [0, 1, 2, 3])
    costs = backend.mask_costs
    assert costs.rows == {"xgrammar": MaskCosts.MIN_ROWS // 2, "llguidance": MaskCosts.MIN_ROWS // 2}
    assert backend.expected_gain_s("xgrammar", "llguidance") == 0.0  # not enough rows per engine yet
    for _ in range(MaskCosts.MIN_ROWS // 4):
        backend.fill_bitmasks(grammars, bitmask, [0, 1, 2, 3])
    per_request = sum(costs.rows.values()) / sum(costs.grammars.values())
    expected = max(0.0, (costs.row_seconds["llguidance"] - costs.row_seconds["xgrammar"]) * per_request)
    assert backend.expected_gain_s("xgrammar", "llguidance") == pytest.approx(expected)
    assert costs.gain_s("llguidance", "xgrammar") == pytest.approx(
        max(0.0, (costs.row_seconds["xgrammar"] - costs.row_seconds["llguidance"]) * per_request))
    # llguidance is preferred only where xgrammar would narrow the constraint: worth the whole cap.
    assert backend.expected_gain_s("llguidance", "xgrammar") == float("inf")


def test_both_engines_read_special_tokens_as_no_text(auto_backend):
    # SchemaStore walks (tools/fill_tails.py) took special tokens inside free strings under xgrammar,
    # which llguidance refused: auto's engines did not enforce one language. Now neither allows one
    # anywhere in a document, and both allow the stop token at its end.
    import numpy as np

    tokenizer = auto_backend.tokenizer
    special = tokenizer.special_token_ids()
    schema = {"type": "object", "properties": {"summary": {"type": "string"}, "title": {"type": "string"}}, "required": ["summary"]}
    bitmask = torch.zeros((1, (auto_backend.vocab_size + 31) // 32), dtype=torch.int32)
    for engine in ("xgrammar", "llguidance"):
        backend = auto_backend.engine(engine)
        grammar = backend.new_grammar(backend.compile(parse_guided_request({"guided_json": schema}, GuidedConfig(backend=engine))))
        seen_end = False
        for token in tokenizer.encode('{"summary": "Why not", "title": "x"}') + [None]:
            grammar.fill_bitmask(bitmask, 0)
            allowed = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[: auto_backend.vocab_size]
            specials_allowed = [i for i in special if allowed[i]]
            assert specials_allowed in ([], [1]), (engine, specials_allowed[:5])
            seen_end |= specials_allowed == [1]
            if token is not None:
                assert grammar.accept_token(token)
        assert seen_end, engine
