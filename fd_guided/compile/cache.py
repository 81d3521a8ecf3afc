"""The in-process caches of the compile service, bounded by the bytes they really hold.

Keys count too: a spec's source text can be a megabyte, and ten thousand cached or remembered
specs are ten gigabytes if only the compiled values are counted.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

# Per-entry bookkeeping (dict slots, the spec and key objects, a Future) beyond the key's text.
ENTRY_OVERHEAD_BYTES = 512


def key_bytes(key: Any) -> int:
    """Bytes a cache key holds: the text of its specs (``(engine, spec)`` or a bare spec)."""
    if isinstance(key, tuple):
        return sum(key_bytes(part) for part in key)
    source = getattr(key, "source", None)
    if isinstance(source, str):
        return len(source)
    return len(key) if isinstance(key, str) else 0


class _ByteBoundedLRU:
    """A thread-safe LRU of (value, size, expiry) bounded by the sizes' sum; expired entries read as absent."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int, float | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def _get(self, key: Hashable):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            value, size, expires = entry
            if expires is not None and time.monotonic() > expires:
                del self._entries[key]
                self._bytes -= size
                return None
            self._entries.move_to_end(key)
            return value

    def _put(self, key: Hashable, value, size: int, expires: float | None = None) -> None:
        if size > self.limit_bytes:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._bytes -= previous[1]
            self._entries[key] = (value, size, expires)
            self._bytes += size
            while self._bytes > self.limit_bytes:
                _, (_, evicted, _) = self._entries.popitem(last=False)
                self._bytes -= evicted

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class CompiledGrammarCache(_ByteBoundedLRU):
    """A thread-safe LRU of compiled grammars bounded by their `memory_bytes` plus their keys."""

    def get(self, key: Hashable):
        return self._get(key)

    def put(self, key: Hashable, compiled) -> None:
        self._put(key, compiled, int(compiled.memory_bytes) + key_bytes(key) + ENTRY_OVERHEAD_BYTES)


class RememberedErrors(_ByteBoundedLRU):
    """Failed compiles, so a client retrying a bad constraint costs no compile.

    Bounded by bytes (keys included) and by age: budget errors (a timeout under load) expire after
    `budget_ttl_s`, syntax and feature errors stay until evicted.
    """

    def __init__(self, limit_bytes: int, *, budget_ttl_s: float = 300.0):
        super().__init__(limit_bytes)
        self.budget_ttl_s = budget_ttl_s

    def get(self, key: Hashable) -> BaseException | None:
        return self._get(key)

    def put(self, key: Hashable, error: BaseException, *, transient: bool) -> None:
        expires = time.monotonic() + self.budget_ttl_s if transient else None
        self._put(key, error, key_bytes(key) + len(str(error)) + ENTRY_OVERHEAD_BYTES, expires)
