"""The guard's candidate loop in C (`_native.c`), for the rows whose state it takes.

`row_plan` looks at a tracker and says whether its row is in the state the C loop decides (the
innermost container is a guarded array of string items whose domain never runs out: no finite
domain, no integers, and no language of strings that can run out; between items or inside a
string item with no escape) and, if so, what the loop needs: the item's bytes so far, the phase,
the kind of domain, whether an enclosing array is guarded too, and the used strings, sorted.
`restrict` runs the loop over many rows with the GIL released and hands back, per row, the
candidates it left undecided; the guard asks the Python tracker (the reference) about those.

Built optional (setup.py); without it, or with `ENABLED` False, every row takes the Python path.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .tracker import _MODE_CLASS as MODE_CLASS
from .tracker import AFTER_QUOTE, CLOSE, JsonTracker

try:
    # The C extension (setup.py): mypy reads no compiled module and it ships no stub.
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # optional extension: see setup.py
    _native = None

AVAILABLE = _native is not None
ENABLED = AVAILABLE  # tests and benchmarks switch it off to run the Python reference alone

KIND_OPEN, KIND_LANGUAGE = 0, 1
_NONE, _STRING = 0, 1  # JsonTracker.mode values: the two the C loop takes
MODE_NONE, MODE_STRING = _NONE, _STRING


class TokenTable:
    """Every token's bytes joined, with int64 offsets: what the C loop reads (one per tokenizer)."""

    def __init__(self, texts: Sequence[bytes], flags: np.ndarray):
        lengths = np.fromiter((len(text) for text in texts), dtype=np.int64, count=len(texts))
        self.flat = b"".join(texts)
        self.offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.flags = np.ascontiguousarray(flags, dtype=np.uint8)
        self.num_tokens = len(texts)
        # numpy's `.ctypes.data` costs ~1 us a read: read once (the arrays live as long as the table)
        self.offsets_pointer = self.offsets.ctypes.data
        self.flags_pointer = self.flags.ctypes.data


def row_plan(tracker: JsonTracker) -> tuple | None:
    """(written, phase_comma, kind, no_guarded_ancestor, used) for a row the C loop decides, else
    None; with `written` (the open item's bytes) None between items."""
    stack = tracker.stack
    if not stack:
        return None
    top = stack[-1]
    if top[0] != "a" or top[4] is None:
        return None
    unique = top[4]
    if unique.unused is not None or unique.integers:
        return None
    if unique.language is None:
        kind = KIND_OPEN
    elif never_runs_out(unique.language):
        kind = KIND_LANGUAGE
    else:
        return None
    if tracker.mode == _STRING:
        written = tracker._open_string_item()
        if written is None:
            return None
        phase_comma = 0
    elif tracker.mode == _NONE:
        written, phase_comma = None, int(top[3] == "comma")
    else:
        return None
    ancestors = any(frame[0] == "a" and frame[4] is not None for frame in stack[:-1])
    return written, phase_comma, kind, int(not ancestors), sorted_strings(unique.strings)


def candidates(classes, mode: int, ancestors: bool) -> tuple:
    """The two candidate lists the C loop picks from as `JsonTracker.finishing_classes` does (the
    mode's classes, or only the tokens that end a string and go on when no used string begins
    with the item), each `TokenClasses.id_pointer` (the ids, their bytes and flags packed in
    order); `classes` is the `TokenClasses`."""
    close = CLOSE if ancestors else 0
    return classes.id_pointer(MODE_CLASS[mode] | close), classes.id_pointer(AFTER_QUOTE | close)


@functools.lru_cache(maxsize=256)
def never_runs_out(language: Any) -> bool:
    """Every state of the string language's automaton has infinitely many completions: then its
    liveness test (`items.strings_left`) is true for every prefix and the array is never used up
    (`Unique.exhausted`), so its items are decided as open ones (a quote that ends the token
    still ends an item)."""
    moves = language.dfa.moves
    return bool(moves) and all(state in language._infinite for state in range(len(moves)))


@functools.lru_cache(maxsize=1024)
def sorted_strings(strings: frozenset) -> tuple:
    return tuple(sorted(strings))


def restrict(table: TokenTable, words: np.ndarray, rows: list[tuple]) -> list[list[int]]:
    """`words`: the bitmask as a 2-D uint32/int32 array (rows contiguous); `rows`: (row index,
    plan..., candidates...) per row; returns the undecided ids per row."""
    return _native.restrict(
        table.flat,
        table.offsets_pointer,
        table.num_tokens,
        table.flags_pointer,
        AFTER_QUOTE,
        words.ctypes.data,
        words.strides[0] // 4,
        words.shape[1],
        words.shape[0],
        rows,
    )
