"""Values made once per object and found again by the object's identity (the uniqueItems guard's
per-domain tables)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class ByIdentity:
    """Values made from an object (a finite domain's tuple of spellings, a used set's tuple of
    unused ones), found again by the object's identity: hashing and comparing a 500-value tuple
    per item start and end of every row cost more than the rest of the guard's step. Each entry
    holds its object, so the id it is filed under stays that object's while it is cached; past
    `max_entries` the cache is cleared whole (an entry is cheap to make again). Not locked: each
    entry is made whole before it is stored, and making one twice is harmless."""

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int):
        self._entries: dict[tuple[int, Hashable], tuple[Any, Any]] = {}
        self.max_entries = max_entries

    def get(self, held: Any, make: Callable[..., Any], *args: Any, tag: Hashable = None) -> Any:
        """`make(*args)` for `held` (and `tag`: one value per (object, tag)), made once."""
        key = (id(held), tag)
        entry = self._entries.get(key)
        if entry is None or entry[0] is not held:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            entry = self._entries[key] = (held, make(*args))
        return entry[1]

    def clear(self) -> None:
        self._entries.clear()
