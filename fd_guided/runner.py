"""The one piece of glue every per-device model runner uses for guided decoding.

A runner (GPU, CPU, XPU-like) inherits `GuidedRunnerMixin` and implements only `device_forward`:
the mixin calls the manager's hooks around it in the fixed order a serving stack needs
(prefill-done -> begin_step -> forward -> apply -> [host samples] -> accept). Device runners
differ in where the model runs and which mask kernel path they use, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from .manager import GuidedDecodingManager, GuidedFinish


class GuidedRunnerMixin:
    """Guided-decoding hooks shared by every device runner.

    Subclasses set `device` (a Paddle device string) and `kernel_impl` (a `fd_guided.kernels`
    path) and implement `device_forward(chunks) -> logits`.
    """

    device: ClassVar[str] = "cpu"
    kernel_impl: ClassVar[str] = "auto"
    guided: GuidedDecodingManager | None = None

    def attach_guided(self, manager: GuidedDecodingManager | None) -> None:
        """Use `manager` for guided requests (None: this runner serves unguided requests only)."""
        if manager is not None:
            manager.kernel_impl = self.kernel_impl
        self.guided = manager

    def device_forward(self, chunks: Sequence[Any]):
        raise NotImplementedError

    def execute_step(self, chunks: Sequence[Any], rows: Sequence[int | None], prefill_done: Sequence[int]):
        """Run one forward with guided masking; `rows[i]` is the slot of logits row i."""
        if self.guided is None:
            return self.device_forward(chunks)
        self.guided.mark_prefill_done(prefill_done)
        self.guided.begin_step(rows)
        logits = self.device_forward(chunks)
        # In place: None. A baseline manager (duck-typed, not a GuidedDecodingManager) may return a copy.
        masked = self.guided.apply(logits)  # type: ignore[func-returns-value]
        return logits if masked is None else masked

    def execute_speculative_step(
        self,
        chunks: Sequence[Any],
        slots: Sequence[int | None],
        drafts: Sequence[Sequence[int]],
        prefill_done: Sequence[int],
    ):
        """Run one verification forward with guided masking: request i (slot `slots[i]`) owns
        ``len(drafts[i]) + 1`` consecutive logits rows (`GuidedDecodingManager.begin_speculative_step`)."""
        if self.guided is None:
            return self.device_forward(chunks)
        self.guided.mark_prefill_done(prefill_done)
        self.guided.begin_speculative_step(slots, drafts)
        logits = self.device_forward(chunks)
        self.guided.apply(logits)
        return logits

    def after_verify(self, accepted: Sequence[Sequence[int]]) -> list[GuidedFinish]:
        """Advance matchers with each request's accepted drafts and sampled token."""
        if self.guided is None:
            return []
        return self.guided.accept_speculative(accepted)

    def after_sample(self, token_ids: Sequence[int]) -> list[GuidedFinish]:
        """Advance matchers with the sampled tokens; returns slots the grammar finished."""
        if self.guided is None:
            return []
        return self.guided.accept(token_ids)
