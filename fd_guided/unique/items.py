"""A guarded array's finished items and the equality they are judged by (`JsonTracker`'s values).

`item_keys` gives two keys per JSON value, `jsonschema`'s equality (floats) and exact decimals; `Unique`
is one guarded array's immutable record (finished items, where the current one began, and for finite
or counted string domains what is left); `strings_left` counts a language's strings past the used ones.
"""

from __future__ import annotations

import bisect
import functools
import json
from decimal import Decimal, InvalidOperation

from ..schema.leaves import json_key
from ..schema.refusal import Refusal

ZERO = json_key(0)


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


class Unique:
    """One guarded array's finished items (both key forms), where its current item began, and,
    for a finite item domain, the spellings of the values not used yet (`unused`)."""

    __slots__ = ("judged", "exact", "strings", "start", "unused", "domain", "language", "literals", "integers")

    def __init__(
        self,
        judged: frozenset = frozenset(),
        exact: frozenset = frozenset(),
        strings: frozenset = frozenset(),
        start: int = -1,
        unused: tuple[bytes, ...] | None = None,
        domain: tuple[bytes, ...] | None = None,
        language=None,
        literals: tuple = (),
        integers: bool = False,
    ):
        self.judged, self.exact, self.strings, self.start, self.unused = judged, exact, strings, start, unused
        self.domain = domain if domain is not None else unused  # the whole finite domain, sorted
        self.language = language  # string items that can run out (`UniquePaths.item_strings`), or None
        self.literals = literals  # and the literals beside them ("null")
        self.integers = integers  # numbers are integers only: a 0 item cannot go on (`UniquePaths.item_integers`)

    def _with(self, **changes) -> Unique:
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Unique(**fields)

    def starting(self, at: int) -> Unique:
        return self._with(start=at)

    def adding(self, judged, exact) -> Unique:
        strings = self.strings | {exact[1].encode("utf-8", "surrogatepass")} if exact[0] == "s" else self.strings
        unused = self.unused
        if unused is not None:
            spelled = _domain_keys(self.domain).get(judged)
            unused = tuple(text for text in unused if text != spelled)  # stays sorted
        return self._with(
            judged=self.judged | {judged}, exact=self.exact | {exact}, strings=strings, start=-1, unused=unused
        )

    def live(self, written: bytes) -> bool:
        """Can the item whose bytes so far are `written` still become a value not used yet? For a
        finite domain, some unused spelling begins so; for strings that can run out, the strings
        of the language beginning so outnumber the used ones that do. (Always true for an open
        domain, and for a string item holding an escape or a split character: not judged.)"""
        if self.unused is not None:
            at = bisect.bisect_left(self.unused, written)  # sorted: the texts that start so follow it
            return at < len(self.unused) and self.unused[at].startswith(written)
        if self.integers and written in (b"0", b"-0"):
            return ZERO not in self.judged  # an integer 0 is final: begun again, it repeats
        if self.language is None or written[:1] != b'"' or b"\\" in written:
            return True
        return strings_left(self.language, self.strings, written[1:])

    def exhausted(self) -> bool:
        """Strings that can run out: every one is used (another item could only repeat one)."""
        if self.language is None or any(json_key(None) not in self.judged for name in self.literals if name == "null"):
            return False
        return self.language.completions(0, len(self.strings) + 1) <= len(self.strings)


@functools.lru_cache(maxsize=4096)
def strings_left(language, used: frozenset, prefix: bytes) -> bool:
    """Does `language` hold a string beginning with `prefix` (UTF-8) that is not in `used`?
    Cached: a fill asks it for many tokens with the same prefix (those that start with a quote)."""
    try:
        state = language.state_after(prefix.decode("utf-8"))
    except UnicodeDecodeError:
        return True  # a split character: judged once it is whole
    if state is None:
        return True  # not a prefix the language knows: the engine decides
    count = sum(1 for text in used if text.startswith(prefix))
    return language.completions(state, count + 1) > count


def sorted_texts(texts: tuple[bytes, ...] | None) -> tuple[bytes, ...] | None:
    return None if texts is None else tuple(sorted(texts))


@functools.lru_cache(maxsize=256)
def _domain_keys(texts: tuple[bytes, ...]) -> dict:
    """judged key -> spelling for the values of a finite domain (computed once per domain)."""
    return {item_keys(text)[0]: text for text in texts}
