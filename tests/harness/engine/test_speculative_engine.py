"""The reference engine speculates, jumps forward, reasons and keeps min_tokens, with guided
decoding on real logits: every finished output validates, greedy speculative output is the
non-speculative greedy output, and sampled verification has the target's distribution."""
import numpy as np
import paddle
import pytest

from fd_guided import GuidedConfig
from fd_guided.harness.validate import validate_output
from fd_guided.harness.engine.engine import ReferenceEngine, SpeculativeConfig
from fd_guided.harness.engine.sampling import SamplingParams
from fd_guided.harness.engine.verify import verify

from corpus import GRAMMARS, REGEXES, SCHEMAS

pytestmark = pytest.mark.cpu

MAX_TOKENS = 40
XGRAMMAR = GuidedConfig(backend="xgrammar")


def mixed_requests(**extra) -> list[dict]:
    requests = [{"prompt": f"Return {name} as JSON.", "guided_json": SCHEMAS[name], **extra}
                for name in ("person", "enum_status", "nested_address", "array_of_objects")]
    requests.append({"prompt": "Compact person:", "guided_json": SCHEMAS["person"], "disable_any_whitespace": True, **extra})
    requests += [{"prompt": f"A {name}:", "guided_regex": REGEXES[name], **extra} for name in list(REGEXES)[:2]]
    requests += [{"prompt": f"Derive {name}:", "guided_grammar": GRAMMARS[name], **extra} for name in list(GRAMMARS)[:2]]
    requests.append({"prompt": "Unconstrained:", **extra})
    return requests


def run(engine, requests, seed=0):
    results = engine.generate(requests, max_tokens=MAX_TOKENS, seed=seed)
    for request, result in zip(requests, results):
        assert result.error is None, (request, result.error)
        assert result.finish_reason in ("stop", "length"), result
        if result.finish_reason == "stop" and result.spec is not None:
            verdict = validate_output(result.spec, result.text)
            assert verdict.valid, f"{request}\n-> {result.text!r}\n{verdict.reason}"
    return results


@pytest.fixture(scope="module")
def greedy_baseline():
    # One engine pinned: `auto` serves a request with whichever engine compiles first, and the
    # engines may differ on which tokenizations they allow, so greedy text could depend on timing.
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=16, guided_config=XGRAMMAR)
    requests = mixed_requests(temperature=0)
    yield requests, [r.text for r in run(engine, requests)]
    engine.close()


@pytest.mark.parametrize("drafter", ["ngram", "draft_model"])
def test_greedy_speculative_output_is_the_greedy_output_for_every_k(greedy_baseline, drafter):
    requests, expected = greedy_baseline
    acceptance = {}
    for k in range(1, 8):
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=16, guided_config=XGRAMMAR,
                                         speculative=SpeculativeConfig(drafter, k, masked_drafts=k % 2 == 1))
        texts = [r.text for r in run(engine, requests)]
        assert texts == expected, (drafter, k)
        assert engine.stats.draft_tokens > 0
        acceptance[k] = engine.stats.acceptance_length
        engine.close()
    assert max(acceptance.values()) > 1.0, acceptance  # drafts were really accepted


def test_greedy_speculative_output_is_the_greedy_output_on_llguidance():
    config = GuidedConfig(backend="llguidance")
    requests = mixed_requests(temperature=0)
    texts = {}
    for speculative in (None, SpeculativeConfig("ngram", 3), SpeculativeConfig("draft_model", 5, masked_drafts=False)):
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=16, guided_config=config, speculative=speculative)
        texts[speculative] = [r.text for r in run(engine, requests)]
        engine.close()
    baseline = texts.pop(None)
    assert all(t == baseline for t in texts.values())


def test_masked_draft_model_drafts_are_accepted_more_often():
    requests = mixed_requests(temperature=0)[:6]
    lengths = {}
    for masked in (False, True):
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=16, guided_config=XGRAMMAR,
                                         speculative=SpeculativeConfig("draft_model", 3, masked_drafts=masked))
        run(engine, requests)
        lengths[masked] = engine.stats.acceptance_length
        engine.close()
    assert lengths[True] > lengths[False], lengths


def test_sampled_speculative_outputs_are_valid_with_both_drafters_and_engines():
    for drafter, backend in (("ngram", "llguidance"), ("draft_model", "xgrammar")):
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=16, guided_config=GuidedConfig(backend=backend),
                                         speculative=SpeculativeConfig(drafter, 4))
        results = run(engine, mixed_requests(temperature=1.0, top_k=20), seed=5)
        assert sum(r.finish_reason == "stop" for r in results) >= 5
        engine.close()


@pytest.mark.parametrize("q_kind", ["point_mass", "draft_distribution"])
def test_rejection_sampling_verification_has_the_target_distribution(q_kind):
    """Two rows over a 6-token vocabulary: the first emitted token must follow p0, whatever q is."""
    rng = np.random.default_rng(0)
    target = np.log(np.array([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]], dtype=np.float32))
    logits = paddle.to_tensor(target)
    params = SamplingParams(temperature=1.0, top_k=0)
    q = (np.array([3, 1, 0]), np.array([0.6, 0.3, 0.1]))
    counts = np.zeros(6)
    trials = 20_000
    for _ in range(trials):
        if q_kind == "point_mass":
            draft, dists = 3, None
        else:
            draft = int(rng.choice(q[0], p=q[1]))
            dists = [q]
        first = verify(logits, [0], [[draft]], [params], [rng], [dists], [1])[0][0]
        counts[first] += 1
    expected = np.exp(target[0]) / np.exp(target[0]).sum()
    np.testing.assert_allclose(counts / trials, expected, atol=0.012)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_jump_forward_saves_forward_passes_on_key_heavy_schemas(backend):
    schema = {"type": "object", "properties": {name: {"type": "boolean"} for name in
                                               ("is_enabled", "has_children", "was_verified", "needs_review", "can_export")},
              "required": ["is_enabled", "has_children", "was_verified", "needs_review", "can_export"]}
    requests = [{"prompt": f"Flags {i}:", "guided_json": schema, "disable_any_whitespace": True} for i in range(4)]
    passes = {}
    for on in (False, True):
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=8, guided_config=GuidedConfig(backend=backend, jump_forward=on))
        results = engine.generate(requests, max_tokens=80, seed=2)
        for result in results:
            assert result.finish_reason == "stop" and validate_output(result.spec, result.text).valid, result
        passes[on] = engine.stats.forward_passes_per_token
        assert (engine.stats.jump_tokens > 0) == on
        engine.close()
    assert passes[True] <= 0.75 * passes[False], passes


def test_jump_forward_per_request_and_with_speculation():
    schema = SCHEMAS["person"]
    requests = [{"prompt": "P:", "guided_json": schema, "disable_any_whitespace": True, "jump_forward": on, "temperature": 0}
                for on in (True, False, None)]
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=8, guided_config=XGRAMMAR, speculative=SpeculativeConfig("ngram", 3))
    results = run(engine, requests)
    assert engine.stats.jump_tokens > 0
    # The jumping request's forced tokens are its own re-encoding, so its context (and its greedy
    # text) may differ from the others'; the one without jump-forward is the server default's twin.
    assert results[1].text == results[2].text and results[1].token_ids == results[2].token_ids
    engine.close()


def test_min_tokens_never_leaves_a_row_without_a_legal_token():
    # The sampler raises on an all -inf row, so finishing at all proves every row kept a token.
    requests = [{"prompt": "Pick:", "guided_choice": ["yes", "no"], "min_tokens": 30},
                {"prompt": "Letters:", "guided_regex": "[a-z]{1,12}", "min_tokens": 8},
                {"prompt": "Free:", "min_tokens": 6, "max_tokens": 10}]
    for speculative in (None, SpeculativeConfig("ngram", 3)):
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=4, speculative=speculative)
        choice, letters, free = run(engine, requests)
        assert choice.finish_reason == "stop" and choice.text in ("yes", "no")  # the constraint wins over min_tokens
        assert letters.finish_reason == "stop" and (len(letters.token_ids) >= 8 or len(letters.text) == 12)
        assert len(free.token_ids) >= 6
        engine.close()


@pytest.mark.parametrize("thinking", [None, False, True])
@pytest.mark.parametrize("closed_in_prompt", [False, True])
def test_reasoning_matrix_with_a_multi_token_think_end_and_a_budget(thinking, closed_in_prompt):
    engine = ReferenceEngine.default(preset="tiny", tokenizer="qwen", max_num_seqs=4, think_end="</think>",
                                     speculative=SpeculativeConfig("ngram", 2))
    marker = engine.tokenizer.encode("</think>")
    assert len(marker) > 1
    prompt = "Think, then answer." + (" <think>ok</think>" if closed_in_prompt else "")
    request = {"prompt": prompt, "guided_choice": ["alpha", "beta"], "reasoning_budget": 5}
    if thinking is not None:
        request["enable_thinking"] = thinking
    [result] = engine.generate([request], max_tokens=MAX_TOKENS, seed=4)
    assert result.finish_reason == "stop", result
    ids = result.token_ids
    if thinking and not closed_in_prompt:
        end = _marker_end(ids, marker)
        assert end <= 5 + len(marker)  # the budget forced the marker (the model may have begun it)
        answer = engine.tokenizer.decode(ids[end:])
    else:
        answer = result.text
    assert answer in ("alpha", "beta"), result.text
    engine.close()


def _marker_end(ids, marker) -> int:
    for end in range(len(marker), len(ids) + 1):
        if ids[end - len(marker):end] == marker:
            return end
    raise AssertionError(f"no think-end marker in {ids}")
