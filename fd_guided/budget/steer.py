"""Budget steering: a guided request with a token budget ends complete and valid within it.

For each budgeted slot the manager keeps a *plan*: a real completion of its grammar from the
current state (`search.shortest_completion`: the shortest found, in tokens of the request's
tokenizer, the stop token included) and how much of it the output has already written. `need` is
what the plan still costs: the fewest tokens that spell the rest of its text, plus the stop token.
With `left` the tokens the request may still generate (its ``max_tokens`` minus every token it
generated, reasoning included), once per step, after the fill (`BudgetSteering.steer`):

  far      ``left > need + headroom + window``: nothing is done (no search, no look at tokens);
           after its first look (the start plan of a schema seen before: one lookup by its
           compiled grammar, the cached plan shared) a far row leaves `watched`: a plain step
           hands it to neither `prepare` nor `steer`, and the one comparison left is where its
           tokens are accepted, which puts it back at its mark (`far.FarRows`)
  near     the tokens emitted since the last look are checked against the plan: on the plan, it
           advances; off it, the rest of the plan is tried from the new state (accept, one fill,
           roll back): still a completion (a string grew, whitespace), it stays; else a new search
  closing  ``left - need <= headroom``: the row allows only tokens that spell the next bytes of
           the plan and leave a completion within what is left (``1 + need_after <= left``), the
           stop tokens (opt-in `slack_tokens`: while slack is left, ``left > need``, also the
           tokens that keep the plan a completion, `slack.SlackTokens`: a string may still grow);
           the matcher's own row still has the last word
  thinking a request in its reasoning section gets its think-end marker forced (through its
           `ReasoningState` budget) when what is left would hold only the marker and the
           shortest output from the grammar's start

At the request's first masked step, a budget smaller than the shortest output found fails the
request (reason ``error``, the minimum named): admission does not know the compiled grammar.
Speculative drafts of a request in its near or closing zone are cut (their rows allow only stop
tokens, `draft_limits` 0), so drafts never overrun the budget.

A request's ``headroom`` is `HEADROOM`, or its start plan's growth plus one where that is larger
(`Plan.growth`: the most tokens one optional property or array item adds to the shortest output,
from the landmarks written beside it), so that outside the closing zone the slack exceeds what
opening any one such member costs.

Guarantee: in the closing zone every allowed token keeps a verified completion within the
budget, so a request that enters it with ``need <= left`` ends ``stop`` with a valid output.
Outside it a token that opens one optional member the landmarks hold still leaves room to close
it. A token that raises the shortest completion by more than that (a costlier ``anyOf`` branch
or type, a member of a member no landmark holds, a grammar without landmarks: EBNF, Lark) can
still overrun; such requests are counted (``budget_overruns_total``) and end as the host's budget
says (``length``). See docs/budget.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from time import perf_counter_ns
from typing import Any

import numpy as np

from ..bitmask_rows import token_row
from ..interface import Grammar
from .far import FarRows
from .follow import PlanFollowing
from .minimum import BudgetTooSmallError, StartPlanning
from .plan import Plan, chain
from .rows import StepRows, cut_drafts, engine_of, stop_entry
from .search import TokenTable
from .slack import SlackTokens
from .start_plans import StartPlans

logger = logging.getLogger(__name__)

HEADROOM = 8  # slack at which the closing zone starts (a token taken before it may grow the completion by this much)
WINDOW = 16  # tokens before the closing zone from which the plan is followed step by step
# A request with more tokens left than this at its first look does not wait for the first
# search of its grammar's start plan (10-160 ms on a cold schema, on the host's thread): the
# search runs in the background on a matcher of its own and the request is steered from the
# step it is done. Tighter budgets search at once (they may be in the closing zone already).
DEFER_START_ABOVE = 128


@dataclass
class _Slot:
    max_tokens: int
    plan: Plan | None = None
    seen: int = 0  # tokens of the grammar's history the plan accounts for
    stale: bool = False
    started: bool = False
    steered: bool = False
    overrun: bool = False
    gave_up: bool = False
    deferred: bool = False  # its first look waits for a background start-plan search
    # Tokens generated (reasoning included) below which the row is far from its budget with its
    # plan as it stands: set where a look finds it far (`_far`: the slot leaves `watched`),
    # cleared whenever the plan is followed (the plan does not change while far; far.py).
    far_until: int = 0
    # Slack at which its closing zone starts: the steering's headroom, or its start plan's growth
    # (the most one optional member adds) and one more where that is larger (`_take_start`).
    headroom: int = HEADROOM
    shared: bool = False  # `plan` is the cached start plan itself (far.py): copied before it moves


@dataclass
class BudgetSteering(FarRows, PlanFollowing, StartPlanning):
    """The manager's budget steering (see the module docstring); one per manager."""

    backend: Any
    metrics: Any
    headroom: int = HEADROOM
    window: int = WINDOW
    max_expansions: int = 3000
    defer_start_above: int = DEFER_START_ABOVE  # see DEFER_START_ABOVE
    # Closing rows also allow the tokens that keep the plan while slack is left (a string may go
    # on growing): more freedom for the model, at a matcher walk per new state (docs/budget.md).
    slack_tokens: bool = False
    # Closing rows written from their few candidates on the fill thread, not filled (closing.py).
    closing_rows: bool = True
    _slots: dict[int, _Slot] = field(default_factory=dict)
    start_plans: StartPlans = field(default_factory=StartPlans)
    # The budgeted slots the manager's begin hook hands to `prepare` (all but those known far from
    # their budget, far.py); the manager passes its `SlotTable.budget_watched`, which puts a far
    # slot back where its history reaches its mark.
    watched: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._table: TokenTable | None = None
        self._slack: SlackTokens | None = None
        self._scratch: tuple[Any, np.ndarray] | None = None
        self._plan_asked = {}
        # Slot -> `_Slot` of every budgeted slot (`_slots` itself, read-only outside): the manager's
        # begin hook hands a speculative step's entries of these slots to `prepare` (far.py).
        self.budgeted: Mapping[int, _Slot] = self._slots
        self.hook_ns = 0  # time spent in `prepare` and `steer` (far.py)

    # ----- lifecycle -----------------------------------------------------------------------------

    def track(self, slot: int, max_tokens: int | None, enabled: bool = True) -> None:
        """Steer `slot` within `max_tokens` generated tokens (None or not `enabled`: not at all)."""
        self.forget(slot)
        if max_tokens is not None and enabled:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
            self._slots[slot] = _Slot(int(max_tokens))
            self.watched.add(slot)

    def forget(self, slot: int) -> None:
        self._slots.pop(slot, None)
        self.watched.discard(slot)

    def close(self) -> None:
        """Wait for a background start-plan search in flight (it holds a matcher of its own)."""
        self.start_plans.close()

    def need(self, slot: int) -> int | None:
        """Tokens the slot's plan still needs (its stop token included), or None (no plan yet)."""
        budget = self._slots.get(slot)
        return budget.plan.need if budget is not None and budget.plan is not None else None

    # ----- the step ------------------------------------------------------------------------------

    def _closing_candidates(self, budget: _Slot, state, entry, generated: int) -> tuple[int, ...] | None:
        """The candidates of `entry`'s only row when it is in its closing zone (written from them
        on the fill thread, `closing.write_closing_row`, no full fill), else None (filled as
        usual). Follows the plan up to the accepted tokens first. Called by `prepare` (far.py)."""
        plan = budget.plan
        if plan is None or not budget.started or not self.closing_rows or self.slack_tokens:
            return None
        if entry.tree.num_nodes != 1 or state.in_reasoning or state.grammar is None:
            return None
        left, headroom = budget.max_tokens - generated, budget.headroom
        if left > plan.need + headroom + self.window:
            return None  # far from the budget
        self._follow(state.grammar, state.history, budget)
        plan = budget.plan
        if plan is None or not 0 <= left - plan.need <= headroom:
            return None
        return tuple(self._allowed(plan, left, self.backend.stop_token_ids))

    def steer(
        self,
        entries: Sequence[Any],
        get_state: Callable[[int], Any],
        fail: Callable[[int, Any, str], None],
        words: np.ndarray,
        masked: set[int],
        stop_rows: list[int],
        stop_ids: frozenset[int],
    ) -> None:
        """After the fill, before the kernel: restrict the rows of budgeted slots (see above).

        `entries` are the step's entries `prepare` returned (slot, first_row, tree, plans, limit,
        stopped): far rows are not among them (far.py); `get_state(slot)` gives a slot's
        `SlotState` and `fail(slot, state, message)` finishes it with an error; `words` are the
        step's bitmask rows, `masked` the rows the kernel will mask and `stop_rows` those it will
        set to stop tokens (both updated here)."""
        if not entries:
            return
        started = perf_counter_ns()
        step = StepRows(fail, words, masked, stop_rows, stop_ids)
        slots, closed = self._slots, 0
        for entry in entries:
            budget = slots.get(entry.slot)  # None: no budget (or no request)
            if budget is None or budget.gave_up or entry.plans is None:
                continue
            if entry.fill is not None and entry.fill.closed:  # written from its candidates (prepare)
                closed += 1
                if not budget.steered:
                    budget.steered = True
                    self.metrics.inc("budget_steered_requests_total")
                continue
            state = get_state(entry.slot)
            if state is None or state.finish is not None or state.grammar is None:
                continue
            left = budget.max_tokens - self._generated(state)
            if state.in_reasoning:
                self._reasoning(budget, state, left)
                continue
            if entry.first_row in masked:
                self._row(step, entry, state, budget, left)
        if closed:
            self.metrics.inc("budget_forced_tokens_total", closed)
        self.hook_ns += perf_counter_ns() - started

    def _row(self, step: StepRows, entry, state, budget: _Slot, left: int) -> None:
        if not budget.started:
            if self._far_at_start(entry, state, budget, budget.max_tokens - left, entry.tree.num_nodes):
                return  # its start plan cached, far from the budget: a comparison a step from here
            if self._start_deferred(state, left, budget):
                return  # far from the budget: steered once the background search is done
            budget.started = True
            if not self._start(step, entry, state, budget, left):
                return
        plan = budget.plan
        if plan is None:
            return
        headroom = budget.headroom
        if left > plan.need + headroom + self.window and entry.tree.num_nodes <= left - plan.need - headroom:
            self._far(entry.slot, state, budget, budget.max_tokens - plan.need - headroom - self.window)
            return  # far from the budget: nothing to do
        self.watched.add(entry.slot)  # not far (a speculative step hands unwatched rows with drafts)
        self._follow(state.grammar, state.history, budget)
        plan = budget.plan
        if plan is None:
            return
        if entry.tree.num_nodes > 1:
            cut_drafts(step, entry)
        if plan.need > left and not budget.overrun:
            budget.overrun = True
            self.metrics.inc("budget_overruns_total")
        if left - plan.need <= headroom:
            if not self._close(step, entry.first_row, plan, left, budget, state.grammar):
                # The engine allows none of the plan's spellings here (llguidance keeps to canonical
                # tokens of forced bytes): plan again from this very state, whose tokens it accepted.
                completion = self._search(state.grammar, (plan.text[plan.position :],), plan.landmarks)
                if completion is not None:
                    budget.plan = Plan(completion.text, chain(completion, self.table), landmarks=completion.landmarks)
                    self._close(step, entry.first_row, budget.plan, left, budget, state.grammar)

    def _take_start(self, budget: _Slot, plan: Plan, seen: int) -> None:
        """`plan` (a start plan, or one searched at a first look) becomes `budget`'s; its closing
        zone starts at the headroom or past the plan's growth (see `Plan.growth`), whichever is
        wider: a token taken outside it opens at most one optional member, which then still fits."""
        budget.plan, budget.seen = plan, seen
        budget.headroom = self._headroom_of(plan)

    def _headroom_of(self, start_plan: Plan) -> int:
        """The slack at which a request with `start_plan` enters its closing zone: the steering's
        headroom, or one more than the plan's growth where that is wider."""
        return max(self.headroom, start_plan.growth + 1)

    def _start(self, step: StepRows, entry, state, budget: _Slot, left: int) -> bool:
        """The first look: a plan from the current state; fail the request if it cannot fit."""
        if budget.deferred and state.history:
            return self._start_late(step, entry, state, budget, left)
        plan = self._start_plan(state) if not state.history else None
        if plan is None and (state.history or not self._start_searched(state)):
            # replayed tokens (or no start search ran)
            completion = self._search(state.grammar, self.start_hints(state.spec, engine_of(state)))
            plan = Plan.of(completion, self.table) if completion is not None else None
        if plan is None:
            budget.gave_up = True
            self.metrics.inc("budget_search_failures_total")
            return False
        self._take_start(budget, plan, len(state.history))
        if plan.need > left:
            spent = budget.max_tokens - left
            refusal = BudgetTooSmallError(
                budget.max_tokens, plan.need, state.spec.kind, generated=spent, from_start=not state.history
            )
            return self._refuse(step, entry, state, refusal)
        return True

    def _refuse(self, step: StepRows, entry, state, refusal: BudgetTooSmallError) -> bool:
        """Fail the request at its first look, before any of its output is sampled."""
        self.metrics.inc("budget_refused_requests_total")
        step.fail(entry.slot, state, str(refusal))
        stop_entry(step, entry)
        return False

    def _start_late(self, step: StepRows, entry, state, budget: _Slot, left: int) -> bool:
        """The first look of a request that generated tokens while its start plan was searched in
        the background: the start plan, brought up to its tokens when it nears its budget
        (`_follow`); refused only if even the start needed more than its whole budget."""
        cached = self.start_plans.get((state.spec, engine_of(state)))
        if cached is None:  # the background search found nothing: a plan from here, as usual
            budget.deferred = False
            return self._start(step, entry, state, budget, left)
        plan = cached.fresh()
        self._take_start(budget, plan, 0)
        if plan.need > budget.max_tokens:
            return self._refuse(step, entry, state, BudgetTooSmallError(budget.max_tokens, plan.need, state.spec.kind))
        return True

    def _close(self, step: StepRows, row: int, plan: Plan, left: int, budget: _Slot, grammar: Grammar) -> bool:
        """Allow only the tokens that spell the plan's next bytes within what is left and the stop
        tokens (with `slack_tokens`, while slack is left, also the tokens that keep the plan:
        `slack.SlackTokens`); False (the row untouched) when the grammar allows none of them."""
        table, words = self.table, step.words
        allowed = self._allowed(plan, left, step.stop_ids)
        current = words[row]
        if self.slack_tokens and left > plan.need:
            if self._slack is None:
                self._slack = SlackTokens(table, self.backend.vocab_size)
            rest = plan.rest_tokens(table)
            restriction = token_row(allowed, words.shape[1]) | self._slack.row(
                grammar, current, plan.text[plan.position :], rest, self._completes
            )
            restricted = current & restriction
            if not restricted.any():
                return False
            words[row] = restricted
        else:  # a handful of tokens: keep their bits alone (no pass over the vocabulary)
            have = current.view(np.uint32)
            size = have.shape[0]
            keep = [token for token in allowed if (token >> 5) < size and (int(have[token >> 5]) >> (token & 31)) & 1]
            if not keep:
                return False
            current.fill(0)
            for token in keep:
                have[token >> 5] |= np.uint32(1 << (token & 31))
        self._count(budget)
        return True

    def _allowed(self, plan: Plan, left: int, stop_ids) -> list[int]:
        """A closing row's tokens: those spelling the plan's next bytes that leave a completion
        within `left` (the token, what its rest then needs, the stop token), then the stop tokens."""
        allowed = [token for token, after in plan.spellings(self.table) if after + 2 <= left]
        allowed.extend(stop_ids)
        return allowed

    def _count(self, budget: _Slot) -> None:
        if not budget.steered:
            budget.steered = True
            self.metrics.inc("budget_steered_requests_total")
        self.metrics.inc("budget_forced_tokens_total")

    def _reasoning(self, budget: _Slot, state, left: int) -> None:
        """Force the think-end marker while the budget still holds it and the shortest output."""
        if budget.plan is None and not budget.gave_up:
            plan = self._start_plan(state)
            if plan is None:
                budget.gave_up = True
                return
            self._take_start(budget, plan, 0)
        if budget.plan is None:
            return
        reasoning = state.reasoning
        marker = len(reasoning.marker.sequences[0])
        # One step late (this step's rows were planned already): hence the 1.
        if left - 1 - marker <= budget.plan.need + budget.headroom and (
            reasoning.budget is None or reasoning.budget > reasoning.spent
        ):
            state.reasoning = replace(reasoning, budget=reasoning.spent)
            self.metrics.inc("budget_reasoning_cut_total")

    # ----- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _generated(state) -> int:
        """The tokens `state`'s request generated (reasoning included)."""
        reasoning = state.reasoning
        return len(state.history) + (reasoning.spent if reasoning is not None else 0)
