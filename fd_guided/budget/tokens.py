"""Completions and the token table they are spelled with (the request's tokenizer, in bytes).

`TokenTable`: a tokenizer's single-byte tokens and a bytes -> id index; `fewest_tokens`: the
fewest vocabulary tokens that spell every suffix of a text (a dynamic program over the table);
`Completion`: a completion from some matcher state, its text and the tokens that spell it.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..tokenizer import TokenizerBundle

UNSPELLED = 1 << 30  # fewest_tokens' count for a suffix no token sequence spells
FEWEST_CACHE = 4096


@dataclass(frozen=True)
class Completion:
    """A completion from some matcher state: `text` (bytes) spelled by `tokens`, then a stop token.

    `length` counts the stop token: the tokens a request still has to generate to end there.
    `landmarks` are the texts of the plans it descends from (`plan.Plan.landmarks`): a later
    search lands on their suffixes (`search.shortest_completion`).
    """

    text: bytes
    tokens: tuple[int, ...]
    landmarks: tuple[bytes, ...] = field(default=(), compare=False)

    @property
    def length(self) -> int:
        return len(self.tokens) + 1


class TokenTable:
    """What the search needs from a tokenizer: its single-byte tokens and a bytes -> id index."""

    def __init__(self, tokenizer: TokenizerBundle):
        self.byte_token = np.full(256, -1, dtype=np.int64)
        self.by_bytes: dict[bytes, int] = {}
        self.max_len = 1
        # The longest token beginning with each two bytes: a text's spellings are looked up that
        # far only (DeepSeek's tokens reach 128 bytes, those beginning `"s` 2).
        self.reach: dict[bytes, int] = {}
        for token_id, text in enumerate(tokenizer.token_bytes):
            if not text:
                continue
            self.by_bytes.setdefault(text, token_id)
            self.max_len = max(self.max_len, len(text))
            if len(text) > 1:
                self.reach[text[:2]] = max(self.reach.get(text[:2], 0), len(text))
            if len(text) == 1 and self.byte_token[text[0]] < 0:
                self.byte_token[text[0]] = token_id
        self.bytes_of: tuple[bytes, ...] = tuple(text or b"" for text in tokenizer.token_bytes)  # b"": special
        present = self.byte_token >= 0
        self._bytes = np.flatnonzero(present)
        self._ids = self.byte_token[present]
        self._words, self._bits = self._ids >> 5, (self._ids & 31).astype(np.uint32)
        self._fewest: OrderedDict[bytes, list[tuple[int, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def allowed_bytes(self, words: np.ndarray) -> np.ndarray:
        """The bytes whose single-byte token row `words` allows."""
        row = words.view(np.uint32)
        return self._bytes[((row[self._words] >> self._bits) & 1).astype(bool)]

    def tokenize(self, text: bytes) -> list[int] | None:
        """The fewest vocabulary tokens that spell `text` exactly (None if no tokenization exists)."""
        best = self.fewest(text)
        if best[0][0] >= UNSPELLED:
            return None
        return spelled_from(self, best, 0, len(text))

    def ends(self, text: bytes, start: int) -> range:
        """The ends of the tokens that may spell `text` from `start` (`reach`)."""
        return range(start + 1, min(len(text), start + self.reach.get(text[start : start + 2], 1)) + 1)

    def fewest(self, text: bytes) -> list[tuple[int, int]]:
        """`fewest_tokens(self, text)`, remembered for the last `FEWEST_CACHE` texts (a plan's
        landmarks are searched again at each re-plan; read-only: the list is shared)."""
        with self._lock:
            found = self._fewest.get(text)
            if found is not None:
                self._fewest.move_to_end(text)
                return found
        found = fewest_tokens(self, text)
        with self._lock:
            self._fewest[text] = found
            if len(self._fewest) > FEWEST_CACHE:
                self._fewest.popitem(last=False)
        return found

    def count(self, text: bytes) -> int:
        """How many tokens `tokenize` spells `text` with (`UNSPELLED` if none)."""
        return self.fewest(text)[0][0]


def spelled_from(table: TokenTable, best: list[tuple[int, int]], start: int, end: int) -> list[int]:
    """The tokens of `best` (`fewest_tokens` of some text) from byte `start` to `end`."""
    tokens, position = [], start
    while position < end:
        token = best[position][1]
        tokens.append(token)
        position += len(table.bytes_of[token])
    return tokens


def fewest_tokens(table: TokenTable, text: bytes) -> list[tuple[int, int]]:
    """best[k] = (the fewest tokens that spell text[k:], the first of them), (UNSPELLED, -1) where
    none does; best[len(text)] = (0, -1)."""
    size = len(text)
    best = [(UNSPELLED, -1)] * (size + 1)
    best[size] = (0, -1)
    reach, by_bytes = table.reach, table.by_bytes
    for start in range(size - 1, -1, -1):
        first = UNSPELLED
        for end in range(start + 1, min(size, start + reach.get(text[start : start + 2], 1)) + 1):
            after = best[end][0]
            if after + 1 >= first:
                continue  # (an unspelled rest is UNSPELLED: never below)
            token = by_bytes.get(text[start:end])
            if token is not None:
                first = after + 1
                best[start] = (first, token)
    return best


@functools.lru_cache(maxsize=4)
def token_table(tokenizer: TokenizerBundle) -> TokenTable:
    return TokenTable(tokenizer)
