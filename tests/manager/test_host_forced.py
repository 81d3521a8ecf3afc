"""An out-of-mask token is never taken silently under ``masked_out="host"``: only the host's stop
tokens and the tokens it names (`host_forced`) are host-forced; any other token outside its row's
mask fails the request with an error and a metric. The un-masking comes from a real logits
processor (a logit bias applied after our mask, as a host's processor chain may) and a greedy
sampler, on real Paddle logits and real xgrammar matchers."""
import numpy as np
import paddle
import pytest

from fd_guided import parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.manager import GuidedDecodingManager
from fd_guided.tokenizer import load_tokenizer
from guided_helpers import add_ready

pytestmark = pytest.mark.cpu

VOCAB = 129_280
EOS = 1
CHOICE = parse_guided_request({"guided_choice": ["yes", "no"]})


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture()
def manager(tokenizer):
    manager = GuidedDecodingManager(XGrammarBackend(tokenizer, vocab_size=VOCAB), max_num_seqs=4, max_draft_tokens=2)
    yield manager
    manager.close()


class LogitBias:
    """A host logits processor run after the guided mask: sets `token`'s logit in `rows` to `value`
    (un-masking it when it was -inf), as an OpenAI ``logit_bias`` of +100 does."""

    def __init__(self, token: int, rows, value: float = 100.0):
        self.token, self.rows, self.value = token, list(rows), value

    def __call__(self, logits: paddle.Tensor) -> None:
        for row in self.rows:
            logits[row, self.token] = self.value


def greedy(logits: paddle.Tensor) -> list[int]:
    return paddle.argmax(logits, axis=-1).numpy().reshape(-1).tolist()


def logits_for(rows: int) -> paddle.Tensor:
    return paddle.to_tensor(np.random.default_rng(0).standard_normal((rows, VOCAB)).astype("float32"))


def token_of(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_a_token_a_logits_processor_unmasked_fails_its_request_visibly(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    add_ready(manager, 1, CHOICE, prefill_done=True)
    maybe = token_of(tokenizer, "maybe")
    manager.begin_step([0, 1])
    logits = logits_for(2)
    manager.apply(logits)
    assert not np.isfinite(logits[1, maybe].item())  # our mask forbade it
    LogitBias(maybe, rows=[1])(logits)  # the host's processor runs after our apply
    tokens = greedy(logits)
    assert tokens[1] == maybe
    finishes = manager.accept(tokens, masked_out="host")
    assert [(f.slot, f.reason) for f in finishes] == [(1, "error")]
    assert finishes[0].error == f"guided decoding: token {maybe} outside the grammar at position 0"
    assert manager.metrics.value("out_of_mask_tokens_total") == 1
    assert manager.metrics.labelled("host_forced_tokens_total") == {}
    assert manager.finish_of(0) is None  # the other request goes on
    manager.begin_step([0, 1])
    after = logits_for(2)
    manager.apply(after)
    assert set(np.flatnonzero(np.isfinite(after[1].numpy())).tolist()) == {EOS}  # failed: only stop tokens


def test_the_position_is_the_count_of_tokens_the_grammar_accepted(manager, tokenizer):
    regex = parse_guided_request({"guided_regex": "[a-c]{6}"})
    add_ready(manager, 2, regex, prefill_done=True)
    letter_a, letter_z = token_of(tokenizer, "a"), token_of(tokenizer, "z")
    for token in (letter_a, letter_a):
        manager.begin_step([None, None, 2])
        manager.apply(logits_for(3))
        assert manager.accept([EOS, EOS, token], masked_out="host") == []
    manager.begin_step([None, None, 2])
    logits = logits_for(3)
    manager.apply(logits)
    LogitBias(letter_z, rows=[2])(logits)
    finishes = manager.accept(greedy(logits), masked_out="host")
    assert [f.error for f in finishes] == [f"guided decoding: token {letter_z} outside the grammar at position 2"]


def test_named_host_tokens_are_skipped_and_stop_tokens_end_quietly(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    add_ready(manager, 1, CHOICE, prefill_done=True)
    newline = tokenizer.encode("\n")[0]
    manager.begin_step([0, 1])
    manager.apply(logits_for(2))
    assert manager.accept([newline, EOS], masked_out="host", host_forced={newline: "line_break"}) == []
    assert manager.metrics.labelled("host_forced_tokens_total") == {"line_break": 1, "stop": 1}
    assert manager.metrics.value("out_of_mask_tokens_total") == 0
    assert manager.finish_of(0) is None and manager.finish_of(1).reason == "forced"
    # The same token not named: an error.
    manager.begin_step([0, 1])
    manager.apply(logits_for(2))
    finishes = manager.accept([newline, EOS], masked_out="host")
    assert [(f.slot, f.reason) for f in finishes] == [(0, "error")]
    assert manager.metrics.value("out_of_mask_tokens_total") == 1


def test_an_unmasked_token_on_a_verification_path_fails_the_request(manager, tokenizer):
    add_ready(manager, 0, CHOICE, prefill_done=True)
    yes, maybe = token_of(tokenizer, "yes"), token_of(tokenizer, "maybe")
    manager.begin_speculative_step([0], [[yes]])  # rows: root, after "yes"
    logits = logits_for(2)
    manager.apply(logits)
    LogitBias(maybe, rows=[1])(logits)  # after "yes" the grammar allows only stop tokens
    finishes = manager.accept_speculative([[yes, greedy(logits)[1]]], masked_out="host")
    assert [f.error for f in finishes] == [f"guided decoding: token {maybe} outside the grammar at position 1"]
    assert manager.metrics.value("out_of_mask_tokens_total") == 1


def test_without_a_processor_the_same_step_stays_valid(manager, tokenizer):
    """The check above can fail: the same step without the bias samples inside the mask."""
    add_ready(manager, 1, CHOICE, prefill_done=True)
    manager.begin_step([None, 1])
    logits = logits_for(2)
    manager.apply(logits)
    tokens = greedy(logits)
    assert np.isfinite(logits[1, tokens[1]].item())
    assert all(f.reason != "error" for f in manager.accept(tokens, masked_out="host"))
    assert manager.metrics.value("out_of_mask_tokens_total") == 0
