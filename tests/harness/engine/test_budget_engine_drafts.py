"""Speculative drafts and jump-forward never overrun a guided request's budget (fd_guided.budget):
through the reference engine, step by step, a request never holds more than ``max_tokens - 1``
output tokens while it runs (its stop token must still fit), every step adds at most what is
left, and every request ends ``stop`` with a valid document, at 1.2x and 1.5x its shortest
document (test_budget_engine.NEEDS), with n-gram and draft-model drafts (K=4) and jump-forward."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "budget"))
from corpus import SCHEMAS  # noqa: E402
from test_budget_engine import NEEDS  # noqa: E402

from fd_guided import GuidedConfig  # noqa: E402
from fd_guided.harness.engine.engine import ReferenceEngine  # noqa: E402
from fd_guided.harness.engine.speculative import SpeculativeConfig  # noqa: E402
from fd_guided.harness.validate import validate_output  # noqa: E402

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize(
    "drafter, jump_forward", [("ngram", False), ("draft_model", False), ("ngram", True), (None, True)]
)
def test_drafts_and_jump_forward_stay_within_the_budget_left(drafter, jump_forward):
    kwargs = {"speculative": SpeculativeConfig(drafter=drafter, num_draft_tokens=4)} if drafter else {}
    engine = ReferenceEngine.default(preset="small", guided_config=GuidedConfig(backend="xgrammar"), **kwargs)
    try:
        requests = {}
        for name, need in NEEDS.items():
            for budget in (math.ceil(need * 1.2), math.ceil(need * 1.5)):
                request = {
                    "prompt": f"{name} {name}:",  # repeats: the n-gram drafter finds something to propose
                    "guided_json": SCHEMAS[name],
                    "max_tokens": budget,
                    "seed": 2,
                    "jump_forward": jump_forward,
                }
                requests[engine.submit(request)] = request
        held = {index: 0 for index in requests}
        results = {}
        while engine.has_unfinished():
            for update in engine.step():
                budget = requests[update.index]["max_tokens"]
                assert len(update.new_token_ids) <= budget - held[update.index], (update, held[update.index])
                held[update.index] += len(update.new_token_ids)
                if update.finished is None:
                    assert held[update.index] <= budget - 1, (requests[update.index], held[update.index])
                else:
                    results[update.index] = update.finished
        for index, request in requests.items():
            result = results[index]
            assert result.finish_reason == "stop", (request["max_tokens"], result)
            assert len(result.token_ids) < request["max_tokens"]
            assert validate_output(result.spec, result.text).valid, result.text
        metrics = engine.manager.metrics
        assert metrics.value("budget_steered_requests_total") >= 1
        if drafter:
            assert metrics.value("draft_tokens_total") > 0
    finally:
        engine.close()
