"""End to end on the reference engine: random-weight Paddle LM, real tokenizers, real xgrammar.

Every output that finishes under a constraint must validate (jsonschema / re.fullmatch / choice
membership / grammar re-parse); an output cut by max_tokens must say ``length``.
"""
import json

import pytest

from fd_guided import GuidedConfig
from fd_guided.harness.validate import validate_output
from fd_guided.harness.engine import ReferenceEngine, XPUModelRunner

from corpus import CHOICES, GRAMMARS, REGEXES, SCHEMAS, STRUCTURAL_TAGS

pytestmark = pytest.mark.cpu

MAX_TOKENS = 96


def corpus_requests() -> list[dict]:
    requests = [{"prompt": f"Return {name} as JSON.", "guided_json": schema} for name, schema in SCHEMAS.items()]
    requests += [{"prompt": f"Compact {name}:", "guided_json": schema, "disable_any_whitespace": True} for name, schema in list(SCHEMAS.items())[:6]]
    requests += [{"prompt": f"A {name}:", "guided_regex": pattern} for name, pattern in REGEXES.items()]
    requests += [{"prompt": f"Pick ({name}):", "guided_choice": choices} for name, choices in CHOICES.items()]
    requests += [{"prompt": f"Derive {name}:", "guided_grammar": grammar} for name, grammar in GRAMMARS.items()]
    requests += [{"prompt": "Call a tool:", "structural_tag": tag} for tag in STRUCTURAL_TAGS.values()]
    requests += [{"prompt": "Any object:", "response_format": {"type": "json_object"}}]
    requests += [{"prompt": "OpenAI style:", "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"], "strict": True}}}]
    return requests


@pytest.fixture(scope="module", params=["deepseek", "qwen"])
def engine(request):
    engine = ReferenceEngine.default(preset="tiny", tokenizer=request.param, max_num_seqs=32)
    yield engine
    engine.close()


def check_results(requests, results, min_finished_fraction):
    finished = 0
    for request, result in zip(requests, results):
        assert result.error is None, (request, result.error)
        assert result.finish_reason in ("stop", "length"), result
        if result.finish_reason == "length":
            assert len(result.token_ids) == MAX_TOKENS
            continue
        finished += 1
        verdict = validate_output(result.spec, result.text)
        assert verdict.valid, f"{request}\n-> {result.text!r}\n{verdict.reason}"
    assert finished >= min_finished_fraction * len(requests), f"only {finished}/{len(requests)} finished"


def test_conformance_corpus(engine):
    requests = corpus_requests()
    assert len(SCHEMAS) >= 30
    results = engine.generate(requests, max_tokens=MAX_TOKENS, seed=1)
    check_results(requests, results, min_finished_fraction=0.75)


def test_json_outputs_parse_to_the_schema_types(engine):
    results = engine.generate([{"prompt": "p", "guided_json": SCHEMAS["person"]}] * 4, max_tokens=MAX_TOKENS, seed=3)
    for result in results:
        if result.finish_reason == "stop":
            person = json.loads(result.text)
            assert isinstance(person["name"], str) and 0 <= person["age"] <= 130


def test_max_tokens_says_length_not_stop(engine):
    # (budget steering off: it would refuse a 12-token budget for 200 letters at the first step)
    requests = [{"prompt": "Long:", "guided_regex": "[a-z]{200}", "guided_fit_budget": False}, {"prompt": "free text", "max_tokens": 5}]
    results = engine.generate(requests, max_tokens=12)
    assert results[0].finish_reason == "length" and len(results[0].token_ids) == 12
    assert results[1].finish_reason in ("length", "stop") and len(results[1].token_ids) <= 5


def test_bad_requests_fail_alone_in_a_mixed_batch(engine):
    requests = [
        {"prompt": "ok", "guided_choice": ["red", "green"]},
        {"prompt": "bad", "guided_json": "{not json"},
        {"prompt": "ok", "guided_json": SCHEMAS["enum_status"]},
        {"prompt": "bad", "guided_json": {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}},
        {"prompt": "bad", "guided_regex": "(unclosed"},
        {"prompt": "bad", "guided_choice": []},
        {"prompt": "ok", "guided_regex": REGEXES["hex_color"]},
        {"prompt": "bad", "guided_regex": "a", "guided_choice": ["a"]},
    ]
    results = engine.generate(requests, max_tokens=MAX_TOKENS)
    bad = {1: "malformed JSON", 3: "uniqueItems", 4: "guided_regex", 5: "at least one", 7: "only one kind"}
    for index, result in enumerate(results):
        if index in bad:
            assert result.finish_reason == "error" and bad[index] in result.error
        else:
            assert result.finish_reason == "stop" and validate_output(result.spec, result.text).valid


def test_chunked_prefill_long_prompts_stay_valid():
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=4, max_num_batched_tokens=16)
    prompt = "Write the JSON for this long description. " * 12
    requests = [{"prompt": prompt, "guided_json": SCHEMAS[name]} for name in ("person", "tool_call", "invoice", "defs_ref")]
    requests += [{"prompt": prompt, "guided_choice": CHOICES["sentiment"]}] * 3
    results = engine.generate(requests, max_tokens=MAX_TOKENS, seed=5)
    check_results(requests, results, min_finished_fraction=0.5)
    engine.close()


def test_xpu_like_runner_with_the_paddle_kernel_matches_the_cpu_runner():
    requests = [{"prompt": "p", "guided_json": SCHEMAS["tool_call"]}, {"prompt": "q", "guided_regex": REGEXES["email"]}, {"prompt": "r"}]
    cpu = ReferenceEngine.default(preset="tiny", max_num_seqs=4)
    xpu = ReferenceEngine.default(preset="tiny", max_num_seqs=4, runner_cls=XPUModelRunner, runner_kwargs={"device": "cpu"})
    assert xpu.manager.kernel_impl == "paddle" and cpu.manager.kernel_impl == "cpu"
    a = cpu.generate(requests, max_tokens=48, seed=7)
    b = xpu.generate(requests, max_tokens=48, seed=7)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    cpu.close()
    xpu.close()


def test_an_inline_fill_masks_exactly_as_the_overlapped_one():
    # `fd-guided serve` fills inline (its model runs on the CPU); the masks must not change.
    requests = [{"prompt": "p", "guided_json": SCHEMAS["tool_call"]}, {"prompt": "q", "guided_regex": REGEXES["email"]},
                {"prompt": "r", "guided_choice": CHOICES["sentiment"]}, {"prompt": "s"}]
    # One engine pinned: under auto, which engine serves a cold request is timing.
    config = GuidedConfig(backend="llguidance")
    overlapped = ReferenceEngine.default(preset="tiny", max_num_seqs=4, guided_config=config)
    inline = ReferenceEngine.default(preset="tiny", max_num_seqs=4, guided_config=config, overlap_fill=False)
    a = overlapped.generate(requests, max_tokens=MAX_TOKENS, seed=3)
    b = inline.generate(requests, max_tokens=MAX_TOKENS, seed=3)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert inline.manager.timings.fill > 0
    check_results(requests, b, min_finished_fraction=0.5)
    overlapped.close()
    inline.close()


def test_reasoning_request_is_constrained_after_think_end():
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=2)
    think_end = engine.tokenizer.think_end_id
    # The prompt already closes the thinking section: constrained from the first token.
    prompt = "Think first.<think>ok</think>"
    results = engine.generate([{"prompt": prompt, "guided_choice": ["alpha", "beta"], "enable_thinking": True}], max_tokens=16)
    assert think_end in engine.tokenizer.encode(prompt)
    assert results[0].finish_reason == "stop" and results[0].text in ("alpha", "beta")
    engine.close()


def test_queued_requests_compile_while_they_wait():
    """Compiles start at admission: a request waiting for a slot never misses the cache when added."""
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=1)
    requests = [{"prompt": f"Record {i}:", "guided_json": {**SCHEMAS["person"], "title": f"queued-{i}"}} for i in range(3)]
    results = engine.generate(requests, max_tokens=MAX_TOKENS, seed=3)
    check_results(requests, results, min_finished_fraction=0.5)
    metrics = engine.manager.metrics
    assert metrics.value("compile_requests_total") == 6  # one at admission, one when the slot is assigned
    assert metrics.value("cache_misses_total") == 3
    assert metrics.value("cache_hits_total") + metrics.value("inflight_joins_total") == 3
    engine.close()
