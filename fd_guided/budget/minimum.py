"""A budget too small for any valid output: refused with the minimum named, as early as it is known.

The minimum is the need of the grammar's start plan (`search.shortest_completion` from the start
state, in tokens of the request's tokenizer, its stop token included): only the compiled grammar
knows it, and the search is bounded (``max_expansions`` fills: 0.1-160 ms on the 33 corpus schemas,
median ~10 ms). `StartPlanning` (the start-plan half of `steer.BudgetSteering`) offers it at
three points, earliest first:

  admission      `check(spec, max_tokens)`: the spec's start plan is known (an earlier request
                 of the same schema): a budget below it raises `BudgetTooSmallError` (HTTP 400)
                 at once; nothing is searched, nothing waits
  compile ready  `refusal_when_compiled(spec, ticket, max_tokens)`: once the compile is done the
                 start plan is searched on the background thread (`StartPlans`) and the future
                 says whether the budget holds it; a server awaiting the compile before its
                 response header (`fd-guided serve`) awaits this too and answers 400. The plan is
                 then cached, so the request's first step does not search again
  first step     `steer` refuses at the request's first masked step, before any token of its
                 output is sampled (its rows allow only stop tokens), for hosts that call neither
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..errors import InvalidGrammarError
from .growth import start_growth
from .instance import start_candidates, start_landmarks
from .plan import Plan
from .rows import engine_of
from .search import UNSPELLED, Completion, TokenTable, shortest_completion
from .start_plans import StartPlans


class BudgetTooSmallError(InvalidGrammarError):
    """``max_tokens`` cannot hold the shortest valid output of the request's constraint (a 400).

    `minimum` is that output's tokens, its stop token included (an upper bound: the shortest found);
    `max_tokens` the request's budget. Raise the budget, or send ``guided_fit_budget: false`` to be
    cut at it instead."""

    def __init__(self, max_tokens: int, minimum: int, kind: str, *, generated: int = 0, from_start: bool = True):
        self.max_tokens, self.minimum = max_tokens, minimum
        where = "" if from_start else " from here"
        spent = f", and {generated} were generated already" if generated else ""
        super().__init__(
            f"max_tokens={max_tokens} cannot hold a complete output: the shortest valid {kind} output{where} "
            f"needs {minimum} tokens (its stop token included){spent}",
            part="max_tokens",
        )


class StartPlanning:
    """The start plans of a `BudgetSteering`: searched once per spec and engine, and the refusals
    they allow (see the module docstring). Mixed into `steer.BudgetSteering`."""

    backend: Any
    _slots: dict[int, Any]
    _plan_asked: dict[int, Hashable]  # slot -> the start-plan key `plan_ready` searched for it
    max_expansions: int
    defer_start_above: int
    start_plans: StartPlans

    @property
    def table(self) -> TokenTable:
        raise NotImplementedError

    def _search(self, grammar, hints: Sequence[bytes] = (), marks: Sequence[bytes] = ()) -> Completion | None:
        raise NotImplementedError

    def start_hints(self, spec, engine: str) -> list[bytes]:
        """The start plan's candidates written from `spec` for `engine` (`instance.start_candidates`),
        in tokens of this tokenizer; [] for EBNF, Lark and structural tags."""
        return start_candidates(spec, engine, self.table.count)

    def start_landmarks(self, spec, engine: str) -> list[bytes]:
        """Near-shortest outputs of `spec` (`instance.start_landmarks`: one optional property or
        array item more each) that the start plan keeps to land on when a request leaves it."""
        return start_landmarks(spec, engine, self.table.count)

    def check(self, spec, max_tokens: int | None, fit_budget: bool = True) -> None:
        """At admission: raise `BudgetTooSmallError` when `spec`'s start plan is known (any engine)
        and needs more than `max_tokens`. Never searches, never waits."""
        if not fit_budget or max_tokens is None:
            return
        need = self.start_plans.need_of(spec)
        if need is not None and need > max_tokens:
            raise BudgetTooSmallError(max_tokens, need, spec.kind)

    def refusal_when_compiled(self, spec, ticket: Future, max_tokens: int | None, fit_budget: bool = True) -> Future:
        """A future of the `BudgetTooSmallError` to answer once `ticket` (the spec's compile) is
        done and its start plan known, or of None (it fits, no budget, no plan found, or the compile
        failed: that error is the ticket's). The search runs on the background thread."""
        result: Future = Future()
        if not fit_budget or max_tokens is None:
            result.set_result(None)
            return result

        def settle(plan: Plan | None) -> None:
            if plan is not None and plan.need > max_tokens:
                result.set_result(BudgetTooSmallError(max_tokens, plan.need, spec.kind))
            else:
                result.set_result(None)

        def compiled(done: Future) -> None:
            try:
                grammar = done.result()
                self.start_plans.when_known(
                    (spec, str(grammar.backend_name)), lambda: self._own_search(grammar), settle
                )
            except BaseException:  # noqa: BLE001 - a failed compile is the ticket's own error
                if not result.done():
                    result.set_result(None)

        _ = self.table  # built on this thread, not on a callback's
        ticket.add_done_callback(compiled)
        return result

    def _start_deferred(self, state, left: int, budget) -> bool:
        """Whether the first look waits for a background start-plan search (see DEFER_START_ABOVE)."""
        if not budget.deferred and (state.history or left <= self.defer_start_above):
            return False
        key = (state.spec, engine_of(state))
        if self.start_plans.known(key):
            return False
        if self.start_plans.searching(key):
            if left > self.defer_start_above:
                budget.deferred = True
                return True
            # Close enough that its plan may matter: wait for the (bounded) search, so the step at
            # which steering starts does not depend on the search's timing (ranks of a TP group agree).
            self.start_plans.wait(key)
            return False
        if budget.deferred:
            return False  # its search failed: the slot searches on its own matcher now
        try:
            compiled = state.ticket.result(timeout=0)
        except Exception:  # noqa: BLE001 - no compiled grammar to copy: search on the slot's matcher
            return False
        _ = self.table  # built here, not raced for by the background thread
        budget.deferred = self.start_plans.search_later(key, lambda: self._own_search(compiled))
        return budget.deferred

    def _own_search(self, compiled: Any) -> Plan | None:
        """The start plan of `compiled`, on a matcher and scratch row of its own (any thread)."""
        scratch = self.backend.allocate_bitmask(1)
        words = scratch.numpy() if hasattr(scratch, "numpy") else np.asarray(scratch)
        spec, engine = compiled.spec, str(compiled.backend_name)
        landmarks = self.start_landmarks(spec, engine)
        completion = shortest_completion(
            self.backend.new_grammar(compiled),
            self.table,
            self.backend.stop_token_ids,
            words[0],
            scratch,
            0,
            max_expansions=self.max_expansions,
            hints=self.start_hints(compiled.spec, str(compiled.backend_name)),
            landmarks=landmarks,
        )
        return self._start_plan_of(completion, landmarks, spec, engine)

    def _start_plan_of(
        self, completion: Completion | None, landmarks: Sequence[bytes], spec, engine: str
    ) -> Plan | None:
        """The start plan of a completion from the start state, its landmarks its text and
        `landmarks`, its growth what one choice of `spec` (or a landmark) adds at most."""
        if completion is None:
            return None
        plan = Plan.of(completion, self.table)
        plan.landmarks = (completion.text, *landmarks)
        start, counts = self.table.count(completion.text), [self.table.count(mark) for mark in landmarks]
        landed = max([count - start for count in counts if count < UNSPELLED], default=0)
        plan.growth = max(landed, start_growth(spec, engine, self.table.count))
        return plan

    def plan_ready(self, slot: int, state) -> bool:
        """False while `slot`'s first sample should wait for its grammar's start plan: a budget close
        enough that its first look needs the plan (<= `defer_start_above`, where `steer` would
        otherwise wait for the search on the step's thread), its grammar compiled, the plan not
        known yet. The search is started here, on the background thread; a host that holds the
        request's first sample until this is True (`GuidedDecodingManager.is_budget_ready`) has no
        step wait for anyone's search (a burst of cold schemas queued their searches behind one
        another on the step thread: steps of seconds for every request)."""
        budget = self._slots.get(slot)
        if budget is None or budget.started or budget.gave_up or budget.max_tokens > self.defer_start_above:
            return True
        if state.finish is not None or state.pending_tokens or state.history or state.reasoning is not None:
            return True  # no start-state first look (replayed tokens, reasoning)
        if not state.ticket.done():
            return True  # is_ready's turn
        try:
            compiled = state.ticket.result(timeout=0)
        except Exception:  # noqa: BLE001 - a failed compile: the request fails at its first step
            return True
        key = (state.spec, str(compiled.backend_name))
        if self.start_plans.known(key):
            return True
        if self._plan_asked.get(slot) == key:  # searched for this request: done (or it raised)
            return not self.start_plans.searching(key)
        self._plan_asked[slot] = key
        _ = self.table  # built on this thread, not raced for by the background one
        self.start_plans.search_later(key, lambda: self._own_search(compiled))
        return False

    def _start_searched(self, state) -> bool:
        """Whether the start plan of `state`'s spec and engine was searched to the end (found or
        not): a start search that found nothing is not run again on the slot's matcher (the same
        grammar from the same state: the same result, another `max_expansions` fills on the host's
        thread, 0.4 s on a 129k vocabulary)."""
        return self.start_plans.known((state.spec, engine_of(state)))

    def _start_plan(self, state) -> Plan | None:
        """The plan from the grammar's start state, searched once per spec and engine (its matcher's
        type: a plan is in that engine's tokens) and copied for every request after. A search of it
        in flight (started at the compile, `refusal_when_compiled`) is waited for, not repeated."""
        key: Hashable = (state.spec, engine_of(state))
        self.start_plans.wait(key)
        if self.start_plans.known(key):
            cached = self.start_plans.get(key)
            return cached.fresh() if cached is not None else None
        spec, engine = state.spec, engine_of(state)
        landmarks = self.start_landmarks(spec, engine)
        completion = self._search(state.grammar, self.start_hints(spec, engine), landmarks)
        plan = self._start_plan_of(completion, landmarks, spec, engine)
        self.start_plans.remember(key, plan)
        return plan.fresh() if plan is not None else None
