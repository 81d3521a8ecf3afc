"""Admission verdicts remembered by canonical hash: the same spec object or the same refusal again,
key order kept (it is the generation order), bounded, and a fraction of a cold admission's time."""

from __future__ import annotations

import time

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.admission import cache
from fd_guided.admission.cache import VerdictCache

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "age": {"type": "integer", "minimum": 0},
    },
    "required": ["name"],
}


@pytest.fixture(autouse=True)
def fresh():
    cache.PARSED.clear()
    cache.CHECKED.clear()


def test_a_schema_seen_before_is_the_same_spec_from_a_lookup():
    config = GuidedConfig(backend="auto")
    first = parse_guided_request({"guided_json": dict(SCHEMA)}, config)
    started = time.perf_counter()
    again = [parse_guided_request({"guided_json": dict(SCHEMA)}, config) for _ in range(200)]
    per_request = (time.perf_counter() - started) / 200
    assert all(spec is first for spec in again)
    assert per_request < 0.5e-3, per_request  # the bound is 0.2 ms; slack for two shared cores


def test_key_order_is_part_of_the_key():
    one = parse_guided_request({"guided_json": {"properties": {"a": {}, "b": {}}}}, check_backend=False)
    two = parse_guided_request({"guided_json": {"properties": {"b": {}, "a": {}}}}, check_backend=False)
    assert one.source != two.source and list(two.schema["properties"]) == ["b", "a"]


def test_options_and_config_are_part_of_the_key():
    fields = {"guided_json": SCHEMA}
    loose = parse_guided_request(fields, GuidedConfig(backend="auto"))
    compact = parse_guided_request({**fields, "any_whitespace": False}, GuidedConfig(backend="auto"))
    strict = parse_guided_request(fields, GuidedConfig(backend="auto", strict_mode=not GuidedConfig().strict_mode))
    assert len({loose.json_format, compact.json_format, strict.json_format}) == 3


def test_a_refusal_is_remembered_and_raised_afresh():
    fields = {"guided_grammar": 'root ::= ("a" | '}
    errors = []
    for _ in range(2):
        with pytest.raises(InvalidGrammarError) as refused:
            parse_guided_request(fields)
        errors.append(refused.value)
    assert errors[0] is not errors[1] and str(errors[0]) == str(errors[1])
    assert errors[1].part == "guided_grammar" and cache.PARSED.hits == 1


def test_what_is_not_plain_json_is_never_cached():
    pydantic = pytest.importorskip("pydantic")

    class Model(pydantic.BaseModel):
        name: str

    for _ in range(2):
        parse_guided_request({"guided_json": Model}, check_backend=False)
    assert cache.PARSED.hits == 0 and len(cache.PARSED) == 0


def test_the_cache_is_bounded_by_entries_and_bytes():
    lru = VerdictCache(max_entries=3, max_bytes=100)
    for index in range(5):
        lru.verdict(index, 10, lambda index=index: index)
    assert len(lru) == 3
    lru.verdict("big", 75, lambda: "big")  # 3 + 4 + big = 95 bytes; 2 dropped by count, not bytes
    assert lru._bytes <= 100 and len(lru) <= 3 and lru.verdict("big", 75, lambda: "other") == "big"
    lru.verdict("huge", 101, lambda: "huge")
    assert "huge" not in lru._entries


def test_fastdeploys_checker_can_leave_the_normaliser_to_the_compile_worker():
    """FD_GUIDED_DEFER_SCHEMA_CHECKS: the engine's insertion thread runs the bounded checks and the
    backend verdicts it remembers; what it has not seen is decided by the compile (in a worker)."""
    from fd_guided.integrations.fastdeploy.admission import SchemaChecker

    unenforceable = {"type": "array", "contains": {"const": 1}}
    deferred = SchemaChecker(GuidedConfig(backend="auto"), defer_backend_check=True)
    assert deferred.schema_format({"guided_json": dict(unenforceable)})[1] is None
    assert "column" in deferred.schema_format({"guided_grammar": 'root ::= ("a" | '})[1]  # syntax: always inline
    inline = SchemaChecker(GuidedConfig(backend="auto"))
    assert "contains" in inline.schema_format({"guided_json": dict(unenforceable)})[1]
    assert "contains" in deferred.schema_format({"guided_json": dict(unenforceable)})[1]  # remembered now
