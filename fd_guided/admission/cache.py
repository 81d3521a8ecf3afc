"""Admission results remembered by canonical hash: a constraint seen before is admitted (or refused)
again without reading it again.

Cold admission reads a schema several times over (meta-schema, references, bounds, each engine's
normal form): milliseconds, on the host's request thread. The verdict depends only on the guided
fields, the config and the backend, so it is kept in one bounded LRU per process: a `GrammarSpec`
(frozen: safe to share) or the refusal (re-raised as a new `InvalidGrammarError` with the same
message, part and feature). The key is the canonical JSON of the guided fields (compact, in the
order written: an object's key order is the order its properties are generated in, so it is part
of the constraint; a field that is not plain JSON, such as a pydantic class, is never cached) with
the config.
Entries and their key text are bounded (`MAX_ENTRIES`, `MAX_BYTES`); nothing expires otherwise:
verdicts never change within a process.

A request's text is its own key, looked up by `TextKey`: hashing a new megabyte string is ~0.5-1 ms
(Python caches a string's hash, but each request brings a new string), so a long text is hashed
by its length and a sample of it, and told apart from others by comparing it whole (memcmp, ~0.1
ms a megabyte). Texts made to share a sample cost a comparison each: at most `MAX_PER_HASH`
entries share a hash, so a lookup compares at most that many.

A value given as objects (a host's dict) is keyed by the text orjson writes for it (the floor of a
seen-before object: ~0.5 MB a millisecond). Where that text holds a null literal a NaN may have
been written: a long text's null literals are found once, with their places in the value
(`NULL_PLACES`), so a seen-before object costs its write, a comparison and a look at those places.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from ..errors import InvalidGrammarError
from . import json_text
from .documents import compact

MAX_ENTRIES = 4096
MAX_BYTES = 64 << 20  # key text held, summed
MAX_PER_HASH = 4  # entries kept under one hash (texts made to collide are compared, not hashed)
SAMPLED_TEXT_CHARS = 4096  # longer texts are hashed by a sample (`TextKey`)
_END_CHARS = 2048  # characters taken from each end of a long text (contiguous: cheap to read)
# Characters taken at even steps through it: each one another cache line read from memory (~0.1 us);
# 512 keep the hash at ~15 us on a 2.5 MB text (2,048: ~40 us). A collision costs a comparison only.
_STRIDE_SAMPLES = 512


class TextKey:
    """A long request text as a cache key: hashed by its length, its first and last
    `_END_CHARS` characters and `_STRIDE_SAMPLES` characters at even steps (microseconds,
    whatever its length), equal only to the same text (compared whole)."""

    __slots__ = ("text", "_hash")

    def __init__(self, text: str | bytes):
        self.text = text
        step = max(1, len(text) // _STRIDE_SAMPLES)
        self._hash = hash((type(text), len(text), text[:_END_CHARS], text[-_END_CHARS:], text[::step]))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TextKey) or self._hash != other._hash:
            return False
        if self.text is other.text:
            return True
        if self.text != other.text:
            return False
        # Equal: both keep the string `self` holds (a dict compares its stored key first, so the
        # cache's), so the lookups that follow (the LRU's move to the end, the checker's key, a
        # second cache holding the same key) compare by identity instead of comparing megabytes.
        other.text = self.text
        return True

    def __len__(self) -> int:
        return len(self.text)


class _Refused:
    __slots__ = ("error_class", "message", "part", "feature")

    def __init__(self, error: InvalidGrammarError):
        self.error_class = type(error)
        text = str(error)
        prefix = f"{error.part}: " if error.part else ""
        self.message = text[len(prefix) :] if prefix and text.startswith(prefix) else text
        self.part, self.feature = error.part, error.feature

    def raise_again(self):
        try:
            error = self.error_class(self.message, part=self.part, feature=self.feature)
        except TypeError:  # a subclass with another signature
            error = InvalidGrammarError(self.message, part=self.part, feature=self.feature)
        raise error


class VerdictCache:
    """A thread-safe LRU of admission verdicts, bounded by entries and by key bytes."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._per_hash: dict[int, int] = {}  # entries under each hash, at most MAX_PER_HASH
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def verdict(self, key: Hashable | None, size: int, decide: Callable[[], Any]) -> Any:
        """`decide()`'s result for `key`, remembered (a raised InvalidGrammarError too); `key` None:
        not cacheable, decided every time."""
        if key is None:
            return decide()
        try:
            hash(key)
        except TypeError:  # a config holding an unhashable value: decided every time
            return decide()
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
        if found is not None:
            if isinstance(found[0], _Refused):
                found[0].raise_again()
            return found[0]
        self.misses += 1
        try:
            value = decide()
        except InvalidGrammarError as error:
            self._store(key, _Refused(error), size)
            raise
        self._store(key, value, size)
        return value

    def known(self, key: Hashable) -> bool:
        """Whether `key`'s verdict is remembered (a lookup; `verdict` then returns or raises it)."""
        with self._lock:
            return key in self._entries

    def _store(self, key: Hashable, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        hashed = hash(key)
        with self._lock:
            if key in self._entries or self._per_hash.get(hashed, 0) >= MAX_PER_HASH:
                return
            self._entries[key] = (value, size)
            self._per_hash[hashed] = self._per_hash.get(hashed, 0) + 1
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                old, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
                self._forget_hash(hash(old))

    def _forget_hash(self, hashed: int) -> None:
        left = self._per_hash.pop(hashed) - 1
        if left:
            self._per_hash[hashed] = left

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._per_hash.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)


def canonical_key(fields: Mapping[str, Any], names: tuple[str, ...]) -> tuple[tuple, int] | None:
    """(key, size) for `fields`' entries named in `names`: text as given (a long one as a
    `TextKey`; hashing text is cheaper than writing it as JSON again), anything else as compact
    JSON (`documents.compact`: checked, so one text is one document); None if a value is not plain
    JSON nested at most 128 deep."""
    key, size = [], 0
    for name in names:
        if name in fields:
            value = fields[name]
            if isinstance(value, (str, bytes)) and len(value) > SAMPLED_TEXT_CHARS:
                value = TextKey(value)  # hashed by a sample, compared whole
            elif not isinstance(value, str):
                value = _object_key(value)
                if value is None:
                    return None
                name = f"{name}:json"  # the text '"a"' and the JSON string "a" are different requests
            key.append((name, value))
            size += len(value)
    return tuple(key), size


def _object_key(value: Any) -> str | TextKey | None:
    """The key of a value given as objects (a host's dict): the text `compact` writes for it, a
    long one as a `TextKey`; None if it is not plain JSON. A long text's null literals (where a
    NaN or Infinity would be, written by orjson as ``null``) are found once per text with their
    places (`NULL_PLACES`): seen before, the text is compared whole (memcmp, ~20x faster than the
    search) and only those places of the value are checked for None (a text with more than
    `MAX_NULL_PLACES` has its whole value checked for NaN, as a short text has)."""
    written = json_text.write_unchecked(value)
    if written is None:
        text = compact(value)  # the standard library's exact path
        return TextKey(text) if text is not None and len(text) > SAMPLED_TEXT_CHARS else text
    if len(written) <= SAMPLED_TEXT_CHARS:
        if json_text.has_null_literal(written) and not json_text.finite(value):
            return None  # NaN or Infinity: not plain JSON (`compact` is None too; admission names it)
        return written
    key = TextKey(written)  # a new string: hashing it whole is ~0.5 ms a MB
    places = NULL_PLACES.verdict(key, len(written), lambda: _null_places(written, value))
    if places is None:  # too many to check one by one
        return key if json_text.finite(value) else None
    return key if json_text.nulls_at(value, places) else None


def _null_places(written: str, value: Any) -> tuple[tuple, ...] | None:
    """The places of `written`'s null literals, found through `value` (one that writes it)."""
    if not json_text.has_null_literal(written):
        return ()
    return json_text.null_places(value, MAX_NULL_PLACES)


# A long text written for objects -> the places of its null literals (`json_text.null_places`), or
# None past `MAX_NULL_PLACES`. Its strings are mostly the ones `PARSED` holds for the same requests
# (one `TextKey` in both).
MAX_NULL_PLACES = 256
NULL_PLACES = VerdictCache(max_entries=1024, max_bytes=16 << 20)
PARSED = VerdictCache()  # (canonical fields, config) -> GrammarSpec | None | refusal
CHECKED = VerdictCache()  # (backend class, spec) -> None | refusal
