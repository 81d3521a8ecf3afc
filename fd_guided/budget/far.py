"""Far rows: a request far from its budget costs no call of its own a step (issue #24 item 4).

The manager hands `BudgetSteering.prepare` the step's budgeted rows once, at the begin hook (the
rows of slots in `BudgetSteering.tracked`, with their states: an unbudgeted row is not handed at
all). `prepare` compares each row's generated tokens with its slot's `far_until` (set once a look
finds it far, cleared whenever its plan is followed: the plan does not change while far) and
returns the rows that are not far: only those reach `steer`. A far row thus costs one loop turn
and one comparison inside one call per step, no call of its own, in either hook. Its state cannot
change between the begin hook and `steer` (no token is accepted in between), so the comparison
made at the begin hook holds for the whole step.

A request's first look, far from its budget, whose schema was seen before takes its start plan by
its compiled grammar's identity (`_far_at_start`: `StartPlans.of_grammar`, no spec hashed, no
lock) and sets `far_until`, in `prepare` (a plain row: it never reaches `steer`; a row with drafts
gets its first look in `steer`'s `_row`, as a start that is not far or not cached does); its later
steps are the comparison above.

`hook_ns` counts the nanoseconds spent in `prepare` and `steer` (one clock pair per call, two
calls a step), for benchmarks (tools/budget_cost.py): the steering's own time, without a wrapper
per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

from .plan import Plan
from .start_plans import StartPlans


class FarRows:
    """The step's far test (`prepare`) and a far request's first look (see the module docstring)."""

    _slots: dict[int, Any]
    start_plans: StartPlans
    window: int
    hook_ns: int

    def prepare(self, rows: Sequence[tuple[Any, Any]]) -> list[Any]:
        """At the begin hook, before the fill: of `rows` (the step's (entry, state) pairs whose
        slots are budgeted and whose rows are planned), those `steer` looks at: every one not far
        from its budget (far: fewer tokens generated than its `far_until`, or at its first look
        with its start plan cached, `_far_at_start`; a one-row entry) whose steering did not give
        up. A plain row in its closing zone gets its candidates here
        (`TreeFill.candidates`: written from them on the fill thread, `closing.write_closing_row`,
        no full fill); its plan is followed up to the accepted tokens first."""
        if not rows:
            return []
        started = perf_counter_ns()
        looked = []
        slots = self._slots
        for entry, state in rows:
            budget = slots.get(entry.slot)
            if budget is None or budget.gave_up:
                continue
            reasoning = state.reasoning
            generated = len(state.history) + (reasoning.spent if reasoning is not None else 0)
            if not entry.tree.tokens:  # a one-row entry (no drafts): not `num_nodes`, a call per row
                if generated < budget.far_until:
                    continue  # far from the budget (found so at an earlier look, the plan unchanged)
                if (
                    not budget.started
                    and entry.fill is not None
                    and not state.in_reasoning
                    and self._far_at_start(entry, state, budget, budget.max_tokens - generated)
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

    def _far_at_start(self, entry, state, budget, left: int) -> bool:
        """The first look of a request far from its budget whose start plan is cached (every
        request of a schema seen before): the plan copied, `far_until` set; the plan found by its
        compiled grammar's identity (`StartPlans.of_grammar`), by its spec and engine the first
        time. False (nothing done) otherwise: `_start` decides."""
        if state.history or budget.deferred:
            return False
        try:
            compiled = state.ticket.result(timeout=0)
        except Exception:  # noqa: BLE001 - no compiled grammar (yet): `_start` decides
            return False
        plans = self.start_plans
        cached = plans.of_grammar(compiled)
        if cached is None:
            cached = plans.get((state.spec, str(compiled.backend_name)))
            if cached is None:
                return False
            plans.tie(compiled, cached)
        need = cached.need
        slack = left - need - self._headroom_of(cached)
        if slack <= self.window or entry.tree.num_nodes > slack:
            return False
        budget.started = True
        self._take_start(budget, cached.fresh(), 0)
        budget.far_until = budget.max_tokens - need - budget.headroom - self.window
        return True

    def _headroom_of(self, start_plan: Plan) -> int:
        raise NotImplementedError  # BudgetSteering's

    def _take_start(self, budget, plan: Plan, seen: int) -> None:
        raise NotImplementedError  # BudgetSteering's
