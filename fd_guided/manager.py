"""The batch manager: the few hooks a serving stack's model runner calls, slot by slot.

Per request (a *slot* is the host's batch index for it)::

    spec = manager.validate(fields)                 # admission; InvalidGrammarError -> HTTP 400
    manager.add_request(slot, spec, ...)            # at prefill: the compile starts in the background
    manager.mark_prefill_done([slot])               # in the step whose forward ends the prompt

Per decode step, with ``rows[i]`` the slot whose logits are row i (None for a row of no slot)::

    manager.begin_step(rows)                        # before the forward: fills start in the background
    logits = model(...)
    manager.apply(logits)                           # joins compiles/fills, masks IN PLACE
    tokens = sample(logits)
    finished = manager.accept(tokens)               # advance matchers; finished slots with reasons
    manager.release(slot)                           # when the host retires the request

Guarantees: a slot is masked only after its prefill is done, its compile is joined and its
reasoning (if any) has ended; a failed compile, a compile timeout or a rejected token finishes
only that slot (reason ``error``, message in `GuidedFinish.error`) and the batch goes on; every
slot owns its matcher, compiled grammars are shared read-only; the host thread never blocks on a
compile before the step that samples the request's first token.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from .compile import CompileService, join
from .config import GuidedConfig
from .errors import GrammarCompileTimeout, GuidedDecodingError, InvalidGrammarError, SlotStateError
from .interface import Grammar, GuidedBackend
from .kernels import apply_token_bitmask_inplace
from .metrics import GuidedMetrics
from .spec import GrammarSpec, check_with_backend, parse_guided_request

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GuidedFinish:
    """A slot that guided decoding finished: ``stop`` (grammar complete) or ``error`` (with why)."""

    slot: int
    reason: Literal["stop", "error"]
    error: str | None = None


@dataclass
class StepTimings:
    """Seconds spent in each guided phase, summed over the steps of a run."""

    compile_wait: float = 0.0
    fill: float = 0.0
    fill_join: float = 0.0
    apply: float = 0.0
    accept: float = 0.0
    steps: int = 0

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in ("compile_wait", "fill", "fill_join", "apply", "accept", "steps")}


@dataclass
class _Slot:
    request_id: Any
    spec: GrammarSpec
    future: Future
    deadline: float
    pending_tokens: list[int]
    in_reasoning: bool
    prefill_done: bool = False
    grammar: Grammar | None = None
    finish: GuidedFinish | None = None
    finish_reported: bool = False
    accepted: int = 0
    rejected_token: int | None = field(default=None, repr=False)


class GuidedDecodingManager:
    """Slot-indexed guided decoding for one engine (or one tensor-parallel rank).

    Args:
        backend: a built `GuidedBackend` (see `fd_guided.registry.create_backend`).
        max_num_seqs: the most logits rows a step can have (bitmask rows are allocated once).
        metrics: shared metrics sink; a private one is made if omitted.
        think_end_id: token id that ends a reasoning section; None for non-reasoning models.
        compile_service: share one between managers of the same backend (e.g. TP ranks in one
            process); by default the manager owns its own.
        kernel_impl: the `fd_guided.kernels` path used to mask logits ("auto" picks by device).
    """

    def __init__(
        self,
        backend: GuidedBackend,
        max_num_seqs: int,
        *,
        metrics: GuidedMetrics | None = None,
        think_end_id: int | None = None,
        compile_service: CompileService | None = None,
        kernel_impl: str = "auto",
    ):
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self.backend = backend
        self.config: GuidedConfig = backend.config
        self.max_num_seqs = max_num_seqs
        self.metrics = metrics or (compile_service.metrics if compile_service else GuidedMetrics())
        self.think_end_id = think_end_id
        self.kernel_impl = kernel_impl
        self._owns_compiler = compile_service is None
        self.compiler = compile_service or CompileService(backend, metrics=self.metrics)
        self.bitmask = backend.allocate_bitmask(max_num_seqs)
        self.timings = StepTimings()
        self._slots: dict[int, _Slot] = {}
        self._fill_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-fill")
        self._fill_future: Future | None = None
        self._rows: list[int | None] = []
        self._masked_rows: list[int] = []
        self._deferred_rows: list[int] = []

    # ----- admission and slot lifecycle -------------------------------------------------------

    def validate(self, fields: Mapping[str, Any]) -> GrammarSpec | None:
        """Parse and check a request's guided fields against this manager's backend."""
        spec = parse_guided_request(fields, self.config, check_backend=False)
        if spec is not None:
            check_with_backend(type(self.backend), spec)
        return spec

    def prefetch(self, spec: GrammarSpec | None) -> None:
        """Start compiling `spec` now: when the request enters the engine's waiting queue.

        Never blocks. When `add_request` later submits the same spec it finds the grammar cached
        or joins the compile in flight, so a request that queued for a slot starts with its
        grammar (nearly) ready instead of compiling during its own prefill. A failed compile is
        remembered and fails the request when it is added, as it would have anyway.
        """
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
    ) -> None:
        """Start guiding `slot` with `spec` (None clears the slot: an unguided request).

        `output_token_ids` are tokens already generated for this request elsewhere (a prefill
        node in disaggregated serving, or before a preemption); they are replayed into the new
        matcher, reasoning included, before its first mask. `enable_thinking` follows the chat
        template flag: with ``True`` on a reasoning model (`think_end_id` set) the constraint
        starts after the think-end token, unless the prompt already closed the section. ``None``
        and ``False`` constrain from the first token: a request is never unconstrained by omission.
        """
        self._check_slot(slot)
        self._join_fill()
        self._slots.pop(slot, None)
        if spec is None:
            return
        self.metrics.inc("requests_total")
        self._slots[slot] = _Slot(
            request_id=request_id,
            spec=spec,
            future=self.compiler.submit(spec),
            deadline=time.monotonic() + self.config.compile_timeout_s,
            pending_tokens=list(output_token_ids),
            in_reasoning=self._starts_in_reasoning(prompt_token_ids, enable_thinking),
            prefill_done=prefill_done or bool(output_token_ids),
        )

    def _starts_in_reasoning(self, prompt_token_ids: Sequence[int], enable_thinking: bool | None) -> bool:
        if self.think_end_id is None or enable_thinking is not True:
            return False
        return self.think_end_id not in prompt_token_ids

    def mark_prefill_done(self, slots: Sequence[int]) -> None:
        """The given slots sample their first token in the coming step (their final prefill chunk)."""
        for slot in slots:
            state = self._slots.get(slot)
            if state is not None:
                state.prefill_done = True

    def release(self, slot: int) -> None:
        """Forget `slot` (finished, aborted or preempted). Its compiled grammar stays cached."""
        self._join_fill()
        self._slots.pop(slot, None)

    def is_guided(self, slot: int) -> bool:
        return slot in self._slots

    def finish_of(self, slot: int) -> GuidedFinish | None:
        state = self._slots.get(slot)
        return state.finish if state else None

    # ----- the step -----------------------------------------------------------------------------

    def begin_step(self, rows: Sequence[int | None]) -> None:
        """Before the forward: map logits rows to slots and start filling ready rows in the background."""
        if len(rows) > self.max_num_seqs:
            raise ValueError(f"{len(rows)} logits rows exceed max_num_seqs={self.max_num_seqs}")
        self._join_fill()
        self._rows = list(rows)
        ready_rows, grammars, deferred = [], [], []
        for row, slot in enumerate(self._rows):
            state = self._slots.get(slot) if slot is not None else None
            if state is None or not state.prefill_done or state.finish is not None:
                continue
            if state.grammar is None and not state.future.done():
                deferred.append(row)
                continue
            self._materialise(slot, state)
            if state.finish is None and not state.in_reasoning:
                ready_rows.append(row)
                grammars.append(state.grammar)
        self._masked_rows = ready_rows
        self._deferred_rows = deferred
        if ready_rows:
            self._fill_future = self._fill_pool.submit(self._timed_fill, grammars, ready_rows)

    def apply(self, logits) -> None:
        """Join pending compiles and fills, then mask `logits` in place (rows as given to begin_step)."""
        if len(self._rows) != _num_rows(logits):
            raise SlotStateError(f"begin_step announced {len(self._rows)} rows but the logits have {_num_rows(logits)}")
        late_rows = self._join_deferred()
        started = time.perf_counter()
        self._join_fill()
        self.timings.fill_join += time.perf_counter() - started
        self.metrics.observe("fill_join_seconds", time.perf_counter() - started)
        if late_rows:
            self._timed_fill([self._slots[self._rows[r]].grammar for r in late_rows], late_rows)
            self._masked_rows = sorted(self._masked_rows + late_rows)
        started = time.perf_counter()
        if self._masked_rows:
            # Every row guided: no row list (on CUDA that saves staging it and a scatter).
            indices = None if len(self._masked_rows) == len(self._rows) else self._masked_rows
            apply_token_bitmask_inplace(logits, self.bitmask, indices=indices, impl=self.kernel_impl)
        elapsed = time.perf_counter() - started
        self.timings.apply += elapsed
        self.metrics.observe("apply_seconds", elapsed)

    def accept(self, token_ids: Sequence[int]) -> list[GuidedFinish]:
        """Advance each decoding slot by its row's sampled token; return slots finished this step.

        A token the grammar rejects finishes that slot with reason ``error`` (the rejection
        policy); it is never fed through unconstrained or dropped silently.
        """
        started = time.perf_counter()
        if len(token_ids) != len(self._rows):
            raise SlotStateError(f"got {len(token_ids)} sampled tokens for {len(self._rows)} rows")
        for slot, token in zip(self._rows, token_ids):
            state = self._slots.get(slot) if slot is not None else None
            if state is None or not state.prefill_done or state.finish is not None or state.grammar is None:
                continue
            self._advance(slot, state, int(token))
        finished = self._collect_finishes()
        elapsed = time.perf_counter() - started
        self.timings.accept += elapsed
        self.timings.steps += 1
        self.metrics.observe("accept_seconds", elapsed)
        return finished

    # ----- internals ----------------------------------------------------------------------------

    def _materialise(self, slot: int, state: _Slot) -> None:
        """Create the slot's matcher from its joined compile and replay tokens made elsewhere."""
        if state.grammar is not None:
            return
        try:
            compiled = join(state.future, state.deadline)
        except GrammarCompileTimeout as error:
            self.metrics.inc("compile_timeouts_total")
            self._fail(slot, state, str(error))
            return
        except GuidedDecodingError as error:
            self._fail(slot, state, f"grammar failed to compile: {error}")
            return
        state.grammar = self.backend.new_grammar(compiled)
        self.metrics.inc_labelled("requests_by_backend_total", "backend", compiled.backend_name)
        logger.debug("guided request %s (slot %d): %s on backend %s", state.request_id, slot, state.spec.describe(), compiled.backend_name)
        pending, state.pending_tokens = state.pending_tokens, []
        for token in pending:
            if state.finish is not None:
                break
            self._advance(slot, state, token)

    def _join_deferred(self) -> list[int]:
        late_rows = []
        for row in self._deferred_rows:
            slot = self._rows[row]
            state = self._slots[slot]
            started = time.perf_counter()
            self._materialise(slot, state)
            waited = time.perf_counter() - started
            self.timings.compile_wait += waited
            self.metrics.observe("compile_wait_seconds", waited)
            if state.finish is None and not state.in_reasoning:
                late_rows.append(row)
        self._deferred_rows = []
        return late_rows

    def _advance(self, slot: int, state: _Slot, token: int) -> None:
        if state.in_reasoning:
            if token == self.think_end_id:
                state.in_reasoning = False
            return
        if state.grammar.is_terminated():
            return
        if not state.grammar.accept_token(token):
            self.metrics.inc("rejected_tokens_total")
            state.rejected_token = token
            self._fail(slot, state, f"token {token} was rejected by the {state.spec.kind} grammar after {state.accepted} accepted tokens")
            return
        state.accepted += 1
        if state.grammar.is_terminated():
            state.finish = GuidedFinish(slot, "stop")

    def _fail(self, slot: int, state: _Slot, message: str) -> None:
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

    def _timed_fill(self, grammars: list[Grammar], rows: list[int]) -> None:
        started = time.perf_counter()
        self.backend.fill_bitmasks(grammars, self.bitmask, rows)
        elapsed = time.perf_counter() - started
        self.timings.fill += elapsed
        self.metrics.observe("fill_seconds", elapsed)

    def _join_fill(self) -> None:
        future, self._fill_future = self._fill_future, None
        if future is not None:
            future.result()

    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.max_num_seqs:
            raise SlotStateError(f"slot must be an int in [0, {self.max_num_seqs}), got {slot!r}")

    def close(self) -> None:
        self._join_fill()
        self._fill_pool.shutdown(wait=True)
        if self._owns_compiler:
            self.compiler.close()


def _num_rows(logits) -> int:
    return int(logits.shape[0])


__all__ = ["GuidedDecodingManager", "GuidedFinish", "StepTimings", "InvalidGrammarError"]
