"""The batch manager's hooks on real Paddle logits, a real tokenizer and real xgrammar matchers."""
import threading
import time

import numpy as np
import paddle
import pytest

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.manager import GuidedDecodingManager
from fd_guided.spec import GrammarSpec
from fd_guided.tokenizer import load_tokenizer
from guided_helpers import add_ready

pytestmark = pytest.mark.cpu

VOCAB = 129_280
EOS = 1


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture()
def manager(tokenizer):
    backend = XGrammarBackend(tokenizer, vocab_size=VOCAB)
    manager = GuidedDecodingManager(backend, max_num_seqs=8, think_end_id=tokenizer.think_end_id)
    yield manager
    manager.close()


def logits_for(rows: int) -> paddle.Tensor:
    return paddle.to_tensor(np.random.default_rng(0).standard_normal((rows, VOCAB)).astype("float32"))


def allowed(row: paddle.Tensor) -> set[int]:
    return set(np.flatnonzero(np.isfinite(row.numpy())).tolist())


def token_of(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def step(manager, rows, tokens=None):
    """One decode step; returns (logits before sampling, finishes)."""
    manager.begin_step(rows)
    logits = logits_for(len(rows))
    manager.apply(logits)
    finishes = manager.accept(tokens if tokens is not None else [EOS] * len(rows))
    return logits, finishes


CHOICE = parse_guided_request({"guided_choice": ["yes", "no"]})


def test_masks_only_guided_rows_and_in_place(manager, tokenizer):
    add_ready(manager, 3, CHOICE, prefill_done=True)
    manager.begin_step([None, 3])
    logits = logits_for(2)
    before = logits.numpy().copy()
    pointer = logits.data_ptr()
    manager.apply(logits)
    assert logits.data_ptr() == pointer
    np.testing.assert_array_equal(logits[0].numpy(), before[0])  # the unguided row is untouched
    first_tokens = allowed(logits[1])
    assert token_of(tokenizer, "yes") in first_tokens and token_of(tokenizer, "no") in first_tokens
    assert EOS not in first_tokens and len(first_tokens) < 20
    np.testing.assert_array_equal(logits[1].numpy()[sorted(first_tokens)], before[1][sorted(first_tokens)])


def test_full_choice_then_stop(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    _, finishes = step(manager, [0], [token_of(tokenizer, "yes")])
    assert finishes == []
    logits, finishes = step(manager, [0], [EOS])
    assert allowed(logits[0]) == {EOS}
    assert [(f.slot, f.reason) for f in finishes] == [(0, "stop")]


def test_no_mask_before_the_final_prefill_chunk(manager):
    add_ready(manager, 1, CHOICE)
    manager.begin_step([1])
    logits = logits_for(1)
    before = logits.numpy().copy()
    manager.apply(logits)
    np.testing.assert_array_equal(logits.numpy(), before)
    assert manager.accept([12345]) == []  # a non-final chunk's token is not fed to the grammar
    manager.mark_prefill_done([1])
    logits, _ = step(manager, [1], [EOS])
    assert len(allowed(logits[0])) < 20


def test_rejected_token_fails_only_that_request(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    add_ready(manager, 1, CHOICE, prefill_done=True)
    _, finishes = step(manager, [0, 1], [token_of(tokenizer, "maybe"), token_of(tokenizer, "no")])
    assert [(f.slot, f.reason) for f in finishes] == [(0, "error")]
    assert "rejected" in finishes[0].error
    assert manager.metrics.value("rejected_tokens_total") == 1
    _, finishes = step(manager, [0, 1], [EOS, EOS])  # slot 0 is finished: skipped, never re-reported
    assert [(f.slot, f.reason) for f in finishes] == [(1, "stop")]


def test_reasoning_is_unconstrained_until_think_end(manager, tokenizer):
    think_end = tokenizer.think_end_id
    add_ready(manager, 0, CHOICE, prefill_done=True, enable_thinking=True)
    logits, _ = step(manager, [0], [token_of(tokenizer, "maybe")])
    assert len(allowed(logits[0])) == VOCAB
    logits, finishes = step(manager, [0], [think_end])
    assert len(allowed(logits[0])) == VOCAB and finishes == []
    logits, _ = step(manager, [0], [token_of(tokenizer, "no")])
    assert len(allowed(logits[0])) < 20


@pytest.mark.parametrize("case", ["thinking_disabled", "think_end_in_prompt"])
def test_constrained_at_once_without_reasoning(manager, tokenizer, case):
    if case == "thinking_disabled":
        add_ready(manager, 0, CHOICE, prefill_done=True, enable_thinking=False)
    else:
        add_ready(manager, 0, CHOICE, prefill_done=True, enable_thinking=True, prompt_token_ids=[5, tokenizer.think_end_id])
    logits, _ = step(manager, [0])
    assert len(allowed(logits[0])) < 20


def test_replayed_tokens_continue_the_constraint(manager, tokenizer):
    schema = parse_guided_request({"guided_json": {"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"]}, "disable_any_whitespace": True})
    replay = tokenizer.encode('{"a":')
    add_ready(manager, 2, schema, output_token_ids=replay, enable_thinking=False)
    logits, _ = step(manager, [2], [token_of(tokenizer, '"')])
    text_tokens = {tokenizer.decode([t]) for t in allowed(logits[0])}
    assert text_tokens and all('"x"'.startswith(t) for t in text_tokens), text_tokens


def test_replay_with_a_rejected_token_fails_the_request(manager, tokenizer):
    add_ready(manager, 0, CHOICE, output_token_ids=tokenizer.encode("maybe"))
    _, finishes = step(manager, [0])
    assert [f.reason for f in finishes] == ["error"]


def test_compile_failure_fails_only_its_slot(manager):
    json_format = parse_guided_request({"guided_json": {"type": "integer"}}).json_format
    bad = GrammarSpec("json_schema", '{"type":"array","items":{"type":"integer","maximum":5},"uniqueItems":true}', json_format)  # bypasses admission
    add_ready(manager, 0, bad, prefill_done=True)
    add_ready(manager, 1, CHOICE, prefill_done=True)
    logits, finishes = step(manager, [0, 1], [EOS, token_of(manager.backend.tokenizer, "yes")])
    assert [(f.slot, f.reason) for f in finishes] == [(0, "error")]
    assert "failed to compile" in finishes[0].error
    assert len(allowed(logits[1])) < 20


class SlowBackend(XGrammarBackend):
    """The real xgrammar backend whose regex compiles wait for a gate (thread isolation: in-process)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def compile(self, spec):
        if spec.kind == "regex":
            self.gate.wait(10)
        return super().compile(spec)


def test_the_step_never_waits_for_a_compile_and_an_unready_row_fails_alone(tokenizer):
    backend = SlowBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(compile_isolation="thread"))
    manager = GuidedDecodingManager(backend, max_num_seqs=4)
    try:
        manager.add_request(0, parse_guided_request({"guided_regex": "z+"}), prefill_done=True)
        add_ready(manager, 1, CHOICE, prefill_done=True)
        assert not manager.is_ready(0) and manager.is_ready(1) and manager.is_ready(3)  # 3: no request
        started = time.perf_counter()
        logits, finishes = step(manager, [0, 1], [EOS, token_of(tokenizer, "no")])
        assert time.perf_counter() - started < 5  # the gate holds the compile for 10 s
        assert [(f.slot, f.reason) for f in finishes] == [(0, "error")] and "still compiling" in finishes[0].error
        assert manager.metrics.value("unready_samples_total") == 1
        assert allowed(logits[0]) == {EOS}  # the failed row samples a stop token, never an unmasked one
        assert len(allowed(logits[1])) < 20
    finally:
        backend.gate.set()
        manager.close()


def test_finished_rows_allow_only_stop_tokens(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    step(manager, [0], [token_of(tokenizer, "no")])
    _, finishes = step(manager, [0], [EOS])
    assert [f.reason for f in finishes] == ["stop"]
    logits, finishes = step(manager, [0], [EOS])  # the host keeps sampling it (min_tokens, late retire)
    assert allowed(logits[0]) == {EOS} and finishes == []


def test_a_dead_end_row_fails_its_request_not_the_batch(manager, tokenizer):
    # "a" then an empty class: the grammar allows "a" and then no token at all. (A regex of that
    # shape is refused at admission, as Python reads it; an EBNF grammar only its compiler reads.)
    dead_end = parse_guided_request({"guided_grammar": 'root ::= "a" [^\\u0000-\\U0010ffff]'}, GuidedConfig(backend="xgrammar"))
    add_ready(manager, 0, dead_end, prefill_done=True)
    add_ready(manager, 1, CHOICE, prefill_done=True)
    _, finishes = step(manager, [0, 1], [token_of(tokenizer, "a"), token_of(tokenizer, "yes")])
    assert finishes == []
    logits, finishes = step(manager, [0, 1], [EOS, EOS])
    assert allowed(logits[0]) == {EOS}  # nothing was allowed: the row sampled a stop token, not an unmasked one
    assert [(f.slot, f.reason) for f in finishes] == [(0, "error"), (1, "stop")]
    assert "allows no token" in finishes[0].error
    assert manager.metrics.value("dead_end_rows_total") == 1


def test_hooks_out_of_order_raise_slot_state_errors(manager):
    from fd_guided import SlotStateError

    add_ready(manager, 0, CHOICE, prefill_done=True)
    with pytest.raises(SlotStateError, match="release it first"):
        manager.add_request(0, CHOICE)
    manager.begin_step([0])
    with pytest.raises(SlotStateError, match="being prepared"):
        manager.release(0)
    manager.apply(logits_for(1))
    manager.release(0)  # after apply: its row is simply not advanced
    assert manager.accept([EOS]) == []
    add_ready(manager, 0, CHOICE, prefill_done=True)  # free again


def test_tokens_the_host_forced_are_not_rejections(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    add_ready(manager, 1, CHOICE, prefill_done=True)
    manager.begin_step([0, 1])
    manager.apply(logits_for(2))
    # Row 0: the host overwrote the sample with EOS (length limit); row 1: a token outside the mask
    # that the host names as one it forces (tests/manager/test_host_forced.py: one it does not).
    maybe = token_of(tokenizer, "maybe")
    finishes = manager.accept([EOS, maybe], masked_out="host", host_forced={maybe: "limit_marker"})
    assert finishes == [] and manager.metrics.value("rejected_tokens_total") == 0
    assert manager.finish_of(0).reason == "forced"
    assert manager.metrics.labelled("host_forced_tokens_total") == {"stop": 1, "limit_marker": 1}
    logits, finishes = step(manager, [0, 1], [EOS, token_of(tokenizer, "no")])
    assert allowed(logits[0]) == {EOS}  # ended by the host: only stop tokens from now on
    assert token_of(tokenizer, "no") in allowed(logits[1])  # row 1 kept its state: "maybe" was not fed


def test_released_slot_is_not_masked_by_a_stale_row(manager):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    step(manager, [0])
    manager.release(0)
    logits, _ = step(manager, [0])  # the same slot now serves an unguided request
    assert len(allowed(logits[0])) == VOCAB


def test_row_count_mismatch_is_reported(manager):
    from fd_guided import SlotStateError

    manager.begin_step([0, 1])
    with pytest.raises(SlotStateError, match="2 rows"):
        manager.apply(logits_for(3))
    with pytest.raises(SlotStateError):
        manager.add_request(99, CHOICE)


def test_many_rows_use_the_parallel_fill(tokenizer):
    backend = XGrammarBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(parallel_fill_min_rows=4, fill_threads=2))
    manager = GuidedDecodingManager(backend, max_num_seqs=16)
    for slot in range(16):
        add_ready(manager, slot, CHOICE, prefill_done=True)
    logits, _ = step(manager, list(range(16)), [token_of(tokenizer, "yes")] * 16)
    expected = allowed(logits[0])
    assert all(allowed(logits[r]) == expected for r in range(16))
    manager.close()
