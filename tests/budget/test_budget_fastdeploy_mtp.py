"""Budget steering under FastDeploy's MTP drafting (fd_guided.integrations.fastdeploy.mtp): drafts
from FastDeploy's real ``MTPSampler``, masked by the grammar, verified by FastDeploy's sampler path
(the loop of tests/integrations/fastdeploy/test_fastdeploy_speculative.py), at tight
``max_tokens``: every request ends with its EOS within its budget, EOS included (FastDeploy's
``max_dec_len``), and its output validates. The loop itself never cuts at the budget, so a draft
accepted past it would show as a longer output."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations" / "fastdeploy"))

pytestmark = pytest.mark.fastdeploy

FIELDS = [
    {
        "guided_json": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            },
            "required": ["name", "tags"],
        }
    },
    {"guided_regex": r"[a-z]+@[a-z]+\.com"},
]


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    import fastdeploy_engine as fe

    return fe.enabled_host(tmp_path_factory)


def test_mtp_drafts_never_overrun_a_tight_budget(fd):
    import fastdeploy_engine as fe
    from fd_runner import tiny_model
    from test_budget import minimum
    from test_fastdeploy_decoding import admitted
    from test_fastdeploy_speculative import K, MTPLoop

    from fd_guided import parse_guided_request
    from fd_guided.harness.validate import validate_output
    from fd_guided.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("deepseek")
    cfg = fe.engine_config(
        fd,
        guided_decoding_backend="xgrammar",
        max_num_seqs=4,
        speculative_config={"method": "ngram", "num_speculative_tokens": K},
    )
    fd_config = fe.start_worker(cfg)
    fd_config.speculative_config.num_model_steps = K
    loop = MTPLoop(fe.build_runner(fd_config), tiny_model(), tokenizer, fd_config)
    # Four requests (the loop's rows are max_num_seqs): each constraint at 1.2x and 1.5x its shortest
    # output (the manager's start plan on xgrammar), plus one token: FastDeploy's EOS counts.
    cases = [(f, math.ceil(minimum("xgrammar", f) * factor) + 1) for f in FIELDS for factor in (1.2, 1.5)]
    requests = [
        admitted(cfg, loop.engine.request(f"r{i}", tokenizer.encode(f"Give item {i}:"), max_tokens=budget, **fields))
        for i, (fields, budget) in enumerate(cases)
    ]
    states = loop.run(requests)
    manager = loop.runner.sampler.guided_decoding.manager
    for state, (fields, budget) in zip(states.values(), cases):
        output = list(state.request.output_token_ids)
        assert state.finished == "stop" and len(output) <= budget, (fields, budget, output)
        text = tokenizer.decode([t for t in output if t not in tokenizer.eos_token_ids])
        assert validate_output(parse_guided_request(fields), text).valid, (fields, text)
    assert manager.metrics.value("draft_tokens_total") > 0
    assert manager.metrics.value("budget_steered_requests_total") >= 1
