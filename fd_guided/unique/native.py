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

import functools
from typing import Any

import numpy as np

from .by_identity import ByIdentity
from .items import domain_keys, never_runs_out
from .reader import _LITERAL, _NONE, _STRING
from .tracker import (
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
    if frames is None or frames[0] is not stack:  # (a string keeps its stack across tokens)
        frames = tracker.plan_frames = [stack, _read_frames(stack), False, None]
    last = frames[3]
    if last is not None and last[0] == tracker.start and tracker.mode == _STRING and not tracker.escape:
        if tracker.buffer.find(b"\\", last[2]) < 0:  # the same string, grown, no escape in it since
            plan = last[1].at(len(tracker.buffer))
            frames[3] = (last[0], plan, len(tracker.buffer))
            return plan
    reading = frames[1]
    if reading.__class__ is bool:
        return reading
    unique, depth, kind, codes, ancestors, domain = reading
    items = unique.items
    if items.native is None:
        items.native = _native.Used()
    if items.native.sync(items.entries, unique.count):
        return True  # an item C cannot key (`canon.c`): Python judges this array's items
    mode, buffer, start = tracker.mode, tracker.buffer, tracker.start
    written, values = -1, None
    open_string = mode == _STRING and not tracker.is_key and not tracker.escape and buffer.find(b"\\", start + 1) < 0
    if not depth and open_string and unique.start == start:  # `JsonTracker._open_string_item`, without the copy
        written = start + 1
    elif depth == 1 and stack[-1][0] == "o" and stack[-1][3] == "value" and (open_string or mode == _NONE):
        # a member's value in an object item, to come or a string being written: the string values
        # after which closing the object would repeat an item, once per member (the stack stays)
        if frames[2] is False:
            key = stack[-1][2].encode("utf-8", "surrogatepass")
            written_so_far = bytes(buffer[unique.start : start if open_string else None])
            frames[2] = items.native.values_for(written_so_far, key, unique.count)
        values = frames[2]  # (None: C cannot key the item: the machine keys each end)
        if values is not None and open_string:
            written = start + 1
    literal_left = 0
    if mode == _LITERAL:
        literal_left = (5 if buffer[start] == ord("f") else 4) - (len(buffer) - start)
    # Whether an array opened next may be guarded (0: surely not); 1 leaves such an array to
    # Python. A finite domain's items are literals, so no array opens where the engine is right,
    # and finding out cost a node-set walk per item per row (~20-70 us, the item index is new).
    child = tracker.next_array_guarded() if mode == _NONE and kind != KIND_FINITE else 1
    fields: tuple = (unique.count, unique.start, written, kind, mode, tracker.escape, tracker.is_key, literal_left)
    fields += (ancestors, child, depth)
    plan = _native.Plan(vocab_of(), items.native, buffer, unique.unused, fields, codes, values, domain)
    # Inside a string with no escape, a later token that stays in it moves only the byte count
    # (finite domains and strings whose escapes change `written` are planned afresh).
    reusable = mode == _STRING and not tracker.escape and (written >= 0 or kind != KIND_FINITE)
    frames[3] = (start, plan, len(buffer)) if reusable else None
    return plan


def _read_frames(stack: tuple) -> Any:
    """What a plan reads off the frames: False outside every guarded array, True where the C side
    does not take the innermost one, else (its `Unique`, frames above it, kind, the frame codes
    from it up, whether a guarded array encloses it, a finite domain's `_native.Domain` or None)."""
    g = len(stack) - 1
    while g >= 0 and (stack[g][0] != "a" or stack[g][4] is None):
        g -= 1
    if g < 0:
        return False
    unique = stack[g][4]
    depth = len(stack) - 1 - g
    if not AVAILABLE or unique.integers or depth >= MAX_FRAMES:
        return True
    domain = None
    if unique.unused is not None:
        domain = _domain_of(unique.domain)
        if depth or domain is None:
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
    return unique, depth, kind, codes, ancestors, domain


_DOMAINS = ByIdentity(256)  # spellings -> its Domain or None


def _domain_of(spellings: tuple[bytes, ...]) -> Any:
    """`native_domain` of a finite domain whose spellings key apart (else None: Python decides),
    found by the tuple's identity (`items.sorted_texts` shares one per domain): a lookup by its
    500 texts' hash and comparison, per item start and end per row, cost more than the plan."""
    return _DOMAINS.get(spellings, _domain_made, spellings)


def _domain_made(spellings: tuple[bytes, ...]) -> Any:
    keyed_apart = len(domain_keys(spellings)) == len(spellings)
    return native_domain(spellings) if keyed_apart else None


@functools.lru_cache(maxsize=64)
def native_domain(spellings: tuple[bytes, ...]) -> Any:
    """The `_native.Domain` of a finite domain's sorted spellings, one per domain (equal tuples
    share it): its cache of which spellings each token reaches from an item's bytes so far
    serves every request whose array takes its items from that domain."""
    return _native.Domain(spellings)


def is_plan(plan: object) -> bool:
    return AVAILABLE and isinstance(plan, _native.Plan)


def restrict(words_of, bitmask, grammars, rows, guard_type) -> list[tuple[int, list[int] | None]]:
    """Decide the planned rows of the guards among `grammars` (instances of `guard_type`) in C:
    `_native.restrict`. Returns (position, undecided token ids) for the rows Python must finish,
    None for a row without a current plan. `words_of(bitmask)` gives the 2-D 32-bit words."""
    return _native.restrict(words_of, bitmask, grammars, rows, guard_type)


# push_plain(tracker, data) -> True | False | None: a token of plain bytes (no quote, no backslash)
# inside a string, pushed into `tracker` with its plan grown as `JsonTracker.push` and `make_plan`
# would (push.c: no Python code; most tokens of a guarded output): True pushed, False refused (a
# finite item's dead end; the state as it was), None where this is not such a step (the caller
# then runs the Python path). The C function itself: `accept_token` calls it once per token.
push_plain: Any = _native.push_plain if AVAILABLE else None


def canon(text: bytes) -> tuple[bytes, bytes] | None:
    """The C side's canonical keys of one JSON value, or None where Python must key it (tests)."""
    return _native.canon(text)
