"""Budget steering: a guided request with a token budget ends complete and valid within it.

For each budgeted slot the manager keeps a *plan*: a real completion of its grammar from the
current state (`search.shortest_completion`: the shortest found, in tokens of the request's
tokenizer, the stop token included) and how much of it the output has already written. `need` is
what the plan still costs: the fewest tokens that spell the rest of its text, plus the stop token.
With `left` the tokens the request may still generate (its ``max_tokens`` minus every token it
generated, reasoning included), once per step, after the fill (`BudgetSteering.steer`):

  far      ``left > need + headroom + window``: nothing is done (no search, no look at tokens)
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

Guarantee: in the closing zone every allowed token keeps a verified completion within the
budget, so a request that enters it with ``need <= left`` ends ``stop`` with a valid output. A
token taken outside the closing zone that raises the shortest completion by more than the slack
left then (an array item of a long required object, opened with more than ``headroom`` slack) can
still overrun; such requests are counted (``budget_overruns_total``) and end as the host's budget
says (``length``). See docs/budget.md.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..interface import Grammar
from .search import UNSPELLED, Completion, TokenTable, fewest_tokens, shortest_completion, token_table
from .slack import SlackTokens

logger = logging.getLogger(__name__)

HEADROOM = 8  # slack at which the closing zone starts (a token taken before it may grow the completion by this much)
WINDOW = 16  # tokens before the closing zone from which the plan is followed step by step
START_PLANS = 256  # start-state plans remembered per grammar spec
# A request with more tokens left than this at its first look does not wait for the first
# search of its grammar's start plan (10-160 ms on a cold schema, on the host's thread): the
# search runs in the background on a matcher of its own and the request is steered from the
# step it is done. Tighter budgets search at once (they may be in the closing zone already).
DEFER_START_ABOVE = 128
_INVALID = "invalid"  # fd_guided.manager.plan.INVALID (not imported: the manager imports this package)


@dataclass
class _Plan:
    """A completion and the fewest tokens spelling each of its suffixes (`fewest[k]`: text[k:])."""

    text: bytes
    fewest: list[tuple[int, int]]
    position: int = 0
    # position -> [(token spelling the next bytes, tokens needed after it)]; shared by the copies
    # of a cached start plan (read-only but for this memo)
    spellings_at: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, completion: Completion, table: TokenTable) -> _Plan:
        # The fewest-token spellings, when the completion's (verified) tokens are one of them;
        # else only the completion's own tokens.
        if table.tokenize(completion.text) == list(completion.tokens):
            return cls(completion.text, fewest_tokens(table, completion.text))
        return cls(completion.text, _chain(completion, table))

    @property
    def need(self) -> int:
        return self.fewest[self.position][0] + 1

    def fresh(self) -> _Plan:
        """This plan from its start, sharing its tables (a cached start plan for a new request)."""
        return _Plan(self.text, self.fewest, 0, self.spellings_at)

    def spellings(self, table: TokenTable) -> list[tuple[int, int]]:
        """The tokens that spell the plan's next bytes, each with the tokens its rest then needs."""
        found = self.spellings_at.get(self.position)
        if found is None:
            found, start = [], self.position
            for end in range(start + 1, min(len(self.text), start + table.max_len) + 1):
                token = table.by_bytes.get(self.text[start:end])
                if token is not None and self.fewest[end][0] < UNSPELLED:
                    found.append((token, self.fewest[end][0]))
            self.spellings_at[self.position] = found
        return found

    def rest_tokens(self, table: TokenTable) -> list[int]:
        tokens, position = [], self.position
        while position < len(self.text):
            token = self.fewest[position][1]
            tokens.append(token)
            position += len(table.bytes_of[token])
        return tokens


def _chain(completion: Completion, table: TokenTable) -> list[tuple[int, int]]:
    """`fewest` along the completion's own tokens (when the text has no shorter spelling)."""
    fewest = [(UNSPELLED, -1)] * (len(completion.text) + 1)
    fewest[-1] = (0, -1)
    position = len(completion.text)
    for index in range(len(completion.tokens) - 1, -1, -1):
        token = completion.tokens[index]
        position -= len(table.bytes_of[token])
        fewest[position] = (len(completion.tokens) - index, token)
    return fewest


@dataclass
class _Slot:
    max_tokens: int
    plan: _Plan | None = None
    seen: int = 0  # tokens of the grammar's history the plan accounts for
    stale: bool = False
    started: bool = False
    steered: bool = False
    overrun: bool = False
    gave_up: bool = False
    deferred: bool = False  # its first look waits for a background start-plan search


@dataclass
class BudgetSteering:
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
    _slots: dict[int, _Slot] = field(default_factory=dict)
    _start_plans: OrderedDict[Any, _Plan | None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self._table: TokenTable | None = None
        self._slack: SlackTokens | None = None
        self._scratch: tuple[Any, np.ndarray] | None = None
        self._searches: dict[Any, Future] = {}  # start plans being searched in the background
        self._search_pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # the start-plan cache, shared with the background search

    # ----- lifecycle -----------------------------------------------------------------------------

    def track(self, slot: int, max_tokens: int | None, enabled: bool = True) -> None:
        """Steer `slot` within `max_tokens` generated tokens (None or not `enabled`: not at all)."""
        self._slots.pop(slot, None)
        if max_tokens is not None and enabled:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
            self._slots[slot] = _Slot(int(max_tokens))

    def forget(self, slot: int) -> None:
        self._slots.pop(slot, None)

    def close(self) -> None:
        """Wait for a background start-plan search in flight (it holds a matcher of its own)."""
        if self._search_pool is not None:
            self._search_pool.shutdown(wait=True)

    def need(self, slot: int) -> int | None:
        """Tokens the slot's plan still needs (its stop token included), or None (no plan yet)."""
        budget = self._slots.get(slot)
        return budget.plan.need if budget is not None and budget.plan is not None else None

    # ----- the step ------------------------------------------------------------------------------

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

        `entries` are the step's entries (slot, first_row, tree, plans, limit, stopped);
        `get_state(slot)` gives a slot's `SlotState` and `fail(slot, state, message)` finishes it
        with an error; `words` are the step's bitmask rows, `masked` the rows the kernel will mask
        and `stop_rows` those it will set to stop tokens (both updated here)."""
        if not self._slots:
            return
        step = _Step(fail, words, masked, stop_rows, stop_ids)
        for entry in entries:
            budget = self._slots.get(entry.slot) if entry.slot is not None else None
            if budget is None or budget.gave_up or entry.plans is None:
                continue
            state = get_state(entry.slot)
            if state is None or state.finish is not None or state.grammar is None:
                continue
            reasoning = state.reasoning
            left = budget.max_tokens - len(state.history) - (reasoning.spent if reasoning is not None else 0)
            if state.in_reasoning:
                self._reasoning(budget, state, left)
                continue
            if entry.first_row in masked:
                self._row(step, entry, state, budget, left)

    def _row(self, step: _Step, entry, state, budget: _Slot, left: int) -> None:
        if not budget.started:
            if self._start_deferred(state, left, budget):
                return  # far from the budget: steered once the background search is done
            budget.started = True
            if not self._start(step, entry, state, budget, left):
                return
        plan = budget.plan
        if plan is None:
            return
        if left > plan.need + self.headroom + self.window and entry.tree.num_nodes <= left - plan.need - self.headroom:
            return  # far from the budget: nothing to do
        self._follow(state.grammar, state.history, budget)
        plan = budget.plan
        if plan is None:
            return
        if entry.tree.num_nodes > 1:
            _cut_drafts(step, entry)
        if plan.need > left and not budget.overrun:
            budget.overrun = True
            self.metrics.inc("budget_overruns_total")
        if left - plan.need <= self.headroom:
            if not self._close(step, entry.first_row, plan, left, budget, state.grammar):
                # The engine allows none of the plan's spellings here (llguidance keeps to canonical
                # tokens of forced bytes): plan again from this very state, whose tokens it accepted.
                completion = self._search(state.grammar)
                if completion is not None:
                    budget.plan = _Plan(completion.text, _chain(completion, self.table))
                    self._close(step, entry.first_row, budget.plan, left, budget, state.grammar)

    def _start_deferred(self, state, left: int, budget: _Slot) -> bool:
        """Whether the first look waits for a background start-plan search (see DEFER_START_ABOVE)."""
        if not budget.deferred and (state.history or left <= self.defer_start_above):
            return False
        key = (state.spec, _engine_of(state))
        with self._lock:
            if key in self._start_plans:
                return False
            running = self._searches.get(key)
            if running is not None:
                budget.deferred = True
                return True
            if budget.deferred:
                return False  # its search failed: the slot searches on its own matcher now
            try:
                compiled = state.ticket.result(timeout=0)
            except Exception:  # noqa: BLE001 - no compiled grammar to copy: search on the slot's matcher
                return False
            if self._search_pool is None:
                self._search_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-budget")
            _ = self.table  # built here, not raced for by the background thread
            self._searches[key] = self._search_pool.submit(self._background_start_plan, key, compiled)
            budget.deferred = True
            return True

    def _background_start_plan(self, key: Any, compiled: Any) -> None:
        """Search the start plan of `compiled` on a matcher and scratch row of its own; cache it."""
        try:
            scratch = self.backend.allocate_bitmask(1)
            words = scratch.numpy() if hasattr(scratch, "numpy") else np.asarray(scratch)
            completion = shortest_completion(
                self.backend.new_grammar(compiled),
                self.table,
                self.backend.stop_token_ids,
                words[0],
                scratch,
                0,
                max_expansions=self.max_expansions,
            )
            plan = _Plan.of(completion, self.table) if completion is not None else None
        except Exception:  # noqa: BLE001 - the slot searches on its own matcher instead
            logger.exception("background start-plan search failed")
            with self._lock:
                self._searches.pop(key, None)
            return
        with self._lock:
            self._remember(key, plan)
            self._searches.pop(key, None)

    def _remember(self, key: Any, plan: _Plan | None) -> None:
        self._start_plans[key] = plan
        if len(self._start_plans) > START_PLANS:
            self._start_plans.popitem(last=False)

    def _start(self, step: _Step, entry, state, budget: _Slot, left: int) -> bool:
        """The first look: a plan from the current state; fail the request if it cannot fit."""
        if budget.deferred and state.history:
            return self._start_late(step, entry, state, budget, left)
        plan = self._start_plan(state) if not state.history else None
        if plan is None:
            completion = self._search(state.grammar)  # replayed tokens (or the start search failed)
            plan = _Plan.of(completion, self.table) if completion is not None else None
        if plan is None:
            budget.gave_up = True
            self.metrics.inc("budget_search_failures_total")
            return False
        budget.plan, budget.seen = plan, len(state.history)
        if plan.need > left:
            self.metrics.inc("budget_refused_requests_total")
            step.fail(
                entry.slot,
                state,
                f"max_tokens={budget.max_tokens} cannot hold a complete output: the shortest "
                f"valid {state.spec.kind} output from here needs {plan.need} tokens (its stop token included)"
                + (f", and {budget.max_tokens - left} were generated already" if left < budget.max_tokens else ""),
            )
            _stop_entry(step, entry)
            return False
        return True

    def _start_late(self, step: _Step, entry, state, budget: _Slot, left: int) -> bool:
        """The first look of a request that generated tokens while its start plan was searched in
        the background: the start plan, brought up to its tokens when it nears its budget
        (`_follow`); refused only if even the start needed more than its whole budget."""
        with self._lock:
            cached = self._start_plans.get((state.spec, _engine_of(state)))
        if cached is None:  # the background search found nothing: a plan from here, as usual
            budget.deferred = False
            return self._start(step, entry, state, budget, left)
        plan = cached.fresh()
        budget.plan, budget.seen = plan, 0
        if plan.need > budget.max_tokens:
            self.metrics.inc("budget_refused_requests_total")
            step.fail(
                entry.slot,
                state,
                f"max_tokens={budget.max_tokens} cannot hold a complete output: the shortest "
                f"valid {state.spec.kind} output needs {plan.need} tokens (its stop token included)",
            )
            _stop_entry(step, entry)
            return False
        return True

    def _start_plan(self, state) -> _Plan | None:
        """The plan from the grammar's start state, searched once per spec and engine (its matcher's
        type: a plan is in that engine's tokens) and copied for every request after."""
        key = (state.spec, _engine_of(state))
        with self._lock:
            if key in self._start_plans:
                self._start_plans.move_to_end(key)
                cached = self._start_plans[key]
                return cached.fresh() if cached is not None else None
        completion = self._search(state.grammar)
        plan = _Plan.of(completion, self.table) if completion is not None else None
        with self._lock:
            self._remember(key, plan)
        return plan.fresh() if plan is not None else None

    def _follow(self, grammar: Grammar, history: Sequence[int], budget: _Slot) -> None:
        """Bring the plan up to the tokens the grammar accepted since the last look."""
        plan, table = budget.plan, self.table
        if plan is None:
            return
        if len(history) == budget.seen and not budget.stale:
            return
        if len(history) < budget.seen:  # jump-forward re-encoded a boundary
            budget.stale = True
        else:
            new = b"".join(table.bytes_of[t] or b"" for t in history[budget.seen :])
            if new and not budget.stale and plan.text.startswith(new, plan.position):
                plan.position += len(new)
            elif new:
                budget.stale = True
        budget.seen = len(history)
        if not budget.stale:
            return
        budget.stale = False
        rest = plan.rest_tokens(table)
        if self._completes(grammar, rest):
            budget.plan = _Plan.of(Completion(plan.text[plan.position :], tuple(rest)), table)
            return
        completion = self._search(grammar)
        if completion is None:
            budget.gave_up = True
            self.metrics.inc("budget_search_failures_total")
            budget.plan = None
            return
        budget.plan = _Plan.of(completion, table)

    def _close(self, step: _Step, row: int, plan: _Plan, left: int, budget: _Slot, grammar: Grammar) -> bool:
        """Allow only the tokens that spell the plan's next bytes within what is left and the stop
        tokens (with `slack_tokens`, while slack is left, also the tokens that keep the plan:
        `slack.SlackTokens`); False (the row untouched) when the grammar allows none of them."""
        table, words = self.table, step.words
        allowed = list(step.stop_ids)
        allowed.extend(token for token, after in plan.spellings(table) if 1 + after + 1 <= left)
        current = words[row]
        if self.slack_tokens and left > plan.need:
            if self._slack is None:
                self._slack = SlackTokens(table, self.backend.vocab_size)
            rest = plan.rest_tokens(table)
            restriction = _row_of(allowed, words.shape[1]) | self._slack.row(
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
        if not budget.steered:
            budget.steered = True
            self.metrics.inc("budget_steered_requests_total")
        self.metrics.inc("budget_forced_tokens_total")
        return True

    def _reasoning(self, budget: _Slot, state, left: int) -> None:
        """Force the think-end marker while the budget still holds it and the shortest output."""
        if budget.plan is None and not budget.gave_up:
            budget.plan, budget.seen = self._start_plan(state), 0
            if budget.plan is None:
                budget.gave_up = True
                return
        if budget.plan is None:
            return
        reasoning = state.reasoning
        marker = len(reasoning.marker.sequences[0])
        # One step late (this step's rows were planned already): hence the 1.
        if left - 1 - marker <= budget.plan.need + self.headroom and (
            reasoning.budget is None or reasoning.budget > reasoning.spent
        ):
            state.reasoning = replace(reasoning, budget=reasoning.spent)
            self.metrics.inc("budget_reasoning_cut_total")

    # ----- helpers -------------------------------------------------------------------------------

    @property
    def table(self) -> TokenTable:
        if self._table is None:
            self._table = token_table(self.backend.tokenizer)
        return self._table

    def _scratch_row(self) -> tuple[Any, np.ndarray]:
        """A one-row bitmask of our own (the search's fills must not touch the step's rows)."""
        if self._scratch is None:
            scratch = self.backend.allocate_bitmask(1)
            self._scratch = (scratch, scratch.numpy() if hasattr(scratch, "numpy") else np.asarray(scratch))
        return self._scratch[0], self._scratch[1][0]

    def _search(self, grammar: Grammar) -> Completion | None:
        bitmask, words = self._scratch_row()
        return shortest_completion(
            grammar, self.table, self.backend.stop_token_ids, words, bitmask, 0, max_expansions=self.max_expansions
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


def _row_of(token_ids: Sequence[int], words: int) -> np.ndarray:
    row = np.zeros(words, dtype=np.uint32)
    for token in token_ids:
        if 0 <= token < words * 32:
            row[token >> 5] |= np.uint32(1 << (token & 31))
    return row.view(np.int32)


def _engine_of(state) -> str:
    """The engine that compiled the slot's grammar (its ticket is done once it has a matcher)."""
    try:
        return str(state.ticket.result(timeout=0).backend_name)
    except Exception:  # noqa: BLE001 - no compiled grammar to name: the matcher's type will do
        return type(state.grammar).__name__


@dataclass
class _Step:
    """What `steer` touches of the step being applied."""

    fail: Callable[[int, Any, str], None]
    words: np.ndarray
    masked: set[int]
    stop_rows: list[int]
    stop_ids: frozenset[int]


def _cut_drafts(step: _Step, entry) -> None:
    """Near the budget a request's drafts are not taken: their rows allow only stop tokens."""
    for node in range(1, entry.tree.num_nodes):
        row = entry.first_row + node
        if row in step.masked:
            step.masked.discard(row)
            step.stop_rows.append(row)
        entry.plans[node] = replace(entry.plans[node], kind=_INVALID, forced=None, path=())
    entry.limit = 0


def _stop_entry(step: _Step, entry) -> None:
    rows = range(entry.first_row, entry.first_row + entry.tree.num_nodes)
    step.masked.difference_update(rows)
    step.stop_rows.extend(rows)
    entry.stopped, entry.plans = True, None
