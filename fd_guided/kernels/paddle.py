"""Paddle-native path for devices that are neither CPU nor CUDA-with-torch (XPU, NPU, DCU, custom).
Needs no torch (a torch bitmask is read through its own .numpy()).

Only the bitmask rows to apply travel to the logits' place; they are unpacked there with Paddle ops
and the logits are masked with `masked_fill_` on a slice view, so the logits never leave their
device and the caller's tensor object is the one that changes. With `indices`, the rows in between
get an all-allowed mask so one masked_fill_ covers them without changing their values.
"""

from __future__ import annotations

from typing import Any

from .dlpack import CPU, device_kind, is_numpy_array, is_paddle_tensor, is_torch_tensor, to_paddle_view

_BITS_PER_WORD = 32
_ALL_ALLOWED = -1

# 1 << j as int32; bit 31 is the sign bit. AND + compare needs no shift kernel on the device.
_BIT_VALUES = [1 << j for j in range(_BITS_PER_WORD - 1)] + [-(1 << (_BITS_PER_WORD - 1))]


def _host_rows(bitmask: Any, indices: tuple[int, ...] | None, rows: int, words: int):
    """Selected bitmask rows as a small contiguous int32 numpy array (host side)."""
    import numpy as np

    if is_numpy_array(bitmask):
        host = bitmask
    elif is_paddle_tensor(bitmask) or is_torch_tensor(bitmask):  # torch: pinned memory too
        host = bitmask.numpy()
    else:
        host = np.from_dlpack(bitmask)
    host = host[:, :words]
    if indices is None:
        return np.ascontiguousarray(host[:rows])
    selected = np.full((max(indices) + 1, words), _ALL_ALLOWED, dtype=np.int32)
    selected[list(indices)] = host[list(indices)]
    return selected


def _device_rows(bitmask: Any, indices: tuple[int, ...] | None, rows: int, words: int, place):
    """The same rows, built with Paddle ops where a bitmask already lives on the logits' device."""
    import numpy as np
    import paddle

    device_bitmask = to_paddle_view(bitmask)[:, :words]
    if indices is None:
        return device_bitmask[:rows]
    index = paddle.to_tensor(list(indices), dtype="int64", place=place)
    all_allowed = np.full((max(indices) + 1, words), _ALL_ALLOWED, dtype=np.int32)
    selected = paddle.to_tensor(all_allowed, place=place)
    return paddle.scatter(selected, index, paddle.index_select(device_bitmask, index))


def apply_token_bitmask_inplace_paddle(
    logits: Any, bitmask: Any, indices: tuple[int, ...] | None, vocab_size: int
) -> None:
    import paddle

    target = to_paddle_view(logits)
    words = (vocab_size + _BITS_PER_WORD - 1) // _BITS_PER_WORD
    if device_kind(bitmask) == CPU:
        rows = paddle.to_tensor(_host_rows(bitmask, indices, target.shape[0], words), place=target.place)
    else:
        rows = _device_rows(bitmask, indices, target.shape[0], words, target.place)
    bit_values = paddle.to_tensor(_BIT_VALUES, dtype="int32", place=target.place)
    masked = paddle.bitwise_and(rows.unsqueeze(-1), bit_values) == 0
    masked = masked.reshape([rows.shape[0], words * _BITS_PER_WORD])[:, :vocab_size]
    target[: rows.shape[0], :vocab_size].masked_fill_(masked, float("-inf"))
