"""The guard's decisions in C (`_native.c` and the files `native.h` names), for the rows whose state it takes.

When a guard accepts a token, `make_plan` reads its tracker's state from the innermost guarded
array up into a `_native.Plan` (the frames and their phases, the scalar being written, where the
current item began, the array's finished items as canonical keys in a `_native.Used` synced with
`items.Items`, a finite domain's unused spellings). A batched fill then calls `restrict` once: it
decides every planned row with the GIL released, each allowed token the Python tracker would try
decided as `JsonTracker.finishes_duplicate` decides it, and hands back only what Python must
finish. The C side takes open items of any kind (strings, numbers, literals, objects, arrays),
string languages that never run out and finite domains of plain literals; it leaves to Python
(`make_plan` says True) integer items (a 0 is final), strings that can run out, an item it cannot
key, and states nested deeper than `MAX_FRAMES` above the guarded array.

Built optional (setup.py); without it, or with `ENABLED` False, every row takes the Python path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .items import _domain_keys, never_runs_out
from .tracker import (
    _LITERAL,
    _NONE,
    _STRING,
    AFTER_QUOTE,
    CLOSE,
    LITERAL_END,
    LITERAL_START,
    NUMBER_END,
    QUOTE,
    JsonTracker,
)

try:
    # The C extension (setup.py): mypy reads no compiled module and it ships no stub.
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # optional extension: see setup.py
    _native = None

AVAILABLE = _native is not None
ENABLED = AVAILABLE  # tests and benchmarks switch it off to run the Python reference alone
if AVAILABLE and _native.CLASSES != (QUOTE, NUMBER_END, LITERAL_END, CLOSE, AFTER_QUOTE, LITERAL_START):
    raise ImportError("fd_guided.unique._native was built for other token classes: rebuild it")

KIND_OPEN, KIND_LANGUAGE, KIND_FINITE = 0, 1, 2
MAX_FRAMES = _native.MAX_FRAMES if AVAILABLE else 0
_PHASES = {"key": 0, "colon": 1, "value": 2, "comma": 3}
_FRAME_CODES = {(kind, phase): kind.encode() + bytes([code]) for kind in "oa" for phase, code in _PHASES.items()}


def vocab(texts: list[bytes], flags: np.ndarray) -> Any:
    """A tokenizer's `_native.Vocab` (every token's bytes and classes; built once, ~20 ms)."""
    lengths = np.fromiter((len(text) for text in texts), dtype=np.int64, count=len(texts))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return _native.Vocab(b"".join(texts), offsets.tobytes(), np.ascontiguousarray(flags, dtype=np.uint8).tobytes())


def make_plan(tracker: JsonTracker, vocab_of) -> Any:
    """False outside every guarded array; else a `_native.Plan` of the tracker's state for the C
    side, or True where the Python reference decides (module docstring). `vocab_of()` gives the
    tokenizer's `Vocab`."""
    stack = tracker.stack
    frames = tracker.plan_frames
    if frames is None or frames[0] is not stack:  # (a string item keeps its stack across tokens)
        frames = tracker.plan_frames = (stack, _read_frames(stack))
    reading = frames[1]
    if reading.__class__ is bool:
        return reading
    unique, depth, kind, codes, ancestors = reading
    items = unique.items
    if items.native is None:
        items.native = _native.Used()
    if items.native.sync(items.entries, unique.count):
        return True  # an item C cannot key (`canon.c`): Python judges this array's items
    mode, buffer, start = tracker.mode, tracker.buffer, tracker.start
    written = -1
    if not depth and mode == _STRING and not tracker.is_key and not tracker.escape and unique.start == start:
        if buffer.find(b"\\", start + 1) < 0:  # `JsonTracker._open_string_item`, without the copy
            written = start + 1
    literal_left = 0
    if mode == _LITERAL:
        literal_left = (5 if buffer[start] == ord("f") else 4) - (len(buffer) - start)
    child = tracker.next_array_guarded() if mode == _NONE else 1
    fields = (unique.count, unique.start, written, kind, mode, tracker.escape, tracker.is_key, literal_left)
    return _native.Plan(vocab_of(), items.native, buffer, unique.unused, fields + (ancestors, child, depth), codes)


def _read_frames(stack: tuple) -> Any:
    """What a plan reads off the frames: False outside every guarded array, True where the C side
    does not take the innermost one, else (its `Unique`, frames above it, kind, the frame codes
    from it up, whether a guarded array encloses it)."""
    g = len(stack) - 1
    while g >= 0 and (stack[g][0] != "a" or stack[g][4] is None):
        g -= 1
    if g < 0:
        return False
    unique = stack[g][4]
    depth = len(stack) - 1 - g
    if not AVAILABLE or unique.integers or depth >= MAX_FRAMES:
        return True
    if unique.unused is not None:
        if depth or len(_domain_keys(unique.domain)) != len(unique.domain):
            return True  # (an item of a finite domain is a literal; spellings must key apart)
        kind = KIND_FINITE
    elif unique.language is None:
        kind = KIND_OPEN
    elif never_runs_out(unique.language):
        kind = KIND_LANGUAGE
    else:
        return True
    codes = b"".join([_FRAME_CODES[frame[0], frame[3]] for frame in stack[g:]])
    ancestors = any(frame[0] == "a" and frame[4] is not None for frame in stack[:g])
    return unique, depth, kind, codes, ancestors


def is_plan(plan: object) -> bool:
    return AVAILABLE and isinstance(plan, _native.Plan)


def restrict(words_of, bitmask, grammars, rows, guard_type) -> list[tuple[int, list[int] | None]]:
    """Decide the planned rows of the guards among `grammars` (instances of `guard_type`) in C:
    `_native.restrict`. Returns (position, undecided token ids) for the rows Python must finish,
    None for a row without a current plan. `words_of(bitmask)` gives the 2-D 32-bit words."""
    return _native.restrict(words_of, bitmask, grammars, rows, guard_type)


def canon(text: bytes) -> tuple[bytes, bytes] | None:
    """The C side's canonical keys of one JSON value, or None where Python must key it (tests)."""
    return _native.canon(text)
