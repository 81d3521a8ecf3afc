"""``uniqueItems`` over open item domains: the runtime guard around real engine matchers.

The adversarial driver below always picks the token that would repeat an earlier item where the
mask allows it: every duplicate the guard misses becomes an invalid output, judged by
`jsonschema` with format checking.
"""
import json

import jsonschema
import numpy as np
import pytest
import torch

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.registry import get_backend_class
from fd_guided.schema import for_engine
from fd_guided.schema.unique_paths import UniquePaths
from fd_guided.tokenizer import load_tokenizer
from fd_guided.json_tracker import JsonTracker, item_keys
from fd_guided.unique_guard import UniqueItemsGrammar

pytestmark = pytest.mark.cpu
BACKENDS = ("xgrammar", "llguidance", "auto")
STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 6}
NUMBERS = {"type": "array", "items": {"type": "number"}, "uniqueItems": True, "minItems": 6}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture(scope="module")
def backends(tokenizer):
    made = {name: get_backend_class(name)(tokenizer, vocab_size=tokenizer.padded_vocab_size, config=GuidedConfig(backend=name))
            for name in BACKENDS}
    yield made
    for backend in made.values():
        backend.close()


def tracker_for(schema) -> JsonTracker:
    return JsonTracker(UniquePaths(schema))


def pushes(tracker: JsonTracker, *chunks: str) -> list[bool]:
    return [tracker.push(chunk.encode()) for chunk in chunks]


# ----- equality, as jsonschema judges it --------------------------------------------------------


@pytest.mark.parametrize("a, b, equal", [
    ("1", "1.0", True), ("1", "1e0", True), ("0", "-0", True), ("true", "1", False), ("false", "0", False),
    ('"a"', '"\\u0061"', True), ('{"a":1,"b":[2]}', '{"b":[2.0], "a":1}', True), ("[1,2]", "[2,1]", False),
    ("null", "false", False), ("1" + "0" * 30, "1e30", True), ("0.1", "0.10000000000000001", True),
])
def test_item_keys_follow_json_schema_equality(a, b, equal):
    ka, kb = item_keys(a.encode()), item_keys(b.encode())
    assert (ka[0] == kb[0] or ka[1] == kb[1]) is equal


def test_the_tracker_finds_duplicates_only_in_unique_arrays():
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                                               "free": {"type": "array", "items": {"type": "string"}}}}
    tracker = tracker_for(schema)
    assert pushes(tracker, '{"free": ["x", "x"], ', '"tags": ["a', '", "b"', ', "a') == [True] * 4
    assert not tracker.push(b'"')  # would finish "a" a second time: refused, state unchanged
    assert pushes(tracker, 'b"', ', "\\u0062', '"') == [True, True, False]  # "ab" is new; "b" spelled with an escape is not


def test_numbers_are_checked_when_they_end_and_a_refused_token_changes_nothing():
    tracker = tracker_for(NUMBERS)
    assert pushes(tracker, "[1", ", 2", ", 1.0") == [True] * 3
    assert pushes(tracker, ",", "]", " ") == [False] * 3  # each would end 1.0, equal to 1
    assert pushes(tracker, "5", "]") == [True, True]


def test_starting_a_literal_the_array_holds_is_a_duplicate_at_once():
    tracker = tracker_for({"type": "array", "uniqueItems": True})
    assert pushes(tracker, "[true", ", null", ", 1") == [True] * 3
    assert pushes(tracker, ", t", ", n", ",nu") == [False] * 3  # "true"/"null" could not become anything else
    assert pushes(tracker, ", f", "alse", "]") == [True] * 3


def test_items_of_any_type_compare_by_value():
    tracker = tracker_for({"type": "array", "uniqueItems": True})
    assert pushes(tracker, "[true", ", 1", ', {"a": 1, "b": [1]}', ", null") == [True] * 4
    assert pushes(tracker, ', {"b": [1.0], "a": 1}', ", null", ",true", ", 1.0]") == [False] * 4
    assert pushes(tracker, ", [null]", "]") == [True, True]


def test_rollback_and_reset_restore_the_items_seen():
    tracker = tracker_for(STRINGS)
    assert pushes(tracker, '["a"', ', "b"') == [True, True]
    tracker.rollback(1)
    assert pushes(tracker, ', "b"', ', "a') == [True, True] and not tracker.push(b'"')
    tracker.reset()
    assert pushes(tracker, '["b"', ', "a"') == [True, True]


def test_unique_paths_follow_refs_combinators_and_older_drafts():
    schema = {"$schema": "http://json-schema.org/draft-07/schema#",
              "definitions": {"set": {"type": "array", "uniqueItems": True}},
              "type": "object",
              "properties": {"a": {"anyOf": [{"$ref": "#/definitions/set"}, {"type": "null"}]},
                             "b": {"type": "array", "items": [{"type": "string"}, {"$ref": "#/definitions/set"}]}},
              "additionalProperties": {"allOf": [{"$ref": "#/definitions/set"}]}}
    paths = UniquePaths(schema)
    root = paths.root()
    assert not paths.unique(root)
    assert paths.unique(paths.child(root, "a")) and paths.unique(paths.child(root, "other"))
    tuple_nodes = paths.child(root, "b")
    assert not paths.unique(tuple_nodes)
    assert not paths.unique(paths.child(tuple_nodes, 0)) and paths.unique(paths.child(tuple_nodes, 1))
    assert not paths.unique(paths.child(tuple_nodes, 2))  # past the tuple: additionalItems absent


# ----- admission: open domains only, whole-output JSON only --------------------------------------


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("items", [{"type": "string"}, {"type": "number"}, {"type": ["string", "number"]}, {"type": "string", "minLength": 2},
                                   {"type": "string", "pattern": "^[a-z]+(-[a-z0-9]+)*$"}, {"type": "string", "pattern": "x"},
                                   {"type": "string", "format": "uri"}, True, {"type": "object"},
                                   {"type": ["string", "boolean", "null"]}, {"type": "array"},
                                   {"anyOf": [{"type": "string"}, {"enum": ["multiline", None]}]},  # the enum adds no value
                                   {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"enum": ["multiline"]}]},
                                   {"anyOf": [{"type": "number"}, {"enum": [1, 2.5, True]}]}])
def test_open_item_domains_are_admitted(name, items):
    parse_guided_request({"guided_json": {"type": "array", "items": items, "uniqueItems": True}}, GuidedConfig(backend=name))
    parse_guided_request({"guided_json": {"type": "array", "uniqueItems": True}}, GuidedConfig(backend=name))  # any value


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer", "maximum": 9}, "uniqueItems": True},  # 9 cannot go on
    {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True},  # 0 cannot go on, nor be refused
    {"type": "array", "items": {"type": "string", "maxLength": 100000}, "uniqueItems": True},  # too large to count
    {"type": "array", "items": {"type": "number", "maximum": 3}, "uniqueItems": True},
    {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 2}}}, "uniqueItems": True},  # strict: closed
    {"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"enum": ["Multi line"]}]}, "uniqueItems": True},
    {"type": "array", "items": {"anyOf": [{"type": "number"}, {"enum": ["x"]}]}, "uniqueItems": True},  # "x" cannot go on
    {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}, "uniqueItems": True},  # finite
    {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "uniqueItems": True},  # at most 2 long
    {"type": "array", "items": {"type": "object", "additionalProperties": False}, "uniqueItems": True},  # only {}
])
def test_item_domains_that_can_dead_end_stay_refused(name, schema):
    with pytest.raises(InvalidGrammarError, match="uniqueItems") as refused:
        parse_guided_request({"guided_json": schema}, GuidedConfig(backend=name))
    assert "uniqueItems" in refused.value.feature


@pytest.mark.parametrize("name", ("xgrammar", "llguidance"))
def test_structural_tags_do_not_get_the_guard(name):
    tag = {"format": {"type": "json_schema", "json_schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        parse_guided_request({"structural_tag": tag}, GuidedConfig(backend=name))


# ----- masks on a real tokenizer ------------------------------------------------------------------


def allowed_ids(bitmask, row=0) -> np.ndarray:
    words = bitmask[row].numpy().view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    return np.nonzero(bits)[0]


def adversarial_output(backend, tokenizer, schema, preferences: list[bytes], max_steps=200) -> str:
    """Decode under the mask, always taking the first allowed token of `preferences` (made to
    repeat items), else the first allowed stop token, else the lowest allowed id; after 80 steps
    closing brackets come first."""
    grammar = backend.new_grammar(backend.compile(parse_guided_request({"guided_json": schema})))
    assert isinstance(grammar, UniqueItemsGrammar)
    ids = [tokenizer.token_bytes.index(text) for text in preferences]
    closing = [tokenizer.token_bytes.index(text) for text in (b'"', b"]", b"}")] + ids
    bitmask = torch.zeros((1, (backend.vocab_size + 31) // 32), dtype=torch.int32)
    out = bytearray()
    for step in range(max_steps):
        grammar.fill_bitmask(bitmask, 0)
        allowed = set(allowed_ids(bitmask).tolist())
        assert allowed, f"dead end after {bytes(out)!r}"
        stops = [t for t in backend.stop_token_ids if t in allowed]
        token = next((t for t in (ids if step < 80 else closing) if t in allowed), stops[0] if stops else min(allowed))
        assert grammar.accept_token(token)
        if grammar.is_terminated():
            return out.decode()
        out += tokenizer.token_bytes[token]
    raise AssertionError(f"no end within {max_steps} tokens: {bytes(out)!r}")


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema, preferences", [
    (STRINGS, [b'"', b"a", b",", b"["]),
    (NUMBERS, [b",", b"1", b"0", b"["]),
    ({**STRINGS, "items": {"type": "string", "pattern": "^[a-z]+$"}}, [b'"', b"a", b",", b"["]),
    ({"type": "array", "uniqueItems": True, "minItems": 6}, [b"true", b"null", b"false", b",", b"1", b"[", b"{", b"}", b"]"]),
    ({**STRINGS, "items": {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"enum": ["a", "ab"]}]}}, [b'"', b"a", b"b", b",", b"["]),
    ({**STRINGS, "items": {"type": "string", "pattern": "^/?([^/]+/)*[^/]+/?$"}}, [b'"', b"a", b"/", b",", b"["]),  # open by its automaton
    ({**NUMBERS, "items": {"type": "integer"}}, [b",", b"0", b"-", b"1", b"["]),  # 0, then 0 and -0 begun again are refused
    ({**NUMBERS, "items": {"type": ["integer", "boolean"]}}, [b",", b"0", b"true", b"-", b"1", b"["]),
    ({**NUMBERS, "items": {"type": "integer", "not": {"const": 0}}}, [b",", b"-", b"1", b"["]),  # bounded away from 0
    ({"type": "object", "properties": {"t": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 4}},
      "required": ["t"]}, [b'"', b"t", b"a", b":", b",", b"[", b"{"]),
    # open because another item can always be appended (and lengths are unbounded)
    ({**STRINGS, "items": {"type": "array", "items": {"type": "boolean"}}}, [b"]", b"[", b"true", b","]),
    # the first item has nothing to repeat: a closed first position before open ones
    ({**STRINGS, "prefixItems": [{"enum": ["a"]}], "items": {"type": "string"}}, [b'"', b"a", b",", b"["]),
])
def test_an_adversarial_decoder_cannot_repeat_an_item(backends, tokenizer, name, schema, preferences):
    text = adversarial_output(backends[name], tokenizer, schema, preferences)
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    items = value if isinstance(value, list) else value["t"]
    assert len(items) >= 4 and len(set(map(json.dumps, items))) == len(items)


@pytest.mark.parametrize("name", BACKENDS)
def test_objects_with_typed_additional_properties_are_open_items(backends, tokenizer, name):
    """Another key (with a boolean value) can always be added, so a repeated object is refused
    at its close and the decoder goes on with a key: {} first, then never {} again."""
    schema = {"type": "array", "uniqueItems": True, "minItems": 2, "items": {"type": "object", "additionalProperties": {"type": "boolean"}}}
    text = adversarial_output(backends[name], tokenizer, schema, [b"}", b"]", b"false", b'"', b"a", b":", b",", b"{", b"["])
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    assert len(value) == 2 and value[0] == {} and value[1] != {}


# A tree whose children are unique nodes: the array sits inside the definition its items refer to,
# so the normaliser decides its uniqueItems only at emission (`unique_items._Pending`). The label
# (open) comes last: a repeated child is refused at its close while its label can still go on.
NODE = {"type": "object", "required": ["label"], "properties": {
    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "uniqueItems": True}, "label": {"type": "string"}}}
TREE = {**NODE, "$defs": {"node": NODE}, "properties": {**NODE["properties"], "children": {**NODE["properties"]["children"], "minItems": 3}}}


@pytest.mark.parametrize("name", BACKENDS)
def test_unique_items_inside_the_definition_they_refer_to(backends, tokenizer, name):
    """The decoder nests, then wants {"children": [], "label": ""} twice at the root: refused."""
    text = adversarial_output(backends[name], tokenizer, TREE, [b"children", b'"', b":", b"[", b"{", b"label", b"}", b",", b"]"],
                              max_steps=600)
    value = json.loads(text)
    jsonschema.Draft202012Validator(TREE, format_checker=jsonschema.FormatChecker()).validate(value)
    assert len(value["children"]) >= 3

    def walk(node):
        children = [json.dumps(child, sort_keys=True) for child in node.get("children", [])]
        assert len(children) == len(set(children))
        for child in node.get("children", []):
            walk(child)

    walk(value)


# Twelve values where "a1" begins "a10" and "a11": an item can be begun and left with no unused
# value to become; minItems asks for all of them, so the decoder must be steered to each.
FINITE_STRINGS = {"type": "array", "uniqueItems": True, "minItems": 12, "items": {"type": "string", "enum": [f"a{i}" for i in range(12)]}}
FINITE_INTEGERS = {"type": "array", "uniqueItems": True, "minItems": 13, "items": {"enum": list(range(13)) + ["x", True]}}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema, preferences", [
    (FINITE_STRINGS, [b'"', b"a", b"1", b",", b"["]),
    (FINITE_INTEGERS, [b"1", b",", b"true", b"[", b'"']),
    ({**FINITE_STRINGS, "minItems": 0}, [b'"', b"a", b"1", b",", b"["]),  # stops only when no value is left
    ({**FINITE_STRINGS, "items": {"anyOf": [{"enum": [f"a{i}" for i in range(6)]}, {"enum": [f"a{i}" for i in range(6, 12)]}]}},
     [b'"', b"a", b"1", b",", b"["]),
    ({**FINITE_STRINGS, "items": {"$ref": "#/$defs/a"}, "$defs": {"a": FINITE_STRINGS["items"]}}, [b'"', b"a", b"1", b",", b"["]),
])
def test_finite_domains_past_enumeration_stay_live_and_unique(backends, tokenizer, name, schema, preferences):
    text = adversarial_output(backends[name], tokenizer, schema, preferences, max_steps=400)
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    assert len(value) >= 12 and len(set(map(json.dumps, value))) == len(value)


def test_a_finite_domain_refuses_a_token_that_leaves_no_unused_value():
    tracker = tracker_for(FINITE_STRINGS)
    assert pushes(tracker, "[", '"a1"', ",", '"a11"', ",", '"a1') == [True] * 6  # "a10" is still free
    assert pushes(tracker, "1") == [False]  # "a11" is used: this item could only repeat it
    assert pushes(tracker, '0"') == [True]
    assert pushes(tracker, ",", '"a1') == [True, False]  # a1, a10, a11 all used: dead at once
    assert tracker.in_finite_domain()


@pytest.mark.parametrize("items, extra, domain", [
    ({"$ref": "#/$defs/c"}, {"$defs": {"c": {"type": "string", "enum": ["hex", "rgba"]}}}, (b'"hex"', b'"rgba"')),
    ({"anyOf": [{"enum": ["a", "b"]}, {"const": "c"}]}, {}, (b'"a"', b'"b"', b'"c"')),
    ({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]}, {}, (b'"a"', b'"c"')),  # "b" matches both
    ({"allOf": [{"type": "string", "description": "x"}], "enum": ["a", 1]}, {}, (b'"a"',)),
    ({"type": "string", "allOf": [{"description": "x"}], "enum": ["a", 1]}, {}, (b'"a"',)),  # an untyped part keeps the type
    ({"type": ["boolean", "null"]}, {}, (b"true", b"false", b"null")),
    ({"enum": [1, 2, True]}, {}, (b"1", b"2", b"true")),
    ({"anyOf": [{"enum": ["a", "b"]}, {"type": "string"}]}, {}, None),  # open
    ({"enum": ["a", "bb"], "maxLength": 1}, {}, None),  # narrowed by a keyword it does not mirror
    ({"enum": ["é"]}, {}, None),  # not a plain spelling
])
def test_item_domains_read_from_the_schema(items, extra, domain):
    paths = UniquePaths({"type": "array", "uniqueItems": True, "items": items, **extra})
    assert paths.item_domain(paths.root()) == domain


@pytest.mark.parametrize("name", BACKENDS)
def test_small_finite_domains_behind_refs_are_enumerated(name):
    schema = {"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/m"}, "$defs": {"m": {"enum": ["GET", "PUT"]}}}
    for guard in (True, False):
        emitted = for_engine(name if name != "auto" else "llguidance", schema, unique_guard=guard)
        arrays = emitted["enum"]
        assert sorted(map(tuple, arrays)) == [(), ("GET",), ("GET", "PUT"), ("PUT",), ("PUT", "GET")]


@pytest.mark.parametrize("name", BACKENDS)
def test_finite_domains_need_plain_spellings_and_room_for_min_items(name):
    config = GuidedConfig(backend=name)
    parse_guided_request({"guided_json": FINITE_STRINGS}, config)
    unplain = {**FINITE_STRINGS, "items": {"enum": [f"é{i}" for i in range(12)]}}  # an engine may escape it
    with pytest.raises(InvalidGrammarError, match="more than 256 possible arrays"):
        parse_guided_request({"guided_json": unplain}, config)
    with pytest.raises(InvalidGrammarError, match="admits no value"):
        parse_guided_request({"guided_json": {**FINITE_STRINGS, "minItems": 13}}, config)


@pytest.mark.parametrize("name", ("xgrammar", "llguidance"))
def test_batched_fills_apply_the_guard(backends, tokenizer, name):
    backend = backends[name]
    spec = parse_guided_request({"guided_json": STRINGS})
    compiled = backend.compile(spec)
    rows = max(backend.config.parallel_fill_min_rows, 2)
    grammars = [backend.new_grammar(compiled) for _ in range(rows)]
    quote, a = tokenizer.token_bytes.index(b'"'), tokenizer.token_bytes.index(b"a")
    for grammar in grammars:
        for text in (b"[", b'"', b"a", b'"', b",", b'"', b"a"):
            assert grammar.accept_token(tokenizer.token_bytes.index(text))
    batched = torch.zeros((rows, (backend.vocab_size + 31) // 32), dtype=torch.int32)
    backend.fill_bitmasks(grammars, batched, list(range(rows)))
    single = torch.zeros_like(batched)
    grammars[0].fill_bitmask(single, 0)
    assert torch.equal(batched[0], single[0])
    allowed = set(allowed_ids(batched, rows - 1).tolist())
    assert quote not in allowed and a in allowed


# ----- object items: the last property's open value keeps them live -------------------------------

NAMED = {"type": "array", "uniqueItems": True, "minItems": 4,
         "items": {"type": "object", "properties": {"name": {"enum": ["a"]}, "value": {"type": "string"}}, "required": ["name", "value"]}}
BAGGED = {"type": "array", "uniqueItems": True, "minItems": 3,
          "items": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "object"}}, "required": ["value"]}}
OPTIONAL = {"type": "array", "uniqueItems": True, "minItems": 4,
            "items": {"type": "object", "properties": {"name": {"type": "boolean"}, "value": {"type": "number"}}}}


MIXED = {"type": "array", "uniqueItems": True, "minItems": 5,
         "items": {"anyOf": [{"type": "string"}, {"type": "null"},
                             {"type": "object", "properties": {"k": {"type": "boolean"}, "v": {"type": "string"}}, "required": ["k", "v"]},
                             {"type": "object", "properties": {"n": {"type": "number"}}}]}}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema, preferences", [
    (NAMED, [b'"', b"a", b"name", b"value", b":", b",", b"{", b"}", b"["]),  # wants {"name":"a","value":""} again and again
    (MIXED, [b"{", b'"', b"k", b"true", b"v", b"}", b":", b",", b"null", b"["]),  # object alternatives beside open ones
    (BAGGED, [b"}", b'"', b"a", b"value", b"name", b":", b",", b"{", b"["]),
    (OPTIONAL, [b"}", b",", b"1", b"true", b"{", b"[", b'"', b"name", b":"]),
])
def test_object_items_whose_last_property_is_open_stay_live_and_unique(backends, tokenizer, name, schema, preferences):
    """The engine forces the close after the last property: a token ending its value as a repeat
    is refused while the value can go on (it fails with that check removed: a dead end)."""
    text = adversarial_output(backends[name], tokenizer, schema, preferences, max_steps=300)
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    assert len(value) >= schema["minItems"]


@pytest.mark.parametrize("name", BACKENDS)
def test_accepting_a_token_that_forces_a_repeated_object_is_refused(backends, tokenizer, name):
    grammar = backends[name].new_grammar(backends[name].compile(parse_guided_request({"guided_json": NAMED})))
    text = '[{"name":"a","value":"x"},{"name":"a","value":"x'
    for token in _greedy_tokens(tokenizer, text.encode()):
        assert grammar.accept_token(token)
    quote = tokenizer.token_bytes.index(b'"')
    assert not grammar.accept_token(quote)  # "x" again, and only } may follow it
    assert grammar.accept_token(tokenizer.token_bytes.index(b"a"))
    assert grammar.accept_token(quote)


def _greedy_tokens(tokenizer, data: bytes) -> list[int]:
    """Longest-match tokens spelling `data` exactly (no merges needed, only a valid spelling)."""
    by_bytes = {text: token for token, text in enumerate(tokenizer.token_bytes) if text}
    out, at = [], 0
    while at < len(data):
        for end in range(min(len(data), at + 16), at, -1):
            if data[at:end] in by_bytes:
                out.append(by_bytes[data[at:end]])
                at = end
                break
        else:
            raise AssertionError(f"no token for {data[at:at + 8]!r}")
    return out


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("items", [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},  # open: another key
    {"$ref": "#/$defs/pair"},
])
def test_object_items_with_an_open_last_property_are_admitted(name, items):
    schema = {"type": "array", "uniqueItems": True, "items": items,
              "$defs": {"pair": {"type": "object", "properties": {"k": {"enum": [1, 2]}, "v": {"type": "number"}}}}}
    parse_guided_request({"guided_json": schema}, GuidedConfig(backend=name))


@pytest.mark.parametrize("items", [
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string", "maxLength": 3}}},  # nothing open
    {"$ref": "#/$defs/y"},  # behind a $ref too, and nothing to move last
    {"type": "object", "properties": {"a": {"type": "string"}}, "maxProperties": 0},
    {"type": ["object", "integer"], "maximum": 5, "properties": {"a": {"type": "string"}}},  # 5 cannot go on
])
def test_object_items_that_can_dead_end_stay_refused(items):
    defs = {"y": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string", "maxLength": 3}}}}
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        parse_guided_request({"guided_json": {"type": "array", "uniqueItems": True, "items": items, "$defs": defs}})


ENABLED = {"type": "array", "uniqueItems": True, "minItems": 4,
           "items": {"type": "object", "properties": {"name": {"type": "string"}, "enabled": {"type": "boolean"}}, "required": ["name"]}}


@pytest.mark.parametrize("name", ("xgrammar", "llguidance"))
def test_the_last_open_property_is_moved_to_the_end(name):
    emitted = for_engine(name, ENABLED, unique_guard=True)
    assert list(emitted["items"]["properties"]) == ["enabled", "name"]
    assert list(for_engine(name, {**ENABLED, "uniqueItems": False}, unique_guard=True)["items"]["properties"]) == ["name", "enabled"]


# The same items behind a $ref: the array gets an inlined copy with the open property last (the
# definition itself, which other places may share, keeps its order).
ENABLED_BY_REF = {"$defs": {"entry": ENABLED["items"]}, "type": "array", "uniqueItems": True, "minItems": 4,
                  "items": {"$ref": "#/$defs/entry"}}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema", [ENABLED, ENABLED_BY_REF], ids=["inline", "by-ref"])
def test_object_items_with_the_open_property_moved_last_stay_live(backends, tokenizer, name, schema):
    text = adversarial_output(backends[name], tokenizer, schema, [b'"', b"}", b"true", b"a", b"name", b"enable", b"d", b":", b",", b"{", b"["],
                              max_steps=300)
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    assert len(value) >= 4


def test_properties_in_any_order_refuse_object_items():
    schema = {"type": "array", "uniqueItems": True, "items": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string"}}}}
    parse_guided_request({"guided_json": schema}, GuidedConfig(backend="xgrammar"))
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        parse_guided_request({"guided_json": schema, "guided_any_order": True}, GuidedConfig(backend="xgrammar"))


# ----- strings that can run out: a maxLength, a pattern that ends ---------------------------------

AB = {"type": "array", "uniqueItems": True, "minItems": 6, "items": {"type": "string", "pattern": "^[ab]+$", "maxLength": 2}}


@pytest.mark.parametrize("name", ("llguidance", "auto"))  # xgrammar refuses maxLength beside a pattern
@pytest.mark.parametrize("schema, preferences", [
    (AB, [b'"', b"a", b"b", b",", b"["]),  # a, aa, ab, b, ba, bb: each begun where every way on is used is refused
    ({**AB, "minItems": 0}, [b'"', b"a", b"b", b",", b"["]),  # ends only when none is left
    ({"type": "array", "uniqueItems": True, "minItems": 4, "items": {"type": ["string", "null"], "maxLength": 1, "pattern": "^[xy]*$"}},
     [b'"', b"x", b"null", b",", b"["]),
])
def test_strings_that_run_out_stay_live_and_unique(backends, tokenizer, name, schema, preferences):
    text = adversarial_output(backends[name], tokenizer, schema, preferences, max_steps=300)
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    assert len(value) == len(set(map(json.dumps, value)))
    if schema["items"].get("pattern") == "^[ab]+$":
        assert sorted(value) == ["a", "aa", "ab", "b", "ba", "bb"]


def test_a_string_begun_where_every_way_on_is_used_is_refused():
    tracker = tracker_for(AB)
    assert pushes(tracker, "[", '"a"', ",", '"aa"', ",", '"ab"', ",") == [True] * 7
    assert pushes(tracker, '"a') == [False]  # a, aa, ab: all used
    assert pushes(tracker, '"b', '"', ",", '"ba"', ",", '"bb"') == [True] * 6
    assert pushes(tracker, ",") == [False]  # all six used: another item could only repeat one


@pytest.mark.parametrize("name", ("llguidance", "auto"))
@pytest.mark.parametrize("items, admitted", [
    ({"type": "string", "maxLength": 40}, True),
    ({"type": ["string", "null"], "minLength": 1, "maxLength": 40}, True),
    ({"type": "string", "pattern": r"^\d+(\.\d+)?x$"}, True),
    ({"type": "string", "pattern": "^[0-9A-F]{8}$"}, True),
    ({"type": "string", "maxLength": 3}, True),
    ({"type": "string", "pattern": "^[ab]$"}, True),
    ({"type": "string", "pattern": "^(a|b+)$"}, True),  # "a" cannot go on: counted, not open
    ({"type": "string", "format": "date"}, True),
    ({"type": "string", "format": "uri", "pattern": "^h"}, True),  # two languages, joined as automata
])
def test_strings_that_can_run_out_are_admitted(name, items, admitted):
    parse_guided_request({"guided_json": {"type": "array", "uniqueItems": True, "items": items}}, GuidedConfig(backend=name))


def test_more_items_than_strings_is_refused():
    with pytest.raises(InvalidGrammarError):
        parse_guided_request({"guided_json": {**AB, "minItems": 7}}, GuidedConfig(backend="llguidance"))
