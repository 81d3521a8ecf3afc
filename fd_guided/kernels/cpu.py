"""CPU path: the C kernel in `_cpu_mask.c` on raw pointers, in the logits' own dtype, zero-copy.

Single-threaded on purpose: Paddle's and torch's thread pools already compete for the cores, and
the loop is memory bound (it skips all-allowed words and streams -inf over all-masked runs).
If the extension was not built (no compiler at install time), `FAST_PATH_AVAILABLE` is False and
the vectorised torch implementation in `torch_native` runs instead: same results, ~5-10x slower.
"""
from __future__ import annotations

from typing import Any

from .dlpack import dtype_name, is_numpy_array, is_paddle_tensor, is_torch_tensor, to_torch_view

try:
    from . import _cpu_mask
except ImportError:  # optional extension: see setup.py
    _cpu_mask = None

FAST_PATH_AVAILABLE = _cpu_mask is not None


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
        logits_ptr, logits_row_stride, dtype_name(logits), bitmask_ptr, bitmask_row_stride,
        vocab_size, rows, indices,
    )
    del logits_owner, bitmask_owner  # alive until the kernel returned
