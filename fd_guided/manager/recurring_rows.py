"""`RecurringRows`: rows of deeper states of the engines whose masks cost most, kept so a request
that reaches a state by the same tokens as an earlier one copies its row instead of filling it.

`fd_guided.manager.first_masks` keeps the rows of a grammar's first states (at most two tokens in).
Past those, llguidance's fills stay slow where it enforces a pattern alone: inside a key under
``patternProperties`` or a ``pattern`` string, at a state where the lexeme may end, its slicer does
not apply and each fill walks the whole token trie (~1.5-2.5 ms for 129,280 tokens, every time the
state is reached: the lexer's caches do not make it cheaper; docs/benchmarks.md, issue #25 item 2).
Requests of one constraint often share more than their first tokens (the same keys in the same
order, the same values), so those states recur. A mask is a function of the compiled grammar and
the tokens it accepted (the uniqueItems guard's restriction too), so a row kept under
``(engine, spec, accepted tokens)`` is exactly the row the engine would fill there.

Only the engines in `engines` (llguidance by default: xgrammar's fills are ~10-30 us, near the
cost of keeping a row) and prefixes of at most `max_prefix_tokens` tokens are kept (the key hashes
the whole prefix: ~1 us for 256 tokens). Rows are bounded in bytes apart from the first states'
(their own budget: deeper rows, kept at every step of a slow engine's rows, never push a first
state out).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .first_masks import MAX_PREFIX_TOKENS as FIRST_STATES_TOKENS
from .first_masks import FirstMasks

# Rows of these engines' states are kept past the first states.
SLOW_ENGINES = frozenset({"llguidance"})
# The longest prefix kept: hashing it is the cost every row of a slow engine pays per step.
MAX_PREFIX_TOKENS = 256
# 16 MiB: 1,024 rows of a 129,280-token vocabulary.
MAX_BYTES = 16 << 20


class RecurringRows(FirstMasks):
    """Rows of states `min_prefix_tokens`..`max_prefix_tokens` tokens in, of `engines` only, by
    ``(engine, spec, accepted tokens)``; thread-safe, bounded in bytes (least recently used dropped)."""

    def __init__(
        self,
        engines: frozenset[str] = SLOW_ENGINES,
        min_prefix_tokens: int = FIRST_STATES_TOKENS + 1,
        max_prefix_tokens: int = MAX_PREFIX_TOKENS,
        max_bytes: int = MAX_BYTES,
    ):
        super().__init__(max_prefix_tokens=max_prefix_tokens, max_bytes=max_bytes)
        self.engines = engines
        self.min_prefix_tokens = min_prefix_tokens

    def key(self, engine: str, spec: Hashable, accepted: Sequence[int]) -> Hashable | None:
        """The key of the state after `accepted`, or None when it is not kept here (another engine,
        a first state, or a prefix too long)."""
        if engine not in self.engines or len(accepted) < self.min_prefix_tokens:
            return None
        return super().key(engine, spec, accepted)
