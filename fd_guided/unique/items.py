"""A guarded array's finished items and the equality they are judged by (`JsonTracker`'s values).

`item_keys` gives two keys per JSON value, `jsonschema`'s equality (floats) and exact decimals.
`Items` is one guarded array's finished items in order, shared by every snapshot of it; `Unique` is
one snapshot (how many of those items it holds, where the current one began, and for finite or
counted string domains what is left); `strings_left` counts a language's strings past the used ones.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation

from ..schema.leaves import json_key
from ..schema.refusal import Refusal
from .by_identity import ByIdentity

ZERO = json_key(0)
_NULL = json_key(None)
_serials = itertools.count(1)  # one per item ever added, across arrays: names an item and all before it


def item_keys(text: bytes) -> tuple:
    """Two `json_key`s of one JSON value: read as `jsonschema` reads it (floats) and as exact decimals."""
    if text[:1] == b'"' and b"\\" not in text:  # a string without escapes: its bytes are its value
        try:
            key = json_key(text[1:-1].decode("utf-8"))
            return key, key
        except UnicodeDecodeError:
            pass
    try:
        judged = json_key(json.loads(text))
    except (ValueError, RecursionError, Refusal):
        judged = ("raw", text)
    try:
        exact = json_key(json.loads(text, parse_float=Decimal, parse_int=Decimal))
    except (ValueError, RecursionError, InvalidOperation, Refusal):
        exact = ("raw", text)
    return judged, exact


class Items:
    """One guarded array's finished items, in order, shared by every snapshot (`Unique`) of it.

    A snapshot holds the first `count` entries. Entries past it belong to states rolled back or
    tried from it (`JsonTracker.finishes_duplicate`), and the next item added from it drops them
    first: the tracker restores snapshots last in, first out, so no snapshot still in use holds a
    dropped entry. Each snapshot used to carry its own frozensets, and every snapshot stays in
    the tracker's history: memory and time grew with the square of the items (3,000 items: 5.3 s
    and 670 MB); here both grow linearly. `native` is the C guard's copy (`native.Used`), synced
    by serial number when a fill plan is made.
    """

    __slots__ = ("judged", "exact", "strings", "entries", "string_counts", "native")

    def __init__(self) -> None:
        self.judged: dict = {}  # key -> index of the entry (keys are unique: a repeat is refused)
        self.exact: dict = {}
        self.strings: dict[bytes, int] = {}  # a string item's value (UTF-8, surrogates passed) -> index
        self.entries: list[tuple] = []  # (judged, exact, string or None, text, serial)
        self.string_counts = [0]  # string_counts[i]: string items among entries[:i]
        self.native: object = None

    def truncate(self, count: int) -> None:
        while len(self.entries) > count:
            judged, exact, string, _, _ = self.entries.pop()
            del self.judged[judged], self.exact[exact]
            if string is not None:
                del self.strings[string]
            self.string_counts.pop()

    def append(self, judged, exact, text: bytes) -> None:
        string = exact[1].encode("utf-8", "surrogatepass") if exact[0] == "s" else None
        index = len(self.entries)
        self.judged[judged] = self.exact[exact] = index
        if string is not None:
            self.strings[string] = index
        self.entries.append((judged, exact, string, text, next(_serials)))
        self.string_counts.append(self.string_counts[-1] + (string is not None))


class Strings:
    """The string items of a snapshot, as a read-only set of their UTF-8 values (hashable: the
    items it names never change, so `strings_left` can cache by it)."""

    __slots__ = ("items", "count", "serial")

    def __init__(self, items: Items, count: int):
        self.items, self.count = items, count
        self.serial = items.entries[count - 1][4] if count else 0

    def __contains__(self, text: object) -> bool:
        return self.items.strings.get(text, self.count) < self.count  # type: ignore[call-overload]

    def __iter__(self) -> Iterator[bytes]:
        return (entry[2] for entry in itertools.islice(self.items.entries, self.count) if entry[2] is not None)

    def __len__(self) -> int:
        return self.items.string_counts[self.count]

    def __bool__(self) -> bool:
        return len(self) > 0

    def __hash__(self) -> int:
        return hash((id(self.items), self.count, self.serial))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Strings)
            and other.items is self.items
            and other.count == self.count
            and other.serial == self.serial
        )


class Unique:
    """One guarded array as a snapshot: its first `count` finished `items` (both key forms),
    where its current item began, and, for a finite item domain, the spellings of the values
    not used yet (`unused`)."""

    __slots__ = ("items", "count", "start", "unused", "domain", "language", "literals", "integers")

    def __init__(
        self,
        items: Items | None = None,
        count: int = 0,
        start: int = -1,
        unused: tuple[bytes, ...] | None = None,
        domain: tuple[bytes, ...] | None = None,
        language=None,
        literals: tuple = (),
        integers: bool = False,
    ):
        self.items = items if items is not None else Items()
        self.count, self.start, self.unused = count, start, unused
        self.domain = domain if domain is not None else unused  # the whole finite domain, sorted
        self.language = language  # string items that can run out (`UniquePaths.item_strings`), or None
        self.literals = literals  # and the literals beside them ("null")
        self.integers = integers  # numbers are integers only: a 0 item cannot go on (`UniquePaths.item_integers`)

    def _with(self, **changes) -> Unique:
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Unique(**fields)

    def holds(self, judged, exact=None) -> bool:
        """Is an item with this judged (or, given, exact) key among the finished ones?"""
        count = self.count
        return self.items.judged.get(judged, count) < count or (
            exact is not None and self.items.exact.get(exact, count) < count
        )

    @property
    def strings(self) -> Strings:
        return Strings(self.items, self.count)

    def starting(self, at: int) -> Unique:
        return self._with(start=at)

    def adding(self, judged, exact, text: bytes) -> Unique:
        """This snapshot with the item `text` (keys `judged`, `exact`; not held yet) finished."""
        self.items.truncate(self.count)
        self.items.append(judged, exact, text)
        unused = self.unused
        if unused is not None:
            assert self.domain is not None  # (a finite domain's: `unused` defaults to it)
            unused = _unused_after(unused, domain_keys(self.domain).get(judged))
        return self._with(count=self.count + 1, start=-1, unused=unused)

    def live(self, written: bytes) -> bool:
        """Can the item whose bytes so far are `written` still become a value not used yet? For a
        finite domain, some unused spelling begins so; for strings that can run out, the strings
        of the language beginning so outnumber the used ones that do. (Always true for an open
        domain, and for a string item holding an escape or a split character: not judged.)"""
        if self.unused is not None:
            at = bisect.bisect_left(self.unused, written)  # sorted: the texts that start so follow it
            return at < len(self.unused) and self.unused[at].startswith(written)
        if self.integers and written in (b"0", b"-0"):
            return not self.holds(ZERO)  # an integer 0 is final: begun again, it repeats
        if self.language is None or written[:1] != b'"' or b"\\" in written or never_runs_out(self.language):
            return True
        return strings_left(self.language, self.strings, written[1:])

    def exhausted(self) -> bool:
        """Strings that can run out: every one is used (another item could only repeat one)."""
        if self.language is None or any(not self.holds(_NULL) for name in self.literals if name == "null"):
            return False
        strings = len(self.strings)
        return self.language.completions(0, strings + 1) <= strings


@functools.lru_cache(maxsize=256)
def never_runs_out(language) -> bool:
    """Every state of the string language's automaton has infinitely many completions: then
    `strings_left` is true for every prefix (no walk needed: it cost a walk of the item's bytes
    on every token) and the array is never used up (`Unique.exhausted`)."""
    moves = language.dfa.moves
    return bool(moves) and all(state in language._infinite for state in range(len(moves)))


@functools.lru_cache(maxsize=4096)
def strings_left(language, used: Strings, prefix: bytes) -> bool:
    """Does `language` hold a string beginning with `prefix` (UTF-8) that is not in `used`?
    Cached: a fill asks it for many tokens with the same prefix (those that start with a quote)."""
    try:
        state = language.state_after(prefix.decode("utf-8"))
    except UnicodeDecodeError:
        return True  # a split character: judged once it is whole
    if state is None:
        return True  # not a prefix the language knows: the engine decides
    if language.completions(state, len(used) + 1) > len(used):
        return True  # more strings than all the used ones (an open language: always), no count needed
    count = sum(1 for text in used if text.startswith(prefix))
    return language.completions(state, count + 1) > count


def sorted_texts(texts: tuple[bytes, ...] | None) -> tuple[bytes, ...] | None:
    """`texts` sorted, as one shared tuple per set of texts: every array (every row of a batch)
    with items from one finite domain holds the same tuple and the same bytes objects, so what is
    derived from it (`domain_keys`, `_unused_after`, the C guard's `Domain` and counts) is found
    by identity, not by hashing and comparing its texts each time."""
    return None if texts is None else _sorted_once(tuple(sorted(texts)))


@functools.lru_cache(maxsize=256)
def _sorted_once(texts: tuple[bytes, ...]) -> tuple[bytes, ...]:
    return texts  # the first tuple of these texts, returned for every equal one


_ID_CACHE_MAX = 1024
_KEYS_BY_ID = ByIdentity(_ID_CACHE_MAX)  # domain tuple -> judged key -> spelling
_UNUSED_AFTER = ByIdentity(_ID_CACHE_MAX)  # (unused tuple, spelling) -> the unused tuple without it


def domain_keys(texts: tuple[bytes, ...]) -> dict:
    """judged key -> spelling for the values of a finite domain (made once per domain tuple;
    read-only), found by the tuple's identity."""
    return _KEYS_BY_ID.get(texts, _keys_of, texts)


def _keys_of(texts: tuple[bytes, ...]) -> dict:
    return {item_keys(text)[0]: text for text in texts}


def _unused_after(unused: tuple[bytes, ...], spelled: bytes | None) -> tuple[bytes, ...]:
    """The sorted `unused` without `spelled`, one tuple per (unused tuple, spelling): the rows of
    a batch that finish the same item from the same unused set share the result (and with it
    the C guard's counts of it, by identity)."""
    return _UNUSED_AFTER.get(unused, _without, unused, spelled, tag=spelled)


def _without(unused: tuple[bytes, ...], spelled: bytes | None) -> tuple[bytes, ...]:
    return tuple(text for text in unused if text != spelled)  # stays sorted
