"""Far rows: a request far from its budget costs nothing a step in the steering (issue #24 item 4).

The steering keeps `watched`: the budgeted slots the manager's begin hook hands to `prepare` (a
set the manager's `SlotTable` shares, `SlotTable.budget_watched`). Where a look finds a request
far from its budget (`_far`: fewer tokens generated than its `far_until`, the plan unchanged
while far) its slot leaves `watched` and its state gets a `budget_mark`, the history length at
which it is no longer far; `SlotTable.advance` (and jump-forward) put the slot back once its
history reaches the mark, one comparison where the tokens are accepted. A far row of a plain step
is thus never handed to `prepare` or `steer`: no loop turn, no lookup, no call of its own. In a
speculative step every budgeted entry is handed (a far row's drafts may reach its closing zone:
`steer`'s `_row` decides); an entry without drafts is dropped there by the same comparison.

`prepare` returns the handed rows that are not far: only those reach `steer`. A request's first
look, far from its budget, whose schema was seen before (`_far_at_start`) takes its start plan by
its compiled grammar's identity (`StartPlans.of_grammar`, no spec hashed, no lock; the compiled
grammar kept on its state, `SlotState.compiled`, not asked of its ticket) *without copying it*:
the slot shares the cached plan until its first follow moves it (`_Slot.shared`, copied in
`_follow`), so a first look is a lookup, a comparison and a few assignments.

`hook_ns` counts the nanoseconds spent in `prepare` and `steer` (one clock pair per call that has
rows, two calls a step at most), for benchmarks (tools/budget_cost.py): the steering's own time,
without a wrapper per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

from .start_plans import StartPlans

NO_MARK = 1 << 62  # `SlotState.budget_mark` of a request the steering looks at every step (or none)


class FarRows:
    """The step's far test (`prepare`), a far request's first look, and `watched` (see above)."""

    _slots: dict[int, Any]
    watched: set[int]
    start_plans: StartPlans
    headroom: int
    window: int
    hook_ns: int

    def prepare(self, rows: Sequence[tuple[Any, Any]]) -> list[Any]:
        """At the begin hook, before the fill: of `rows` (the step's (entry, state) pairs whose
        slots are `watched`, or budgeted in a speculative step, and whose rows are planned), those
        `steer` looks at: every one not far from its budget (far: fewer tokens generated than its
        `far_until`, or at its first look with its start plan cached, `_far_at_start`; a one-row
        entry) whose steering did not give up. A plain row in its closing zone gets its candidates
        here (`TreeFill.candidates`: written from them on the fill thread,
        `closing.write_closing_row`, no full fill); its plan is followed up to the accepted tokens
        first."""
        if not rows:
            return []
        started = perf_counter_ns()
        looked = []
        slots = self._slots
        for entry, state in rows:
            budget = slots.get(entry.slot)
            if budget is None or budget.gave_up:
                continue
            # `BudgetSteering._generated(state)`, inlined (a call per row)
            reasoning = state.reasoning
            generated = len(state.history) + (reasoning.spent if reasoning is not None else 0)
            if not entry.tree.tokens:  # a one-row entry (no drafts): not `num_nodes`, a call per row
                if generated < budget.far_until:
                    continue  # far from the budget (a speculative step hands far rows too)
                if (
                    not budget.started
                    and entry.fill is not None
                    and (reasoning is None or not reasoning.thinking)  # `state.in_reasoning`, inlined
                    and self._far_at_start(entry, state, budget, generated, 1)
                ):
                    continue  # its first look, far from the budget: its start plan cached
            looked.append(entry)
            fill = entry.fill
            if fill is not None and len(fill.nodes) == 1 and budget.started:
                candidates = fill.candidates = self._closing_candidates(budget, state, entry, generated)
                if candidates is not None:
                    fill.first_mask = None  # written from its candidates: no kept row copied, none kept
        self.hook_ns += perf_counter_ns() - started
        return looked

    def _closing_candidates(self, budget, state, entry, generated: int) -> tuple[int, ...] | None:
        raise NotImplementedError  # BudgetSteering's

    def _far_at_start(self, entry, state, budget, generated: int, nodes: int) -> bool:
        """The first look of a request far from its budget whose start plan is cached (every
        request of a schema seen before; `generated`: reasoning tokens spent, `nodes`: its entry's
        rows): the cached plan itself taken (shared until its first follow), `far_until` set, the
        slot out of `watched` (`_far`, inlined); the plan, its need and growth found by its compiled
        grammar's identity (`StartPlans.by_grammar`), by its spec and engine the first time. False
        (nothing done) otherwise: `_start` decides."""
        compiled = state.compiled  # set with its matcher (`SlotTable.materialise`): no lock taken
        if compiled is None or state.history or budget.deferred:
            return False  # `_start` decides
        tied = self.start_plans.by_grammar.get(id(compiled))  # `StartPlans.of_grammar`, inlined
        if tied is not None and tied[0]() is compiled:
            cached, need, growth = tied[1], tied[2], tied[3]
        else:
            plans = self.start_plans
            found = plans.get((state.spec, str(compiled.backend_name)))
            if found is None:
                return False
            plans.tie(compiled, found)
            cached, need, growth = found, found.need, found.growth
        headroom = growth + 1 if growth >= self.headroom else self.headroom  # `_headroom_of(cached)`
        slack = budget.max_tokens - generated - need - headroom
        if slack <= self.window or nodes > slack:
            return False
        # `_take_start(budget, cached, 0)` without a copy: `_follow` copies it before it moves
        budget.started = budget.shared = True
        budget.plan, budget.seen, budget.headroom = cached, 0, headroom
        budget.far_until = far_until = budget.max_tokens - need - headroom - self.window
        self.watched.discard(entry.slot)
        state.budget_mark = far_until - generated  # its history is empty: every token generated was reasoning
        return True

    def _far(self, slot: int, state, budget, far_until: int) -> None:
        """`slot` is far from its budget until it generated `far_until` tokens (its plan as it
        stands): out of `watched`, its state marked where its history reaches that (reasoning
        tokens, spent before, count too)."""
        budget.far_until = far_until
        self.watched.discard(slot)
        reasoning = state.reasoning
        state.budget_mark = far_until - (reasoning.spent if reasoning is not None else 0)
