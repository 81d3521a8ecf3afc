"""Far rows (issue #24 item 4): a request far from its budget finds its start plan by its compiled
grammar's identity (no spec hashed, no lock), costs no call of its own a step after that (one
comparison in `prepare`'s one call for the step's rows; `steer` never sees it), and still ends
complete and valid once it nears its budget, under the adversarial decoder."""

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
        compiled = manager.step.slots.get(1).ticket.result(timeout=0)
        cached = plans.of_grammar(compiled)
        # the cached start plan itself, shared (not copied) until a follow moves it
        assert cached is not None and all(slots[s].plan is cached and slots[s].shared for s in (0, 1))
        assert cached.need == need and not {0, 1} & manager.budget.watched  # far: not handed

        # Far: `prepare` keeps the step's entry from `steer`; near: steered to the end.
        outputs: dict[int, list[int]] = {0: [first[0]], 1: [first[1]]}
        finished: dict[int, str] = {}
        passed_by = 0
        while len(finished) < 2:
            rows = [s if s not in finished else None for s in (0, 1)]
            manager.begin_step(rows)
            looked = manager.step._looked
            passed_by += sum(1 for e in manager.step._entries if e.slot in slots and e not in looked)
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
        assert cached.position == 0 and cached.need == need  # each followed its own copy
        for slot in (0, 1):
            text = tokenizer.decode(outputs[slot])
            assert finished[slot] == "stop" and len(outputs[slot]) < budget, (finished[slot], text)
            assert valid(fields, text), text
    finally:
        manager.close()


def test_a_plan_resumes_past_the_bytes_the_output_shares_with_it():
    """`{\\n` where the plan has `{"id...`: the plan's rest is tried from past the `{`, not from the
    `{` again (which no longer completes anything: a search on every such token)."""
    from fd_guided.budget.follow import resumed
    from fd_guided.budget.search import token_table

    table = token_table(load_tokenizer("deepseek"))
    text = b'{"id":0,"kind":"alpha"}'
    plan = resumed(Plan(text, table.fewest(text)), b"{\n", table)
    assert plan.text[plan.position :] == b'"id":0,"kind":"alpha"}'
    chained = Plan(text, [(2, table.by_bytes[b'{"']), *[(1 << 30, -1)] * (len(text) - 2), (1, 0), (0, -1)])
    respelled = resumed(chained, b"{\n", table)  # its table knows only token boundaries: spelled again
    assert respelled.text == b'"id":0,"kind":"alpha"}' and respelled.position == 0
    untouched = Plan(text, table.fewest(text))
    assert resumed(untouched, b" ", table) is untouched and untouched.position == 0


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_whitespace_off_the_plan_is_followed_without_a_search(backend_name):
    """A request near its budget takes `{` and a newline where its plan has `{"`: its plan's rest
    still completes the output from there, so the look after it runs no search (on main it
    searched, 5-30 ms on llguidance), and it ends complete and valid."""
    fields = REQUESTS[1]
    config = GuidedConfig(backend=backend_name)
    tokenizer = load_tokenizer("deepseek")
    manager = GuidedDecodingManager(in_process_backend(backend_name), max_num_seqs=1)
    manager.budget.defer_start_above = 10**9
    try:
        add_ready(manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=10_000)
        _step(manager, tokenizer, [0])  # its start plan: need and closing headroom
        need, headroom = manager.budget.need(0), manager.budget._slots[0].headroom
        manager.release(0)
        budget = need + headroom + WINDOW // 2  # near (its plan followed every step), not closing
        add_ready(manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=budget)
        searches = []
        inner = manager.budget._search
        manager.budget._search = lambda *a, **k: searches.append(a) or inner(*a, **k)  # type: ignore[method-assign]
        manager.begin_step([0])
        manager.apply(torch.zeros((1, VOCAB)))
        brace_newline = manager.budget.table.by_bytes[b"{\n"]
        words = manager.bitmask.numpy()[0]
        assert (int(words[brace_newline >> 5]) >> (brace_newline & 31)) & 1
        assert not manager.accept([brace_newline])
        outputs, searched = [brace_newline], len(searches)  # the start plan's own search, if any
        manager.begin_step([0])
        manager.apply(torch.zeros((1, VOCAB)))  # the look that follows `{\n`: the plan's rest kept
        assert len(searches) == searched and manager.budget.need(0) is not None
        token = pick(tokenizer, manager.bitmask.numpy()[0], VOCAB)
        assert not manager.accept([token])
        outputs.append(token)
        while True:
            manager.begin_step([0])
            manager.apply(torch.zeros((1, VOCAB)))
            token = pick(tokenizer, manager.bitmask.numpy()[0], VOCAB)
            done = manager.accept([token])
            if done:
                assert done[0].reason == "stop", done[0]
                break
            outputs.append(token)
            assert len(outputs) < budget
        assert valid(fields, tokenizer.decode(outputs)), tokenizer.decode(outputs)
    finally:
        manager.close()


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_far_rows_are_not_looked_at_row_by_row(backend_name):
    """Two far rows, an unbudgeted one and one near its budget, on the same schema: after their
    first looks (in `prepare`: their start plan cached) the far rows reach no per-row code of the
    steering (no call names them: not the closing candidates, `_row`, a first look or `_follow`)
    and `steer` is handed only the near row, from the first step; the unbudgeted row is not
    handed to `prepare` at all. A far row's mask is the unbudgeted row's (the same tokens taken),
    and the near row ends complete and valid within its budget."""
    fields = REQUESTS[1]
    config = GuidedConfig(backend=backend_name)
    tokenizer = load_tokenizer("deepseek")
    manager = GuidedDecodingManager(in_process_backend(backend_name), max_num_seqs=4)
    steering = manager.budget
    steering.defer_start_above = 10**9
    try:
        add_ready(manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=10_000)
        _step(manager, tokenizer, [0])  # the start plan searched and cached
        need, headroom = steering.need(0), steering._slots[0].headroom
        manager.release(0)
        near = need + headroom + WINDOW // 2
        budgets = {0: 10_000, 1: 10_000, 2: None, 3: near}
        for slot, budget in budgets.items():
            add_ready(manager, slot, parse_guided_request(fields, config), prefill_done=True, max_tokens=budget)
        slot_of = {id(b): s for s, b in steering._slots.items()}
        calls: list[tuple[int, str, int]] = []  # (step, what was called, for which slot)
        at = [0]

        def counted(name, slot_at):
            inner = getattr(steering, name)
            setattr(steering, name, lambda *a: calls.append((at[0], name, slot_at(a))) or inner(*a))

        counted("_closing_candidates", lambda a: slot_of[id(a[0])])
        counted("_row", lambda a: a[1].slot)
        counted("_far_at_start", lambda a: a[0].slot)
        counted("_follow", lambda a: slot_of[id(a[2])])
        handed, steered = [], []
        prepare, steer = steering.prepare, steering.steer
        steering.prepare = lambda rows: handed.append([e.slot for e, _ in rows]) or prepare(rows)  # type: ignore[method-assign]
        steering.steer = lambda entries, *a: steered.append([e.slot for e in entries]) or steer(entries, *a)  # type: ignore[method-assign]

        outputs: dict[int, list[int]] = {slot: [] for slot in budgets}
        finished: dict[int, str] = {}
        for step in range(near + 2):
            at[0] = step
            rows = [slot if 3 not in finished or slot != 3 else None for slot in budgets]
            manager.begin_step(rows)
            manager.apply(torch.zeros((4, VOCAB)))
            words = manager.bitmask.numpy()
            far_token = pick(tokenizer, words[0], VOCAB)
            # the far and unbudgeted rows: one mask for the same tokens
            assert (words[0] == words[2]).all() and (words[1] == words[2]).all()
            tokens = [far_token, far_token, far_token, pick(tokenizer, words[3], VOCAB) if rows[3] is not None else 0]
            done = {f.slot: f for f in manager.accept(tokens)}
            assert not {0, 1, 2} & set(done), done
            if rows[3] is not None:
                if 3 in done:
                    finished[3] = done[3].reason
                else:
                    outputs[3].append(tokens[3])
            if 3 in finished and step >= WINDOW:
                break
        assert {slot for step, name, slot in calls if name == "_far_at_start"} == {0, 1, 3}
        assert all(step == 0 for step, name, _ in calls if name == "_far_at_start")  # first looks
        later = [(step, name, slot) for step, name, slot in calls if step > 0]
        assert later and all(slot == 3 for _, _, slot in later), later
        assert all(2 not in slots for slots in handed)
        assert handed[0] == [0, 1, 3] and all(0 not in slots and 1 not in slots for slots in handed[1:]), handed
        assert steered[0] == [3] and all(slots in ([3], []) for slots in steered), steered  # first looks too
        assert finished[3] == "stop" and len(outputs[3]) < near
        assert valid(fields, tokenizer.decode(outputs[3])), tokenizer.decode(outputs[3])
    finally:
        manager.close()


class _HandedAll:
    """The far4 path, for comparison: every budgeted row handed to `prepare` each step and compared
    there (`_far` sets `far_until` alone: the slot stays watched, its state unmarked)."""

    def __init__(self, steering):
        steering._far = self._far
        self.steering = steering

    def _far(self, slot, state, budget, far_until):
        budget.far_until = far_until


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_far_rows_come_back_at_their_mark_with_the_same_masks(backend_name):
    """Requests that start far from their budget and near it: a far row is not handed to
    `prepare` (no loop turn of its own) from its first look until the step at which its tokens
    reach its `far_until`, then is handed every step; at every step the masks equal those of the
    far4 path (every budgeted row handed and compared in `prepare`) on the same tokens, and every
    request ends complete and valid within its budget."""
    fields = REQUESTS[1]
    config = GuidedConfig(backend=backend_name)
    tokenizer = load_tokenizer("deepseek")
    backend = in_process_backend(backend_name)
    managers = [GuidedDecodingManager(backend, max_num_seqs=3) for _ in range(2)]
    for manager in managers:
        manager.budget.defer_start_above = 10**9
    _HandedAll(managers[1].budget)
    try:
        for manager in managers:  # the start plan searched and cached in each
            add_ready(manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=10_000)
            _step(manager, tokenizer, [0])
            need, headroom = manager.budget.need(0), manager.budget._slots[0].headroom
            manager.release(0)
        far = need + headroom + WINDOW
        budgets = {0: far + 3, 1: far + 9, 2: None}
        for manager in managers:
            for slot, budget in budgets.items():
                add_ready(manager, slot, parse_guided_request(fields, config), prefill_done=True, max_tokens=budget)
        steering, states = managers[0].budget, managers[0].step.slots
        handed: list[list[int]] = []
        prepare = steering.prepare
        steering.prepare = lambda rows: handed.append([e.slot for e, _ in rows]) or prepare(rows)  # type: ignore[method-assign]
        outputs: dict[int, list[int]] = {slot: [] for slot in budgets}
        finished: dict[int, str] = {}
        for step in range(far + 10):
            rows = [slot if slot not in finished else None for slot in budgets]
            if rows[0] is None and rows[1] is None:
                break
            generated = {slot: len(states[slot].history) for slot in (0, 1) if rows[slot] is not None}
            until = {slot: steering._slots[slot].far_until for slot in generated}
            words, at = [], len(handed)  # handed[at]: the begin hook's call (apply's has deferred rows only)
            for manager in managers:
                manager.begin_step(rows)
                manager.apply(torch.zeros((3, VOCAB)))
                words.append(manager.bitmask.numpy().copy())
            assert (words[0] == words[1]).all(), step
            for slot in generated:  # handed from its first look on only where it is not far
                if step > 0:
                    assert (slot in handed[at]) == (generated[slot] >= until[slot]), (step, slot, handed[at])
            tokens = [pick(tokenizer, words[0][row], VOCAB) if rows[row] is not None else 0 for row in range(3)]
            done = [{f.slot: f.reason for f in manager.accept(tokens)} for manager in managers]
            assert done[0] == done[1], step
            for slot in (0, 1):
                if rows[slot] is None:
                    continue
                if slot in done[0]:
                    finished[slot] = done[0][slot]
                else:
                    outputs[slot].append(tokens[slot])
        begun = handed[2::2]  # the begin hooks' calls after the first step's (each followed by apply's)
        assert any(0 not in h for h in begun) and any(0 in h for h in begun), handed  # far, then near
        for slot in (0, 1):
            text = tokenizer.decode(outputs[slot])
            assert finished.get(slot) == "stop" and len(outputs[slot]) < budgets[slot], (finished, text)
            assert valid(fields, text), text
    finally:
        for manager in managers:
            manager.close()
        backend.close()


def test_a_far_row_jumped_forward_past_its_mark_is_watched_again():
    """Jump-forward adds tokens outside `accept`: a far request whose forced tokens reach its
    `far_until` is handed to `prepare` again at the next step (`SlotTable.reached_mark`)."""
    fields = {"guided_regex": r"a(bcdefghijklmnopqrstuvwxyz)[0-9]+"}
    config = GuidedConfig(backend="xgrammar")
    tokenizer = load_tokenizer("deepseek")
    manager = GuidedDecodingManager(in_process_backend("xgrammar"), max_num_seqs=1)
    steering = manager.budget
    steering.defer_start_above = 10**9
    try:
        add_ready(manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=10_000)
        _step(manager, tokenizer, [0])
        need, headroom = steering.need(0), steering._slots[0].headroom
        manager.release(0)
        budget = need + headroom + WINDOW + 2  # far until 2 tokens generated
        add_ready(
            manager, 0, parse_guided_request(fields, config), prefill_done=True, max_tokens=budget, jump_forward=True
        )
        a = steering.table.by_bytes[b"a"]
        manager.begin_step([0])
        manager.apply(torch.zeros((1, VOCAB)))
        assert not manager.accept([a])
        state = manager.step.slots[0]
        assert steering._slots[0].far_until == 2 and 0 not in steering.watched and state.budget_mark == 2
        jumped = manager.jump_forward(0)
        assert jumped is not None and len(state.history) >= 2
        assert 0 in steering.watched and state.budget_mark > 1 << 40
    finally:
        manager.close()
