"""Large schema texts admitted unread (issue #22 item 3): read by the compile worker with the
verdicts admission reading them gives, and seen again by their text alone.

A text over `unread.UNREAD_TEXT_CHARS` under an admission budget gets a pending spec whose source
is the text as sent; the worker (`compile.worker._compile`, in process here) reads it through the
functions admission uses. Each case compares the verdict finally reached that way with inline
admission's (no budget: everything read on the thread), message and path included.
"""

import json
import pickle

import pytest
from guided_helpers import in_process_backend

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.admission import cache, deferred, unread
from fd_guided.admission.cache import MAX_PER_HASH, TextKey, VerdictCache
from fd_guided.compile import worker
from fd_guided.errors import error_class
from fd_guided.registry import get_backend_class
from fd_guided.spec import check_with_backend

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_admission_caches")]

INLINE = GuidedConfig(admission_budget_s=None)
BUDGET = GuidedConfig(admission_budget_s=0.002)  # the default budget (tests default to inline: conftest)
NO_BUDGET = GuidedConfig(admission_budget_s=0.0)
MIB = 1 << 20


def large_schema(properties: int = 9000, **extra) -> dict:
    """A schema of ~1 MB of indented text (~0.7 MB compact): `properties` string properties."""
    node = {"type": "string", "description": "é" * 10, "maxLength": 64}
    props = {f"property_{i:05d}": dict(node) for i in range(properties)}
    return {"type": "object", "properties": props, **extra}


MEDIUM = 4400  # properties: ~0.5 MB of indented text, ~5x `unread.UNREAD_TEXT_CHARS`


def text_of(schema) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False)


def eventual(fields: dict, config: GuidedConfig) -> tuple[str, str]:
    """What a client finally learns: admission's verdict, then what it left to the worker."""
    cache.PARSED.clear()
    cache.CHECKED.clear()
    try:
        spec = parse_guided_request(fields, config)
        if spec is not None:
            deferred.finish_deferred_checks(spec)
            check_with_backend(get_backend_class(config.backend), spec)
    except InvalidGrammarError as error:
        return type(error).__name__, str(error)
    return "admitted", ""


def test_a_1_mb_schema_text_is_left_unread_and_admitted_as_inline_admission_admits_it():
    text = text_of(large_schema())
    assert len(text.encode()) > 1_000_000
    spec = parse_guided_request({"guided_json": text}, BUDGET)
    assert spec is not None and spec.pending is not None and spec.pending.unread
    assert spec.source is text  # not read, not written: the text as sent is the key
    inline = parse_guided_request({"guided_json": text}, INLINE)
    assert inline.pending is None and len(inline.source) < len(text)
    assert spec.schema == inline.schema  # read (and checked) when the compile reads it
    assert eventual({"guided_json": text}, BUDGET) == eventual({"guided_json": text}, INLINE) == ("admitted", "")


@pytest.mark.parametrize(
    "case",
    [
        "bad type at a path",
        "dangling reference",
        "malformed JSON",
        "over 1 MiB compact",
        "100,000 deep",
        "lone surrogate",
        "integers past 64 bits",
    ],
)
def test_a_large_text_refused_or_admitted_by_the_worker_as_inline(case):
    text = ""
    # ~5x the unread threshold: every draft's meta-schema reads an invalid schema that has no
    # `$schema` (5 passes of pure Python, ~1 s each at 1 MB), three times a case here.
    schema = large_schema(MEDIUM)
    if case == "bad type at a path":
        schema["properties"]["property_04321"]["type"] = "strin"
        text = text_of(schema)
    elif case == "dangling reference":
        schema["properties"]["property_00007"] = {"$ref": "#/$defs/missing"}
        text = text_of(schema)
    elif case == "malformed JSON":
        text = text_of(schema)[:-1] + ",}"
    elif case == "over 1 MiB compact":
        text = text_of(large_schema(14000))
        assert MIB < len(text.encode()) < 2 * MIB
    elif case == "100,000 deep":
        text = '{"a":' * 100_000 + "{}" + "}" * 100_000
    elif case == "lone surrogate":
        schema["properties"]["property_00001"]["description"] = "a\ud800b"
        text = text_of(schema)
    elif case == "integers past 64 bits":
        schema["properties"]["property_00002"] = {"type": "integer", "maximum": 2**70}
        text = text_of(schema)
    fields = {"guided_json": text}
    assert len(text) > unread.UNREAD_TEXT_CHARS
    for config in (BUDGET, NO_BUDGET):
        cache.PARSED.clear()
        spec = parse_guided_request(fields, config)  # nothing refused on the thread: left unread
        assert spec is not None and spec.pending is not None and spec.pending.unread, case
    inline = eventual(fields, INLINE)
    assert eventual(fields, BUDGET) == inline, case
    assert eventual(fields, NO_BUDGET) == inline, case
    if case != "integers past 64 bits":
        assert inline[0] == "InvalidGrammarError", case


def test_a_refusal_decided_in_the_worker_for_a_large_text_names_the_path_and_is_remembered():
    schema = large_schema(MEDIUM)
    schema["properties"]["property_04321"]["type"] = "strin"
    fields = {"guided_json": text_of(schema)}
    spec = parse_guided_request(fields, BUDGET)
    sent = pickle.loads(pickle.dumps(spec))  # what a compile worker receives
    assert sent.pending is not None and sent.pending.unread and not sent.pending.checked
    status, class_name, message, part, feature = worker._compile(in_process_backend("llguidance"), "llguidance", sent)
    assert status == "error" and message.startswith(deferred.DEFERRED_TAG)
    error, was_deferred = deferred.learned(spec, error_class(class_name)(message, part=part, feature=feature))
    assert was_deferred and error.part == "guided_json.properties.property_04321.type"
    assert "not a valid JSON schema" in str(error)
    with pytest.raises(InvalidGrammarError, match="not a valid JSON schema") as again:
        parse_guided_request({"guided_json": text_of(schema)}, BUDGET)  # the same text, a new object
    assert again.value.part == "guided_json.properties.property_04321.type"


def test_the_worker_compiles_a_large_text_it_read():
    spec = parse_guided_request({"guided_json": text_of(large_schema(2000))}, BUDGET)
    assert spec.pending is not None and spec.pending.unread
    outcome = worker._compile(in_process_backend("llguidance"), "llguidance", pickle.loads(pickle.dumps(spec)))
    assert outcome[0] == "ok"


def test_non_utf8_bytes_are_refused_at_admission_as_before():
    text = text_of(large_schema(2000)).encode()
    bad = text[:5000] + b"\xff\xfe" + text[5000:]
    fields = {"guided_json": bad}
    verdict = eventual(fields, BUDGET)
    assert verdict == eventual(fields, INLINE)
    assert verdict[0] == "InvalidGrammarError" and "not valid UTF-8" in verdict[1] and "at byte 5000" in verdict[1]
    good = parse_guided_request({"guided_json": text}, BUDGET)  # valid UTF-8 bytes: left unread
    assert good.pending is not None and good.pending.unread and good.source == text.decode()


@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 100_000 + "]" * 100_000, "not an object: refused here as before"),
        (" " * 70_000 + "true", "`true` padded: admitted here as `{}`"),
        (text_of(large_schema(2000)).replace('"type"', '"typ\\u0065"', 1), "a letter spelled as an escape"),
    ],
)
def test_texts_that_may_read_otherwise_are_read_on_the_thread(text, why):
    assert len(text) > unread.UNREAD_TEXT_CHARS
    fields = {"guided_json": text}
    try:
        spec = parse_guided_request(fields, BUDGET)
    except InvalidGrammarError:
        spec = None
    assert spec is None or spec.pending is None or not spec.pending.unread, why
    assert eventual(fields, BUDGET) == eventual(fields, INLINE), why


def test_a_text_seen_before_is_found_by_its_text_and_only_by_the_same_text():
    text = text_of(large_schema(3000))
    first = parse_guided_request({"guided_json": text}, BUDGET)
    hits = cache.PARSED.hits
    again = parse_guided_request({"guided_json": "".join(list(text))}, BUDGET)  # equal, a new object
    assert again is first and cache.PARSED.hits == hits + 1
    # One character changed where no sample looks (the middle of a step): another request.
    middle = len(text) // 2 + 1
    changed = text[:middle] + ("x" if text[middle] != "x" else "y") + text[middle + 1 :]
    assert TextKey(changed) == TextKey(changed) and TextKey(changed) != TextKey(text)
    other = parse_guided_request({"guided_json": changed}, BUDGET)
    assert other is not first and other.source is changed


class _CountedText(str):
    """A text that counts how often it is compared whole."""

    compared = 0

    def __ne__(self, other):
        _CountedText.compared += 1
        return str.__ne__(self, other)


def test_a_text_found_again_is_compared_whole_once_per_lookup():
    """The LRU's lookup and its move to the end both compare the key: after the first equal
    comparison the two keys share one string, so the second is an identity check (a megabyte
    compared once, not twice, in a seen-before admission)."""
    text = text_of(large_schema(3000))
    stored, asked = TextKey(_CountedText(text)), TextKey(_CountedText("".join(list(text))))
    assert stored.text is not asked.text
    verdicts = VerdictCache()
    verdicts.verdict(stored, len(text), lambda: "verdict")
    _CountedText.compared = 0
    assert verdicts.verdict(asked, len(text), lambda: "decided again") == "verdict"
    assert _CountedText.compared == 1 and asked.text is stored.text


class _Colliding(str):
    """Texts sharing one hash: what an attacker could craft against a sampled hash."""

    def __hash__(self):
        return 42


def test_texts_made_to_collide_are_kept_at_most_max_per_hash_times():
    verdicts = VerdictCache()
    for i in range(MAX_PER_HASH + 5):
        verdicts.verdict(_Colliding(f"text {i}"), 10, lambda i=i: i)
    assert len(verdicts) == MAX_PER_HASH  # a lookup compares at most that many texts
    assert verdicts.verdict(_Colliding("text 0"), 10, lambda: "again") == 0
    assert verdicts.verdict(_Colliding("text 8"), 10, lambda: "again") == "again"  # not kept: decided again
    verdicts.clear()
    assert len(verdicts) == 0 and verdicts.verdict(_Colliding("text 8"), 10, lambda: 8) == 8


def test_a_text_past_twice_the_limit_or_choices_past_theirs_are_refused_without_a_cache_entry():
    for fields in (
        {"guided_json": " " * (2 * MIB + 1)},
        {"guided_choice": [f"w{i}" for i in range(20_001)]},
    ):
        for _ in range(2):
            with pytest.raises(InvalidGrammarError, match="over the limit"):
                parse_guided_request(fields, BUDGET)
        assert len(cache.PARSED) == 0


@pytest.mark.parametrize("text", [text_of(large_schema(2000)) + "\n", "{" + " " * 70_000 + "}\n"])
def test_fastdeploys_request_field_carries_an_unread_text_with_its_options(text):
    """FastDeploy's checker writes the spec back into the request (options appended to the source,
    on the engine's thread, without reading it): an unread text, padded as sent, stays valid JSON."""
    from fd_guided.integrations.fastdeploy.admission import OPTIONS_KEY, request_field_for

    spec = parse_guided_request({"guided_json": text}, BUDGET)
    assert spec.pending is not None and spec.pending.unread
    field, value = request_field_for(spec)
    document = json.loads(value)
    assert field == "guided_json" and document.pop(OPTIONS_KEY)["strict"] is True
    assert document == json.loads(text)
