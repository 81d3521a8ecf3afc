"""A manager that guides the way FastDeploy's xgrammar backend does, for side-by-side benchmarks.

It is correct but slow on purpose, reproducing the prior art's costs so `fd-guided bench` can
report our overhead as a ratio of theirs in one run:
  - compiles are joined (blocking) when the step applies the mask, and the compile cache is
    FastDeploy's hard-coded 4 MiB;
  - bitmask rows are filled serially after the forward, not overlapped with it;
  - off CUDA the logits go through numpy: a copy out, xgrammar's CPU kernel on a float32 torch
    tensor, and a new Paddle tensor back (not in place).
Never use it to serve.
"""

from __future__ import annotations

import time

from fd_guided.manager import GuidedDecodingManager
from fd_guided.manager.plan import EMPTY
from fd_guided.manager.step import BatchStep, StepEntry

FASTDEPLOY_CACHE_BYTES = 4 * 1024 * 1024


class FastDeployStyleStep(BatchStep):
    """The step as FastDeploy's xgrammar backend runs it: nothing starts before the forward."""

    def begin_step(self, rows) -> None:
        self._join_fill()
        self._entries = [StepEntry(slot, row, EMPTY) for row, slot in enumerate(rows)]
        self._rows, self._speculative, self.phase = list(rows), False, "begun"
        self._stop_rows, self._forced_rows = [], {}
        self._deferred = [
            entry
            for entry in self._entries
            if (state := self.slots.get(entry.slot)) is not None and state.prefill_done and state.finish is None
        ]

    def apply(self, logits):
        """Blocking compile joins, serial fill, then the numpy round trip; returns a NEW Paddle tensor."""
        import paddle
        import torch
        import xgrammar as xgr

        started = time.perf_counter()
        self.slots.wait_ready([entry.slot for entry in self._deferred if entry.slot is not None])
        self.timings.compile_wait += time.perf_counter() - started
        jobs = self._resolve_deferred()
        if jobs:
            self._timed_fill(jobs)
        masked: set[int] = set()
        for entry in self._entries:
            self._settle(entry, masked)
        rows = sorted(masked)
        self.phase = "applied"
        started = time.perf_counter()
        if not rows:
            return logits
        host = torch.from_numpy(logits.numpy()).float()
        xgr.apply_token_bitmask_inplace(host, self.bitmask, indices=rows)
        masked_logits = paddle.to_tensor(host.numpy(), dtype=logits.dtype, place=logits.place)
        elapsed = time.perf_counter() - started
        self.timings.apply += elapsed
        self.metrics.observe("apply_seconds", elapsed)
        return masked_logits


class FastDeployStyleManager(GuidedDecodingManager):
    """`GuidedDecodingManager` stepping as FastDeploy does (`FastDeployStyleStep`)."""

    step_class = FastDeployStyleStep
