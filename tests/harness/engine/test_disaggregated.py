"""Disaggregated prefill/decode: a decode instance continues what a prefill instance started.

Both sides are mini FastDeploy runners (tests/fd_runner.py) with their own backend, compile
service and manager. The prefill instance admits the request, prefills it and samples under
the constraint; the request (normalised fields, prompt, generated tokens) crosses to the
decode instance through a Redis list, as FastDeploy's splitwise scheduler sends it, or through
plain pickled bytes; the decode instance replays the generated tokens (reasoning included) and
decodes under the same constraint. With Redis, the decode instance also reuses the prefill
instance's compile through `RedisGrammarCache`.
"""
import pickle
import time

import pytest

from fd_guided import parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.compile import CompileService
from fd_guided.integrations.fastdeploy import schema_checker
from fd_guided.redis_cache import RedisGrammarCache
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output

from corpus import CHOICES, REGEXES, SCHEMAS
from fd_runner import VOCAB, MiniFastDeployRunner, Request, fd_config
from redis_server import free_port, running_redis

pytestmark = pytest.mark.cpu

CASES = [
    {"guided_json": SCHEMAS["person"]},
    {"guided_json": SCHEMAS["tool_call"], "disable_any_whitespace": True},
    {"guided_regex": REGEXES["email"]},
    {"guided_choice": CHOICES["shared_prefix"]},
]
THINKING = "Let me think about the format first"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture(scope="module")
def redis_client():
    with running_redis() as client:
        yield client


def admitted_requests(tokenizer, *, reasoning: bool) -> tuple[list[Request], list]:
    """API server side: build and normalise the requests; returns them with their specs."""
    checker = schema_checker("xgrammar")
    requests, specs = [], []
    for index, fields in enumerate(CASES):
        specs.append(parse_guided_request(fields))
        request = Request(request_id=f"pd-{index}", prompt_token_ids=tokenizer.encode(f"Answer {index} in format:"),
                          seed=index, max_tokens=96, **fields)
        if reasoning:
            request.enable_thinking = True
            request.scripted_tokens = tokenizer.encode(THINKING) + [tokenizer.think_end_id]
        _, error = checker.schema_format(request)
        assert error is None, error
        requests.append(request)
    return requests, specs


def run_disaggregated(tokenizer, send, receive, *, reasoning: bool, p_cache=None, d_cache=None):
    requests, specs = admitted_requests(tokenizer, reasoning=reasoning)
    parser = "deepseek_r1" if reasoning else None
    # P samples the first token under the mask; a thinking request hands over after its
    # reasoning, the think-end token and one constrained token.
    handoff_after = len(tokenizer.encode(THINKING)) + 2 if reasoning else 1
    prefill = MiniFastDeployRunner(fd_config(4, reasoning_parser=parser), role="prefill", handoff_after=handoff_after, shared_cache=p_cache)
    decode = MiniFastDeployRunner(fd_config(4, reasoning_parser=parser), role="decode", shared_cache=d_cache)
    try:
        prefill.run(requests)
        assert [r.request_id for r in prefill.handed_off] == [r.request_id for r in requests]
        for request in prefill.handed_off:
            send(request)
        received = receive(len(requests))
        assert [r.output_token_ids for r in received] == [r.output_token_ids for r in prefill.handed_off]
        decode.run(received)
        return prefill, decode, received, specs
    finally:
        prefill.close()
        decode.close()


def check_outputs(tokenizer, prefill, decode, received, specs, *, reasoning: bool):
    think_end = tokenizer.think_end_id
    for request, spec in zip(received, specs):
        assert request.finish_reason == "stop", (request.request_id, request.finish_reason, request.error)
        if reasoning:
            assert request.output_token_ids.index(think_end) == len(tokenizer.encode(THINKING))
        verdict = validate_output(spec, decode.text(request))
        assert verdict.valid, (spec.kind, decode.text(request), verdict.reason)
    # The decode instance constrains from its very first step: P's tokens were replayed,
    # reasoning included, before D's first mask.
    first_rows = decode.masked_rows[0]
    assert len(first_rows) == len(received) and all(n < VOCAB // 2 for n in first_rows.values()), first_rows
    if reasoning:  # on P, the reasoning section itself was never masked
        reasoning_rows = [n for step in prefill.masked_rows[: len(tokenizer.encode(THINKING)) + 1] for n in step.values()]
        assert reasoning_rows and all(n == VOCAB for n in reasoning_rows)


@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
def test_decode_instance_continues_under_the_constraint_in_process(tokenizer, reasoning):
    wire: list[bytes] = []
    send = lambda request: wire.append(pickle.dumps(request, protocol=5))  # noqa: E731
    receive = lambda count: [pickle.loads(data) for data in wire[:count]]  # noqa: E731
    prefill, decode, received, specs = run_disaggregated(tokenizer, send, receive, reasoning=reasoning)
    check_outputs(tokenizer, prefill, decode, received, specs, reasoning=reasoning)


@pytest.mark.redis
@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
def test_decode_instance_continues_through_redis_and_reuses_the_compile(tokenizer, redis_client, reasoning):
    major, minor = (int(x) for x in redis_client.info()["redis_version"].split(".")[:2])
    assert (major, minor) >= (6, 2)  # FastDeploy's splitwise scheduler pops with RPOP count
    redis_client.flushall()
    queue = f"ReqQ_decode_{reasoning}"

    def send(request):
        redis_client.lpush(queue, pickle.dumps(request, protocol=5))

    def receive(count):
        received = []
        deadline = time.monotonic() + 10
        while len(received) < count and time.monotonic() < deadline:
            received += [pickle.loads(item) for item in redis_client.rpop(queue, 50) or []]
        return received

    p_cache, d_cache = RedisGrammarCache(redis_client), RedisGrammarCache(redis_client)
    prefill, decode, received, specs = run_disaggregated(tokenizer, send, receive, reasoning=reasoning, p_cache=p_cache, d_cache=d_cache)
    check_outputs(tokenizer, prefill, decode, received, specs, reasoning=reasoning)
    p_metrics, d_metrics = prefill.guided_backend.metrics, decode.guided_backend.metrics
    assert p_metrics.value("compile_seconds") == len(CASES) and p_metrics.value("shared_cache_misses_total") == len(CASES)
    assert d_metrics.value("shared_cache_hits_total") == len(CASES)
    assert d_metrics.value("compile_seconds") == 0  # the decode instance compiled nothing


# ----- the shared cache itself -----------------------------------------------------------------

@pytest.fixture(scope="module")
def backend(tokenizer):
    backend = XGrammarBackend(tokenizer, vocab_size=VOCAB)
    yield backend
    backend.close()


def spec_of(fields):
    return parse_guided_request(fields)


@pytest.mark.redis
def test_redis_key_covers_tokenizer_stop_ids_vocab_and_json_format(tokenizer, backend, redis_client):
    cache = RedisGrammarCache(redis_client)
    person = spec_of({"guided_json": SCHEMAS["person"]})
    compact = spec_of({"guided_json": SCHEMAS["person"], "disable_any_whitespace": True})
    assert cache.key(person, backend) == RedisGrammarCache(redis_client).key(person, XGrammarBackend(tokenizer, vocab_size=VOCAB))
    assert cache.key(person, backend) != cache.key(compact, backend)
    other_stops = XGrammarBackend(tokenizer, vocab_size=VOCAB, stop_token_ids=[1, 2])
    wider = XGrammarBackend(tokenizer, vocab_size=VOCAB + 32)
    assert len({cache.key(person, b) for b in (backend, other_stops, wider)}) == 3
    assert cache.key(person, backend).startswith("fd_guided:grammar:")


@pytest.mark.redis
def test_redis_values_expire_and_oversized_values_are_not_stored(backend, redis_client):
    spec = spec_of({"guided_regex": REGEXES["semver"]})
    cache = RedisGrammarCache(redis_client, ttl_s=120)
    cache.put(spec, backend, b"payload")
    assert cache.get(spec, backend) == b"payload" and 0 < redis_client.ttl(cache.key(spec, backend)) <= 120
    small = RedisGrammarCache(redis_client, max_value_bytes=4, prefix="small:")
    small.put(spec, backend, b"too large")
    assert small.get(spec, backend) is None


@pytest.mark.redis
def test_foreign_bytes_in_redis_are_refused_and_compiled_locally(backend, redis_client):
    spec = spec_of({"guided_regex": REGEXES["hex_color"]})
    cache = RedisGrammarCache(redis_client, prefix="foreign:")
    cache.put(spec, backend, b'{"not": "a compiled grammar"}')
    service = CompileService(backend, shared_cache=cache)
    try:
        assert service.compile_now(spec).spec == spec
        assert service.metrics.value("shared_cache_misses_total") == 1 and service.metrics.value("compile_seconds") == 1
    finally:
        service.close()


def test_unreachable_redis_never_raises_and_compiles_locally(backend):
    pytest.importorskip("redis")
    cache = RedisGrammarCache.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2)
    spec = spec_of({"guided_regex": REGEXES["phone"]})
    started = time.monotonic()
    assert cache.get(spec, backend) is None
    cache.put(spec, backend, b"data")
    assert time.monotonic() - started < 5
    service = CompileService(backend, shared_cache=cache)
    try:
        assert service.compile_now(spec).spec == spec
        assert service.metrics.value("shared_cache_misses_total") == 1
    finally:
        service.close()


def test_ttl_and_size_arguments_are_checked():
    with pytest.raises(ValueError):
        RedisGrammarCache(None, ttl_s=0)
    with pytest.raises(ValueError):
        RedisGrammarCache(None, max_value_bytes=0)
