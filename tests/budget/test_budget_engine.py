"""Budget steering through the reference engine: jump-forward and speculative decoding included."""

from __future__ import annotations

import math

import pytest
from corpus import SCHEMAS

from fd_guided import GuidedConfig
from fd_guided.harness.engine.engine import ReferenceEngine
from fd_guided.harness.engine.speculative import SpeculativeConfig
from fd_guided.harness.validate import validate_output

pytestmark = pytest.mark.cpu

# The shortest documents in DeepSeek tokens, stop token included (the manager's start plans).
NEEDS = {"person": 9, "nested_address": 25, "format_uuid": 22, "tool_call": 13, "invoice": 33, "defs_ref": 23}


@pytest.mark.parametrize("mode", ["plain", "jump_forward", "ngram"])
def test_engine_outputs_end_valid_at_tight_budgets(mode):
    kwargs = {"speculative": SpeculativeConfig(drafter="ngram", num_draft_tokens=4)} if mode == "ngram" else {}
    engine = ReferenceEngine.default(preset="small", guided_config=GuidedConfig(backend="xgrammar"), **kwargs)
    try:
        requests = [
            {
                "prompt": f"{name}:",
                "guided_json": SCHEMAS[name],
                "max_tokens": math.ceil(need * 1.2),
                "seed": 1,
                "jump_forward": mode == "jump_forward",
            }
            for name, need in NEEDS.items()
        ]
        for request, result in zip(requests, engine.generate(requests)):
            assert result.finish_reason == "stop", (request["max_tokens"], result)
            assert len(result.token_ids) < request["max_tokens"]  # and the stop token fits
            assert validate_output(result.spec, result.text).valid, result.text
        assert engine.manager.metrics.value("budget_steered_requests_total") >= 1
    finally:
        engine.close()
