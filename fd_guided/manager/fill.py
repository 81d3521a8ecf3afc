"""`BackgroundFill`: a step's bitmask fill, overlapped with the forward, and the upload after it.

The begin hook hands it the rows to fill (`fd_guided.manager.plan.TreeFill` jobs): they are filled
on one background thread while the host runs the forward (or inline, for a model that shares the
CPU with the fill), and `apply` joins it. With CUDA logits and ``FD_GUIDED_BITMASK_PREFETCH=1`` the
fill thread also starts the bitmask's copy to the device on a side stream as soon as the fill ends
(`fd_guided.kernels.prefetch`), so the copy overlaps the forward too; off by default until it has
run on a GPU (docs/integration.md).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..interface import GuidedBackend
from ..kernels.prefetch import BitmaskUploader, Upload, uploader_for
from ..metrics import GuidedMetrics
from .first_masks import FirstMasks
from .plan import TreeFill, fill_trees
from .slot import SlotState, StepTimings


class BackgroundFill:
    """Fills `bitmask` (host words `words`) for one step at a time; owns the fill thread."""

    def __init__(
        self, backend: GuidedBackend, bitmask: Any, words: np.ndarray, timings: StepTimings, metrics: GuidedMetrics
    ):
        self.backend = backend
        self.bitmask = bitmask
        self.words = words
        self.timings = timings
        self.metrics = metrics
        self.prefetch = os.environ.get("FD_GUIDED_BITMASK_PREFETCH", "0") == "1"
        self.uploader: BitmaskUploader | None = None  # made on the first apply with CUDA logits
        self.upload: Upload | None = None  # this step's upload, if the fill thread started one
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-fill")
        self._future: Future | None = None
        # Rows of first states, copied for new requests instead of filled (None: always fill).
        self.first_masks: FirstMasks | None = FirstMasks()

    def first_mask_key(self, state: SlotState):
        """The `FirstMasks` key of `state`'s next root row, or None (not kept: too many tokens in)."""
        if self.first_masks is None or len(state.history) > self.first_masks.max_prefix_tokens:
            return None
        compiled = state.compiled  # its grammar's, kept with it: not asked of the ticket (a lock per row)
        if compiled is None:  # no grammar to fill: nothing to key
            return None
        return self.first_masks.key(compiled.backend_name, state.spec, state.history)

    def start(self, jobs: list[TreeFill], rows: int, *, overlap: bool) -> None:
        """Fill `jobs` (the step has `rows` logits rows): in the background, or now."""
        self.upload = None
        if jobs and overlap:
            self._future = self._pool.submit(self.run, jobs, rows, self.uploader)
        elif jobs:
            self.run(jobs, rows)

    def run(self, jobs: list[TreeFill], rows: int, uploader: BitmaskUploader | None = None) -> None:
        """Fill `jobs` on this thread (timed); then start the upload, if `uploader` is given."""
        started = time.perf_counter()
        to_keep = self._copy_first_masks(jobs)
        fill_trees(self.backend, self.bitmask, self.words, jobs)
        self._keep_first_masks(to_keep)
        if uploader is not None:  # on the fill thread, as soon as the fill ends
            self.upload = uploader.upload(self.bitmask, rows)
        elapsed = time.perf_counter() - started
        self.timings.fill += elapsed
        self.metrics.observe("fill_seconds", elapsed)

    def _copy_first_masks(self, jobs: list[TreeFill]) -> list[TreeFill]:
        """Write the kept rows of first states (those jobs are then done); returns the jobs whose
        row is to be kept once filled."""
        first_masks = self.first_masks
        if first_masks is None:
            return []
        to_keep, copied = [], 0
        for job in jobs:
            if job.first_mask is None or job.closed or job.copied:
                continue
            if first_masks.copy_into(job.first_mask, self.words[job.first_row]):
                job.copied = True  # fill_trees skips it
                copied += 1
            else:
                to_keep.append(job)
        if copied:
            self.metrics.inc("first_mask_rows_total", copied)
        return to_keep

    def _keep_first_masks(self, jobs: list[TreeFill]) -> None:
        first_masks = self.first_masks
        if first_masks is None:
            return
        for job in jobs:
            if not job.root_dead and 0 not in job.invalid and 0 not in job.stops:
                first_masks.keep(job.first_mask, self.words[job.first_row])

    def join(self) -> None:
        """Wait for the background fill (re-raising its error)."""
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def take_upload(self) -> Upload | None:
        """This step's upload, once: `apply` passes it to the kernel (rows written later are copied again)."""
        upload, self.upload = self.upload, None
        return upload

    def watch(self, logits: Any, kernel_impl: str) -> None:
        """After the first apply: make the uploader for CUDA `logits` when prefetch is on."""
        if self.prefetch and self.uploader is None and kernel_impl in ("auto", "cuda"):
            self.uploader = uploader_for(logits, self.bitmask)

    def close(self) -> None:
        self.join()
        self._pool.shutdown(wait=True)
