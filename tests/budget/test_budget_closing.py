"""Closing rows written from their few candidates (fd_guided.budget.closing) are the rows a full
fill restricted to the same tokens gives (on xgrammar; llguidance's fill keeps forced bytes to
their canonical token, which its token checks do not, so its closing rows are filled): two
managers decode the same requests with the adversary, one writing closing rows from candidates,
one filling them, and every applied row is compared."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adversary import pick
from guided_helpers import VOCAB, add_ready, in_process_backend
from test_budget import REQUESTS, minimum, valid

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu


def _manager(backend_name: str, closing_rows: bool, cases) -> GuidedDecodingManager:
    manager = GuidedDecodingManager(in_process_backend(backend_name), max_num_seqs=len(cases))
    manager.budget.closing_rows = closing_rows
    for slot, (fields, budget) in enumerate(cases):
        spec = parse_guided_request(fields, GuidedConfig(backend=backend_name))
        add_ready(manager, slot, spec, prefill_done=True, max_tokens=budget)
    return manager


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance", "auto"])
def test_closing_rows_from_candidates_equal_filled_rows(backend_name):
    tokenizer = load_tokenizer("deepseek")
    cases = [(fields, minimum(backend_name, fields) + extra) for fields in REQUESTS for extra in (0, 2)]
    written, filled = _manager(backend_name, True, cases), _manager(backend_name, False, cases)
    n = len(cases)
    outputs: dict[int, list[int]] = {slot: [] for slot in range(n)}
    finished: dict[int, str] = {}
    closed_rows = 0
    try:
        for _ in range(200):
            rows = [slot if slot not in finished else None for slot in range(n)]
            if all(row is None for row in rows):
                break
            applied = []
            for manager in (written, filled):
                manager.begin_step(rows)
                manager.apply(torch.zeros((n, VOCAB)))
                applied.append(manager.bitmask.numpy()[:n].copy())
            closed_rows += sum(1 for entry in written.step._entries if entry.fill is not None and entry.fill.closed)
            for row in range(n):
                if rows[row] is not None:
                    assert np.array_equal(applied[0][row], applied[1][row]), (cases[row], outputs[row])
            tokens = [pick(tokenizer, applied[0][row], VOCAB) if rows[row] is not None else 0 for row in range(n)]
            done = {f.slot: f.reason for f in written.accept(tokens)}
            assert done == {f.slot: f.reason for f in filled.accept(tokens)}
            for slot, token in enumerate(tokens):
                if rows[slot] is None:
                    continue
                if slot in done:
                    finished[slot] = done[slot]
                else:
                    outputs[slot].append(token)
        assert len(finished) == n
        # xgrammar's closing rows are written, not filled; llguidance's are filled (steer.CANDIDATE_ENGINES)
        # (auto: as the engine it picked per request)
        assert {"xgrammar": closed_rows > n, "llguidance": closed_rows == 0}.get(backend_name, True)
        for (fields, budget), slot in zip(cases, range(n)):
            assert finished[slot] == "stop" and len(outputs[slot]) < budget, (fields, budget)
            assert valid(fields, tokenizer.decode(outputs[slot])), (fields, tokenizer.decode(outputs[slot]))
    finally:
        written.close()
        filled.close()
