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

from .manager import GuidedDecodingManager

FASTDEPLOY_CACHE_BYTES = 4 * 1024 * 1024


class FastDeployStyleManager(GuidedDecodingManager):
    def begin_step(self, rows) -> None:
        self._join_fill()
        self._rows = list(rows)
        self._phase = "begun"
        self._masked_rows, self._stop_rows = [], []
        self._deferred_rows = [
            row for row, slot in enumerate(self._rows)
            if slot is not None and slot in self._slots and self._slots[slot].prefill_done and self._slots[slot].finish is None
        ]

    def apply(self, logits):
        """Blocking compile joins, serial fill, then the numpy round trip; returns a NEW Paddle tensor."""
        import paddle
        import torch
        import xgrammar as xgr

        started = time.perf_counter()
        self.wait_ready([self._rows[r] for r in self._deferred_rows])
        self.timings.compile_wait += time.perf_counter() - started
        rows = self._resolve_deferred()
        if rows:
            self._timed_fill([self._slots[self._rows[r]].grammar for r in rows], rows)
        started = time.perf_counter()
        if not rows:
            return logits
        host = torch.from_numpy(logits.numpy()).float()
        xgr.apply_token_bitmask_inplace(host, self.bitmask, indices=rows)
        masked = paddle.to_tensor(host.numpy(), dtype=logits.dtype, place=logits.place)
        elapsed = time.perf_counter() - started
        self.timings.apply += elapsed
        self.metrics.observe("apply_seconds", elapsed)
        return masked
