"""Per-slot state of the manager, what it reports, and the bitmask row helpers every step uses."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from ..bitmask_rows import allows, host_words, token_row
from ..budget.far import NO_MARK
from ..interface import CompiledGrammar, Grammar
from ..reasoning import ReasoningState
from ..spec import GrammarSpec

__all__ = ["GuidedFinish", "SlotState", "StepTimings", "allows", "host_words", "token_row"]


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
class SlotState:
    """One guided request in one slot.

    `reasoning` is its reasoning section's state while it thinks (None when it does not or has
    finished thinking). `history` holds the tokens its grammar accepted, in order (jump-forward
    re-encodes the last one at the boundary). `jump_forward`: whether jump-forward may emit
    tokens for it.
    """

    request_id: Any
    spec: GrammarSpec
    ticket: Future
    pending_tokens: list[int]
    reasoning: ReasoningState | None
    prefill_done: bool = False
    jump_forward: bool = False
    grammar: Grammar | None = None
    compiled: CompiledGrammar | None = field(default=None, repr=False)  # its grammar's, once materialised
    finish: GuidedFinish | None = None
    finish_reported: bool = False
    history: list[int] = field(default_factory=list, repr=False)
    rejected_token: int | None = field(default=None, repr=False)
    # The history length from which the budget steering looks at it again (below it the request
    # is far from its budget, fd_guided.budget.far); `SlotTable.advance` hands it back there.
    budget_mark: int = field(default=NO_MARK, repr=False)

    @property
    def in_reasoning(self) -> bool:
        return self.reasoning is not None and self.reasoning.thinking

    @property
    def accepted(self) -> int:
        return len(self.history)
