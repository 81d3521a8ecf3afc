"""The shortest completion of a matcher's state, measured in tokens of the request's tokenizer.

`shortest_completion` drives any `Grammar` (the engine's own matcher, through `fill_bitmask`,
`accept_tokens` and `rollback` only) to find the shortest byte string that completes the output
from its current state: a best-first search over the vocabulary's single-byte tokens (a byte-level
vocabulary has one per byte), ordered by length. The matcher does not expose its state, so states
are told apart by their allowed-token rows: a node whose row equals one already expanded is
pushed behind every fresh node (a string that only grew, ``"a"`` -> ``"aa"``, is not a new state),
not dropped (a counted repetition has equal rows on different counts). A completion found is then
cut into the fewest vocabulary tokens that spell it (`TokenTable.tokenize`: exact for that string),
and the matcher checks that it accepts them. Each step of the search costs one fill; the fills of
both engines take microseconds on DeepSeek's 129k vocabulary (measured: 3-30 us), and the search
stops after `max_expansions` nodes. The matcher is back at its state when this returns.

What the result is: a real completion (the matcher accepted it), so its length is an upper bound
on the shortest completion in tokens, and exact whenever the shortest completion in bytes is also
the one with the fewest tokens (the search itself is exact in bytes when no expanded row repeated,
and prefers fresh states otherwise). Budget steering relies only on it being a real completion.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..interface import Grammar
from ..tokenizer import TokenizerBundle

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
# What a byte costs in the search: whitespace and non-ASCII bytes are rarely part of a shortest
# completion, so they are tried after the others of the same length.
_STEP = [1 + (_NON_ASCII if b >= 0x80 else _NON_ASCII - 1 if bytes((b,)).isspace() else 0) for b in range(256)]
_RANK = [_HIGH if b >= 0x80 else _SPACE if bytes((b,)).isspace() else _OTHER + b for b in range(256)]
for _index, _byte in enumerate(_PREFERRED_BYTES):
    _RANK[_byte] = _index


@dataclass(frozen=True)
class Completion:
    """A completion from some matcher state: `text` (bytes) spelled by `tokens`, then a stop token.

    `length` counts the stop token: the tokens a request still has to generate to end there.
    """

    text: bytes
    tokens: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.tokens) + 1


class TokenTable:
    """What the search needs from a tokenizer: its single-byte tokens and a bytes -> id index."""

    def __init__(self, tokenizer: TokenizerBundle):
        self.byte_token = np.full(256, -1, dtype=np.int64)
        self.by_bytes: dict[bytes, int] = {}
        self.max_len = 1
        for token_id, text in enumerate(tokenizer.token_bytes):
            if not text:
                continue
            self.by_bytes.setdefault(text, token_id)
            self.max_len = max(self.max_len, len(text))
            if len(text) == 1 and self.byte_token[text[0]] < 0:
                self.byte_token[text[0]] = token_id
        self.bytes_of: tuple[bytes, ...] = tuple(text or b"" for text in tokenizer.token_bytes)  # b"": special
        present = self.byte_token >= 0
        self._bytes = np.flatnonzero(present)
        self._ids = self.byte_token[present]
        self._words, self._bits = self._ids >> 5, (self._ids & 31).astype(np.uint32)

    def allowed_bytes(self, words: np.ndarray) -> np.ndarray:
        """The bytes whose single-byte token row `words` allows."""
        row = words.view(np.uint32)
        return self._bytes[((row[self._words] >> self._bits) & 1).astype(bool)]

    def tokenize(self, text: bytes) -> list[int] | None:
        """The fewest vocabulary tokens that spell `text` exactly (None if no tokenization exists)."""
        best = fewest_tokens(self, text)
        if best[0][0] >= UNSPELLED:
            return None
        tokens, position = [], 0
        while position < len(text):
            token = best[position][1]
            tokens.append(token)
            position += len(self.bytes_of[token])
        return tokens


UNSPELLED = 1 << 30  # fewest_tokens' count for a suffix no token sequence spells


def fewest_tokens(table: TokenTable, text: bytes) -> list[tuple[int, int]]:
    """best[k] = (the fewest tokens that spell text[k:], the first of them), (UNSPELLED, -1) where
    none does; best[len(text)] = (0, -1)."""
    size = len(text)
    best = [(UNSPELLED, -1)] * (size + 1)
    best[size] = (0, -1)
    for start in range(size - 1, -1, -1):
        for end in range(start + 1, min(size, start + table.max_len) + 1):
            after = best[end][0]
            if after >= UNSPELLED or after + 1 >= best[start][0]:
                continue
            token = table.by_bytes.get(text[start:end])
            if token is not None:
                best[start] = (after + 1, token)
    return best


@functools.lru_cache(maxsize=4)
def token_table(tokenizer: TokenizerBundle) -> TokenTable:
    return TokenTable(tokenizer)


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
) -> Completion | None:
    """The shortest completion of `grammar`'s state found (see the module docstring), or None when
    the search ran out of expansions (or the state has none). `bitmask[row]` (viewed as `words`,
    the host words of that row) is scratch space. The matcher ends where it started."""
    if grammar.is_terminated():
        return Completion(b"", ())
    stops = [int(s) for s in stop_ids if 0 <= int(s) < words.shape[0] * 32]
    seen: set[int] = set()
    rows_after: dict[tuple[int, ...], set[int]] = {}  # the rows of each expanded node's children
    # (cost, order, token path, bytes, the parent's allowed bytes, the parent's row signature)
    heap: list[tuple[int, int, tuple[int, ...], int, np.ndarray, int]] = [(0, 0, (), 0, _NOTHING, 0)]
    pushed = 1
    current: tuple[int, ...] = ()
    found = None
    try:
        for _ in range(max_expansions):
            if not heap:
                break
            cost, _, path, size, before, parent = heapq.heappop(heap)
            current = _move(grammar, current, path)
            if current != path:
                continue  # the matcher refused a token it allowed (should not happen): skip the node
            grammar.fill_bitmask(bitmask, row)
            if any((int(words[s >> 5]) >> (s & 31)) & 1 for s in stops):
                found = path
                break
            signature = hash(words.tobytes())
            siblings = rows_after.setdefault(path[:-1], set()) if path else set()
            if signature in siblings:
                continue  # a sibling led to the same row: the same state, as far as anyone can tell
            siblings.add(signature)
            repeat = signature in seen
            seen.add(signature)
            if size >= max_bytes:
                continue
            # A run of one state (a string, a counted repetition: the parent's row again) goes on
            # at its plain cost; a state met elsewhere before is pushed behind.
            base = cost + (_REPEAT_PENALTY if repeat and signature != parent else 0)
            allowed = table.allowed_bytes(words)
            if len(allowed):
                children = [(int(table.byte_token[b]), _STEP[b]) for b in _children(allowed, before)]
            else:  # no single-byte token here (llguidance allows only the canonical token of forced bytes)
                children = _token_children(table, words, stops)
            for token, step in children[:1] if repeat else children:
                pushed += 1
                heapq.heappush(heap, (base + step, pushed, path + (token,), size + step, allowed, signature))
    finally:
        _move(grammar, current, ())
    if found is None:
        return None
    text = b"".join([table.bytes_of[t] for t in found])
    tokens = table.tokenize(text)
    if tokens is None or len(tokens) > len(found) or grammar.validate_tokens(tokens) != len(tokens):
        tokens = list(found)
    return Completion(text, tuple(tokens))


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
