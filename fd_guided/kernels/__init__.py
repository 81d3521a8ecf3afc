"""Apply a token bitmask to logits in place, on whatever device the logits live.

One contract, every device path (`impl`):

    apply_token_bitmask_inplace(logits, bitmask, indices=None, *, vocab_size=None, impl="auto")

logits      2-D (rows, V_logits) float32 / float16 / bfloat16: a paddle.Tensor (any place), a
            torch.Tensor, or any DLPack producer (CuPy, numpy...). Rows may be strided (a slice
            `big[:, :V]` of a wider tensor) but the vocab dimension must have stride 1: otherwise
            ValueError (in-place masking cannot go through a contiguous copy).
bitmask     int32 (rows_b, W), W >= ceil(vocab_size / 32). Bit j of word w (little-endian within the
            int32: `(word >> j) & 1`) is token w*32 + j; 1 = allowed, 0 = masked. Usually a (pinned)
            torch CPU tensor; any DLPack/numpy int32 array works, on the CPU or on the logits' device.
indices     None: bitmask row i masks logits row i for every i < rows (bitmask may have more
            rows). A sequence of ints: only those logits rows are touched, each with the bitmask
            row of the same number; the other rows stay bit-identical (mixed guided/unguided batch).
vocab_size  Columns considered. Default min(V_logits, W * 32). Logits columns at and beyond it are
            left untouched, as xgrammar does: allocate the bitmask for the padded vocab (or fill its
            padding bits with 0) if padded ids must never be sampled.
impl        "auto": CUDA logits -> "cuda", CPU logits -> "cpu", any other place (XPU, NPU, custom
            device) -> "paddle". "cpu": C kernel (torch fallback if the extension is not built).
            "paddle": Paddle ops on the logits' own place. "cuda": xgrammar's kernel on a DLPack
            view, on the producer's current stream. "torch": plain torch reference (oracle/fallback).

Masked entries become -inf (bit pattern of the logits' dtype), in place; returns None.
Errors: TypeError for a wrong dtype or type (bitmask not int32, logits not float, non-int
indices), ValueError for wrong ndim, non-unit vocab stride, a bitmask with too few rows or too
few words, an index out of range, a vocab_size out of range, an unknown impl, or an impl that
cannot run on the logits' device. Nothing is written when an argument is rejected.

Each implementation lives in its own module, imported only when chosen, so a CPU-only process never
loads Triton or xgrammar's CUDA kernels, and a Paddle-only device never needs torch.
"""

from __future__ import annotations

import functools
import importlib
import operator
from collections.abc import Sequence
from typing import Any

from .dlpack import CPU, CUDA, device_kind, dtype_name, element_strides, to_paddle_view, to_torch_view

__all__ = [
    "IMPLS",
    "allocate_pinned_bitmask",
    "apply_token_bitmask_inplace",
    "bitmask_width",
    "to_paddle_view",
    "to_torch_view",
    "warm_up_cuda",
]

IMPLS = ("auto", "cpu", "paddle", "cuda", "torch")
BITS_PER_WORD = 32
LOGITS_DTYPES = ("float32", "float16", "bfloat16")

# impl -> (module, function). Each function takes validated arguments:
# (logits, bitmask, indices: tuple[int, ...] | None, vocab_size: int).
_IMPLEMENTATIONS = {
    "cpu": (".cpu", "apply_token_bitmask_inplace_cpu"),
    "paddle": (".paddle", "apply_token_bitmask_inplace_paddle"),
    "cuda": (".cuda", "apply_token_bitmask_inplace_cuda"),
    "torch": (".torch_native", "apply_token_bitmask_inplace_torch"),
}
_AUTO_IMPL = {CPU: "cpu", CUDA: "cuda"}  # every other device kind -> "paddle"
_IMPL_DEVICE = {"cpu": CPU, "cuda": CUDA}  # impls bound to one device kind


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words per bitmask row: ceil(vocab_size / 32)."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allocate_pinned_bitmask(rows: int, vocab_size: int):
    """A (rows, bitmask_width(vocab_size)) int32 torch CPU tensor, all tokens allowed (-1).

    Pinned when CUDA is available (so `impl="cuda"` copies it asynchronously), plain otherwise.
    """
    import torch

    return torch.full(
        (rows, bitmask_width(vocab_size)),
        -1,
        dtype=torch.int32,
        pin_memory=torch.cuda.is_available(),
    )


def warm_up_cuda(vocab_size: int, **options) -> None:
    """Launch the CUDA path's kernel variants once at start-up (`fd_guided.kernels.cuda.warm_up`)."""
    from .cuda import warm_up

    warm_up(vocab_size, **options)


def apply_token_bitmask_inplace(
    logits: Any,
    bitmask: Any,
    indices: Sequence[int] | None = None,
    *,
    vocab_size: int | None = None,
    impl: str = "auto",
    prefetched: Any = None,
) -> None:
    """Set logits[i, t] = -inf in place wherever bitmask row i disallows token t (module docstring).

    `prefetched` (CUDA only): the `fd_guided.kernels.prefetch.Upload` of this host bitmask made
    when its fill ended, so the copy overlapped the forward; None stages the rows here."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
    kind = device_kind(logits)
    impl = _AUTO_IMPL.get(kind, "paddle") if impl == "auto" else impl
    required = _IMPL_DEVICE.get(impl)
    if required is not None and kind != required:
        raise ValueError(f"impl={impl!r} needs {required} logits, got logits on a {kind} device")
    _validate_bitmask_device(bitmask, kind)
    rows, vocab_size = _validate_shapes(logits, bitmask, vocab_size)
    indices = _validate_indices(indices, rows, bitmask.shape[0])
    if prefetched is not None and impl != "cuda":
        raise ValueError(f"prefetched uploads are for impl='cuda', got impl={impl!r}")
    if vocab_size == 0 or rows == 0 or indices == ():
        return None
    if prefetched is not None:
        _implementation(impl)(logits, bitmask, indices, vocab_size, prefetched=prefetched)
        return None
    _implementation(impl)(logits, bitmask, indices, vocab_size)
    return None


@functools.cache
def _implementation(impl: str):
    """Imports the impl's module on first use only (a CPU-only process never loads the CUDA path)."""
    module_name, function_name = _IMPLEMENTATIONS[impl]
    return getattr(importlib.import_module(module_name, __name__), function_name)


def _validate_shapes(logits: Any, bitmask: Any, vocab_size: int | None) -> tuple[int, int]:
    """Checks dtypes, ndim and strides; returns (logits rows, resolved vocab_size)."""
    if len(logits.shape) != 2:
        raise ValueError(f"logits must be 2-D (rows, vocab), got shape {tuple(logits.shape)}")
    if len(bitmask.shape) != 2:
        raise ValueError(f"bitmask must be 2-D (rows, words), got shape {tuple(bitmask.shape)}")
    logits_dtype, bitmask_dtype = dtype_name(logits), dtype_name(bitmask)
    if logits_dtype not in LOGITS_DTYPES:
        raise TypeError(f"logits dtype must be one of {', '.join(LOGITS_DTYPES)}, got {logits_dtype}")
    if bitmask_dtype != "int32":
        raise TypeError(f"bitmask dtype must be int32, got {bitmask_dtype}")
    rows, width = int(logits.shape[0]), int(logits.shape[1])
    words = int(bitmask.shape[1])
    if width > 1 and (strides := element_strides(logits))[1] != 1:
        raise ValueError(
            "logits must have stride 1 along the vocab dimension (in-place masking cannot go "
            f"through a copy), got strides {strides}"
        )
    if words > 1 and (strides := element_strides(bitmask))[1] != 1:
        raise ValueError(f"bitmask must have stride 1 along its words, got {strides}")
    if vocab_size is None:
        return rows, min(width, words * BITS_PER_WORD)
    vocab_size = operator.index(vocab_size)
    if not 0 <= vocab_size <= width:
        raise ValueError(f"vocab_size={vocab_size} is outside [0, logits width {width}]")
    if vocab_size > words * BITS_PER_WORD:
        raise ValueError(
            f"bitmask too narrow: {words} words cover {words * BITS_PER_WORD} tokens, vocab_size={vocab_size}"
        )
    return rows, vocab_size


def _validate_bitmask_device(bitmask: Any, logits_kind: str) -> None:
    kind = device_kind(bitmask)
    if kind != CPU and kind != logits_kind:
        raise ValueError(f"bitmask must be on the CPU or on the logits' device ({logits_kind}), got {kind}")


def _validate_indices(indices: Any, rows: int, bitmask_rows: int) -> tuple[int, ...] | None:
    """None (all rows; needs bitmask_rows >= rows) or a tuple of in-range row numbers."""
    if indices is None:
        if bitmask_rows < rows:
            raise ValueError(f"bitmask too small for the rows: {bitmask_rows} bitmask rows, {rows} logits rows")
        return None
    if hasattr(indices, "tolist"):  # torch / paddle / numpy index arrays
        indices = indices.tolist()
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
        raise TypeError(f"indices must be a sequence of ints or None, got {type(indices).__name__}")
    normalized = []
    for position, index in enumerate(indices):
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"indices must be row numbers (ints), got {index!r} at position {position}")
        index = operator.index(index)
        if not 0 <= index < min(rows, bitmask_rows):
            raise ValueError(
                f"indices[{position}] = {index} out of range: {rows} logits rows, {bitmask_rows} bitmask rows"
            )
        normalized.append(index)
    return tuple(normalized)
