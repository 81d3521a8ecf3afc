"""Plain torch implementation: the correctness oracle, and the CPU fallback when the C extension is
not built. Vectorised (unpack the rows' bits, one masked_fill), any torch device, not tuned.
"""

from __future__ import annotations

from typing import Any

from .dlpack import producer_stream, to_torch_view

_BITS_PER_WORD = 32


def _bit_values(device):
    import torch

    # 1 << j as int32 lanes; bit 31 is the sign bit, i.e. -2**31.
    values = [1 << j for j in range(_BITS_PER_WORD - 1)] + [-(1 << (_BITS_PER_WORD - 1))]
    return torch.tensor(values, dtype=torch.int32, device=device)


def masked_positions(bitmask_rows, vocab_size: int):
    """Bool (rows, vocab_size): True where the token is disallowed."""
    rows = bitmask_rows.shape[0]
    bits = bitmask_rows.unsqueeze(-1) & _bit_values(bitmask_rows.device)
    return (bits == 0).reshape(rows, -1)[:, :vocab_size]


def apply_token_bitmask_inplace_torch(
    logits: Any, bitmask: Any, indices: tuple[int, ...] | None, vocab_size: int
) -> None:
    import torch

    # Bitmask copies to the device are blocking (.to() default): this reference path keeps no
    # staging buffers, and the host may refill a pinned bitmask as soon as we return.
    with producer_stream(logits):
        view = to_torch_view(logits)
        host = to_torch_view(bitmask)
        words = (vocab_size + _BITS_PER_WORD - 1) // _BITS_PER_WORD
        if indices is None:
            rows = view.shape[0]
            masked = masked_positions(host[:rows, :words].to(view.device), vocab_size)
            view[:rows, :vocab_size].masked_fill_(masked, float("-inf"))
            return
        row_index = torch.tensor(indices, dtype=torch.int64)
        selected = host[row_index.to(host.device), :words].to(view.device)
        row_index = row_index.to(view.device)
        masked = masked_positions(selected, vocab_size)
        # index_put_ writes only the selected rows of view's own storage.
        view[row_index, :vocab_size] = view[row_index, :vocab_size].masked_fill(masked, float("-inf"))
