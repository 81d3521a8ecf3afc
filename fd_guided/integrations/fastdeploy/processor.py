"""FastDeploy's per-request objects: ``LogitsProcessorBase`` and the reasoning parser's one method.

`sampler.GuidedDecoding` drives the manager, not these; they exist for FastDeploy code (and tests)
that use a processor future's result directly, with FastDeploy's names and call shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...interface import CompiledGrammar
from ...kernels import apply_token_bitmask_inplace

if TYPE_CHECKING:  # the backend builds processors; this module needs its type only
    from .backend import FDGuidedBackend


class LogitsProcessor:
    """FastDeploy's per-request processor (``LogitsProcessorBase``) over one fd_guided matcher.

    For FastDeploy code that drives a processor itself; `sampler.GuidedDecoding` uses the manager.
    ``is_terminated`` is a bool ATTRIBUTE, as FastDeploy reads it. A rejected token returns False
    and leaves the matcher unchanged (FastDeploy's own reset it, dropping the constraint).
    """

    def __init__(self, backend: FDGuidedBackend, compiled: CompiledGrammar, enable_thinking: bool | None = False):
        self.backend = backend
        self.compiled = compiled
        self.spec = compiled.spec
        self.enable_reasoning = bool(enable_thinking)
        self.reasoning_ended = False
        self.is_terminated = False
        self._grammar = None

    @property
    def grammar(self):
        if self._grammar is None:
            self._grammar = self.backend.guided_backend.new_grammar(self.compiled)
        return self._grammar

    def allocate_token_bitmask(self):
        return self.backend.allocate_token_bitmask()

    def fill_token_bitmask(self, token_bitmask, idx: int) -> None:
        self.grammar.fill_bitmask(token_bitmask, idx)

    def apply_token_mask(self, logits, token_bitmask, indices: Sequence[int] | None = None):
        apply_token_bitmask_inplace(logits, token_bitmask, indices=indices)
        return logits

    def accept_token(self, token: int) -> bool:
        if self.is_terminated:
            return False
        if not self.grammar.accept_token(int(token)):
            self.backend.metrics.inc("rejected_tokens_total")
            return False
        self.is_terminated = self.grammar.is_terminated()
        return True

    def reset(self) -> None:
        self.grammar.reset()
        self.is_terminated = False
        self.reasoning_ended = False

    def copy(self) -> LogitsProcessor:
        """A fresh processor (start state) for the same compiled grammar and reasoning flag."""
        return LogitsProcessor(self.backend, self.compiled, self.enable_reasoning)


class ReasoningEndParser:
    """The part of FastDeploy's reasoning parser guided decoding uses: the think-end token."""

    def __init__(self, think_end_token_id: int):
        self.think_end_token_id = think_end_token_id

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return self.think_end_token_id in input_ids
