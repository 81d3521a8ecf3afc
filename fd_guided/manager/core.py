"""`GuidedDecodingManager`: slot lifecycle and the step hooks (the flow: `fd_guided.manager`)."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from typing import Any, Literal, Mapping, Sequence

from ..compile import CompileService
from ..config import GuidedConfig
from ..errors import CompileBudgetError, GuidedDecodingError, InvalidGrammarError, SlotStateError
from ..interface import GuidedBackend
from ..metrics import GuidedMetrics
from ..reasoning import MarkerLike, ReasoningMarker, ReasoningState, starts_in_reasoning
from ..spec import GrammarSpec, check_with_backend, parse_guided_request
from ..budget import BudgetSteering
from .slot import GuidedFinish, SlotState, StepTimings, host_words, token_row
from .step import StepHooks, _Entry

logger = logging.getLogger(__name__)


class GuidedDecodingManager(StepHooks):
    """Slot-indexed guided decoding for one engine (or one tensor-parallel rank).

    Args:
        backend: a built `GuidedBackend` (see `fd_guided.registry.create_backend`).
        max_num_seqs: the most requests a step can have.
        metrics: shared metrics sink; a private one is made if omitted.
        think_end_id / think_end: what ends a reasoning section: a token id, a token-id sequence,
            alternatives of those, or a `ReasoningMarker` (`think_end` wins if both are given);
            None for non-reasoning models (see `fd_guided.reasoning`).
        compile_service: share one between managers of the same backend (e.g. TP ranks in one
            process); by default the manager owns its own.
        kernel_impl: the `fd_guided.kernels` path used to mask logits ("auto" picks by device).
        max_draft_tokens: the most draft nodes one request brings to a speculative step; bitmask
            rows are allocated once for ``max_num_seqs * (max_draft_tokens + 1)`` logits rows.
    """

    def __init__(self, backend: GuidedBackend, max_num_seqs: int, *, metrics: GuidedMetrics | None = None,
                 think_end_id: int | None = None, think_end: MarkerLike = None, compile_service: CompileService | None = None,
                 kernel_impl: str = "auto", max_draft_tokens: int = 0, overlap_fill: bool = True):
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if max_draft_tokens < 0:
            raise ValueError("max_draft_tokens must be >= 0")
        self.backend = backend
        self.config: GuidedConfig = backend.config
        self.max_num_seqs = max_num_seqs
        self.max_draft_tokens = max_draft_tokens
        self.metrics = metrics or (compile_service.metrics if compile_service else GuidedMetrics())
        self.reasoning_marker = ReasoningMarker.of(think_end if think_end is not None else think_end_id)
        self.kernel_impl = kernel_impl
        # Fill masks on a background thread during the forward (the default: the forward runs on
        # a device), or inline in the begin hook (a model on the CPU shares the cores with the
        # fill; measured for the serving loop's lag in docs/benchmarks.md: no clear difference).
        self.overlap_fill = overlap_fill
        self._owns_compiler = compile_service is None
        self.compiler = compile_service or CompileService(backend, metrics=self.metrics)
        self.bitmask = backend.allocate_bitmask(max_num_seqs * (max_draft_tokens + 1))
        self._bitmask_words = host_words(self.bitmask)
        self._stop_ids = frozenset(backend.stop_token_ids)
        self._stop_row = token_row(backend.stop_token_ids, self._bitmask_words.shape[1])
        self._not_stop = ~self._stop_row
        self.timings = StepTimings()
        self._slots: dict[int, SlotState] = {}
        self._fill_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-fill")
        self._fill_future: Future | None = None
        self._rows: list[int | None] = []
        self._entries: list[_Entry] = []
        self._speculative = False
        self._phase: Literal["idle", "begun", "applied"] = "idle"
        self._applied_rows: set[int] = set()
        self._stop_rows: list[int] = []
        self._forced_rows: dict[int, int] = {}
        self._reasoning_rows: set[int] = set()
        self._deferred: list[_Entry] = []
        self._drafting = None  # the open `DraftingSession`, if any
        self.budget = BudgetSteering(backend, self.metrics)  # complete within max_tokens (fd_guided.budget)

    @property
    def think_end_id(self) -> int | None:
        """The single-token think-end id (None for no marker or a multi-token one)."""
        return self.reasoning_marker.single_token if self.reasoning_marker else None

    @think_end_id.setter
    def think_end_id(self, value: MarkerLike) -> None:
        self.reasoning_marker = ReasoningMarker.of(value)

    # ----- admission and slot lifecycle -------------------------------------------------------

    def validate(self, fields: Mapping[str, Any]) -> GrammarSpec | None:
        """Parse and check a request's guided fields against this manager's backend."""
        spec = parse_guided_request(fields, self.config, check_backend=False)
        if spec is not None:
            check_with_backend(type(self.backend), spec)
        return spec

    def prefetch(self, spec: GrammarSpec | None) -> None:
        """Start compiling `spec` now (when the request enters the waiting queue). Never blocks:
        `add_request` later finds the grammar cached or joins the compile in flight; a failure is
        remembered and fails the request when it is added."""
        if spec is not None:
            self.compiler.submit(spec)

    def add_request(self, slot: int, spec: GrammarSpec | None, *, request_id: Any = None, prompt_token_ids: Sequence[int] = (),
                    output_token_ids: Sequence[int] = (), enable_thinking: bool | None = None, prefill_done: bool = False,
                    reasoning_budget: int | None = None, jump_forward: bool | None = None, max_tokens: int | None = None,
                    fit_budget: bool = True) -> None:
        """Start guiding `slot` with `spec` (None: an unguided request, nothing to do).

        `output_token_ids` are tokens already generated for this request elsewhere (a prefill
        node in disaggregated serving, or before a preemption); they are replayed into the new
        matcher, reasoning included, before its first mask. `enable_thinking` follows the chat
        template flag: ``True`` on a reasoning model starts in a reasoning section unless the
        prompt already closed it; ``None`` and ``False`` constrain from the first token.
        `reasoning_budget`: reasoning tokens allowed before the think-end marker is forced (None:
        no limit). `jump_forward`: let `jump_forward` emit forced tokens for this request (None:
        ``GuidedConfig.jump_forward``). `max_tokens`: the most tokens the request may generate
        (reasoning included; None: no budget); with `fit_budget` (the default) its output is steered
        to end complete and valid within them (`fd_guided.budget`).

        Raises:
            SlotStateError: `slot` is out of range or still holds a request (release it first).
        """
        self._check_slot(slot)
        if slot in self._slots:
            raise SlotStateError(f"slot {slot} still holds guided request {self._slots[slot].request_id!r}: release it first")
        if reasoning_budget is not None and reasoning_budget < 0:
            raise ValueError(f"reasoning_budget must be >= 0, got {reasoning_budget}")
        if spec is None:
            return
        self.metrics.inc("requests_total")
        thinking = starts_in_reasoning(self.reasoning_marker, prompt_token_ids, enable_thinking)
        self._slots[slot] = SlotState(
            request_id=request_id, spec=spec, ticket=self.compiler.submit(spec), pending_tokens=list(output_token_ids),
            reasoning=ReasoningState(self.reasoning_marker, budget=reasoning_budget) if thinking else None,
            prefill_done=prefill_done or bool(output_token_ids),
            jump_forward=self.config.jump_forward if jump_forward is None else bool(jump_forward),
        )
        self.budget.track(slot, max_tokens, fit_budget)

    def add_failed_request(self, slot: int, message: str, *, request_id: Any = None) -> None:
        """Hold `slot` for a request whose constraint failed before it reached this manager (e.g.
        a host's own parsing refused it): its rows allow only stop tokens, so it ends at once and
        is never sampled unconstrained; the next `accept` reports it with reason ``error``."""
        self._check_slot(slot)
        if slot in self._slots:
            raise SlotStateError(f"slot {slot} still holds guided request {self._slots[slot].request_id!r}: release it first")
        failed: Future = Future()
        failed.set_exception(InvalidGrammarError(message))
        state = SlotState(request_id=request_id, spec=GrammarSpec("regex", "(failed)"), ticket=failed, pending_tokens=[],
                          reasoning=None, prefill_done=True)
        self._fail(slot, state, message)
        self._slots[slot] = state

    def mark_prefill_done(self, slots: Sequence[int]) -> None:
        """The given slots sample their first token in the coming step (their final prefill chunk)."""
        for slot in slots:
            state = self._slots.get(slot)
            if state is not None:
                state.prefill_done = True

    def release(self, slot: int) -> None:
        """Forget `slot` (finished, aborted or preempted). Its compiled grammar stays cached.

        Raises SlotStateError between `begin_step` and `apply` for a slot with a row in the step
        (its row is being filled), and while a drafting session holds it; after `apply` a released
        slot's row is simply not advanced.
        """
        if slot in self._slots and self._phase == "begun" and any(e.slot == slot for e in self._entries):
            raise SlotStateError(f"slot {slot} has a row in the step being prepared: release it after apply()")
        if slot in self._slots and self._drafting is not None and slot in self._drafting.slots:
            raise SlotStateError(f"slot {slot} is being drafted: close the drafting session first")
        self._slots.pop(slot, None)
        self.budget.forget(slot)

    def is_guided(self, slot: int) -> bool:
        return slot in self._slots

    def is_ready(self, slot: int) -> bool:
        """True when sampling `slot`'s next token waits for nothing: its grammar is compiled (or
        its compile failed, and it will finish with an error), or it is not guided. A host's
        scheduler holds a guided request's first sampling step until then; `apply` never waits."""
        state = self._slots.get(slot)
        return state is None or state.grammar is not None or state.finish is not None or state.ticket.done()

    def wait_ready(self, slots: Sequence[int], timeout_s: float | None = None) -> bool:
        """Block until every slot in `slots` `is_ready` (for simple hosts); False on timeout."""
        tickets = [self._slots[s].ticket for s in slots if s in self._slots and not self.is_ready(s)]
        if not tickets:
            return True
        _, pending = wait_futures(tickets, timeout=timeout_s)
        return not pending

    def finish_of(self, slot: int) -> GuidedFinish | None:
        state = self._slots.get(slot)
        return state.finish if state else None

    def in_reasoning(self, slot: int) -> bool:
        """True while `slot` is inside its reasoning section (unconstrained, or forcing its end)."""
        state = self._slots.get(slot)
        return state is not None and state.in_reasoning

    # ----- helpers for drafters and jump-forward (implemented in their modules) -----------------

    def valid_draft_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        """How many leading `tokens` slot `slot` could accept from its current state (reasoning and a
        forced think-end included), without advancing anything: a drafter cuts its proposal there.
        Every token for an unguided slot; 0 for a finished or not yet compiled one."""
        from .drafting import valid_prefix

        return valid_prefix(self, slot, [int(t) for t in tokens])

    def begin_drafting(self, slots: Sequence[int | None]):
        """A `DraftingSession`: masks for a draft model's own steps (see `fd_guided.manager.drafting`)."""
        from .drafting import DraftingSession

        return DraftingSession(self, slots)

    def jump_forward(self, slot: int, *, max_new_tokens: int | None = None):
        """Tokens the grammar forces next for `slot`, re-encoded at the boundary, or None (see
        `fd_guided.manager.jump_forward.JumpForward` for what the host must do with them)."""
        from .jump_forward import jump_forward

        return jump_forward(self, slot, max_new_tokens)

    # ----- internals ----------------------------------------------------------------------------

    def _materialise(self, slot: int, state: SlotState) -> None:
        """Create the slot's matcher from its (done) ticket and replay tokens made elsewhere."""
        if state.grammar is not None or state.finish is not None:
            return
        try:
            compiled = state.ticket.result(timeout=0)
        except CompileBudgetError as error:
            self.metrics.inc("compile_budget_failures_total")
            self._fail(slot, state, f"grammar failed to compile: {error}")
            return
        except (GuidedDecodingError, FutureTimeout) as error:
            self._fail(slot, state, f"grammar failed to compile: {error}")
            return
        state.grammar = self.backend.new_grammar(compiled)
        self.metrics.inc_labelled("requests_by_backend_total", "backend", compiled.backend_name)
        logger.debug("guided request %s (slot %d): %s on backend %s", state.request_id, slot, state.spec.describe(), compiled.backend_name)
        pending, state.pending_tokens = state.pending_tokens, []
        self._advance(slot, state, pending)

    def _advance(self, slot: int, state: SlotState, tokens: Sequence[int]) -> None:
        """Push `tokens` (in order) through the reasoning section and into the grammar."""
        index = 0
        while index < len(tokens) and state.finish is None:
            if state.in_reasoning:
                before = state.reasoning
                if before.forced_token() is not None:
                    self.metrics.inc("reasoning_forced_tokens_total")
                state.reasoning = before.step(tokens[index])
                index += 1
                continue
            if state.grammar.is_terminated():
                return
            rest = tokens[index:]
            accepted = state.grammar.accept_tokens(rest)
            state.history.extend(rest[:accepted])
            if state.grammar.is_terminated():
                state.finish = GuidedFinish(slot, "stop")
            elif accepted < len(rest):
                self.metrics.inc("rejected_tokens_total")
                state.rejected_token = rest[accepted]
                self._fail(slot, state, f"token {rest[accepted]} was rejected by the {state.spec.kind} grammar after "
                           f"{state.accepted} accepted tokens")
            return

    def _fail(self, slot: int, state: SlotState, message: str) -> None:
        logger.warning("guided request %s (slot %d) failed: %s", state.request_id, slot, message)
        state.finish = GuidedFinish(slot, "error", message)

    def _collect_finishes(self) -> list[GuidedFinish]:
        finished = []
        for state in self._slots.values():
            if state.finish is not None and not state.finish_reported:
                state.finish_reported = True
                finished.append(state.finish)
                self.metrics.inc("requests_finished_total")
        return finished

    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.max_num_seqs:
            raise SlotStateError(f"slot must be an int in [0, {self.max_num_seqs}), got {slot!r}")

    def close(self) -> None:
        self._join_fill()
        self._fill_pool.shutdown(wait=True)
        if self._owns_compiler:
            self.compiler.close()
