"""Keeping a budgeted slot's plan a real completion as its output grows (`PlanFollowing`).

The half of `steer.BudgetSteering` that walks the matcher: once per look the tokens the grammar
accepted since the last look are matched against the plan (`_follow`): on it, the plan advances;
off it (a string grew, whitespace, an optional member opened), the plan's rest is tried from the
new state (accept, one fill for a stop token, roll back: `_completes`) and kept if it still
completes the output, else a new plan is searched (`_search`: `search.shortest_completion` on a
scratch row of its own, landing on the plan's rest and its landmarks). Mixed into `BudgetSteering`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..interface import Grammar
from .plan import Plan
from .search import UNSPELLED, Completion, TokenTable, shortest_completion, token_table


def resumed(plan: Plan, new: bytes, table: TokenTable) -> Plan:
    """`plan` resumed past the longest prefix of `new` it spells from where it stands (the `{` of
    `{\n`, the `":` of `":\n`): its position moved there, or, where its `fewest` table cannot
    spell the rest from there (a chained plan knows only its token boundaries), a plan of that rest
    in its fewest tokens; unchanged where they share nothing or the rest has no spelling. Whether
    it still completes the output is for the caller to check (`_completes`)."""
    start, text = plan.position, plan.text
    end, limit = start, min(len(text), start + len(new))
    while end < limit and text[end] == new[end - start]:
        end += 1
    if end == start:
        return plan
    if plan.fewest[end][0] < UNSPELLED:
        plan.position = end
        return plan
    fewest = table.fewest(text[end:])
    if fewest[0][0] >= UNSPELLED:
        return plan
    return Plan(text[end:], fewest, landmarks=plan.landmarks)


class PlanFollowing:
    """Plans brought up to a slot's accepted tokens, re-planned when they no longer complete it."""

    backend: Any
    metrics: Any
    max_expansions: int
    _table: TokenTable | None
    _scratch: tuple[Any, np.ndarray] | None

    @property
    def table(self) -> TokenTable:
        """The tokenizer's byte table (built once, on first use)."""
        if self._table is None:
            self._table = token_table(self.backend.tokenizer)
        return self._table

    def _follow(self, grammar: Grammar, history: Sequence[int], budget) -> None:
        """Bring `budget`'s plan up to the tokens the grammar accepted since the last look."""
        plan, table = budget.plan, self.table
        budget.far_until = 0  # the plan may change here
        if plan is None:
            return
        seen = budget.seen
        if len(history) == seen and not budget.stale:
            return
        if budget.shared:  # the cached start plan itself (far.py): this slot's own copy from here
            plan = budget.plan = plan.fresh()
            budget.shared = False
        if len(history) < seen:  # jump-forward re-encoded a boundary
            budget.stale = True
        else:
            # one token since the last look, as a plain decode step has it; else every one
            new = (
                table.bytes_of[history[seen]]
                if len(history) == seen + 1
                else b"".join([table.bytes_of[t] for t in history[seen:]])
            )
            if new and not budget.stale and plan.text.startswith(new, plan.position):
                plan.position += len(new)
            elif new:
                if not budget.stale:
                    # The output left the plan here: its rest is tried (and searched, landing on
                    # it) from past the bytes it shares with them, not from before them, which no
                    # longer completes anything (a 5-30 ms search on llguidance each time).
                    plan = budget.plan = resumed(plan, new, table)
                budget.stale = True
        budget.seen = len(history)
        if not budget.stale:
            return
        budget.stale = False
        rest = plan.rest_tokens(table)
        if self._completes(grammar, rest):
            budget.plan = Plan.of(Completion(plan.text[plan.position :], tuple(rest), plan.landmarks), table)
            return
        completion = self._search(grammar, (plan.text[plan.position :],), plan.landmarks)
        if completion is None:
            budget.gave_up = True
            self.metrics.inc("budget_search_failures_total")
            budget.plan = None
            return
        budget.plan = Plan.of(completion, table)

    def _scratch_row(self) -> tuple[Any, np.ndarray]:
        """A one-row bitmask of our own (the search's fills must not touch the step's rows)."""
        if self._scratch is None:
            scratch = self.backend.allocate_bitmask(1)
            self._scratch = (scratch, scratch.numpy() if hasattr(scratch, "numpy") else np.asarray(scratch))
        return self._scratch[0], self._scratch[1][0]

    def _search(self, grammar: Grammar, hints: Sequence[bytes] = (), marks: Sequence[bytes] = ()) -> Completion | None:
        """The shortest completion from `grammar`'s state (unchanged), landing on `hints` (texts whose
        suffixes may complete it) and `marks` (the plan's landmarks); None past `max_expansions`."""
        bitmask, words = self._scratch_row()
        stops, most = self.backend.stop_token_ids, self.max_expansions
        return shortest_completion(
            grammar, self.table, stops, words, bitmask, 0, max_expansions=most, hints=hints, landmarks=marks
        )

    def _completes(self, grammar: Grammar, tokens: list[int]) -> bool:
        """Whether `tokens` and then a stop token complete the grammar from its state (unchanged)."""
        accepted = grammar.accept_tokens(tokens)
        try:
            if accepted < len(tokens):
                return False
            bitmask, words = self._scratch_row()
            grammar.fill_bitmask(bitmask, 0)
            return any(
                (int(words[s >> 5]) >> (s & 31)) & 1 for s in self.backend.stop_token_ids if s < words.shape[0] * 32
            )
        finally:
            if accepted:
                grammar.rollback(accepted)
