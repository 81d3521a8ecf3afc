"""Speculative steps, drafting sessions and jump-forward on the manager, with real matchers (both
engines), a real tokenizer and real Paddle logits: every row is compared with an independent
matcher advanced by the same tokens, and every slot's matcher must be back where it was."""
import numpy as np
import paddle
import pytest

from fd_guided import GuidedConfig, SlotStateError, parse_guided_request
from fd_guided.manager import DraftTree, GuidedDecodingManager
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output
from guided_helpers import add_ready

pytestmark = pytest.mark.cpu

VOCAB = 129_280
EOS = 1
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"]}
JSON = {"guided_json": SCHEMA, "disable_any_whitespace": True}
TEXT = '{"name":"Bob","ok":true}'


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def backend(request, tokenizer):
    backend = create_backend(request.param, tokenizer, vocab_size=VOCAB,
                             config=GuidedConfig(backend=request.param, compile_isolation="thread"))
    yield backend
    backend.close()


@pytest.fixture()
def manager(backend):
    manager = GuidedDecodingManager(backend, max_num_seqs=4, max_draft_tokens=8)
    yield manager
    manager.close()


def logits_for(rows: int, seed: int = 0) -> paddle.Tensor:
    return paddle.to_tensor(np.random.default_rng(seed).standard_normal((rows, VOCAB)).astype("float32"))


def allowed(row) -> set[int]:
    return set(np.flatnonzero(np.isfinite(row.numpy())).tolist())


def reference_allowed(backend, spec, prefix) -> set[int]:
    """What a fresh matcher allows after `prefix` (None if it rejects the prefix)."""
    import torch

    grammar = backend.new_grammar(backend.compile(spec))
    if grammar.accept_tokens(prefix) != len(prefix):
        return None
    bitmask = torch.zeros((1, (VOCAB + 31) // 32), dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits[:VOCAB]).tolist())


def spec_step(manager, slots, drafts, seed=0):
    manager.begin_speculative_step(slots, drafts)
    logits = logits_for(sum(len(DraftTree.of(d).tokens) + 1 for d in drafts), seed)
    manager.apply(logits)
    return logits


def test_each_row_is_masked_with_the_state_after_the_drafts_before_it(manager, backend, tokenizer):
    spec = parse_guided_request(JSON)
    ids = tokenizer.encode(TEXT)
    add_ready(manager, 1, spec, prefill_done=True)
    manager.begin_step([1])
    manager.apply(logits_for(1))
    manager.accept([ids[0]])
    drafts = ids[1:6]
    logits = spec_step(manager, [None, 1], [[], drafts])
    assert len(allowed(logits[0])) == VOCAB  # no slot: untouched
    for i in range(len(drafts) + 1):
        assert allowed(logits[1 + i]) == reference_allowed(backend, spec, ids[:1 + i]), i
    assert manager.draft_limits() == [0, 5]
    finishes = manager.accept_speculative([[], ids[1:4]])  # two drafts accepted, then a sampled token
    assert finishes == []
    # The matcher holds exactly the accepted tokens: the next one-row mask is the state after ids[:4].
    manager.begin_step([1])
    logits = logits_for(1)
    manager.apply(logits)
    assert allowed(logits[0]) == reference_allowed(backend, spec, ids[:4])


def test_a_rejected_draft_ends_the_chain(manager, backend, tokenizer):
    spec = parse_guided_request(JSON)
    ids = tokenizer.encode(TEXT)
    add_ready(manager, 0, spec, prefill_done=True)
    bad = tokenizer.encode("[")[0]
    drafts = [ids[0], ids[1], bad, ids[2], ids[3]]
    logits = spec_step(manager, [0], [drafts])
    assert allowed(logits[2]) == reference_allowed(backend, spec, ids[:2])  # the state before the bad draft
    assert bad not in allowed(logits[2])  # so an exact verifier rejects it (probability 0)
    for row in (3, 4, 5):
        assert allowed(logits[row]) == {EOS}  # past the end of the chain: never an all -inf row
    assert manager.draft_limits() == [2]
    assert manager.metrics.value("draft_tokens_invalid_total") == 3
    # A host that accepts past the limit feeds a token the grammar rejects: the request fails.
    finishes = manager.accept_speculative([[ids[0], ids[1], bad]])
    assert [(f.slot, f.reason) for f in finishes] == [(0, "error")]


def test_a_stop_draft_ends_the_request_where_the_grammar_is_complete(manager, backend, tokenizer):
    spec = parse_guided_request({"guided_choice": ["yes", "no"]})
    yes = tokenizer.encode("yes")
    assert len(yes) == 1
    add_ready(manager, 0, spec, prefill_done=True)
    logits = spec_step(manager, [0], [[yes[0], EOS, yes[0]]])
    assert allowed(logits[1]) == {EOS} and allowed(logits[2]) == {EOS} and allowed(logits[3]) == {EOS}
    assert manager.draft_limits() == [2]  # "yes" and the stop token; nothing after a stop
    finishes = manager.accept_speculative([[yes[0], EOS]])
    assert [(f.slot, f.reason) for f in finishes] == [(0, "stop")]
    logits = spec_step(manager, [0], [[yes[0]]])
    assert allowed(logits[0]) == {EOS} and allowed(logits[1]) == {EOS}  # finished: stop rows only
    assert manager.draft_limits() == [0] and manager.allows_only_stop(0)


def test_draft_trees_fill_one_row_per_node_and_restore_the_matcher(manager, backend, tokenizer):
    spec = parse_guided_request(JSON)
    ids = tokenizer.encode(TEXT)
    add_ready(manager, 2, spec, prefill_done=True)
    bad = tokenizer.encode("x")[0]
    # root -> ids[0] -> {ids[1] -> ids[2], bad -> ids[1]}; root -> bad
    tree = DraftTree((ids[0], ids[1], bad, ids[2], ids[1], bad), (0, 1, 1, 2, 3, 0))
    logits = spec_step(manager, [2], [tree])
    paths = {0: [], 1: ids[:1], 2: ids[:2], 4: ids[:3]}
    for node, prefix in paths.items():
        assert allowed(logits[node]) == reference_allowed(backend, spec, prefix), node
    for node in (3, 5, 6):  # a rejected draft and what hangs below it
        assert allowed(logits[node]) == {EOS}
    with pytest.raises(ValueError, match="not a draft"):
        manager.accept_speculative([[ids[0], ids[2], ids[3]]])
    manager.accept_speculative([[ids[0], ids[1], ids[2]]])
    manager.begin_step([2])
    logits = logits_for(1)
    manager.apply(logits)
    assert allowed(logits[0]) == reference_allowed(backend, spec, ids[:3])


def test_hooks_of_the_two_step_kinds_do_not_mix(manager):
    spec = parse_guided_request({"guided_choice": ["yes", "no"]})
    add_ready(manager, 0, spec, prefill_done=True)
    spec_step(manager, [0], [[5]])
    with pytest.raises(SlotStateError, match="accept_speculative"):
        manager.accept([EOS, EOS])
    with pytest.raises(ValueError, match="max_draft_tokens"):
        manager.begin_speculative_step([0], [list(range(9))])


def test_drafting_session_masks_each_draft_step_and_rolls_back(manager, backend, tokenizer):
    spec = parse_guided_request(JSON)
    ids = tokenizer.encode(TEXT)
    add_ready(manager, 0, spec, prefill_done=True)
    add_ready(manager, 1, spec, prefill_done=True)
    bad = tokenizer.encode("[")[0]
    with manager.begin_drafting([0, None, 1]) as drafting:
        for step, (a, b) in enumerate([(ids[0], ids[0]), (ids[1], bad), (ids[2], ids[1])]):
            logits = logits_for(3, seed=step)
            drafting.apply(logits)
            assert allowed(logits[0]) == reference_allowed(backend, spec, ids[:step])
            assert len(allowed(logits[1])) == VOCAB
            if step < 2:
                assert allowed(logits[2]) == reference_allowed(backend, spec, ids[:step])
            drafting.advance([a, 7, b])
        with pytest.raises(SlotStateError, match="drafting session"):
            manager.begin_step([0])
    assert drafting.valid == [3, 0, 1]
    newline = tokenizer.encode("\n")[0]  # a raw control character cannot be in a JSON string
    assert manager.valid_draft_prefix(0, ids[:3] + [newline]) == 3
    logits = spec_step(manager, [0, 1], [[], []])
    assert allowed(logits[0]) == allowed(logits[1]) == reference_allowed(backend, spec, [])  # both back at the start


@pytest.mark.parametrize("case", ["thinking_unset", "thinking_false", "thinking_true", "closed_in_prompt"])
def test_reasoning_matrix_with_a_multi_token_marker(backend, tokenizer, case):
    marker = tokenizer.encode("</answer>")
    assert len(marker) > 1
    manager = GuidedDecodingManager(backend, max_num_seqs=2, think_end=marker, max_draft_tokens=8)
    spec = parse_guided_request({"guided_choice": ["yes", "no"]})
    thinking = {"thinking_unset": None, "thinking_false": False, "thinking_true": True, "closed_in_prompt": True}[case]
    prompt = [5, 6] + (marker if case == "closed_in_prompt" else [])
    add_ready(manager, 0, spec, prefill_done=True, enable_thinking=thinking, prompt_token_ids=prompt)
    logits = spec_step(manager, [0], [[11] + marker + tokenizer.encode("yes")])
    if case != "thinking_true":
        assert len(allowed(logits[0])) < 20 and allowed(logits[1]) == {EOS}  # constrained at once
        manager.close()
        return
    for row in range(len(marker) + 1):
        assert len(allowed(logits[row])) == VOCAB  # inside the section, the marker still incomplete
    after = len(marker) + 1
    assert allowed(logits[after]) == reference_allowed(backend, spec, [])  # constrained from the marker on
    assert allowed(logits[after + 1]) == {EOS}
    manager.accept_speculative([[11] + marker[:1]])  # the marker is half written
    for token in marker[1:]:
        assert manager.in_reasoning(0)
        manager.begin_step([0])
        logits = logits_for(1)
        manager.apply(logits)
        assert len(allowed(logits[0])) == VOCAB
        manager.accept([token])
    assert not manager.in_reasoning(0)
    manager.begin_step([0])
    logits = logits_for(1)
    manager.apply(logits)
    assert allowed(logits[0]) == reference_allowed(backend, spec, [])
    manager.close()


def test_a_spent_reasoning_budget_forces_the_marker(backend, tokenizer):
    marker = tokenizer.encode("</answer>")
    manager = GuidedDecodingManager(backend, max_num_seqs=2, think_end=marker, max_draft_tokens=8)
    spec = parse_guided_request({"guided_choice": ["yes", "no"]})
    add_ready(manager, 0, spec, prefill_done=True, enable_thinking=True, reasoning_budget=2)
    forced_rows = []
    for step in range(2 + len(marker)):
        manager.begin_step([0])
        logits = logits_for(1, seed=step)
        manager.apply(logits)
        rows = allowed(logits[0])
        forced_rows.append(rows)
        manager.accept([min(rows) if len(rows) == 1 else 42])
    assert [len(r) for r in forced_rows[:2]] == [VOCAB, VOCAB]
    assert [r for r in forced_rows[2:]] == [{t} for t in marker]  # forced one marker token per step
    assert not manager.in_reasoning(0)
    assert manager.metrics.value("reasoning_forced_tokens_total") == len(marker)
    manager.begin_step([0])
    logits = logits_for(1)
    manager.apply(logits)
    assert allowed(logits[0]) == reference_allowed(backend, spec, [])
    manager.close()


def test_min_tokens_rule_finds_rows_that_allow_only_stop_tokens(manager, backend, tokenizer):
    spec = parse_guided_request({"guided_regex": "[a-z]{1,3}"})
    add_ready(manager, 0, spec, prefill_done=True)
    a = tokenizer.encode("a")[0]
    logits = spec_step(manager, [0], [[a, a, a]])
    assert [manager.allows_only_stop(row) for row in range(4)] == [False, False, False, True]
    assert EOS in allowed(logits[3])  # complete: the stop token stays allowed whatever min_tokens says


def test_jump_forward_emits_forced_keys_and_re_encodes_the_boundary(backend, tokenizer):
    schema = {"type": "object", "properties": {"first_name": {"type": "string"}, "last_name": {"type": "string"},
                                               "is_active": {"type": "boolean"}}, "required": ["first_name", "last_name", "is_active"]}
    spec = parse_guided_request({"guided_json": schema, "disable_any_whitespace": True})
    manager = GuidedDecodingManager(backend, max_num_seqs=2)
    add_ready(manager, 0, spec, prefill_done=True, jump_forward=True)
    add_ready(manager, 1, spec, prefill_done=True)  # jump-forward off for this one (the server default)
    target = b'{"first_name":"Al","last_name":"Al","is_active":true}'
    output, jumps = [], []
    while manager.finish_of(0) is None:
        jump = manager.jump_forward(0)
        if jump is not None:
            jumps.append(jump)
            del output[len(output) - jump.retract:]
            output += jump.tokens
            continue
        manager.begin_step([0])
        logits = logits_for(1)
        manager.apply(logits)
        done = tokenizer.decode_bytes(output)
        assert target.startswith(done), done
        rest = target[len(done):]
        # The sampler stands in for a model that writes `target` byte by byte (the shortest allowed
        # token that fits): its closing quotes are tokens the tokenizer would merge with the next key.
        token = min((t for t in allowed(logits[0]) if t != EOS and rest.startswith(tokenizer.token_bytes[t] or b"\xff")),
                    key=lambda t: len(tokenizer.token_bytes[t]), default=EOS)
        manager.accept([token])
        output.append(token)
    assert manager.finish_of(0).reason == "stop"
    text = tokenizer.decode([t for t in output if t != EOS])
    assert validate_output(spec, text).valid, text
    assert text == '{"first_name":"Al","last_name":"Al","is_active":true}'
    assert len(jumps) >= 2 and any(jump.retract for jump in jumps)  # the closing quote merged with the next key
    assert manager.jump_forward(1) is None
    manager.close()
