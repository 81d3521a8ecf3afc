"""`SlotTable`: the guided requests of one manager by slot, from `add` to `pop`, and their matchers.

It owns every request's `SlotState` (its compile ticket, its matcher once the grammar is ready,
its reasoning section, the tokens it accepted, how it finished) and the three things that change
one: `materialise` (the ticket is done: create the matcher, replay tokens made elsewhere),
`advance` (push sampled tokens through reasoning and into the grammar) and `fail`. The step
(`fd_guided.manager.step`), the drafting session and jump-forward read and change requests only
through these methods; the manager (`fd_guided.manager.core`) is the host-facing facade.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures

from ..errors import CompileBudgetError, GuidedDecodingError, SlotStateError
from ..interface import GuidedBackend
from ..metrics import GuidedMetrics
from .slot import NO_MARK, GuidedFinish, SlotState

logger = logging.getLogger(__name__)


class SlotTable:
    """Slot -> `SlotState` for up to `max_num_seqs` slots, with the transitions of a request."""

    def __init__(self, backend: GuidedBackend, metrics: GuidedMetrics, max_num_seqs: int):
        self.backend = backend
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self._states: dict[int, SlotState] = {}
        # The budgeted slots the budget steering looks at in a step (`BudgetSteering.watched`, this
        # set): a request far from its budget leaves it and comes back where its history reaches
        # its `SlotState.budget_mark` (`advance`, `reached_mark`; fd_guided.budget.far).
        self.budget_watched: set[int] = set()

    # ----- membership ---------------------------------------------------------------------------

    def get(self, slot: int | None) -> SlotState | None:
        return self._states.get(slot) if slot is not None else None

    def __getitem__(self, slot: int) -> SlotState:
        return self._states[slot]

    def __contains__(self, slot: object) -> bool:
        return slot in self._states

    def __iter__(self) -> Iterator[int]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def check(self, slot: int) -> None:
        """SlotStateError unless `slot` is an int in range."""
        if not isinstance(slot, int) or not 0 <= slot < self.max_num_seqs:
            raise SlotStateError(f"slot must be an int in [0, {self.max_num_seqs}), got {slot!r}")

    def put(self, slot: int, state: SlotState) -> None:
        """Hold `state` in `slot`; SlotStateError if the slot is out of range or still held."""
        self.check(slot)
        self.check_free(slot)
        self._states[slot] = state

    def check_free(self, slot: int) -> None:
        held = self._states.get(slot)
        if held is not None:
            raise SlotStateError(f"slot {slot} still holds guided request {held.request_id!r}: release it first")

    def pop(self, slot: int) -> SlotState | None:
        return self._states.pop(slot, None)

    # ----- readiness ----------------------------------------------------------------------------

    def is_ready(self, slot: int) -> bool:
        """Sampling `slot` waits for nothing: its grammar is compiled (or failed), or it is unguided."""
        state = self._states.get(slot)
        return state is None or state.grammar is not None or state.finish is not None or state.ticket.done()

    def wait_ready(self, slots: Sequence[int], timeout_s: float | None = None) -> bool:
        """Block until every slot in `slots` `is_ready`; False on timeout."""
        tickets: list[Future] = [self._states[s].ticket for s in slots if s in self._states and not self.is_ready(s)]
        if not tickets:
            return True
        _, pending = wait_futures(tickets, timeout=timeout_s)
        return not pending

    # ----- transitions --------------------------------------------------------------------------

    def materialise(self, slot: int, state: SlotState) -> None:
        """Create the slot's matcher from its (done) ticket and replay tokens made elsewhere."""
        if state.grammar is not None or state.finish is not None:
            return
        try:
            compiled = state.ticket.result(timeout=0)
        except CompileBudgetError as error:
            self.metrics.inc("compile_budget_failures_total")
            self.fail(slot, state, f"grammar failed to compile: {error}")
            return
        except (GuidedDecodingError, FutureTimeout) as error:
            self.fail(slot, state, f"grammar failed to compile: {error}")
            return
        state.grammar, state.compiled = self.backend.new_grammar(compiled), compiled
        self.metrics.inc_labelled("requests_by_backend_total", "backend", compiled.backend_name)
        logger.debug(
            "guided request %s (slot %d): %s on backend %s",
            state.request_id,
            slot,
            state.spec.describe(),
            compiled.backend_name,
        )
        pending, state.pending_tokens = state.pending_tokens, []
        self.advance(slot, state, pending)

    def advance(self, slot: int, state: SlotState, tokens: Sequence[int]) -> None:
        """Push `tokens` (in order) through the reasoning section and into the grammar."""
        index = 0
        while index < len(tokens) and state.finish is None:
            if state.reasoning is not None and state.reasoning.thinking:
                if state.reasoning.forced_token() is not None:
                    self.metrics.inc("reasoning_forced_tokens_total")
                state.reasoning = state.reasoning.step(tokens[index])
                index += 1
                continue
            grammar = state.grammar
            if grammar is None or grammar.is_terminated():
                return
            rest = list(tokens[index:])
            accepted = grammar.accept_tokens(rest)
            state.history.extend(rest[:accepted])
            if len(state.history) >= state.budget_mark:  # `reached_mark`, inlined (a call per row)
                self.budget_watched.add(slot)
                state.budget_mark = NO_MARK
            if grammar.is_terminated():
                state.finish = GuidedFinish(slot, "stop")
            elif accepted < len(rest):
                self.metrics.inc("rejected_tokens_total")
                state.rejected_token = rest[accepted]
                self.fail(
                    slot,
                    state,
                    f"token {rest[accepted]} was rejected by the {state.spec.kind} grammar after "
                    f"{state.accepted} accepted tokens",
                )
            return

    def reached_mark(self, slot: int, state: SlotState) -> None:
        """After tokens were added to `state.history` outside `advance` (jump-forward): the budget
        steering looks at `slot` again if its history reached its `budget_mark`."""
        if len(state.history) >= state.budget_mark:
            self.budget_watched.add(slot)
            state.budget_mark = NO_MARK

    def fail(self, slot: int, state: SlotState, message: str) -> None:
        """Finish `slot` with reason ``error``: its later rows allow only stop tokens."""
        logger.warning("guided request %s (slot %d) failed: %s", state.request_id, slot, message)
        state.finish = GuidedFinish(slot, "error", message)

    def collect_finishes(self) -> list[GuidedFinish]:
        """Finishes not reported yet, each reported once."""
        finished = []
        for state in self._states.values():
            if state.finish is not None and not state.finish_reported:
                state.finish_reported = True
                finished.append(state.finish)
                self.metrics.inc("requests_finished_total")
        return finished

    def take_host_forced(
        self, slot: int, state: SlotState, token: int, stop_ids: frozenset[int], named: Mapping[int, str]
    ) -> None:
        """`token` was outside its row's applied mask under ``masked_out="host"`` (see
        `BatchStep.accept`): a stop token or one `named` is the host's own (counted, the stop ends
        the slot quietly); any other fails the request, never taken silently."""
        kind = "stop" if token in stop_ids else named.get(token)
        if kind is None:  # not a token the host is known to force: never taken silently
            self.metrics.inc("out_of_mask_tokens_total")
            self.fail(slot, state, f"guided decoding: token {token} outside the grammar at position {state.accepted}")
            return
        self.metrics.inc_labelled("host_forced_tokens_total", "kind", kind)
        if kind == "stop":
            state.finish = GuidedFinish(slot, "forced")
            state.finish_reported = True
