"""Grammar-aware drafting: drafts that obey the constraint are accepted more often.

A draft model proposes K tokens one step at a time; unmasked, it wastes drafts on tokens the
grammar rejects (the target's masked row gives them probability 0). `DraftingSession` masks the
drafter's own logits with each request's grammar *as advanced by its drafts so far*, using the
slot's own matcher, and puts every matcher back at its accepted state on `close`::

    with manager.begin_drafting(slots) as drafting:      # rows[i] of each draft step = slots[i]
        for _ in range(k):
            logits = draft_model(...)
            drafting.apply(logits)                        # in place, same kernel as the target step
            drafts = sample(logits)
            drafting.advance(drafts)                      # a rejected draft ends that slot's chain
    valid = drafting.valid                               # per slot: drafts the grammar accepted

A drafter without logits (n-gram / prompt lookup) calls `GuidedDecodingManager.valid_draft_prefix`
instead and cuts its proposal where the grammar stops accepting it (`valid_prefix` below).
Rows of slots that are unguided, not ready or finished are left unmasked (their drafts do not
matter: the verification step masks them); reasoning rows are unmasked until the think-end
marker, or forced to it once the budget is spent, as in the verification step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..errors import SlotStateError
from ..kernels import apply_token_bitmask_inplace
from .slot import host_words, token_row


class DraftingSession:
    """Masks for a draft model's steps over `slots` (row i of every draft step is slots[i])."""

    def __init__(self, manager, slots: Sequence[int | None]):
        step = manager.step
        if step.drafting is not None:
            raise SlotStateError("a drafting session is already open")
        if step.phase == "begun":
            raise SlotStateError("a step is between its begin hook and apply(): draft before beginning it")
        if len(slots) > manager.max_num_seqs:
            raise ValueError(f"{len(slots)} rows exceed max_num_seqs={manager.max_num_seqs}")
        self._manager = manager
        self.slots = [slot for slot in slots]
        self.valid = [0] * len(slots)  # drafts each slot's grammar accepted (pushed onto its matcher)
        self._pushed = [0] * len(slots)  # of those, tokens pushed into the grammar (to roll back)
        self._reasoning = []
        self._active = []
        for slot in self.slots:
            state = manager.slots.get(slot)
            if state is not None and state.prefill_done and state.finish is None and state.ticket.done():
                manager.slots.materialise(slot, state)
            guided = state is not None and state.prefill_done and state.finish is None and state.grammar is not None
            self._active.append(guided)
            self._reasoning.append(state.reasoning if guided and state.in_reasoning else None)
        self._bitmask = step.draft_bitmask
        self._words = host_words(self._bitmask)
        step.drafting = self

    def __enter__(self) -> DraftingSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def active(self, index: int) -> bool:
        """Whether row `index` is still drafting under its grammar (False once a draft was rejected
        or the chain reached a stop token, and for rows that are not guided)."""
        return self._active[index]

    def retire(self, index: int) -> None:
        """Row `index` drafts no more (its request left the draft batch): later steps skip it."""
        self._active[index] = False

    def apply(self, logits) -> None:
        """Mask draft logits in place: row i with slot i's grammar after its drafts so far."""
        manager = self._manager
        if int(logits.shape[0]) != len(self.slots):
            raise SlotStateError(f"the drafting session has {len(self.slots)} rows, the logits {int(logits.shape[0])}")
        started = time.perf_counter()
        grammars, fill_rows, masked = [], [], []
        for row, slot in enumerate(self.slots):
            if not self._active[row]:
                continue
            reasoning = self._reasoning[row]
            if reasoning is not None and reasoning.thinking:
                forced = reasoning.forced_token()
                if forced is not None:
                    self._words[row] = token_row([forced], self._words.shape[1])
                    masked.append(row)
                continue
            grammars.append(manager.slots[slot].grammar)
            fill_rows.append(row)
        if fill_rows:
            manager.backend.fill_bitmasks(grammars, self._bitmask, fill_rows)
        for row in fill_rows:
            if not self._words[row].any():  # a dead end: the chain stops; never an all -inf row
                self._words[row] = manager.step.stop_row
                self._active[row] = False
            masked.append(row)
        if masked:
            masked.sort()
            apply_token_bitmask_inplace(
                logits,
                self._bitmask,
                indices=None if len(masked) == len(self.slots) else masked,
                impl=manager.kernel_impl,
            )
        manager.timings.fill += time.perf_counter() - started

    def advance(self, tokens: Sequence[int]) -> None:
        """Push each active row's draft token (what the drafter sampled) onto its slot's state."""
        manager = self._manager
        if len(tokens) != len(self.slots):
            raise SlotStateError(f"got {len(tokens)} draft tokens for {len(self.slots)} rows")
        for row, (slot, token) in enumerate(zip(self.slots, tokens)):
            if not self._active[row]:
                continue
            token = int(token)
            if token in manager.step.stop_ids:  # the request would end here: valid iff the grammar allows it
                state = manager.slots[slot]
                reasoning = self._reasoning[row]
                ok = reasoning is not None and reasoning.thinking or state.grammar.validate_tokens([token]) == 1
                self.valid[row] += ok
                self._active[row] = False
                continue
            reasoning = self._reasoning[row]
            if reasoning is not None and reasoning.thinking:
                forced = reasoning.forced_token()
                if forced is not None and token != forced:
                    self._active[row] = False
                    continue
                self._reasoning[row] = reasoning.step(token)
                self.valid[row] += 1
                continue
            if manager.slots[slot].grammar.accept_tokens([token]) != 1:
                self._active[row] = False
                continue
            self._pushed[row] += 1
            self.valid[row] += 1

    def close(self) -> list[int]:
        """Roll every matcher back to its accepted state; returns `valid`. Idempotent."""
        manager = self._manager
        if manager.step.drafting is self:
            for slot, pushed in zip(self.slots, self._pushed):
                if pushed:
                    manager.slots[slot].grammar.rollback(pushed)
            self._pushed = [0] * len(self.slots)
            manager.step.drafting = None
        return self.valid


def valid_prefix(manager, slot: int, tokens: list[int]) -> int:
    """`GuidedDecodingManager.valid_draft_prefix`: how many leading `tokens` the slot accepts."""
    state = manager.slots.get(slot)
    if state is None or not state.prefill_done:
        return len(tokens)
    if state.finish is None and state.grammar is None and state.ticket.done():
        manager.slots.materialise(slot, state)
    if state.finish is not None or state.grammar is None:
        return 0
    reasoning, index = (state.reasoning if state.in_reasoning else None), 0
    while index < len(tokens) and reasoning is not None and reasoning.thinking:
        forced = reasoning.forced_token()
        if forced is not None and tokens[index] != forced:
            return index
        if tokens[index] in manager.step.stop_ids:
            return index + 1
        reasoning = reasoning.step(tokens[index])
        index += 1
    if state.grammar.is_terminated():
        return index
    return index + state.grammar.validate_tokens(tokens[index:])
