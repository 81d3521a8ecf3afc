"""CPU path: the C kernel in `_cpu_mask.c` on raw pointers, in the logits' own dtype, zero-copy.

One thread by default (`THREADS`, or FD_GUIDED_CPU_MASK_THREADS): the kernel can split a call's
rows, in units of 16,384 tokens, across pthreads with the GIL released (`_cpu_mask.apply(threads=)`),
but on the 2-core machines measured, shared with Paddle's and torch's pools and other processes, a
second thread waits for a core more often than it finds one (tools/guard_kernel_bench.py,
docs/benchmarks.md); a host with idle cores may raise it (0: every usable core).
The loop is memory bound: it skips all-allowed words, writes -inf only where bits are 0, and on
AVX-512 CPUs streams all-masked 512-token blocks past the cache (non-temporal stores; `_cpu_mask.c`).
If the extension was not built (no compiler at install time), `FAST_PATH_AVAILABLE` is False and
the vectorised torch implementation in `torch_native` runs instead: same results, ~5-10x slower.
"""

from __future__ import annotations

import os
from typing import Any

from .dlpack import dtype_name, is_numpy_array, is_paddle_tensor, is_torch_tensor, to_torch_view

try:
    # The C extension (setup.py): mypy reads no compiled module and it ships no stub.
    from . import _cpu_mask  # type: ignore[attr-defined]
except ImportError:  # optional extension: see setup.py
    _cpu_mask = None

FAST_PATH_AVAILABLE = _cpu_mask is not None
THREADS = int(os.environ.get("FD_GUIDED_CPU_MASK_THREADS", "1"))


def host_pointer(x: Any) -> tuple[int, int, Any]:
    """(data address, row stride in elements, object to keep alive) for a 2-D host array."""
    if is_torch_tensor(x):
        return x.data_ptr(), x.stride(0), x
    if is_paddle_tensor(x):
        return x.data_ptr(), x.strides[0], x  # paddle's data_ptr already includes the view offset
    if is_numpy_array(x):
        return x.ctypes.data, x.strides[0] // x.itemsize, x
    view = to_torch_view(x)
    return view.data_ptr(), view.stride(0), view


def apply_token_bitmask_inplace_cpu(
    logits: Any, bitmask: Any, indices: tuple[int, ...] | None, vocab_size: int
) -> None:
    if _cpu_mask is None:
        from .torch_native import apply_token_bitmask_inplace_torch

        apply_token_bitmask_inplace_torch(logits, bitmask, indices, vocab_size)
        return
    logits_ptr, logits_row_stride, logits_owner = host_pointer(logits)
    bitmask_ptr, bitmask_row_stride, bitmask_owner = host_pointer(bitmask)
    rows = logits.shape[0] if indices is None else min(logits.shape[0], bitmask.shape[0])
    _cpu_mask.apply(
        logits_ptr,
        logits_row_stride,
        dtype_name(logits),
        bitmask_ptr,
        bitmask_row_stride,
        vocab_size,
        rows,
        indices,
        threads=THREADS,
    )
    del logits_owner, bitmask_owner  # alive until the kernel returned
