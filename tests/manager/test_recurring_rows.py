"""A slow engine's deeper states' rows copied when a request reaches them by the same tokens as an
earlier one (`fd_guided.manager.recurring_rows`): the same masks as the engine's fill, on real
engines (llguidance, auto with both engines, a uniqueItems guard), kept only where sound."""
import numpy as np
import pytest
import torch

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.manager import GuidedDecodingManager
from fd_guided.manager.recurring_rows import RecurringRows
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer
from guided_helpers import add_ready

pytestmark = pytest.mark.cpu

VOCAB = 129_280

# Served by llguidance under auto (xgrammar cannot enforce patternProperties): inside a key that
# may end, llguidance walks the whole token trie at every fill (the slow states this is for).
PATTERNED = {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}, "additionalProperties": False}
PATTERNED_OUTPUTS = ['{"x-ab":1,"x-cd":2}', '{"x-ab":1,"x-cd":3}', '{"x-ab":1,"x-c":4}', '{"x-ab":7}']
OBJECT = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
GUARDED = {"type": "array", "items": {"type": "string", "pattern": "^[a-c]+$"}, "uniqueItems": True}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def masks_along(tokenizer, engine, schema, outputs, recurring):
    """Each step's words of one slot walking `outputs` in turn, first states never copied, deeper
    ones through `recurring` (None: off)."""
    config = GuidedConfig(backend=engine, compile_isolation="thread", auto_first_ready=False)
    backend = create_backend(engine, tokenizer, vocab_size=VOCAB, config=config)
    manager = GuidedDecodingManager(backend, max_num_seqs=2)
    manager.step.fill.first_masks = None
    manager.step.fill.recurring_rows = recurring
    spec = parse_guided_request({"guided_json": schema}, config)
    rows = []
    try:
        for text in outputs:
            tokens = tokenizer.encode(text) + [tokenizer.eos_token_ids[0]]
            add_ready(manager, 1, spec, prefill_done=True)
            for token in tokens:
                manager.begin_step([None, 1])
                manager.apply(torch.zeros((2, VOCAB)))
                rows.append(manager.step.bitmask_words[1].copy())
                assert allows(rows[-1], token), (text, token)
                finishes = manager.accept([0, token])
                if finishes:
                    assert finishes[0].reason == "stop", finishes
                    break
            manager.release(1)
        counted = manager.metrics.value("recurring_rows_total")
    finally:
        manager.close()
    return rows, counted


def allows(words, token):
    return bool((int(words[token // 32]) >> (token % 32)) & 1)


@pytest.mark.parametrize("engine, schema, outputs", [
    ("llguidance", PATTERNED, PATTERNED_OUTPUTS),
    ("auto", PATTERNED, PATTERNED_OUTPUTS),
    ("llguidance", GUARDED, ['["a","b"]', '["a","c"]', '["a","b","c"]']),
], ids=["llguidance", "auto-llguidance", "llguidance-uniqueItems"])
def test_copied_rows_equal_filled_rows(tokenizer, engine, schema, outputs):
    kept = RecurringRows(min_prefix_tokens=1)
    filled, _ = masks_along(tokenizer, engine, schema, outputs, None)
    copied, counted = masks_along(tokenizer, engine, schema, outputs, kept)
    assert len(filled) == len(copied)
    for step, (a, b) in enumerate(zip(filled, copied)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    # The later outputs share prefixes with the first: those states' rows were copied, and counted.
    assert kept.hits >= 3 and counted == kept.hits
    assert len(kept) == kept.misses


def test_the_guard_restriction_follows_the_prefix(tokenizer):
    # After '["a","b"' the guard forbids "a" and "b": a row kept for one prefix never serves
    # another prefix of the same length.
    outputs = ['["a","b","c"]', '["b","a","c"]', '["a","b","c"]']
    filled, _ = masks_along(tokenizer, "llguidance", GUARDED, outputs, None)
    copied, _ = masks_along(tokenizer, "llguidance", GUARDED, outputs, RecurringRows(min_prefix_tokens=1))
    for step, (a, b) in enumerate(zip(filled, copied)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_fast_engines_and_first_states_are_not_kept(tokenizer):
    kept = RecurringRows()
    _, counted = masks_along(tokenizer, "xgrammar", OBJECT, ['{"name":"abc"}', '{"name":"abc"}'], kept)
    assert len(kept) == 0 and counted == 0  # xgrammar's rows: not a slow engine's
    assert kept.key("llguidance", "spec", [1, 2]) is None  # a first state: FirstMasks' rows
    assert kept.key("llguidance", "spec", [1, 2, 3]) is not None
    assert kept.key("llguidance", "spec", list(range(kept.max_prefix_tokens + 1))) is None


def test_deeper_rows_never_push_first_states_out():
    # Their own byte budget: filling it drops only its own least recently used rows.
    row = np.ones(4, dtype=np.int32)
    kept = RecurringRows(max_bytes=2 * row.nbytes)
    for n in range(3):
        kept.keep(kept.key("llguidance", "spec", [0, 0, n]), row)
    assert len(kept) == 2 and kept.size_bytes == 2 * row.nbytes
    assert not kept.copy_into(kept.key("llguidance", "spec", [0, 0, 0]), np.zeros_like(row))
