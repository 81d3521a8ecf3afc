"""`FirstMasks`: the bitmask rows of a grammar's first states, kept so a new request's first rows
are copied instead of filled.

A matcher's state, and so its mask, is a function of the compiled grammar and the tokens it
accepted (the uniqueItems guard's restriction too: it follows the same tokens). Every request of
one constraint starts at the same state, and most take the same first token or two (``{"``), so
the rows of those first states repeat across requests. They are also the slow ones where an
engine builds its first lexer states: llguidance's fills over 200 us sit in an output's first
three steps (docs/benchmarks.md, issue #25 item 2), ~0.3-1 ms each, against ~1 us to copy a
129,280-token row. The step's fill (`fd_guided.manager.fill.BackgroundFill`) copies a row kept
here for a request whose accepted tokens are a short prefix, and keeps the rows it fills for such
prefixes.

Keys are ``(engine, spec, prefix)``: the spec is the compile cache's key, and one engine compiles
one spec to the same grammar every time, so a row stays right after its grammar left the compile
cache and came back. Rows are bounded in bytes (least recently used dropped first). Only plain
root rows are kept: a row written from a budget's candidates (`fd_guided.budget.closing`), a
draft node's row or an empty row (a dead end, the request fails) never are.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np

# The prefixes kept: the start state and the states after one or two tokens (where the first
# fills' cost sits; later states spread and rarely repeat across requests).
MAX_PREFIX_TOKENS = 2
# 8 MiB: 512 rows of a 129,280-token vocabulary (16 KiB each).
MAX_BYTES = 8 << 20


class FirstMasks:
    """Rows of first states by ``(engine, spec, accepted tokens)``; thread-safe, bounded in bytes."""

    def __init__(self, max_prefix_tokens: int = MAX_PREFIX_TOKENS, max_bytes: int = MAX_BYTES):
        if max_prefix_tokens < 0 or max_bytes < 0:
            raise ValueError("max_prefix_tokens and max_bytes must be >= 0")
        self.max_prefix_tokens = max_prefix_tokens
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self._rows: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, engine: str, spec: Hashable, accepted: Sequence[int]) -> Hashable | None:
        """The key of the state after `accepted`, or None when that prefix is too long to keep."""
        if self.max_bytes == 0 or len(accepted) > self.max_prefix_tokens:
            return None
        return (engine, spec, tuple(accepted))

    def copy_into(self, key: Hashable, row: np.ndarray) -> bool:
        """Write the row kept for `key` into `row` (a host words row); False when none is kept."""
        with self._lock:
            kept = self._rows.get(key)
            if kept is None:
                self.misses += 1
                return False
            self._rows.move_to_end(key)
            self.hits += 1
        row[:] = kept
        return True

    def keep(self, key: Hashable, row: np.ndarray) -> None:
        """Keep a copy of `row`, just filled for `key`'s state (an empty row is not kept)."""
        if row.nbytes > self.max_bytes or not row.any():
            return
        copy = row.copy()
        with self._lock:
            previous = self._rows.pop(key, None)
            if previous is not None:
                self.size_bytes -= previous.nbytes
            self._rows[key] = copy
            self.size_bytes += copy.nbytes
            while self.size_bytes > self.max_bytes:
                _, dropped = self._rows.popitem(last=False)
                self.size_bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._rows)
