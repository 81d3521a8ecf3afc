"""A budget below the shortest valid output is refused with the minimum named, a typed 400
(`BudgetTooSmallError`, an `InvalidGrammarError` on ``max_tokens``): at admission once the schema's
start plan is known, once compiled otherwise (`refusal_when_compiled`), and at the first step,
before any output token, for a host that calls neither."""

from __future__ import annotations

import threading

import pytest
from guided_helpers import in_process_backend
from test_budget import REQUESTS, minimum

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request
from fd_guided.budget import BudgetTooSmallError
from fd_guided.errors import InvalidGrammarError
from fd_guided.harness.engine.engine import ReferenceEngine

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_refused_once_compiled_then_at_admission(backend_name):
    fields = REQUESTS[1]
    need = minimum(backend_name, fields)
    manager = GuidedDecodingManager(in_process_backend(backend_name), max_num_seqs=1)
    spec = parse_guided_request(fields, GuidedConfig(backend=backend_name))
    try:
        manager.budget.check(spec, need - 1)  # nothing known yet: admission does not search
        ticket = manager.compiler.submit(spec)
        refusal = manager.budget.refusal_when_compiled(spec, ticket, need - 1).result(timeout=60)
        assert isinstance(refusal, BudgetTooSmallError) and isinstance(refusal, InvalidGrammarError)
        assert refusal.part == "max_tokens" and refusal.minimum == need and refusal.max_tokens == need - 1
        assert f"max_tokens={need - 1} cannot hold a complete output" in str(refusal)
        assert f"needs {need} tokens (its stop token included)" in str(refusal)
        assert manager.budget.refusal_when_compiled(spec, ticket, need).result(timeout=60) is None
        assert manager.budget.refusal_when_compiled(spec, ticket, 1, fit_budget=False).result(timeout=60) is None
        # Known now: admission refuses without waiting for anything.
        with pytest.raises(BudgetTooSmallError) as caught:
            manager.budget.check(spec, need - 1)
        assert caught.value.minimum == need
        manager.budget.check(spec, need)
        manager.budget.check(spec, 1, fit_budget=False)
    finally:
        manager.close()


def test_reference_engine_refuses_at_submit_once_known_and_at_the_first_step_before():
    fields = {"prompt": "x:", **REQUESTS[1]}
    need = minimum("xgrammar", REQUESTS[1])
    engine = ReferenceEngine.default(preset="tiny", guided_config=GuidedConfig(backend="xgrammar"))
    try:
        # Cold schema: the compile completes after admission, the first step refuses (no token sampled).
        [first] = engine.generate([dict(fields, max_tokens=need - 1)])
        assert first.finish_reason == "error" and first.token_ids == []
        assert f"needs {need} tokens" in first.error and "max_tokens" in first.error
        # The start plan is known now: submit raises the typed error, nothing is queued.
        with pytest.raises(BudgetTooSmallError) as caught:
            engine.submit(dict(fields, max_tokens=need - 1))
        assert caught.value.minimum == need and not engine.has_unfinished()
        [fits] = engine.generate([dict(fields, max_tokens=need)])
        assert fits.finish_reason == "stop"
    finally:
        engine.close()


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_first_sample_waits_for_its_own_start_plan_not_the_step(backend_name):
    """A tight budget's first look needs the start plan: `is_budget_ready` starts its search on the
    background thread once compiled and says False until it is known, so a host holding the first
    sample on it never has the step search or wait (a far budget and an unbudgeted slot never wait)."""
    fields = REQUESTS[1]
    need = minimum(backend_name, fields)
    manager = GuidedDecodingManager(in_process_backend(backend_name), max_num_seqs=3)
    spec = parse_guided_request(fields, GuidedConfig(backend=backend_name))
    try:
        manager.add_request(0, spec, max_tokens=need + 4)
        manager.add_request(1, spec, max_tokens=100_000)  # far: its search is deferred, never waited for
        manager.add_request(2, spec, max_tokens=need + 4, fit_budget=False)
        assert manager.wait_ready([0, 1, 2], timeout_s=60)
        assert manager.is_budget_ready(1) and manager.is_budget_ready(2)
        deadline = 200
        while not manager.is_budget_ready(0) and deadline:
            deadline -= 1
            threading.Event().wait(0.05)
        assert manager.is_budget_ready(0), "the start plan search never finished"
        key = (spec, backend_name)
        assert manager.budget.start_plans.known(key) and manager.budget.start_plans.get(key).need == need
    finally:
        manager.close()
