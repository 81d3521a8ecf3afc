"""JSON read and written by orjson at admission (`fd_guided.admission.json_text`), with the standard
library's verdicts: every document reads as ``json.loads`` reads it, every refusal is the one the
standard library's path gives, and equal documents get one source whatever form they came in.
"""

import enum
import json
import random
import uuid

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.admission import cache, json_text
from fd_guided.admission.documents import compact, compact_size_at_least

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_admission_caches")]

INLINE = GuidedConfig(admission_budget_s=None)
LIMIT = INLINE.limits.max_constraint_bytes


def admit(value, **fields):
    spec = parse_guided_request({"guided_json": value, **fields}, INLINE, check_backend=False)
    assert spec is not None
    return spec


def refusal(value) -> InvalidGrammarError:
    with pytest.raises(InvalidGrammarError) as refused:
        parse_guided_request({"guided_json": value}, INLINE, check_backend=False)
    return refused.value


def nested(levels: int) -> dict:
    """`levels` objects, each the ``not`` of the one before (a valid schema at any depth)."""
    node: dict = {"type": "string"}
    for _ in range(levels - 1):
        node = {"not": node}
    return node


def test_integers_past_64_bits_are_kept_exact_from_text_and_from_objects():
    big = 2**64 + 1
    text = f'{{"type": "integer", "maximum": {big}, "minimum": -{big}}}'
    from_text, from_dict = admit(text), admit({"type": "integer", "maximum": big, "minimum": -big})
    assert from_text.source == from_dict.source == f'{{"type":"integer","maximum":{big},"minimum":-{big}}}'
    assert from_text.schema["maximum"] == big and isinstance(from_text.schema["maximum"], int)
    assert json_text.read(text) is None  # orjson would read it as a float: the standard library reads it


def test_duplicate_keys_keep_the_last_value_at_the_first_keys_place():
    text = '{"type": "object", "maxProperties": 1, "properties": {}, "maxProperties": 3}'
    spec = admit(text)
    assert spec.schema == json.loads(text) and list(spec.schema) == list(json.loads(text))
    assert spec.source == '{"type":"object","maxProperties":3,"properties":{}}'


def test_non_utf8_bytes_are_refused_naming_the_byte():
    error = refusal(b'{"type": "string", "pattern": "\xff\xfe"}')
    assert str(error) == "guided_json: not valid UTF-8 (invalid start byte at byte 31)"


@pytest.mark.parametrize("form", ["text", "bytes"])
def test_a_100000_deep_text_is_refused_quickly(form):
    text = "[" * 100_000 + "]" * 100_000
    error = refusal(text if form == "text" else text.encode())
    assert error.part == "guided_json" and "nested more than 128 levels deep" in str(error)


def test_a_100000_deep_object_is_refused():
    assert str(refusal(nested(100_000))) == "guided_json: nested more than 128 levels deep"


@pytest.mark.parametrize("form", ["text", "dict"])
def test_128_levels_are_admitted_and_129_refused(form):
    def value(levels):
        return json.dumps(nested(levels)) if form == "text" else nested(levels)

    assert admit(value(128)).source == json.dumps(nested(128), separators=(",", ":"))
    assert str(refusal(value(129))) == "guided_json: nested more than 128 levels deep"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_in_text_are_refused_naming_where(literal):
    error = refusal(f'{{"type": "number", "maximum": {literal}}}')
    assert error.part == "guided_json.maximum" and "is not a JSON number" in str(error)


@pytest.mark.parametrize("number", [float("nan"), float("inf")])
def test_non_finite_numbers_in_objects_are_refused_and_never_read_as_null(number):
    admit({"type": "number", "const": None})  # its twin, if NaN were written as null, cached first
    error = refusal({"type": "number", "const": number})
    assert error.part == "guided_json.const" and "is not a JSON number" in str(error)


def _long_schema(number) -> dict:
    """An object schema whose compact text is past `cache.SAMPLED_TEXT_CHARS` (its key a
    `TextKey`, its null literals' places looked up in `cache.NULL_PLACES`), `number` its last const."""
    properties = {f"p{i:04d}": {"type": "string", "description": "x" * 20} for i in range(300)}
    return {"type": "object", "properties": {**properties, "n": {"type": "number", "const": number}}}


@pytest.mark.parametrize("number", [float("nan"), float("-inf")])
@pytest.mark.parametrize("twin", [None, 1.5])
def test_a_long_object_seen_before_is_never_its_non_finite_twin(twin, number):
    """A long object's text is searched for null literals once; found again, the search is a
    lookup. Its twin with NaN where it had null writes the same text, and one with NaN where it
    had a number another text: both refused, never served the admitted twin's verdict."""
    first = admit(_long_schema(twin))
    assert len(first.source) > cache.SAMPLED_TEXT_CHARS
    hits = cache.NULL_PLACES.hits
    assert admit(_long_schema(twin)) is first  # new objects, equal: the verdict found again
    assert cache.NULL_PLACES.hits == hits + 1  # the null literals looked up, not searched for
    error = refusal(_long_schema(number))
    assert error.part == "guided_json.properties.n.const" and "is not a JSON number" in str(error)
    assert admit(_long_schema(twin)) is first


def test_null_places_are_where_orjson_writes_null():
    nan, inf = float("nan"), float("inf")
    value = {"a": None, "b": [1, nan, {"c": (None, 2.5)}], "d": {"e": -inf, "f": "null"}, "g": False}
    places = json_text.null_places(value, 16)
    assert sorted(places, key=repr) == sorted([("a",), ("b", 1), ("b", 2, "c", 0), ("d", "e")], key=repr)
    assert json_text.null_places(value, 3) is None  # past the limit
    assert json_text.null_places(None, 1) == ((),) and json_text.null_places(nan, 1) == ((),)
    assert json_text.null_places([1, "x"], 1) == () and json_text.null_places(7, 1) == ()
    assert not json_text.nulls_at(value, places)  # NaN and Infinity are not None
    clean = {"a": None, "b": [1, None, {"c": (None, 2.5)}], "d": {"e": None, "f": "null"}, "g": False}
    assert json_text.write(clean) == json_text.write_unchecked(value)  # the same text
    assert json_text.nulls_at(clean, places)
    assert not json_text.nulls_at({"a": None}, places)  # a place the value lacks


@pytest.mark.parametrize("number", [float("nan"), float("inf")])
def test_a_long_object_with_many_nulls_seen_before_is_never_its_non_finite_twin(number):
    """Past `cache.MAX_NULL_PLACES` null literals a text's places are not kept: the whole value is
    checked for NaN, every time."""
    properties = {f"p{i:04d}": {"default": None, "description": "x" * 10} for i in range(cache.MAX_NULL_PLACES + 1)}
    schema = {"type": "object", "properties": properties}
    first = admit(schema)
    assert admit(json.loads(json.dumps(schema))) is first
    twin = json.loads(json.dumps(schema))
    twin["properties"]["p0100"]["default"] = number
    error = refusal(twin)
    assert error.part == "guided_json.properties.p0100.default" and "is not a JSON number" in str(error)


@pytest.mark.parametrize("form", ["escape", "text", "dict"])
def test_lone_surrogates_are_refused_naming_where(form):
    value = {
        "escape": '{"type": "string", "description": "a\\ud800"}',
        "text": '{"type": "string", "description": "a\ud800"}',
        "dict": {"type": "string", "description": "a\ud800"},
    }[form]
    error = refusal(value)
    assert error.part == "guided_json.description" and "not valid Unicode text" in str(error)


class Colour(enum.Enum):
    RED = "red"


class Size(enum.IntEnum):
    SMALL = 1


@pytest.mark.parametrize("value", [{"a"}, b"x", float("nan"), 1j])
def test_values_json_cannot_hold_are_refused_naming_where(value):
    error = refusal({"enum": [value]})
    assert error.part == "guided_json.enum[0]" and "is not a JSON" in str(error)


NATIVE = [(uuid.UUID(int=7), str(uuid.UUID(int=7))), (Colour.RED, "red")]


@pytest.mark.parametrize(("value", "written"), NATIVE, ids=["uuid", "enum"])
@pytest.mark.parametrize("twin_first", [True, False], ids=["twin_first", "object_first"])
def test_values_orjson_writes_natively_read_as_what_it_writes_in_every_check(value, written, twin_first):
    """A UUID or an enum member in a host's objects is read as the JSON orjson writes for it, by
    every check: it and its JSON twin get one verdict, whichever comes first (one cache key)."""
    requests = [
        {"guided_json": {"enum": [value]}},
        {"guided_json": {"type": "string", "pattern": value}},
        {"guided_choice": ["a", value]},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"const": value}}}},
        {"guided_json": {"type": value}},  # refused: not a type name
        {"guided_json": {"type": "object"}, "separators": [value, ":"]},  # refused: not a separator
    ]

    def verdict(fields):
        try:
            spec = parse_guided_request(fields, INLINE)
        except InvalidGrammarError as error:
            return "refused", str(error)
        return "admitted", spec

    def twin(node):
        if node is value:
            return written
        if isinstance(node, dict):
            return {key: twin(child) for key, child in node.items()}
        return [twin(child) for child in node] if isinstance(node, list) else node

    for fields in requests:
        pair = [fields, twin(fields)] if not twin_first else [twin(fields), fields]
        assert verdict(pair[0]) == verdict(pair[1]), fields
        cache.PARSED.clear()
        cache.CHECKED.clear()
        assert verdict(pair[1]) == verdict(pair[0]), fields  # decided afresh, the other way round
    assert verdict(requests[0])[0] == "admitted" and verdict(requests[4])[0] == "refused"


def test_tuples_and_int_subclasses_read_as_their_json_forms():
    assert admit({"enum": (1, 2), "maximum": Size.SMALL}).source == admit({"enum": [1, 2], "maximum": 1}).source


def test_a_key_that_is_not_a_string_is_refused_even_after_its_string_twin():
    admit({"type": "object", "properties": {"1": {}}})
    error = refusal({"type": "object", "properties": {1: {}}})  # json.dumps writes 1 as "1": one cache key before
    assert error.part == "guided_json.properties" and "object keys must be strings" in str(error)


EQUAL_FORMS = [
    '{"type": "number", "minimum": 1e-7, "maximum": 1E+16, "multipleOf": 0.000025, "default": -0.0,\n'
    '  "description": "caf\\u00e9 \\ud83d\\ude00 \\/"}',
    '{"type":"number","minimum":0.0000001,"maximum":10000000000000000.0,"multipleOf":2.5e-5,"default":-0.0,'
    '"description":"café 😀 /"}',
]


def test_equal_documents_get_one_source_whatever_their_form():
    document = json.loads(EQUAL_FORMS[0])
    sources = {admit(form).source for form in EQUAL_FORMS}
    sources |= {admit(EQUAL_FORMS[0].encode()).source, admit(document).source, admit(dict(document)).source}
    sources.add(
        parse_guided_request(
            {"response_format": {"type": "json_schema", "json_schema": {"schema": document}}},
            INLINE,
            check_backend=False,
        ).source
    )
    assert len(sources) == 1
    assert json.loads(sources.pop()) == document


def _one_megabyte_schema(description: str, fields: int) -> dict:
    return {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "description": description} for i in range(fields)},
    }


def _largest_under_the_limit() -> dict:
    low, high = 1, 10_000  # fields: compact(low) fits, compact(high) does not
    while low + 1 < high:
        middle = (low + high) // 2
        low, high = (middle, high) if len(compact(_one_megabyte_schema("d" * 80, middle))) <= LIMIT else (low, middle)
    return _one_megabyte_schema("d" * 80, low)


def test_a_schema_at_the_size_limit_is_admitted_and_one_past_it_refused_as_before():
    under = _largest_under_the_limit()
    assert LIMIT - 200 < len(compact(under)) <= LIMIT
    assert admit(json.dumps(under, indent=4)).source == compact(under)  # 1.4 MB of text, 1 MB compact
    assert admit(under).source == compact(under)
    over = {**under, "description": "x" * max(0, LIMIT + 1 - len(compact(under)) - len(',"description":""'))}
    size = len(compact(over))
    assert size == LIMIT + 1
    for value in (over, json.dumps(over), json.dumps(over, indent=1)):
        error = refusal(value)
        assert str(error).startswith("guided_json: the schema is ") and f"over the limit of {LIMIT:,}" in str(error)
        assert error.feature == f"schema larger than {LIMIT:,} bytes"
        assert f"is {size:,} bytes" in str(error) or "is at least" in str(error)


def test_a_text_surely_too_large_is_refused_unread_and_the_bound_never_refuses_what_fits():
    spaced = json.dumps(_one_megabyte_schema("a b " * 40, 4_500), indent=8)
    assert len(spaced) > LIMIT >= len(compact(json.loads(spaced)))
    assert compact_size_at_least(spaced) <= len(compact(json.loads(spaced)).encode())
    admit(spaced)
    escaped = '{"description": "' + "\\u00e9" * 200_000 + "\\ud83d\\ude00" * 30_000 + '"}'
    assert compact_size_at_least(escaped) <= len(compact(json.loads(escaped)).encode()) <= LIMIT
    admit(escaped)
    wide = json.dumps(_one_megabyte_schema("d" * 80, 14_000), indent=4)
    assert compact_size_at_least(wide) > LIMIT
    assert "is at least" in str(refusal(wide))


def test_orjson_reads_json_text_as_the_standard_library_does():
    """Differential fuzzing: a text orjson reads is one json.loads reads, to the same document."""
    rng = random.Random(22)
    seeds = [
        '{"a": [1, 2.5, -0, 1e5, "x\\u00e9\\n", true, false, null, {"b": {}}], "c": "d", "c": 2}',
        '{"n": 123456789012345678901234567890, "s": "\\ud83d\\ude00"}',
    ]
    alphabet = list('{}[]",:0123456789.eE+-\\ubfnrt/ \t\n\r\x0c\x00\x01\x7fa\ufeff\ud800é')
    agreed = 0
    for _ in range(20_000):
        text = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(text))
            if rng.random() < 0.5:
                del text[at]
            else:
                text.insert(at, rng.choice(alphabet))
        candidate = "".join(text)
        found = json_text.read(candidate)
        if found is None:
            continue
        expected = json.loads(candidate)  # raises (failing the test) if orjson read what json refuses
        assert found[0] == expected and json.dumps(found[0]) == json.dumps(expected), candidate
        assert json.loads(found[1]) == expected
        agreed += 1
    assert agreed > 500


def test_the_depth_bound_follows_orjsons_write_limit():
    assert json_text._WRITE_LIMIT is not None and json_text._WRAPPERS == json_text._WRITE_LIMIT - 128
    assert json_text.write(nested(128)) is not None and json_text.write(nested(129)) is None


def test_the_size_bound_given_the_limit_counts_tabs_only_when_it_must():
    tabbed = "{\t" + "".join(f'"a{i}":\t1,\t' for i in range(200)) + '"b":\r\n2}'
    full = compact_size_at_least(tabbed)
    assert full <= len(compact(json.loads(tabbed)).encode())
    assert compact_size_at_least(tabbed, limit=full - 1) == full  # over the limit: every character counted
    assert full <= compact_size_at_least(tabbed, limit=len(tabbed)) <= len(tabbed)  # within: tabs left
    assert compact_size_at_least(tabbed.encode()) == full
