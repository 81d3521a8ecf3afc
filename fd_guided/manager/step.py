"""The step hooks of `GuidedDecodingManager`: one planner for plain and speculative steps.

`begin_step` is `begin_speculative_step` with no drafts: every request is a `DraftTree` whose
nodes get one logits row each (`fd_guided.manager.plan`). `apply` joins the background fill, turns
ended chains into stop rows and masks with one kernel call; `accept`/`accept_speculative` push the
emitted tokens into each slot's matcher. `BatchStep` owns the step's state (the bitmask, the
rows of the step and what each became, the background fill) and reaches requests only through the
`SlotTable`'s methods; the manager delegates its step hooks to it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import wait as wait_futures
from typing import Any, Literal

from ..budget import BudgetSteering
from ..config import GuidedConfig
from ..errors import SlotStateError
from ..interface import GuidedBackend
from ..kernels import apply_token_bitmask_inplace
from ..metrics import GuidedMetrics
from .fill import BackgroundFill
from .plan import (
    EMPTY,
    FORCED,
    FREE,
    GRAMMAR,
    INVALID,
    STOP,
    DraftTree,
    NodePlan,
    StepEntry,
    TreeFill,
    plan_nodes,
)
from .slot import GuidedFinish, SlotState, StepTimings, allows, host_words, token_row
from .slots import SlotTable


class BatchStep:
    """The per-step hooks over a `SlotTable` (see `fd_guided.manager` for the flow).

    Owns the bitmask (``max_rows`` rows), the current step's rows and what each became, and the
    background fill thread. `phase` is ``idle`` between steps, ``begun`` between a begin hook and
    `apply`, ``applied`` until `accept`; `drafting` is the open `DraftingSession`, if any.
    """

    def __init__(
        self,
        slots: SlotTable,
        backend: GuidedBackend,
        config: GuidedConfig,
        metrics: GuidedMetrics,
        *,
        max_rows: int,
        max_num_seqs: int,
        max_draft_tokens: int,
        kernel_impl: str = "auto",
        overlap_fill: bool = True,
    ):
        self.slots = slots
        self.backend = backend
        self.config = config
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_draft_tokens = max_draft_tokens
        self.kernel_impl = kernel_impl
        # Fill masks on a background thread during the forward (the default: the forward runs on
        # a device), or inline in the begin hook (a model on the CPU shares the cores with the
        # fill; measured for the serving loop's lag in docs/benchmarks.md: no clear difference).
        self.overlap_fill = overlap_fill
        self.bitmask = backend.allocate_bitmask(max_rows)
        self.bitmask_words = host_words(self.bitmask)
        self.stop_ids = frozenset(backend.stop_token_ids)
        self.stop_row = token_row(backend.stop_token_ids, self.bitmask_words.shape[1])
        self._not_stop = ~self.stop_row
        self.timings = StepTimings()
        self.phase: Literal["idle", "begun", "applied"] = "idle"
        self.drafting: Any = None  # the open `DraftingSession`, if any
        self._draft_bitmask: Any = None
        self.fill = BackgroundFill(backend, self.bitmask, self.bitmask_words, self.timings, metrics)
        self._rows: list[int | None] = []
        self._entries: list[StepEntry] = []
        self._speculative = False
        self._applied_rows: set[int] = set()
        self._stop_rows: list[int] = []
        self.budget = BudgetSteering(backend, metrics, watched=slots.budget_watched)  # fd_guided.budget
        self._forced_rows: dict[int, int] = {}
        self._reasoning_rows: set[int] = set()
        self._deferred: list[StepEntry] = []
        # The step's rows for `budget.prepare` (slots in `_handed`: watched, far ones not; a speculative step's:
        # every budgeted one, for their drafts) and those it returned for `steer` (budget/far.py).
        self._budgeted: list[tuple[StepEntry, SlotState]] = []
        self._looked: list[StepEntry] = []

    @property
    def draft_bitmask(self):
        """A bitmask of `max_num_seqs` rows for drafting sessions, allocated on first use."""
        if self._draft_bitmask is None:
            self._draft_bitmask = self.backend.allocate_bitmask(self.max_num_seqs)
        return self._draft_bitmask

    def holds_row_of(self, slot: int) -> bool:
        """Whether `slot` has a row in a step between its begin hook and `apply` (being filled)."""
        return self.phase == "begun" and any(entry.slot == slot for entry in self._entries)

    # ----- the step -----------------------------------------------------------------------------

    def begin_step(self, rows: Sequence[int | None]) -> None:
        """Before the forward: map logits rows to slots and start filling ready rows in the background."""
        if len(rows) > self.max_num_seqs:
            raise ValueError(f"{len(rows)} logits rows exceed max_num_seqs={self.max_num_seqs}")
        self._begin([StepEntry(slot, row, EMPTY) for row, slot in enumerate(rows)], speculative=False)

    def begin_speculative_step(
        self, slots: Sequence[int | None], drafts: Sequence[DraftTree | Sequence[int] | None]
    ) -> None:
        """See `GuidedDecodingManager.begin_speculative_step`."""
        if len(slots) != len(drafts):
            raise ValueError(f"got {len(slots)} slots and {len(drafts)} draft lists")
        if len(slots) > self.max_num_seqs:
            raise ValueError(f"{len(slots)} requests exceed max_num_seqs={self.max_num_seqs}")
        entries, row = [], 0
        for slot, draft in zip(slots, drafts):
            tree = DraftTree.of(draft)
            if tree.num_nodes - 1 > self.max_draft_tokens:
                raise ValueError(
                    f"slot {slot}: {tree.num_nodes - 1} drafts exceed max_draft_tokens={self.max_draft_tokens}"
                )
            entries.append(StepEntry(slot, row, tree))
            row += tree.num_nodes
        self._begin(entries, speculative=True)

    def _begin(self, entries: list[StepEntry], *, speculative: bool) -> None:
        if self.drafting is not None:
            raise SlotStateError("a drafting session is open: close it before the verification step")
        self._join_fill()
        self._entries, self._speculative, self.phase = entries, speculative, "begun"
        self._rows = [e.slot for e in entries for _ in range(e.tree.num_nodes)]
        self._stop_rows, self._forced_rows, self._deferred, self._reasoning_rows = [], {}, [], set()
        jobs, self._budgeted, self._handed = [], [], self.budget.budgeted if speculative else self.budget.watched
        for entry in entries:
            state = self.slots.get(entry.slot)
            if state is None or not state.prefill_done:
                entry.limit = len(entry.tree.tokens)
                continue
            if state.finish is None and state.grammar is None and not state.ticket.done():
                self._deferred.append(entry)
                continue
            assert entry.slot is not None  # a state was found for it
            self.slots.materialise(entry.slot, state)
            job = self._prepare(entry, state)
            if job is not None:
                jobs.append(job)
        self._looked = self.budget.prepare(self._budgeted)  # before the fill: closing rows' candidates
        self.fill.start(jobs, len(self._rows), overlap=self.overlap_fill)

    def _prepare(self, entry: StepEntry, state: SlotState) -> TreeFill | None:
        """Plan `entry`'s rows; returns the grammar rows to fill (None if there are none)."""
        rows = range(entry.first_row, entry.first_row + entry.tree.num_nodes)
        if state.finish is not None:
            entry.stopped = True
            self._stop_rows.extend(rows)
            return None
        entry.plans = plans = plan_nodes(entry.tree, state.reasoning if state.in_reasoning else None, self.stop_ids)
        if entry.slot in self._handed:
            self._budgeted.append((entry, state))
        nodes = []
        for node, plan in enumerate(plans):
            row = entry.first_row + node
            if plan.kind == GRAMMAR:
                nodes.append((row, node, entry.tree.parents[node - 1] if node else -1, plan.path))
            elif plan.kind == FORCED:
                assert plan.forced is not None  # a forced row names its token
                self._forced_rows[row] = plan.forced
                self._reasoning_rows.add(row)
            elif plan.kind == FREE:
                self._reasoning_rows.add(row)
            elif plan.kind in (STOP, INVALID):
                self._stop_rows.append(row)
        if len(entry.tree.tokens):
            self.metrics.inc("draft_tokens_total", len(entry.tree.tokens))
        if not nodes or state.grammar is None:
            return None
        entry.fill = TreeFill(state.grammar, nodes, entry.first_row)
        if len(nodes) == 1 and nodes[0][1] == 0:  # dropped where `budget.prepare` names candidates
            entry.fill.first_mask = self.fill.first_mask_key(state)
        return entry.fill

    def apply(self, logits) -> None:
        """Mask `logits` in place (rows as announced by the begin hook). Never waits for a
        compile (see `GuidedConfig.first_token_wait_s`); joins the background fill."""
        if len(self._rows) != int(logits.shape[0]):
            raise SlotStateError(
                f"the begin hook announced {len(self._rows)} rows but the logits have {int(logits.shape[0])}"
            )
        late_jobs = self._resolve_deferred()
        started = time.perf_counter()
        self._join_fill()
        self.timings.fill_join += time.perf_counter() - started
        self.metrics.observe("fill_join_seconds", time.perf_counter() - started)
        if late_jobs:
            self._timed_fill(late_jobs)
        masked: set[int] = set(self._forced_rows)
        for entry in self._entries:
            self._settle(entry, masked)
        # Rows near max_tokens keep a complete output within it (fd_guided.budget).
        self.budget.steer(
            self._looked, self.slots.get, self.slots.fail, self.bitmask_words, masked, self._stop_rows, self.stop_ids
        )
        words = self.bitmask_words
        for row in self._stop_rows:
            words[row] = self.stop_row
        for row, token in self._forced_rows.items():
            words[row] = token_row([token], words.shape[1])
        rows = sorted(masked | set(self._stop_rows))
        started = time.perf_counter()
        if rows:
            # Every row guided: no row list (on CUDA that saves staging it and a scatter).
            indices = None if len(rows) == len(self._rows) else rows
            upload = self.fill.take_upload()
            if upload is not None:  # rows written since the upload are copied again (prefetch.py)
                apply_token_bitmask_inplace(
                    logits, self.bitmask, indices=indices, impl=self.kernel_impl, prefetched=upload
                )
            else:
                apply_token_bitmask_inplace(logits, self.bitmask, indices=indices, impl=self.kernel_impl)
            self.fill.watch(logits, self.kernel_impl)
        self.fill.upload = None
        self._applied_rows = set(rows)
        self.phase = "applied"
        elapsed = time.perf_counter() - started
        self.timings.apply += elapsed
        self.metrics.observe("apply_seconds", elapsed)

    def _settle(self, entry: StepEntry, masked: set[int]) -> None:
        """After the fill: fail a dead-end root, turn ended chains into stop rows, set the limit."""
        if entry.plans is None:
            return
        fill = entry.fill
        if fill is not None and fill.root_dead:
            slot = entry.slot
            assert slot is not None  # only a guided slot's rows are filled
            state = self.slots[slot]
            self.metrics.inc("dead_end_rows_total")
            self.slots.fail(
                slot,
                state,
                f"the {state.spec.kind} grammar allows no token here (after {state.accepted} accepted "
                "tokens): no valid continuation exists",
            )
            entry.stopped, entry.plans = True, None
            self._stop_rows.extend(range(entry.first_row, entry.first_row + entry.tree.num_nodes))
            return
        if fill is not None:
            for node in fill.invalid:
                entry.plans[node] = NodePlan(INVALID)
            for node in fill.stops:
                entry.plans[node] = NodePlan(STOP)
            for row, node, _, _ in fill.nodes:
                if node in fill.invalid or node in fill.stops:
                    self._stop_rows.append(row)
                else:
                    masked.add(row)
        invalid = sum(plan.kind == INVALID for plan in entry.plans)
        if invalid:
            self.metrics.inc("draft_tokens_invalid_total", invalid)
        entry.limit = 0
        for node in range(1, entry.tree.num_nodes):  # leading valid drafts of the chain through node order
            if entry.plans[node].kind == INVALID or entry.tree.parents[node - 1] != node - 1:
                break
            entry.limit = node

    def draft_limits(self) -> list[int]:
        """See `GuidedDecodingManager.draft_limits`."""
        if self.phase != "applied":
            raise SlotStateError("draft_limits() is known only after apply()")
        return [entry.limit for entry in self._entries]

    def allows_only_stop(self, row: int) -> bool:
        """See `GuidedDecodingManager.allows_only_stop`."""
        if self.phase != "applied":
            raise SlotStateError("allows_only_stop() is known only after apply()")
        return row in self._applied_rows and not (self.bitmask_words[row] & self._not_stop).any()

    def is_reasoning_row(self, row: int) -> bool:
        """See `GuidedDecodingManager.is_reasoning_row`."""
        if self.phase != "applied":
            raise SlotStateError("is_reasoning_row() is known only after apply()")
        return row in self._reasoning_rows

    def accept(
        self,
        token_ids: Sequence[int],
        *,
        masked_out: Literal["reject", "host"] = "reject",
        host_forced: Mapping[int, str] | None = None,
    ) -> list[GuidedFinish]:
        """Advance each decoding slot by its row's sampled token (see `GuidedDecodingManager.accept`)."""
        if self._speculative:
            raise SlotStateError("this step was begun with begin_speculative_step: use accept_speculative()")
        if len(token_ids) != len(self._rows):
            raise SlotStateError(f"got {len(token_ids)} sampled tokens for {len(self._rows)} rows")
        return self._accept([[int(t)] for t in token_ids], masked_out, host_forced)

    def accept_speculative(
        self,
        accepted: Sequence[Sequence[int]],
        *,
        masked_out: Literal["reject", "host"] = "reject",
        host_forced: Mapping[int, str] | None = None,
    ) -> list[GuidedFinish]:
        """Push each request's accepted drafts and sampled token (see the manager's method)."""
        if not self._speculative:
            raise SlotStateError("this step was begun with begin_step: use accept()")
        if len(accepted) != len(self._entries):
            raise SlotStateError(f"got accepted tokens for {len(accepted)} requests, the step has {len(self._entries)}")
        return self._accept([[int(t) for t in tokens] for tokens in accepted], masked_out, host_forced)

    def _accept(
        self, accepted: list[list[int]], masked_out: str, host_forced: Mapping[int, str] | None = None
    ) -> list[GuidedFinish]:
        started = time.perf_counter()
        paths = [entry.path_of(tokens) for entry, tokens in zip(self._entries, accepted)]
        words = self.bitmask_words
        for entry, tokens, path in zip(self._entries, accepted, paths):
            slot = entry.slot
            state = self.slots.get(slot)
            if (
                not tokens
                or state is None
                or not state.prefill_done
                or state.finish is not None
                or state.grammar is None
            ):
                continue
            assert slot is not None  # a state was found for it
            forced_at = None
            if masked_out == "host":
                rows = [entry.first_row + node for node in path]
                forced_at = next(
                    (
                        j
                        for j, row in enumerate(rows)
                        if row in self._applied_rows and not allows(words[row], tokens[j])
                    ),
                    None,
                )
            self.slots.advance(slot, state, tokens if forced_at is None else tokens[:forced_at])
            if forced_at is not None and state.finish is None:
                self.slots.take_host_forced(slot, state, tokens[forced_at], self.stop_ids, host_forced or {})
        self.phase = "idle"
        finished = self.slots.collect_finishes()
        elapsed = time.perf_counter() - started
        self.timings.accept += elapsed
        self.timings.steps += 1
        self.metrics.observe("accept_seconds", elapsed)
        return finished

    def _resolve_deferred(self) -> list[TreeFill]:
        """Entries whose compile was pending at the begin hook: ready now -> filled late; still
        pending after `first_token_wait_s` -> the request fails alone (its rows allow only stop tokens)."""
        if self._deferred and self.config.first_token_wait_s > 0:
            started = time.perf_counter()
            wait_futures(
                [self.slots[self._slot_of(e)].ticket for e in self._deferred], timeout=self.config.first_token_wait_s
            )
            self.timings.compile_wait += time.perf_counter() - started
        jobs, self._budgeted = [], []
        for entry in self._deferred:
            slot = self._slot_of(entry)
            state = self.slots[slot]
            if not state.ticket.done():
                self.metrics.inc("unready_samples_total")
                self.slots.fail(
                    slot,
                    state,
                    "its grammar was still compiling when its first token was sampled "
                    "(the host must wait until is_ready(slot))",
                )
            else:
                self.slots.materialise(slot, state)
            job = self._prepare(entry, state)
            if job is not None:
                jobs.append(job)
        self._looked += self.budget.prepare(self._budgeted)
        self._deferred = []
        return jobs

    @staticmethod
    def _slot_of(entry: StepEntry) -> int:
        """The slot of a deferred entry (deferred only when its slot holds a guided request)."""
        assert entry.slot is not None
        return entry.slot

    def _timed_fill(self, jobs: list[TreeFill]) -> None:
        self.fill.run(jobs, len(self._rows))

    def _join_fill(self) -> None:
        self.fill.join()

    def close(self) -> None:
        self.fill.close()
        self.budget.close()
