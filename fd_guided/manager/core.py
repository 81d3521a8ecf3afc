"""`GuidedDecodingManager`: the host-facing facade over a `SlotTable` and a `BatchStep`.

The manager composes two parts that own their state: the slot table (`fd_guided.manager.slots`:
each request's compile ticket, matcher, reasoning and finish) and the step (`fd_guided.manager.step`:
the bitmask, the rows of the current step, the background fill). It adds admission, the request
lifecycle and the drafting/jump-forward helpers; every step hook is the step's own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Literal

from ..compile import CompileService
from ..config import GuidedConfig
from ..errors import InvalidGrammarError, SlotStateError
from ..interface import GuidedBackend
from ..metrics import GuidedMetrics
from ..reasoning import MarkerLike, ReasoningMarker, ReasoningState, starts_in_reasoning
from ..spec import GrammarSpec, check_with_backend, parse_guided_request
from .drafting import DraftingSession, valid_prefix
from .jump_forward import JumpForward, jump_forward
from .plan import DraftTree
from .slot import GuidedFinish, SlotState, StepTimings
from .slots import SlotTable
from .step import BatchStep

logger = logging.getLogger(__name__)


class GuidedDecodingManager:
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
        overlap_fill: fill masks on a background thread during the forward (default) or inline
            in the begin hook.

    Parts: `slots` (the `SlotTable`) and `step` (the `BatchStep`); hosts use the methods below.
    """

    step_class: type[BatchStep] = BatchStep  # a subclass may step differently (the bench baseline)

    def __init__(
        self,
        backend: GuidedBackend,
        max_num_seqs: int,
        *,
        metrics: GuidedMetrics | None = None,
        think_end_id: int | None = None,
        think_end: MarkerLike = None,
        compile_service: CompileService | None = None,
        kernel_impl: str = "auto",
        max_draft_tokens: int = 0,
        overlap_fill: bool = True,
    ):
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
        self._owns_compiler = compile_service is None
        self.compiler = compile_service or CompileService(backend, metrics=self.metrics)
        self.slots = SlotTable(backend, self.metrics, max_num_seqs)
        self.step = self.step_class(
            self.slots,
            backend,
            self.config,
            self.metrics,
            max_rows=max_num_seqs * (max_draft_tokens + 1),
            max_num_seqs=max_num_seqs,
            max_draft_tokens=max_draft_tokens,
            kernel_impl=kernel_impl,
            overlap_fill=overlap_fill,
        )

    # ----- the step's settings and state, as the manager's --------------------------------------

    @property
    def budget(self):
        """The `fd_guided.budget.BudgetSteering` of this manager's slots."""
        return self.step.budget

    @property
    def kernel_impl(self) -> str:
        return self.step.kernel_impl

    @kernel_impl.setter
    def kernel_impl(self, value: str) -> None:
        self.step.kernel_impl = value

    @property
    def overlap_fill(self) -> bool:
        return self.step.overlap_fill

    @overlap_fill.setter
    def overlap_fill(self, value: bool) -> None:
        self.step.overlap_fill = value

    @property
    def bitmask(self):
        """The step's bitmask (``max_num_seqs * (max_draft_tokens + 1)`` rows)."""
        return self.step.bitmask

    @property
    def timings(self) -> StepTimings:
        return self.step.timings

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

    def add_request(
        self,
        slot: int,
        spec: GrammarSpec | None,
        *,
        request_id: Any = None,
        prompt_token_ids: Sequence[int] = (),
        output_token_ids: Sequence[int] = (),
        enable_thinking: bool | None = None,
        prefill_done: bool = False,
        reasoning_budget: int | None = None,
        jump_forward: bool | None = None,
        max_tokens: int | None = None,
        fit_budget: bool = True,
    ) -> None:
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
        self.slots.check(slot)
        self.slots.check_free(slot)
        if reasoning_budget is not None and reasoning_budget < 0:
            raise ValueError(f"reasoning_budget must be >= 0, got {reasoning_budget}")
        if spec is None:
            return
        self.metrics.inc("requests_total")
        thinking = starts_in_reasoning(self.reasoning_marker, prompt_token_ids, enable_thinking)
        self.slots.put(
            slot,
            SlotState(
                request_id=request_id,
                spec=spec,
                ticket=self.compiler.submit(spec),
                pending_tokens=list(output_token_ids),
                reasoning=ReasoningState(self.reasoning_marker, budget=reasoning_budget)
                if thinking and self.reasoning_marker is not None
                else None,
                prefill_done=prefill_done or bool(output_token_ids),
                jump_forward=self.config.jump_forward if jump_forward is None else bool(jump_forward),
            ),
        )
        self.step.budget.track(slot, max_tokens, fit_budget)

    def add_failed_request(self, slot: int, message: str, *, request_id: Any = None) -> None:
        """Hold `slot` for a request whose constraint failed before it reached this manager (e.g.
        a host's own parsing refused it): its rows allow only stop tokens, so it ends at once and
        is never sampled unconstrained; the next `accept` reports it with reason ``error``."""
        self.slots.check(slot)
        self.slots.check_free(slot)
        failed: Future = Future()
        failed.set_exception(InvalidGrammarError(message))
        state = SlotState(
            request_id=request_id,
            spec=GrammarSpec("regex", "(failed)"),
            ticket=failed,
            pending_tokens=[],
            reasoning=None,
            prefill_done=True,
        )
        self.slots.fail(slot, state, message)
        self.slots.put(slot, state)

    def mark_prefill_done(self, slots: Sequence[int]) -> None:
        """The given slots sample their first token in the coming step (their final prefill chunk)."""
        for slot in slots:
            state = self.slots.get(slot)
            if state is not None:
                state.prefill_done = True

    def release(self, slot: int) -> None:
        """Forget `slot` (finished, aborted or preempted). Its compiled grammar stays cached.

        Raises SlotStateError between `begin_step` and `apply` for a slot with a row in the step
        (its row is being filled), and while a drafting session holds it; after `apply` a released
        slot's row is simply not advanced.
        """
        if slot in self.slots and self.step.holds_row_of(slot):
            raise SlotStateError(f"slot {slot} has a row in the step being prepared: release it after apply()")
        if slot in self.slots and self.step.drafting is not None and slot in self.step.drafting.slots:
            raise SlotStateError(f"slot {slot} is being drafted: close the drafting session first")
        self.slots.pop(slot)
        self.step.budget.forget(slot)

    def is_guided(self, slot: int) -> bool:
        return slot in self.slots

    def is_ready(self, slot: int) -> bool:
        """True when sampling `slot`'s next token waits for nothing: its grammar is compiled (or
        its compile failed, and it will finish with an error), or it is not guided. A host's
        scheduler holds a guided request's first sampling step until then; `apply` never waits."""
        return self.slots.is_ready(slot)

    def is_budget_ready(self, slot: int) -> bool:
        """True unless `slot`'s first sample waits for its budget's start plan (a budget close enough
        that the first step needs it, `fd_guided.budget`), searched on the background thread from
        here. A host that holds a request's first sample until `is_ready` and this are both True
        never has a step wait for a budget search; one that does not has the step wait for it."""
        state = self.slots.get(slot)
        return state is None or self.step.budget.plan_ready(slot, state)

    def wait_ready(self, slots: Sequence[int], timeout_s: float | None = None) -> bool:
        """Block until every slot in `slots` `is_ready` (for simple hosts); False on timeout."""
        return self.slots.wait_ready(slots, timeout_s)

    def finish_of(self, slot: int) -> GuidedFinish | None:
        state = self.slots.get(slot)
        return state.finish if state else None

    def in_reasoning(self, slot: int) -> bool:
        """True while `slot` is inside its reasoning section (unconstrained, or forcing its end)."""
        state = self.slots.get(slot)
        return state is not None and state.in_reasoning

    # ----- helpers for drafters and jump-forward (implemented in their modules) -----------------

    def valid_draft_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        """How many leading `tokens` slot `slot` could accept from its current state (reasoning and a
        forced think-end included), without advancing anything: a drafter cuts its proposal there.
        Every token for an unguided slot; 0 for a finished or not yet compiled one."""
        return valid_prefix(self, slot, [int(t) for t in tokens])

    def begin_drafting(self, slots: Sequence[int | None]) -> DraftingSession:
        """A `DraftingSession`: masks for a draft model's own steps (see `fd_guided.manager.drafting`)."""
        return DraftingSession(self, slots)

    def jump_forward(self, slot: int, *, max_new_tokens: int | None = None) -> JumpForward | None:
        """Tokens the grammar forces next for `slot`, re-encoded at the boundary, or None (see
        `fd_guided.manager.jump_forward.JumpForward` for what the host must do with them)."""
        return jump_forward(self, slot, max_new_tokens)

    # ----- the step hooks (`BatchStep`) ---------------------------------------------------------

    def begin_step(self, rows: Sequence[int | None]) -> None:
        """Before the forward: map logits rows to slots and start filling ready rows in the background."""
        self.step.begin_step(rows)

    def begin_speculative_step(
        self, slots: Sequence[int | None], drafts: Sequence[DraftTree | Sequence[int] | None]
    ) -> None:
        """Before a verification forward: request i has ``len(drafts[i]) + 1`` consecutive logits
        rows (a chain) or one row per node of its `DraftTree`, requests in order. Row j of a chain
        is masked with the grammar after drafts 0..j-1 (see `fd_guided.manager.plan`); all of a
        request's rows are filled from its one matcher, which is back at its accepted state after.
        After `apply`, `draft_limits()` says how many drafts each request may accept."""
        self.step.begin_speculative_step(slots, drafts)

    def apply(self, logits) -> None:
        """Mask `logits` in place (rows as announced by the begin hook); joins the background fill."""
        return self.step.apply(logits)

    def draft_limits(self) -> list[int]:
        """After `apply`: per request of the step, how many leading drafts (of a chain) the host
        may accept. Past that the grammar rejects a draft (its row is the last real mask; the rows
        after it allow only stop tokens): an exact verifier never accepts it, since its masked
        probability is 0; a host whose verifier is not exact must cut there. 0 for a finished or
        failed request; every draft for an unguided one."""
        return self.step.draft_limits()

    def allows_only_stop(self, row: int) -> bool:
        """After `apply`: True when logits row `row` allows no token but stop tokens (the request is
        finished or failed, or its grammar is complete). The `min_tokens` rule: a host that bans
        stop tokens until `min_tokens` must not ban them in such a row (the constraint wins, the
        request ends shorter), or the row would have no legal token at all."""
        return self.step.allows_only_stop(row)

    def is_reasoning_row(self, row: int) -> bool:
        """After `apply`: True when logits row `row` belongs to a guided request still inside its
        reasoning section (unmasked, or forced to the think-end marker). A host that will not let
        a guided request end before its constraint ran bans stop tokens there (the reference
        engine does); the manager itself leaves reasoning rows unmasked."""
        return self.step.is_reasoning_row(row)

    def accept(
        self,
        token_ids: Sequence[int],
        *,
        masked_out: Literal["reject", "host"] = "reject",
        host_forced: Mapping[int, str] | None = None,
    ) -> list[GuidedFinish]:
        """Advance each decoding slot by its row's sampled token; return slots finished this step.

        A token the grammar rejects finishes that slot with reason ``error`` (the rejection
        policy); it is never fed through unconstrained or dropped silently.

        `masked_out` says what a token outside its row's applied mask means. ``reject`` (the
        default): a grammar violation, as above. ``host``: the host may replace a sampled token
        after masking, but only with the tokens it is known to force: its stop tokens (EOS at the
        length limit, a stop sequence) and the tokens `host_forced` names (token id -> a name for
        the metric, e.g. FastDeploy's thinking-limit ``</think>`` and line breaks). Such a token is
        not fed to the matcher and is not a rejection (``host_forced_tokens_total{kind=name}``,
        ``stop`` for stop tokens); a forced stop token ends the slot's guidance quietly (its later
        rows allow only stop tokens; `finish_of` says ``forced``). Any other token outside the
        mask (a race, a logits processor or sampler that un-masked it) is never taken silently:
        the request finishes with ``error`` ("guided decoding: token X outside the grammar at
        position N", N = the tokens its grammar accepted before it) and
        ``out_of_mask_tokens_total`` counts it. Tokens of rows that were not masked (reasoning,
        prefill) are processed as usual, so a forced think-end still starts the constraint.
        """
        return self.step.accept(token_ids, masked_out=masked_out, host_forced=host_forced)

    def accept_speculative(
        self,
        accepted: Sequence[Sequence[int]],
        *,
        masked_out: Literal["reject", "host"] = "reject",
        host_forced: Mapping[int, str] | None = None,
    ) -> list[GuidedFinish]:
        """After verification: per request of the step, the tokens it emits: its accepted drafts
        (a path from the root of its tree) and then the one token sampled at the last of them;
        [] for a request that emits nothing (a prefill chunk). All are pushed into its matcher at
        once (`Grammar.accept_tokens`); `masked_out` and `host_forced` as in `accept`, row by
        row along the path.

        Raises:
            SlotStateError: not after `begin_speculative_step`, or a count mismatch.
            ValueError: a token before the last is not a draft child of the path so far (nothing
                is advanced then).
        """
        return self.step.accept_speculative(accepted, masked_out=masked_out, host_forced=host_forced)

    def close(self) -> None:
        self.step.close()
        if self._owns_compiler:
            self.compiler.close()
