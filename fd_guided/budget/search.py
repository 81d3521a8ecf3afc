"""The shortest completion of a matcher's state, measured in tokens of the request's tokenizer.

`shortest_completion` drives any `Grammar` (the engine's own matcher, through `fill_bitmask`,
`accept_tokens` and `rollback` only) to a real completion of the output from its current state,
in three steps, cheapest first:

  hints       byte strings believed to complete the output (`spelling`): a start plan written
              from the constraint (`instance.start_candidates`), the rest of the plan a request
              was following, best first. The first the matcher accepts, then a stop token, is
              the answer (`_spelled`: its fewest tokens, or its rows' own where they differ).
  best-first  otherwise a best-first search over the vocabulary's single-byte tokens (a
              byte-level vocabulary has one per byte), ordered by length. The matcher does not
              expose its state, so states are told apart by their allowed-token rows: a node
              whose row equals one already expanded is pushed behind every fresh node (a string
              that only grew, ``"a"`` -> ``"aa"``, is not a new state), not dropped (a counted
              repetition has equal rows on different counts). Each node costs one fill.
  landing     from each node the search also tries the suffixes of its hints and landmarks (the
              texts of the plans the caller's plan descends from: `Plan.landmarks`) that the
              node's row can begin (`Landing`: shortest first, each rejected within a token or
              two): a request that left its plan (opened an optional property, grew a number)
              gets a completion as soon as the search has written its way back onto a known
              completion, not after searching the plan's whole rest again (on a ~70-byte
              document, past 3,000 fills). Once a
              completion is found the search goes on only while a cheaper one can still turn up,
              and at most `after_found` more nodes.

The completion found is spelled in its fewest tokens once the matcher accepted them (or, where
its row refuses the first of them, token by token through the rows: `_spelled`). The search
stops after `max_expansions` nodes (fills: 3-30 us each on DeepSeek's 129k vocabulary). The
matcher is back at its state when this returns.

What the result is: a real completion (the matcher accepted it and then a stop token), so its
length is an upper bound on the shortest completion in tokens. The best-first search alone is
exact in bytes when no expanded row repeated; a hint is as short as whoever wrote it (the start
plans written from a schema are measured against the search in docs/benchmarks.md). Budget
steering relies only on it being a real completion.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from ..interface import Grammar
from .spelling import Landing, allows, completes, landing_for, spell_along_rows, stop_allowed
from .tokens import UNSPELLED, Completion, TokenTable, fewest_tokens, token_table

__all__ = [
    "UNSPELLED",
    "Completion",
    "TokenTable",
    "fewest_tokens",
    "shortest_completion",
    "token_table",
]

# A node whose allowed-token row equals one already expanded is followed by one child only, that
# costs this many bytes more: a string that only grew is rarely a new state, but a counted
# repetition (\d{4}, minItems) is one, so it is followed, not dropped.
_REPEAT_PENALTY = 2
# A byte of a multi-byte UTF-8 character costs more: a character is usually one token, and a
# lead byte opens 64 continuations that would each cost a fill at the same depth.
_NON_ASCII = 3
# A class of more than _WIDE allowed bytes is tried through the _PREFERRED bytes it holds and its
# first _SPREAD others.
_WIDE = 40
_SPREAD = 6
_PREFERRED_BYTES = b'"}])>,:0a1A-.{[tfn'
_OTHER, _SPACE, _HIGH = 100, 200, 300
_NOTHING = np.zeros(0, dtype=np.int64)
_WHITESPACE = b" \t\n\r"
# What a byte costs in the search: whitespace and non-ASCII bytes are rarely part of a shortest
# completion, so they are tried after the others of the same length.
_STEP = [1 + (_NON_ASCII if b >= 0x80 else _NON_ASCII - 1 if bytes((b,)).isspace() else 0) for b in range(256)]
_RANK = [_HIGH if b >= 0x80 else _SPACE if bytes((b,)).isspace() else _OTHER + b for b in range(256)]
for _index, _byte in enumerate(_PREFERRED_BYTES):
    _RANK[_byte] = _index


def shortest_completion(
    grammar: Grammar,
    table: TokenTable,
    stop_ids: Sequence[int],
    words: np.ndarray,
    bitmask,
    row: int,
    *,
    max_expansions: int = 3000,
    max_bytes: int = 4096,
    hints: Sequence[bytes] = (),
    landmarks: Sequence[bytes] = (),
    after_found: int = 4,
) -> Completion | None:
    """The shortest completion of `grammar`'s state found (see the module docstring), or None when
    the search ran out of expansions (or the state has none). `hints` are tried whole, then with
    `landmarks` (the texts of the plans the caller's plan descends from) as texts to land on;
    the result carries `landmarks`. `bitmask[row]` (viewed as `words`, the host words of that row) is
    scratch space. The matcher ends where it started."""
    if grammar.is_terminated():
        return Completion(b"", ())
    stops = [int(s) for s in stop_ids if 0 <= int(s) < words.shape[0] * 32]
    for hint in hints:  # best first: the first the matcher accepts
        completion = _spelled(grammar, table, hint, stops, words, bitmask, row)
        if completion is not None:
            return Completion(completion.text, completion.tokens, tuple(landmarks))
    landings = [
        landing for landing in (landing_for(table, tuple(hints)), landing_for(table, tuple(landmarks))) if landing
    ]
    found = _best_first(grammar, table, stops, words, bitmask, row, max_expansions, max_bytes, landings, after_found)
    if found is None:
        return None
    path, suffix = found
    text = b"".join([table.bytes_of[t] for t in path]) + suffix
    completion = _spelled(grammar, table, text, stops, words, bitmask, row)
    # (else the rows' own path, its suffix in the fewest tokens, which the matcher accepted)
    tokens = completion.tokens if completion else tuple(path) + tuple(table.tokenize(suffix) or ())
    return Completion(text, tokens, tuple(landmarks))


def _spelled(grammar: Grammar, table: TokenTable, text: bytes, stops, words, bitmask, row) -> Completion | None:
    """`text` as a completion from here: in its fewest tokens when the matcher accepts them (then a
    stop token) and the row here allows the first (one fill and the accepts); else spelled token
    by token through the rows (`spell_along_rows`: llguidance's rows allow only the canonical token
    of forced bytes, where its token checks accept any spelling); None if the matcher refuses it."""
    tokens = table.tokenize(text)
    if tokens is None or not completes(grammar, tokens, stops):
        return None
    if tokens:
        grammar.fill_bitmask(bitmask, row)
        if not allows(words, tokens[0]):
            spelled = spell_along_rows(grammar, table, text, stops, words, bitmask, row)
            return None if spelled is None else Completion(text, spelled)
    return Completion(text, tuple(tokens))


def _best_first(
    grammar: Grammar,
    table: TokenTable,
    stops: list[int],
    words: np.ndarray,
    bitmask,
    row: int,
    max_expansions: int,
    max_bytes: int,
    landings: list[Landing],
    after_found: int,
) -> tuple[tuple[int, ...], bytes] | None:
    """(token path, suffix landed on) of the cheapest completion found, or None."""
    seen: set[int] = set()
    rows_after: dict[tuple[int, ...], set[int]] = {}  # the rows of each expanded node's children
    bare_seen: set[tuple[int, bytes]] = set()  # (row, text but for whitespace) of each expanded node
    # (cost, order, token path, bytes, the parent's allowed bytes, the parent's row signature,
    # the path's text but for whitespace)
    heap: list[tuple[int, int, tuple[int, ...], int, np.ndarray, int, bytes]] = [(0, 0, (), 0, _NOTHING, 0, b"")]
    pushed = 1
    current: tuple[int, ...] = ()
    best: tuple[int, tuple[int, ...], bytes] | None = None  # (cost, path, suffix)
    left = max_expansions
    try:
        while heap and left > 0:
            cost, _, path, size, before, parent, bare = heapq.heappop(heap)
            if best is not None and cost >= best[0]:
                break  # nothing cheaper is left
            current = _move(grammar, current, path)
            if current != path:
                continue  # the matcher refused a token it allowed (should not happen): skip the node
            left -= 1
            grammar.fill_bitmask(bitmask, row)
            if stop_allowed(words, stops):
                best = (cost, path, b"")
                break  # the cheapest node left: nothing after it can be cheaper
            signature = hash(words.tobytes())
            siblings = rows_after.setdefault(path[:-1], set()) if path else set()
            if signature in siblings:
                continue  # a sibling led to the same row: the same state, as far as anyone can tell
            siblings.add(signature)
            if signature != parent:
                # The same row after the same text but for whitespace (`, "` where `,"` was): the
                # same state reached at a higher cost, dropped. Not within a run of one row (a
                # counted repetition of whitespace, `a {3}b`, has equal rows on different counts).
                if (signature, bare) in bare_seen:
                    continue
                bare_seen.add((signature, bare))
            repeat = signature in seen
            seen.add(signature)
            if size >= max_bytes:
                continue
            allowed = table.allowed_bytes(words)
            if len(allowed):
                children = [(int(table.byte_token[b]), _STEP[b]) for b in _children(allowed, before)]
            else:  # no single-byte token here (llguidance allows only the canonical token of forced bytes)
                children = _token_children(table, words, stops)
            # Within a run of one row (string content, digits of a counted repetition) the run's
            # first node tried the same suffixes from the same row: landing there again is waste.
            for landing in landings if signature != parent or not path else ():
                firsts = allowed if len(allowed) else np.array(sorted({table.bytes_of[t][0] for t, _ in children}))
                below = best[0] - cost if best is not None else max_bytes
                suffix = landing.land(grammar, firsts, stops, words, below)
                if suffix is not None:
                    best = (cost + len(suffix), path, suffix)
                    left = min(left, after_found)
            # A run of one state (a string, a counted repetition: the parent's row again) goes on
            # at its plain cost; a state met elsewhere before is pushed behind.
            base = cost + (_REPEAT_PENALTY if repeat and signature != parent else 0)
            for token, step in children[:1] if repeat else children:
                pushed += 1
                child = (base + step, pushed, path + (token,), size + step, allowed, signature)
                heapq.heappush(heap, (*child, bare + table.bytes_of[token].translate(None, _WHITESPACE)))
    finally:
        _move(grammar, current, ())
    return None if best is None else (best[1], best[2])


def _token_children(table: TokenTable, words: np.ndarray, stops: Sequence[int]) -> list[tuple[int, int]]:
    """The allowed tokens of a row without single-byte ones (at most _WIDE, shortest first)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    ids = [
        int(t) for t in np.flatnonzero(bits[: len(table.bytes_of)]) if int(t) not in stops and table.bytes_of[int(t)]
    ]
    ids.sort(key=lambda t: len(table.bytes_of[t]))
    return [(t, len(table.bytes_of[t])) for t in ids[:_WIDE]]


def _children(allowed: np.ndarray, before: np.ndarray) -> list[int]:
    """The bytes to try after a node, best first: the bytes that close or separate JSON and the
    shortest literals, then other ASCII, whitespace and non-ASCII last. Of a wide class (string
    content, any character) only the preferred bytes, those the node's parent did not allow (a
    loop's exits: the ``@`` of an e-mail address) and a few others: each child costs a fill, and
    most of a wide class lead to the same state."""
    ordered = sorted((int(b) for b in allowed), key=_RANK.__getitem__)
    if len(ordered) <= _WIDE:
        return ordered
    old = set(int(b) for b in before) if len(before) > _WIDE else set(ordered)
    chosen = [b for b in ordered if _RANK[b] < _OTHER or b not in old]
    return chosen + [b for b in ordered if _RANK[b] >= _OTHER and b in old][:_SPREAD]


def _move(grammar: Grammar, current: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """Move the matcher from the token path `current` (from the search's start) to `target`;
    returns the path it is at."""
    common = 0
    limit = min(len(current), len(target))
    while common < limit and current[common] == target[common]:
        common += 1
    if len(current) > common:
        grammar.rollback(len(current) - common)
    rest = target[common:]
    if not rest:
        return target[:common]
    accepted = grammar.accept_tokens(rest)
    return target[: common + accepted]
