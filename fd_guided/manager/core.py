"""The batch manager: the few hooks a serving stack's model runner calls, slot by slot.

Per request (a *slot* is the host's batch index for it)::

    spec = manager.validate(fields)                 # admission; InvalidGrammarError -> HTTP 400
    manager.prefetch(spec)                          # optional, when it queues: the compile starts
    manager.add_request(slot, spec, ...)            # at prefill: the compile starts (or is joined)
    manager.is_ready(slot)                          # the scheduler samples its first token only then
    manager.mark_prefill_done([slot])               # in the step whose forward ends the prompt

Per decode step, with ``rows[i]`` the slot whose logits are row i (None for a row of no slot)::

    manager.begin_step(rows)                        # before the forward: fills start in the background
    logits = model(...)
    manager.apply(logits)                           # joins compiles/fills, masks IN PLACE
    tokens = sample(logits)
    finished = manager.accept(tokens)               # advance matchers; finished slots with reasons
    manager.release(slot)                           # when the host retires the request

Guarantees: a slot is masked only after its prefill is done, its grammar is ready and its
reasoning (if any) has ended; the step never waits for a compile (a row sampled before its
grammar is ready waits at most `GuidedConfig.first_token_wait_s`, then fails alone). A failed or
over-budget compile, a rejected token or a row the grammar leaves without any allowed token
finishes only that slot (reason ``error``, message in `GuidedFinish.error`) and the batch goes on.
Rows of finished slots allow only the engine's stop tokens, so a host that keeps sampling them
(``min_tokens``, a late retire) samples a stop token, never an unconstrained one and never from an
all-masked row. Every slot owns its matcher; compiled grammars are shared read-only. Hooks called
out of order raise `SlotStateError`.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from .compile import CompileService
from .config import GuidedConfig
from .errors import CompileBudgetError, GuidedDecodingError, InvalidGrammarError, SlotStateError
from .interface import Grammar, GuidedBackend
from .kernels import apply_token_bitmask_inplace
from .metrics import GuidedMetrics
from .spec import GrammarSpec, check_with_backend, parse_guided_request

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GuidedFinish:
    """A slot that guided decoding finished: ``stop`` (grammar complete) or ``error`` (with why).

    ``forced``: the host ended the request itself with a stop token the mask did not allow (see
    `GuidedDecodingManager.accept`); it is never returned by `accept`, only by `finish_of`.
    """

    slot: int
    reason: Literal["stop", "error", "forced"]
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
    ticket: Future
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
        self._bitmask_words = _host_words(self.bitmask)
        self._stop_row = _stop_only_row(backend.stop_token_ids, self._bitmask_words.shape[1])
        self.timings = StepTimings()
        self._slots: dict[int, _Slot] = {}
        self._fill_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-fill")
        self._fill_future: Future | None = None
        self._rows: list[int | None] = []
        self._phase: Literal["idle", "begun", "applied"] = "idle"
        self._applied_rows: set[int] = set()
        self._masked_rows: list[int] = []
        self._deferred_rows: list[int] = []
        self._stop_rows: list[int] = []

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
        """Start guiding `slot` with `spec` (None: an unguided request, nothing to do).

        `output_token_ids` are tokens already generated for this request elsewhere (a prefill
        node in disaggregated serving, or before a preemption); they are replayed into the new
        matcher, reasoning included, before its first mask. `enable_thinking` follows the chat
        template flag: with ``True`` on a reasoning model (`think_end_id` set) the constraint
        starts after the think-end token, unless the prompt already closed the section. ``None``
        and ``False`` constrain from the first token: a request is never unconstrained by omission.

        Raises:
            SlotStateError: `slot` is out of range or still holds a request (release it first).
        """
        self._check_slot(slot)
        if slot in self._slots:
            raise SlotStateError(f"slot {slot} still holds guided request {self._slots[slot].request_id!r}: release it first")
        if spec is None:
            return
        self.metrics.inc("requests_total")
        self._slots[slot] = _Slot(
            request_id=request_id,
            spec=spec,
            ticket=self.compiler.submit(spec),
            pending_tokens=list(output_token_ids),
            in_reasoning=self._starts_in_reasoning(prompt_token_ids, enable_thinking),
            prefill_done=prefill_done or bool(output_token_ids),
        )

    def add_failed_request(self, slot: int, message: str, *, request_id: Any = None) -> None:
        """Hold `slot` for a request whose constraint failed before it reached this manager (e.g.
        a host's own parsing refused it): its rows allow only stop tokens, so it ends at once and
        is never sampled unconstrained; the next `accept` reports it with reason ``error``."""
        self._check_slot(slot)
        if slot in self._slots:
            raise SlotStateError(f"slot {slot} still holds guided request {self._slots[slot].request_id!r}: release it first")
        failed: Future = Future()
        failed.set_exception(InvalidGrammarError(message))
        state = _Slot(request_id=request_id, spec=GrammarSpec("regex", "(failed)"), ticket=failed, pending_tokens=[],
                      in_reasoning=False, prefill_done=True)
        self._fail(slot, state, message)
        self._slots[slot] = state

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
        """Forget `slot` (finished, aborted or preempted). Its compiled grammar stays cached.

        Raises SlotStateError between `begin_step` and `apply` for a slot with a row in the step
        (its row is being filled); after `apply` a released slot's row is simply not advanced.
        """
        if self._phase == "begun" and slot in self._rows and slot in self._slots:
            raise SlotStateError(f"slot {slot} has a row in the step being prepared: release it after apply()")
        self._slots.pop(slot, None)

    def is_guided(self, slot: int) -> bool:
        return slot in self._slots

    def is_ready(self, slot: int) -> bool:
        """True when sampling `slot`'s next token waits for nothing: its grammar is compiled (or
        its compile failed, and it will finish with an error), or it is not guided. A host's
        scheduler holds a guided request's first sampling step until then (vLLM keeps such
        requests waiting); `apply` never waits for a compile."""
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

    # ----- the step -----------------------------------------------------------------------------

    def begin_step(self, rows: Sequence[int | None]) -> None:
        """Before the forward: map logits rows to slots and start filling ready rows in the background."""
        if len(rows) > self.max_num_seqs:
            raise ValueError(f"{len(rows)} logits rows exceed max_num_seqs={self.max_num_seqs}")
        self._join_fill()
        self._rows = list(rows)
        self._phase = "begun"
        ready_rows, grammars, deferred, stops = [], [], [], []
        for row, slot in enumerate(self._rows):
            state = self._slots.get(slot) if slot is not None else None
            if state is None or not state.prefill_done:
                continue
            if state.finish is not None:
                stops.append(row)
                continue
            if state.grammar is None and not state.ticket.done():
                deferred.append(row)
                continue
            self._materialise(slot, state)
            if state.finish is not None:
                stops.append(row)
            elif not state.in_reasoning:
                ready_rows.append(row)
                grammars.append(state.grammar)
        self._masked_rows, self._deferred_rows, self._stop_rows = ready_rows, deferred, stops
        if ready_rows:
            self._fill_future = self._fill_pool.submit(self._timed_fill, grammars, ready_rows)

    def apply(self, logits) -> None:
        """Mask `logits` in place (rows as given to begin_step). Never waits for a compile (see
        `GuidedConfig.first_token_wait_s`); joins the background fill."""
        if len(self._rows) != _num_rows(logits):
            raise SlotStateError(f"begin_step announced {len(self._rows)} rows but the logits have {_num_rows(logits)}")
        late_rows = self._resolve_deferred()
        started = time.perf_counter()
        empty = self._join_fill() or []
        self.timings.fill_join += time.perf_counter() - started
        self.metrics.observe("fill_join_seconds", time.perf_counter() - started)
        if late_rows:
            empty += self._timed_fill([self._slots[self._rows[r]].grammar for r in late_rows], late_rows)
            self._masked_rows = sorted(self._masked_rows + late_rows)
        for row in empty:
            slot = self._rows[row]
            self.metrics.inc("dead_end_rows_total")
            self._fail(slot, self._slots[slot], f"the {self._slots[slot].spec.kind} grammar allows no token here "
                       f"(after {self._slots[slot].accepted} accepted tokens): no valid continuation exists")
        rows = self._masked_rows
        if self._stop_rows or empty:
            self._write_stop_rows(self._stop_rows + empty)
            rows = sorted(set(rows) | set(self._stop_rows))
        started = time.perf_counter()
        if rows:
            # Every row guided: no row list (on CUDA that saves staging it and a scatter).
            indices = None if len(rows) == len(self._rows) else rows
            apply_token_bitmask_inplace(logits, self.bitmask, indices=indices, impl=self.kernel_impl)
        self._applied_rows = set(rows)
        self._phase = "applied"
        elapsed = time.perf_counter() - started
        self.timings.apply += elapsed
        self.metrics.observe("apply_seconds", elapsed)

    def accept(self, token_ids: Sequence[int], *, masked_out: Literal["reject", "host"] = "reject") -> list[GuidedFinish]:
        """Advance each decoding slot by its row's sampled token; return slots finished this step.

        A token the grammar rejects finishes that slot with reason ``error`` (the rejection
        policy); it is never fed through unconstrained or dropped silently.

        `masked_out` says what a token outside its row's applied mask means. ``reject`` (the
        default): a grammar violation, as above. ``host``: the host replaced the sampled token
        after masking (FastDeploy forces EOS at the length limit and ``</think>`` at the thinking
        limit): it is not fed to the matcher and not a rejection (counted in
        ``host_forced_tokens_total``); a forced stop token ends the slot's guidance quietly (its
        later rows allow only stop tokens; `finish_of` says ``forced``). Tokens of rows that were
        not masked (reasoning, prefill) are processed as usual, so a forced think-end still starts
        the constraint.
        """
        started = time.perf_counter()
        if len(token_ids) != len(self._rows):
            raise SlotStateError(f"got {len(token_ids)} sampled tokens for {len(self._rows)} rows")
        words = self._bitmask_words
        for row, (slot, token) in enumerate(zip(self._rows, token_ids)):
            state = self._slots.get(slot) if slot is not None else None
            if state is None or not state.prefill_done or state.finish is not None or state.grammar is None:
                continue
            token = int(token)
            if masked_out == "host" and row in self._applied_rows and not _allows(words[row], token):
                self._host_forced(slot, state, token)
                continue
            self._advance(slot, state, token)
        self._phase = "idle"
        finished = self._collect_finishes()
        elapsed = time.perf_counter() - started
        self.timings.accept += elapsed
        self.timings.steps += 1
        self.metrics.observe("accept_seconds", elapsed)
        return finished

    def _host_forced(self, slot: int, state: _Slot, token: int) -> None:
        stop = token in self.backend.stop_token_ids
        self.metrics.inc_labelled("host_forced_tokens_total", "kind", "stop" if stop else "other")
        if stop:
            state.finish = GuidedFinish(slot, "forced")
            state.finish_reported = True

    # ----- internals ----------------------------------------------------------------------------

    def _materialise(self, slot: int, state: _Slot) -> None:
        """Create the slot's matcher from its (done) ticket and replay tokens made elsewhere."""
        if state.grammar is not None:
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
        for token in pending:
            if state.finish is not None:
                break
            self._advance(slot, state, token)

    def _resolve_deferred(self) -> list[int]:
        """Rows whose compile was pending at begin_step: ready now -> filled late; still pending
        after `first_token_wait_s` -> the request fails alone (its row allows only stop tokens)."""
        late_rows = []
        if self._deferred_rows and self.config.first_token_wait_s > 0:
            started = time.perf_counter()
            wait_futures([self._slots[self._rows[r]].ticket for r in self._deferred_rows], timeout=self.config.first_token_wait_s)
            self.timings.compile_wait += time.perf_counter() - started
        for row in self._deferred_rows:
            slot = self._rows[row]
            state = self._slots[slot]
            if not state.ticket.done():
                self.metrics.inc("unready_samples_total")
                self._fail(slot, state, "its grammar was still compiling when its first token was sampled "
                           "(the host must wait until is_ready(slot))")
            else:
                self._materialise(slot, state)
            if state.finish is not None:
                self._stop_rows.append(row)
            elif not state.in_reasoning:
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

    def _timed_fill(self, grammars: list[Grammar], rows: list[int]) -> list[int]:
        """Fill `rows`; return those the grammar left without a single allowed token."""
        started = time.perf_counter()
        self.backend.fill_bitmasks(grammars, self.bitmask, rows)
        empty = [row for row in rows if not self._bitmask_words[row].any()]
        elapsed = time.perf_counter() - started
        self.timings.fill += elapsed
        self.metrics.observe("fill_seconds", elapsed)
        return empty

    def _write_stop_rows(self, rows: list[int]) -> None:
        for row in rows:
            self._bitmask_words[row] = self._stop_row

    def _join_fill(self) -> list[int] | None:
        future, self._fill_future = self._fill_future, None
        if future is not None:
            return future.result()
        return None

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


def _allows(words: np.ndarray, token: int) -> bool:
    word, bit = divmod(token, 32)
    return 0 <= word < words.shape[0] and bool((int(words[word]) >> bit) & 1)


def _host_words(bitmask) -> np.ndarray:
    """The bitmask as a writable numpy int32 view (CPU memory, pinned or not)."""
    return bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)


def _stop_only_row(stop_token_ids: Sequence[int], words: int) -> np.ndarray:
    row = np.zeros(words, dtype=np.uint32)
    for token in stop_token_ids:
        if 0 <= token < words * 32:
            row[token >> 5] |= np.uint32(1 << (token & 31))
    return row.view(np.int32)


__all__ = ["GuidedDecodingManager", "GuidedFinish", "StepTimings", "InvalidGrammarError"]
