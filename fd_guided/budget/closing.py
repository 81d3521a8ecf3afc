"""Closing rows without a full fill: a row in its closing zone is written from a few candidates.

In its closing zone (see `steer`) a request's row allows at most the tokens that spell the plan's
next bytes within what is left, and the stop tokens, each only where the grammar allows it. The
grammar's full row (a fill over the whole vocabulary: 1-80 us per row on DeepSeek's 129k
vocabulary) is not needed for that: asking the matcher about each candidate (accept, roll back:
~1-3 us each) gives the same row. So the begin hook names a closing row's candidates
(`BudgetSteering.prepare`, after following the plan up to the tokens accepted since the last step)
and the fill thread, where the row would have been filled, writes it from them
(`write_closing_row`). Where the matcher's fill allows a single token for forced bytes
(llguidance keeps them to their canonical tokenization, `Grammar.canonical_forced_token`; its
token check accepts any spelling) the candidates are cut to that token first. Where none is left
the row is filled as usual and `steer` plans again at `apply`.

Sound as the filled row was: a bit is set only for a candidate the matcher accepted from this very
state (a stop token: accepted means the output is complete here) and its fill allows, and
candidates are exactly the tokens `steer` would have kept of the filled row
(tests/budget/test_budget_closing.py compares the rows on every engine).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..interface import Grammar


def write_closing_row(grammar: Grammar, candidates: Sequence[int], words: np.ndarray) -> bool:
    """Write bitmask row `words` (int32 words) allowing the `candidates` that `grammar`'s fill
    would allow from its state (unchanged); False (the row untouched) when it allows none of them."""
    size = words.shape[0]
    forced = grammar.canonical_forced_token()
    if forced is not None:
        candidates = (forced,) if forced in candidates else ()
    keep = [token for token in candidates if (token >> 5) < size and grammar.validate_tokens((token,)) == 1]
    if not keep:
        return False
    bits: dict[int, int] = {}  # word -> its bits, in Python ints (no numpy scalar per token)
    for token in keep:
        bits[token >> 5] = bits.get(token >> 5, 0) | 1 << (token & 31)
    row = words.view(np.uint32)
    row.fill(0)
    for word, value in bits.items():
        row[word] = value
    return True
