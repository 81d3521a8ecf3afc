"""Far rows (issue #24 item 4): a request far from its budget finds its start plan by its compiled
grammar's identity (no spec hashed, no lock), is passed by with one test a step after that, and
still ends complete and valid once it nears its budget, under the adversarial decoder."""

from __future__ import annotations

import gc

import pytest
import torch
from adversary import pick
from guided_helpers import VOCAB, add_ready, in_process_backend
from test_budget import REQUESTS, valid

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request
from fd_guided.budget.plan import Plan
from fd_guided.budget.start_plans import StartPlans
from fd_guided.budget.steer import WINDOW
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu


class _Grammar:
    """Stands for a compiled grammar: any object with weak references."""


def test_start_plans_tie_a_plan_to_a_grammar_by_identity():
    plans, plan = StartPlans(limit=2), Plan(b"{}", [(1, 0), (0, -1), (0, -1)])
    first, second = _Grammar(), _Grammar()
    plans.tie(first, plan)
    assert plans.of_grammar(first) is plan and plans.of_grammar(second) is None
    plans.tie(second, plan)
    plans.tie(_Grammar(), plan)  # past the limit: the earlier ties are forgotten
    assert plans.of_grammar(first) is None
    plans.tie(first, plan)
    identity = id(first)
    del first
    gc.collect()
    assert all(plans.of_grammar(other) is None for other in [_Grammar() for _ in range(50)] if id(other) == identity)
    plans.tie(3, plan)  # no weak reference to an int: not tied, looked up by spec as before
    assert plans.of_grammar(3) is None


def _step(manager, tokenizer, slots: list[int]) -> list[int]:
    """One step of `slots` (none of them ending in it); the adversary's tokens."""
    manager.begin_step(slots)
    manager.apply(torch.zeros((len(slots), VOCAB)))
    words = manager.bitmask.numpy()
    tokens = [pick(tokenizer, words[row], VOCAB) for row in range(len(slots))]
    assert not manager.accept(tokens)
    return tokens


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_far_rows_take_the_start_plan_by_grammar_and_end_valid(backend_name):
    fields = REQUESTS[1]  # nested required object, an enum and a pattern
    config = GuidedConfig(backend=backend_name)
    tokenizer = load_tokenizer("deepseek")
    manager = GuidedDecodingManager(in_process_backend(backend_name), max_num_seqs=2)
    manager.budget.defer_start_above = 10**9  # the first request searches its start plan at once
    try:
        add_ready(manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=10_000)
        _step(manager, tokenizer, [0])
        need = manager.budget.need(0)
        assert need is not None
        manager.release(0)

        # Two requests of the schema, each its own (equal) spec, far from their budgets: their
        # first looks find the plan by the compiled grammar the compile cache hands both.
        plans = manager.budget.start_plans
        by_spec, lookups = plans.get, []
        plans.get = lambda key: lookups.append(key) or by_spec(key)  # type: ignore[method-assign]
        budget = need + 8 + WINDOW + 40
        for slot in (0, 1):
            add_ready(manager, slot, parse_guided_request(fields, config), prefill_done=True, max_tokens=budget)
        first = _step(manager, tokenizer, [0, 1])
        assert len(lookups) == 1  # the first by spec and engine, then tied to the grammar
        slots = manager.budget._slots
        assert all(slots[s].far_until > 0 and slots[s].plan is not None for s in (0, 1))
        assert slots[0].plan is not slots[1].plan and slots[0].plan.need == need  # each its own copy
        compiled = manager.step.slots.get(1).ticket.result(timeout=0)
        assert plans.of_grammar(compiled) is not None

        # Far: `prepare` marks the step's entry, `steer` passes it by; near: steered to the end.
        outputs: dict[int, list[int]] = {0: [first[0]], 1: [first[1]]}
        finished: dict[int, str] = {}
        passed_by = 0
        while len(finished) < 2:
            rows = [s if s not in finished else None for s in (0, 1)]
            manager.begin_step(rows)
            passed_by += sum(1 for e in manager.step._entries if e.slot in slots and slots[e.slot].far_entry is e)
            manager.apply(torch.zeros((2, VOCAB)))
            words = manager.bitmask.numpy()
            tokens = [pick(tokenizer, words[row], VOCAB) if rows[row] is not None else 0 for row in (0, 1)]
            done = {f.slot: f for f in manager.accept(tokens)}
            for slot in (0, 1):
                if rows[slot] is None:
                    continue
                if slot in done:
                    finished[slot] = "stop" if done[slot].reason != "error" else f"error: {done[slot].error}"
                    continue
                outputs[slot].append(tokens[slot])
                if len(outputs[slot]) >= budget:
                    finished[slot] = "length"
        assert passed_by > 0
        for slot in (0, 1):
            text = tokenizer.decode(outputs[slot])
            assert finished[slot] == "stop" and len(outputs[slot]) < budget, (finished[slot], text)
            assert valid(fields, text), text
    finally:
        manager.close()
