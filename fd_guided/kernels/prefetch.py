"""Bitmask rows on their way to the GPU as soon as they are filled, overlapping the forward (CUDA).

Without it the host-to-device copy of a step's bitmask is queued at apply time on the logits'
stream, behind the forward: only the CPU fill overlaps the forward, the copy does not. With it:

    fill thread, when the fill ends:   upload = uploader.upload(bitmask, rows)
        the rows are copied into one of two pinned slots (double-buffered: the next step fills
        the host bitmask while this copy is in flight), then to one of two device buffers on the
        uploader's own side stream, and an event is recorded behind the copy
    apply:                             apply_token_bitmask_inplace(logits, bitmask, rows, prefetched=upload)
        the logits' stream waits for that event on the GPU (no host wait); rows the host wrote
        after the upload (stop rows, forced rows, late fills) are found by comparing with the
        pinned snapshot and copied again, alone; the kernel reads the device buffer; an event
        behind the kernel keeps the next upload into that buffer from overtaking it.

An `Upload` serves one apply. A `BitmaskUploader` belongs to one manager (one bitmask, one
device); its uploads may come from any one thread at a time. Not run on a GPU yet.
"""

from __future__ import annotations

from typing import Any

from .dlpack import CUDA, cuda_device_index, device_kind, to_torch_view

_BUFFERS = 2


class Upload:
    """One `BitmaskUploader.upload`: rows [0, rows) of the host bitmask, copied to device buffer
    `buffer` behind `copied` (an event on the uploader's side stream)."""

    def __init__(self, uploader: BitmaskUploader, buffer: int, rows: int):
        self.uploader, self.buffer, self.rows = uploader, buffer, rows
        self.used = False

    def device_rows(self, host, indices: tuple[int, ...] | None, rows: int, stream):
        """On `stream` (the logits' stream): wait for the copy, re-copy the rows the host changed
        since, and return the device bitmask indexed like the logits."""
        import numpy as np
        import torch

        if self.used:
            raise ValueError("this bitmask upload was applied already: upload once per step")
        self.used = True
        uploader = self.uploader
        stream.wait_event(uploader.copied[self.buffer])
        device = uploader.device[self.buffer]
        wanted = np.arange(rows) if indices is None else np.asarray(indices, dtype=np.int64)
        if len(wanted) == 0:
            return device[:rows]
        host_words = host.numpy()
        snapshot = uploader.host[self.buffer].numpy()
        late = wanted[wanted >= self.rows]
        early = wanted[wanted < self.rows]
        changed = early[(host_words[early] != snapshot[early]).any(axis=1)] if len(early) else early
        patch = np.concatenate([changed, late])
        if len(patch):
            rows_host = torch.from_numpy(np.ascontiguousarray(host_words[patch])).pin_memory()
            index_host = torch.from_numpy(patch.astype(np.int64)).pin_memory()
            rows_device = rows_host.to(device.device, non_blocking=True)
            index_device = index_host.to(device.device, non_blocking=True)
            device.index_copy_(0, index_device, rows_device)
        uploader.patched_rows += len(patch)
        return device[:rows]

    def kernel_enqueued(self, stream) -> None:
        self.uploader.kernel_done[self.buffer].record(stream)


class BitmaskUploader:
    """Two pinned slots, two device buffers and a side stream for one host bitmask of
    `capacity` rows x `width` int32 words on CUDA device `device` (module docstring)."""

    def __init__(self, device: Any, capacity: int, width: int):
        import torch

        self.device_index = torch.device(device).index or 0
        target = torch.device("cuda", self.device_index)
        self.capacity, self.width = capacity, width
        with torch.cuda.device(self.device_index):
            self.stream = torch.cuda.Stream(target)
            self.host = [torch.empty((capacity, width), dtype=torch.int32, pin_memory=True) for _ in range(_BUFFERS)]
            self.device = [torch.empty((capacity, width), dtype=torch.int32, device=target) for _ in range(_BUFFERS)]
            self.copied = [torch.cuda.Event() for _ in range(_BUFFERS)]
            self.kernel_done = [torch.cuda.Event() for _ in range(_BUFFERS)]
        self._next = 0
        self.patched_rows = 0  # rows re-copied at apply time (written after their upload), summed

    def upload(self, bitmask: Any, rows: int) -> Upload:
        """Start copying rows [0, rows) of the host `bitmask` to the device now; never waits for
        the GPU (but for the pinned slot's copy of two uploads ago, long done in steady state)."""
        import torch

        if not 0 <= rows <= self.capacity:
            raise ValueError(f"{rows} rows exceed the uploader's capacity of {self.capacity}")
        host = to_torch_view(bitmask)
        if host.device.type != "cpu" or tuple(host.shape[1:]) != (self.width,):
            raise ValueError(
                f"expected a host bitmask of {self.width} words per row, got {tuple(host.shape)} on {host.device}"
            )
        buffer, self._next = self._next, (self._next + 1) % _BUFFERS
        self.copied[buffer].synchronize()  # the pinned slot is free once its last copy ran
        self.host[buffer][:rows].copy_(host[:rows])
        with torch.cuda.device(self.device_index), torch.cuda.stream(self.stream):
            self.stream.wait_event(self.kernel_done[buffer])  # the last kernel that read this buffer
            self.device[buffer][:rows].copy_(self.host[buffer][:rows], non_blocking=True)
            self.copied[buffer].record(self.stream)
        return Upload(self, buffer, rows)


def uploader_for(logits, bitmask) -> BitmaskUploader | None:
    """A `BitmaskUploader` for CUDA `logits`, or None for logits elsewhere."""
    if device_kind(logits) != CUDA:
        return None
    return BitmaskUploader(f"cuda:{cuda_device_index(logits)}", int(bitmask.shape[0]), int(bitmask.shape[1]))
