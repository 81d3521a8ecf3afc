"""Which tokens a request near its budget may spend its slack on without growing its completion.

In the closing zone with slack left (``left > need``), a token may also be one that leaves the
plan's rest a completion: it does not make the shortest completion longer, so ``1 + need <= left``
still holds after it. Trying every allowed token would cost a matcher walk each, so the bytes are
judged instead: a byte *keeps* the plan when, after it, the rest of the plan still completes the
output (accept it, accept the rest, one fill for the stop token, roll back). The tokens spelled
only with keeping bytes are allowed (string content and whitespace inside a string, a letter
inside ``[a-z]+``). One row of those per (the grammar's row, the plan's rest): a request inside a
long string pays the walk once, then a cache lookup per step.

Assumed, not checked token by token: a token whose every byte keeps the plan keeps it too. A
multi-byte token can break that (a string at its ``maxLength`` minus one: each byte keeps the
plan, two do not); then the grammar's own row has already refused the token when the string
cannot hold it, and otherwise the plan is searched again after the token, which only shortens it
(the closing bytes ``"`` remain a completion).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..interface import Grammar
from .search import TokenTable

CACHE_ROWS = 256


class SlackTokens:
    """Rows of plan-keeping tokens, cached per (grammar row, plan rest)."""

    def __init__(self, table: TokenTable, vocab_size: int):
        self.table = table
        self.vocab_size = vocab_size
        self._byte_sets: np.ndarray | None = None
        self._cache: OrderedDict[tuple[int, bytes], np.ndarray] = OrderedDict()

    def row(
        self, grammar: Grammar, words: np.ndarray, rest_text: bytes, rest_tokens: Sequence[int], completes
    ) -> np.ndarray:
        """The int32 bitmask row of tokens made only of bytes after which `rest_tokens` (spelling
        `rest_text`) still complete the grammar; `words` is the grammar's filled row here and
        `completes(grammar, tokens)` the check (state unchanged)."""
        key = (hash(words.tobytes()), rest_text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        keeping = np.zeros(4, dtype=np.uint64)
        for byte in self.table.allowed_bytes(words):
            token = int(self.table.byte_token[byte])
            if not grammar.accept_token(token):
                continue
            try:
                if completes(grammar, list(rest_tokens)):
                    keeping[int(byte) >> 6] |= np.uint64(1) << np.uint64(int(byte) & 63)
            finally:
                grammar.rollback(1)
        row = self._tokens_within(keeping, words.shape[0])
        self._cache[key] = row
        if len(self._cache) > CACHE_ROWS:
            self._cache.popitem(last=False)
        return row

    def _tokens_within(self, keeping: np.ndarray, words: int) -> np.ndarray:
        sets = self.byte_sets
        inside = ~np.any(sets & ~keeping, axis=1)
        inside &= np.any(sets != 0, axis=1)  # no special tokens (they spell no bytes)
        bits = np.zeros(words * 32, dtype=bool)
        bits[: len(inside)] = inside
        return np.packbits(bits, bitorder="little").view(np.int32)

    @property
    def byte_sets(self) -> np.ndarray:
        """(tokens, 4) uint64: the set of bytes each token is spelled with (empty for special tokens)."""
        if self._byte_sets is None:
            sets = np.zeros((len(self.table.bytes_of), 4), dtype=np.uint64)
            for token, text in enumerate(self.table.bytes_of):
                if text:
                    for byte in set(text):
                        sets[token, byte >> 6] |= np.uint64(1) << np.uint64(byte & 63)
            self._byte_sets = sets
        return self._byte_sets
