"""Budget steering under tensor parallelism: per-rank managers (one per rank over one compile
service, as `fd_guided.harness.parallel.per_rank_managers` builds them) fed the same broadcast
tokens make identical decisions: every applied bitmask row, every draft limit and every finish is
the same on each rank, at tight budgets (closing rows written from candidates or filled and cut)
and at far ones (start plans searched in the background on each rank at its own pace), and every
output ends complete and valid under the adversarial decoder of tests/budget."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "budget"))
from adversary import pick  # noqa: E402
from guided_helpers import VOCAB, in_process_backend  # noqa: E402
from test_budget import REQUESTS, minimum, valid  # noqa: E402

from fd_guided import GuidedConfig, parse_guided_request  # noqa: E402
from fd_guided.harness.parallel import per_rank_managers  # noqa: E402
from fd_guided.tokenizer import load_tokenizer  # noqa: E402

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_ranks_steer_identically(backend_name):
    tokenizer = load_tokenizer("deepseek")
    needs = [minimum(backend_name, fields) for fields in REQUESTS]
    cases = [(fields, need + extra) for fields, need in zip(REQUESTS, needs) for extra in (0, 2)]
    cases += [(fields, need + 150) for fields, need in zip(REQUESTS[:3], needs)]  # far: background search
    n, world = len(cases), 3
    managers = per_rank_managers(in_process_backend(backend_name), world, max_num_seqs=n)
    config = GuidedConfig(backend=backend_name)
    try:
        for manager in managers:
            for slot, (fields, budget) in enumerate(cases):
                manager.add_request(slot, parse_guided_request(fields, config), prefill_done=True, max_tokens=budget)
            assert manager.wait_ready(list(range(n)), 120)
        outputs: dict[int, list[int]] = {slot: [] for slot in range(n)}
        finished: dict[int, str] = {}
        for _ in range(400):
            rows = [slot if slot not in finished else None for slot in range(n)]
            if all(row is None for row in rows):
                break
            masks = []
            for manager in managers:
                manager.begin_step(rows)
                manager.apply(torch.zeros((n, VOCAB)))
                masks.append(manager.bitmask.numpy()[:n].copy())
            for rank in range(1, world):
                assert np.array_equal(masks[0], masks[rank]), f"rank {rank} masked differently"
            tokens = [pick(tokenizer, masks[0][row], VOCAB) if rows[row] is not None else 0 for row in range(n)]
            done = [{f.slot: f.reason for f in manager.accept(tokens)} for manager in managers]
            assert all(each == done[0] for each in done[1:])
            for slot, token in enumerate(tokens):
                if rows[slot] is None:
                    continue
                if slot in done[0]:
                    finished[slot] = done[0][slot]
                else:
                    outputs[slot].append(token)
        assert len(finished) == n
        for slot, (fields, budget) in enumerate(cases):
            text = tokenizer.decode(outputs[slot])
            assert finished[slot] == "stop" and len(outputs[slot]) < budget, (fields, budget, text)
            assert valid(fields, text), (fields, text)
        forced = [manager.metrics.value("budget_forced_tokens_total") for manager in managers]
        assert forced[0] > 0
    finally:
        for manager in managers:
            manager.close()
        managers[0].compiler.close()
