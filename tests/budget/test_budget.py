"""Budget steering: guided outputs end complete and valid within max_tokens, on DeepSeek's
vocabulary, under an adversarial decoder that would otherwise never end a string."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch
from adversary import pick
from guided_helpers import VOCAB, add_ready, in_process_backend

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request
from fd_guided.budget import fit_budget_requested
from fd_guided.errors import InvalidGrammarError
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 3},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        },
        "required": ["name", "tags"],
    },
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "kind": {"enum": ["alpha", "beta"]},
            "owner": {
                "type": "object",
                "properties": {"email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.org$"}},
                "required": ["email"],
            },
        },
        "required": ["id", "kind", "owner"],
    },
    {
        "type": "array",
        "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 4}}, "required": ["k"]},
        "minItems": 1,
    },
]
REQUESTS = [{"guided_json": schema} for schema in SCHEMAS] + [
    {"guided_regex": r"[a-z]+@[a-z]+\.com"},
    {"guided_regex": r"\d{4}-\d{2}-\d{2}( note: [a-z ]+)?"},
    {"guided_choice": ["short", "a much longer choice of words", "middle one"]},
    {"guided_json_object": True},
]


def valid(fields: dict, text: str) -> bool:
    if "guided_json" in fields or "guided_json_object" in fields:
        try:
            value = json.loads(text)
        except ValueError:
            return False
        if "guided_json_object" in fields:
            return isinstance(value, dict)
        return jsonschema.Draft202012Validator(fields["guided_json"]).is_valid(value)
    if "guided_regex" in fields:
        return re.fullmatch(fields["guided_regex"], text) is not None
    return text in fields["guided_choice"]


def run(backend_name: str, fields_list: list[dict], budgets: list[int], *, fit: bool = True, slack: bool = False):
    """Decode every request with the adversary; returns (finish, text, tokens generated) each."""
    tokenizer = load_tokenizer("deepseek")
    backend = in_process_backend(backend_name)
    manager = GuidedDecodingManager(backend, max_num_seqs=len(fields_list))
    manager.budget.slack_tokens = slack
    try:
        for slot, (fields, budget) in enumerate(zip(fields_list, budgets)):
            spec = parse_guided_request(fields, GuidedConfig(backend=backend_name))
            add_ready(manager, slot, spec, prefill_done=True, max_tokens=budget, fit_budget=fit)
        outputs = {slot: [] for slot in range(len(fields_list))}
        finish: dict[int, str] = {}
        logits = torch.zeros((len(fields_list), VOCAB))
        while len(finish) < len(fields_list):
            rows = [slot if slot not in finish else None for slot in range(len(fields_list))]
            manager.begin_step(rows)
            manager.apply(logits)
            words = manager.bitmask.numpy()  # the rows as applied (host memory)
            tokens = [pick(tokenizer, words[row], VOCAB) if rows[row] is not None else 0 for row in range(len(rows))]
            done = {f.slot: f for f in manager.accept(tokens)}
            for slot, token in enumerate(tokens):
                if rows[slot] is None:
                    continue
                if slot in done:
                    finish[slot] = done[slot].reason if done[slot].reason == "error" else "stop"
                    if done[slot].reason == "error":
                        finish[slot] = "error: " + (done[slot].error or "")
                    continue
                outputs[slot].append(token)
                if len(outputs[slot]) >= budgets[slot]:  # the host's length limit, as the reference engine does
                    finish[slot] = "length"
        return [(finish[s], tokenizer.decode(outputs[s]), len(outputs[s])) for s in range(len(fields_list))]
    finally:
        manager.close()


def minimum(backend_name: str, fields: dict) -> int:
    """The shortest output's tokens (stop included), as the manager's plan has it at the start."""
    backend = in_process_backend(backend_name)
    manager = GuidedDecodingManager(backend, max_num_seqs=1)
    manager.budget.defer_start_above = 10**9  # the first look searches at once: need() is known after it
    try:
        add_ready(
            manager,
            0,
            parse_guided_request(fields, GuidedConfig(backend=backend_name)),
            prefill_done=True,
            max_tokens=10_000,
        )
        manager.begin_step([0])
        manager.apply(torch.zeros((1, VOCAB)))
        need = manager.budget.need(0)
        manager.accept([0])
        return need
    finally:
        manager.close()


@pytest.mark.parametrize(
    "backend_name, slack",
    [("xgrammar", False), ("llguidance", False), ("auto", False), ("xgrammar", True), ("llguidance", True)],
)
def test_adversary_ends_valid_within_budget(backend_name, slack):
    needs = [minimum(backend_name, fields) for fields in REQUESTS]
    cases = [(fields, need + extra) for fields, need in zip(REQUESTS, needs) for extra in (0, 1, 3)]
    cases += [(fields, int(need * 2)) for fields, need in zip(REQUESTS, needs)]
    results = run(backend_name, [f for f, _ in cases], [b for _, b in cases], slack=slack)
    for (fields, budget), (finish, text, used) in zip(cases, results):
        assert finish == "stop", (fields, budget, finish, text)
        assert used < budget, (fields, budget, used)  # the stop token fits too
        assert valid(fields, text), (fields, budget, text)


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_without_steering_the_adversary_is_cut(backend_name):
    fields = REQUESTS[0]
    need = minimum(backend_name, fields)
    [(finish, text, _)] = run(backend_name, [fields], [need * 2], fit=False)
    assert finish == "length" and not valid(fields, text)


def test_a_budget_below_the_shortest_output_fails_naming_it():
    fields = REQUESTS[1]
    need = minimum("xgrammar", fields)
    [(finish, text, used)] = run("xgrammar", [fields], [need - 1])
    assert finish.startswith("error") and f"needs {need} tokens" in finish and f"max_tokens={need - 1}" in finish
    assert used == 0


def test_request_field():
    assert fit_budget_requested({}) is True
    assert fit_budget_requested({"guided_fit_budget": False}) is False
    with pytest.raises(InvalidGrammarError) as error:
        fit_budget_requested({"guided_fit_budget": "no"})
    assert error.value.part == "guided_fit_budget"


def test_a_thinking_request_is_cut_to_leave_room_for_its_output():
    tokenizer = load_tokenizer("deepseek")
    backend = in_process_backend("xgrammar")
    manager = GuidedDecodingManager(backend, max_num_seqs=1, think_end_id=tokenizer.think_end_id)
    fields = REQUESTS[0]
    try:
        add_ready(
            manager,
            0,
            parse_guided_request(fields, GuidedConfig(backend="xgrammar")),
            prefill_done=True,
            enable_thinking=True,
            max_tokens=40,
        )
        output: list[int] = []
        space = tokenizer.encode(" ")[0]
        while len(output) < 40:
            logits = torch.zeros((1, VOCAB))
            manager.begin_step([0])
            manager.apply(logits)
            if manager.is_reasoning_row(0):  # thinks forever unless the marker is forced
                allowed = np.flatnonzero(np.isfinite(logits[0].numpy()))
                token = space if len(allowed) > 1 else int(allowed[0])
            else:
                token = pick(tokenizer, manager.bitmask.numpy()[0], VOCAB)
            finished = manager.accept([token])
            if finished:
                assert finished[0].reason == "stop"
                break
            output.append(token)
        assert len(output) < 40 and tokenizer.think_end_id in output
        text = tokenizer.decode(output[output.index(tokenizer.think_end_id) + 1 :])
        assert valid(fields, text), text
        assert manager.metrics.value("budget_reasoning_cut_total") == 1
    finally:
        manager.close()


def test_drafts_near_the_budget_are_cut():
    backend = in_process_backend("xgrammar")
    manager = GuidedDecodingManager(backend, max_num_seqs=1, max_draft_tokens=3)
    fields = REQUESTS[0]
    tokenizer = load_tokenizer("deepseek")
    try:
        need = minimum("xgrammar", fields)
        add_ready(
            manager,
            0,
            parse_guided_request(fields, GuidedConfig(backend="xgrammar")),
            prefill_done=True,
            max_tokens=need + 1,
        )
        drafts = tokenizer.encode('{"name"')[:3]
        manager.begin_speculative_step([0], [drafts])
        manager.apply(torch.zeros((len(drafts) + 1, VOCAB)))
        assert manager.draft_limits() == [0]
        assert all(manager.allows_only_stop(row) for row in range(1, len(drafts) + 1))
    finally:
        manager.close()


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_grammars_and_structural_tags_end_valid(backend_name):
    from corpus import GRAMMARS, STRUCTURAL_TAGS

    from fd_guided.harness.validate import validate_output

    fields_list = [{"guided_grammar": g} for g in GRAMMARS.values()]
    fields_list += [{"structural_tag": json.dumps(t)} for t in STRUCTURAL_TAGS.values()]
    cases = [(fields, minimum(backend_name, fields) + extra) for fields in fields_list for extra in (0, 3)]
    results = run(backend_name, [f for f, _ in cases], [b for _, b in cases])
    config = GuidedConfig(backend=backend_name)
    for (fields, budget), (finish, text, used) in zip(cases, results):
        assert finish == "stop" and used < budget, (fields, budget, finish, text)
        assert validate_output(parse_guided_request(fields, config), text).valid, (fields, text)


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_a_far_budget_searches_in_the_background_and_still_ends_valid(backend_name):
    """A budget far above its shortest output (> DEFER_START_ABOVE tokens left) does not search on
    the host's thread at its first step (no plan yet after it); the search runs on a matcher of its
    own, and the adversary still ends complete and valid within the budget."""
    fields = REQUESTS[0]
    need = minimum(backend_name, fields)
    budget = need + 200
    backend = in_process_backend(backend_name)
    manager = GuidedDecodingManager(backend, max_num_seqs=1)
    try:
        spec = parse_guided_request(dict(fields, guided_json={**fields["guided_json"], "title": "far"}),
                                    GuidedConfig(backend=backend_name))  # a spec no plan is cached for
        add_ready(manager, 0, spec, prefill_done=True, max_tokens=budget)
        manager.begin_step([0])
        manager.apply(torch.zeros((1, VOCAB)))
        assert manager.budget.need(0) is None  # deferred: nothing searched on this thread
        manager.accept([int(np.flatnonzero(np.unpackbits(manager.bitmask.numpy()[0].view(np.uint8),
                                                          bitorder="little"))[0])])
    finally:
        manager.close()
    [(finish, text, used)] = run(backend_name, [fields], [budget])
    assert finish == "stop" and used <= budget and valid(fields, text), (finish, used, budget, text)
