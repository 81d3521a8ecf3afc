"""Bitmask rows on the host: a row (int32 words, bit t of word t // 32 for token t) allowing given
tokens, whether a row allows a token, and a bitmask's host words. Shared by the manager's step and
the budget steering, which both write whole rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def allows(words: np.ndarray, token: int) -> bool:
    """Whether bitmask row `words` allows `token`."""
    word, bit = divmod(token, 32)
    return 0 <= word < words.shape[0] and bool((int(words[word]) >> bit) & 1)


def host_words(bitmask) -> np.ndarray:
    """The bitmask as a writable numpy int32 view (CPU memory, pinned or not)."""
    return bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)


def token_row(token_ids: Sequence[int], words: int) -> np.ndarray:
    """A bitmask row (int32 words) allowing exactly `token_ids` (ids past the row are ignored)."""
    row = np.zeros(words, dtype=np.uint32)
    for token in token_ids:
        if 0 <= token < words * 32:
            row[token >> 5] |= np.uint32(1 << (token & 31))
    return row.view(np.int32)
