"""CUDA path: xgrammar's kernel (Triton by default) on a zero-copy torch view of the logits, run on
the producer's current stream (see dlpack.py for the stream rule). No device-wide sync.

Host bitmask staging, and the rule the caller relies on: **the caller may overwrite its (pinned)
bitmask as soon as apply returns.**
  1. The rows that will be applied (the `indices` rows, else the first logits.shape[0]) are
     gathered on the host into one of two pinned staging slots owned by this module.
  2. One non_blocking host-to-device copy moves them into a persistent device buffer (reused across
     calls: no allocation per step); an event is recorded behind the copy.
  3. A slot is refilled only after its previous copy finished: `event.synchronize()` on that one
     copy, enqueued two calls ago, so in steady state it has long completed and never waits.
  Before overwriting the device buffer, the stream waits (on the GPU) for the previous call's
  kernel, which may have run on another stream.
With `indices`, the compacted rows are scattered on the device back to their row numbers, because
xgrammar applies bitmask row i to logits row i. The row numbers reach xgrammar as a device tensor
copied from pinned memory: given a Python list, xgrammar would copy it from pageable memory, which
may block the host behind the stream's pending work (the forward pass).
Buffers are per thread (no state shared across threads), per device and per bitmask width.

A bitmask already on the device is read through `dlpack.cross_stream_read` when its producer
stream is not the logits' (e.g. a torch bitmask with Paddle logits): waits both ways plus
`record_stream`, on the GPU. Paddle logits whose current stream cannot be wrapped for torch
(`StreamOrderError`) are masked with Paddle's own ops on that stream instead (kernels/paddle.py).

`FD_GUIDED_CUDA_MASK_BACKEND` picks xgrammar's kernel: ``auto``/``triton`` (the default),
``cuda`` (xgrammar's native kernel, built with nvcc on first use, i.e. by `warm_up`; it reads
``min(logits width, words * 32)`` columns and the logits' rows, so it gets the logits sliced to
``vocab_size`` and the bitmask to the rows and words used; its float4 stores assume a 16-byte
aligned row start, so an unaligned view goes to Triton) or ``torch_compile``.
`warm_up` launches every kernel variant a step can hit once, at start-up: Triton compiles a
variant per dtype and argument specialisation on first use, which would otherwise stall a step.
None of this has run on a GPU yet (docs/integration.md).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .dlpack import (
    CUDA,
    StreamOrderError,
    cross_stream_read,
    device_kind,
    is_paddle_tensor,
    producer_stream,
    producer_torch_stream,
    to_torch_view,
)

logger = logging.getLogger(__name__)

# xgrammar backend for CUDA logits (module docstring); read at import, checked at use.
XGRAMMAR_BACKEND = os.environ.get("FD_GUIDED_CUDA_MASK_BACKEND", "auto")
XGRAMMAR_BACKENDS = ("auto", "triton", "cuda", "torch_compile")
_VECTOR_BYTES = 16  # xgrammar's CUDA kernel stores float4
_warned_paddle_fallback = False
_STAGING_SLOTS = 2
_MIN_CAPACITY = 8
_thread_state = threading.local()


class _HostSlot:
    """Pinned staging rows + row numbers, and the event recorded behind their last H2D copy."""

    def __init__(self, capacity: int, width: int):
        import torch

        self.rows = torch.empty((capacity, width), dtype=torch.int32, pin_memory=True)
        self.index = torch.empty((capacity,), dtype=torch.int64, pin_memory=True)
        self.copied = torch.cuda.Event()


class _Staging:
    """Host slots and persistent device buffers for one (device, bitmask width)."""

    def __init__(self, device, capacity: int, width: int):
        import torch

        self.capacity = capacity
        self.slots = [_HostSlot(capacity, width) for _ in range(_STAGING_SLOTS)]
        self.next_slot = 0
        self.device_rows = torch.empty((capacity, width), dtype=torch.int32, device=device)
        self.device_compact = torch.empty((capacity, width), dtype=torch.int32, device=device)
        self.device_index = torch.empty((capacity,), dtype=torch.int64, device=device)
        self.kernel_done = torch.cuda.Event()

    def take_slot(self) -> _HostSlot:
        slot = self.slots[self.next_slot]
        self.next_slot = (self.next_slot + 1) % len(self.slots)
        slot.copied.synchronize()  # that slot's previous copy only; returns at once if never recorded
        return slot

    def drain(self) -> None:
        """Wait until no copy or kernel still reads these buffers (before dropping them)."""
        self.kernel_done.synchronize()
        for slot in self.slots:
            slot.copied.synchronize()


def _stagings() -> dict:
    if not hasattr(_thread_state, "stagings"):
        _thread_state.stagings = {}
    return _thread_state.stagings


def staging_buffers(device_index: int, width: int) -> _Staging | None:
    """This thread's staging for (device, width), if any call created it (for tests and debugging)."""
    return _stagings().get((device_index, width))


def _staging_for(device, rows: int, width: int) -> _Staging:
    stagings = _stagings()
    key = (device.index, width)
    staging = stagings.get(key)
    if staging is None or staging.capacity < rows:
        if staging is not None:
            staging.drain()  # growing is rare; the old buffers must not be freed while in use
        capacity = max(_MIN_CAPACITY, 1 << (rows - 1).bit_length())
        staging = stagings[key] = _Staging(device, capacity, width)
    return staging


def _stage_host_bitmask(staging: _Staging, host, indices: tuple[int, ...] | None, rows: int, stream):
    """Copy the rows to apply to the device.

    Returns (device bitmask indexed like the logits, device int64 row numbers or None).
    """
    import torch

    count = rows if indices is None else len(indices)
    slot = staging.take_slot()
    host_rows = slot.rows[:count]
    if indices is None:
        host_rows.copy_(host[:count])
    else:
        host_index = slot.index[:count]
        host_index.copy_(torch.tensor(indices, dtype=torch.int64))
        torch.index_select(host, 0, host_index, out=host_rows)
    stream.wait_event(staging.kernel_done)  # GPU-side: previous kernel done reading device buffers
    if indices is None:
        device_rows = staging.device_rows[:count]
        device_rows.copy_(host_rows, non_blocking=True)
        slot.copied.record(stream)
        return device_rows, None
    compact = staging.device_compact[:count]
    compact.copy_(host_rows, non_blocking=True)
    device_index = staging.device_index[:count]
    device_index.copy_(host_index, non_blocking=True)
    slot.copied.record(stream)
    staging.device_rows.index_copy_(0, device_index, compact)
    return staging.device_rows[:rows], device_index


def _device_indices(indices: tuple[int, ...], device):
    """Row numbers on `device` through pinned memory (torch's host cache recycles the block)."""
    import torch

    return torch.tensor(indices, dtype=torch.int64).pin_memory().to(device, non_blocking=True)


def apply_token_bitmask_inplace_cuda(
    logits: Any,
    bitmask: Any,
    indices: tuple[int, ...] | None,
    vocab_size: int,
    *,
    backend: Any = None,
    prefetched: Any = None,
) -> None:
    """`prefetched`: a `prefetch.Upload` of this host bitmask (its rows already on their way to
    the device on a side stream): waited for on the GPU instead of staging the rows here."""
    import torch
    import xgrammar

    backend = backend or XGRAMMAR_BACKEND  # one of xgrammar's backend literals, checked here
    if backend not in XGRAMMAR_BACKENDS:
        raise ValueError(f"FD_GUIDED_CUDA_MASK_BACKEND={backend!r}; valid: {', '.join(XGRAMMAR_BACKENDS)}")
    on_device = device_kind(bitmask) == CUDA
    try:
        # Before entering the logits' stream: a torch bitmask's producer is torch's current stream now.
        bitmask_stream = producer_torch_stream(bitmask) if on_device else None
        producer_torch_stream(logits)  # Paddle logits whose stream torch cannot reach: refused here
    except StreamOrderError:
        if not is_paddle_tensor(logits) or (on_device and not is_paddle_tensor(bitmask)):
            raise
        return _on_paddles_stream(logits, bitmask, indices, vocab_size)
    with producer_stream(logits) as stream:
        view = to_torch_view(logits)
        staging, release = None, None
        if on_device:  # already on the device: nothing to stage
            release = cross_stream_read(bitmask_stream, stream)
            device_bitmask = to_torch_view(bitmask)
            device_index = _device_indices(indices, view.device) if indices is not None else None
        elif prefetched is not None:
            device_bitmask = prefetched.device_rows(to_torch_view(bitmask), indices, view.shape[0], stream)
            device_index = _device_indices(indices, view.device) if indices is not None else None
        else:
            host = to_torch_view(bitmask)
            staging = _staging_for(view.device, view.shape[0], host.shape[1])
            device_bitmask, device_index = _stage_host_bitmask(staging, host, indices, view.shape[0], stream)
        index32 = device_index.to(torch.int32) if device_index is not None else None  # xgrammar's CUDA kernel: int32
        if backend == "cuda":
            _native_kernel(xgrammar, view, device_bitmask, index32, vocab_size)
        else:
            xgrammar.apply_token_bitmask_inplace(
                view, device_bitmask, vocab_size=vocab_size, indices=index32, backend=backend
            )
        if staging is not None:
            staging.kernel_done.record(stream)
        if prefetched is not None and not on_device:
            prefetched.kernel_enqueued(stream)
        if release is not None:
            release(device_bitmask)


def _native_kernel(xgrammar, view, device_bitmask, index32, vocab_size: int) -> None:
    """xgrammar's nvcc kernel on exactly the columns and rows it must touch; Triton where its
    vector stores would be misaligned."""
    if view.data_ptr() % _VECTOR_BYTES:
        xgrammar.apply_token_bitmask_inplace(
            view, device_bitmask, vocab_size=vocab_size, indices=index32, backend="triton"
        )
        return
    words = (vocab_size + 31) // 32
    rows = device_bitmask if index32 is not None else device_bitmask[: view.shape[0]]
    xgrammar.apply_token_bitmask_inplace(view[:, :vocab_size], rows[:, :words], indices=index32, backend="cuda")


def _on_paddles_stream(logits, bitmask, indices, vocab_size: int) -> None:
    global _warned_paddle_fallback
    if not _warned_paddle_fallback:
        _warned_paddle_fallback = True
        logger.warning(
            "fd_guided: paddle's CUDA stream cannot be reached from torch; masking with paddle ops "
            "on paddle's stream (slower, ordered)"
        )
    from .paddle import apply_token_bitmask_inplace_paddle

    apply_token_bitmask_inplace_paddle(logits, bitmask, indices, vocab_size)


def warm_up(
    vocab_size: int,
    *,
    device: int | None = None,
    dtypes=("float32", "float16", "bfloat16"),
    row_counts=(1, 3),
    backend: str | None = None,
) -> None:
    """Launch every kernel variant a serving step can hit (each dtype, one row and several, all
    rows and an `indices` subset) once on small logits of the served width, then wait for them:
    Triton's first-use compiles (and the ``cuda`` backend's nvcc build) happen here, at start-up,
    not inside a step. Allocates this thread's staging buffers for the width too."""
    import torch

    index = torch.cuda.current_device() if device is None else device
    words = (vocab_size + 31) // 32
    host = torch.full((max(row_counts), words), -1, dtype=torch.int32, pin_memory=True)
    host[:, 0] = 0
    with torch.cuda.device(index):
        for dtype in dtypes:
            for rows in row_counts:
                logits = torch.zeros((rows, vocab_size), dtype=getattr(torch, dtype), device=f"cuda:{index}")
                for indices in (None, tuple(range(0, rows, 2))):
                    apply_token_bitmask_inplace_cuda(logits, host, indices, vocab_size, backend=backend)
        torch.cuda.synchronize(index)
