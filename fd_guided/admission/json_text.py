"""JSON read and written in native code (orjson), with the standard library's verdicts.

Admission reads a request's JSON text, checks that a document is plain JSON nested at most
`MAX_NESTING` deep, and writes its compact text (a spec's `source`, admission's cache key). In pure
Python that was 10-45 ms per megabyte on the caller's thread (``json.dumps``, the depth walk);
orjson writes a megabyte in ~1 ms. The standard library stays the reference: these functions
return None wherever orjson could read or write otherwise than it, and the caller then takes its
exact path (`documents`), which decides and words the refusal as before:

  - orjson refuses NaN and Infinity, lone surrogates, non-UTF-8 bytes, a UTF-8 BOM and documents
    over 1,024 levels (the standard library reads the first two and refuses the others with its own
    words); it refuses to write integers past 64 bits and reads them as floats, so a document whose
    written text holds a float of 1e16 or more (``<digit>e+`` or ``<digit>e1``.. as this orjson
    writes them, `_LARGE_EXPONENTS`) is read again by the caller;
  - depth: orjson writes at most `_WRITE_LIMIT` nested containers, so a document wrapped in
    `_WRAPPERS` lists is written only if it is nested at most `MAX_NESTING` deep (no walk);
  - a value given as objects (a host's dict) is taken as the text orjson writes for it: a check
    reads that text's document, so a verdict is the text's (one cache key, one verdict). NaN and
    Infinity, which orjson writes as ``null``, are refused: an object whose text holds a ``null``
    literal is searched for them by the standard library. Subclasses of str/int/dict/list (given
    to ``default``, which refuses them) go to the caller; a UUID or an enum member orjson writes
    natively is read as what it writes (the standard library's path refused them).

Read as the standard library reads (every value and key order equal, duplicate keys: the last value
at the first key's place; tested by differential fuzzing). Written text is orjson's, and the same for
equal documents whichever form they came in (text or objects); floats under 1e-4 are written
``1e-7`` where ``json.dumps`` wrote ``1e-07`` (and orjson before 3.10 writes ``1e16`` for ``1e+16``):
a cache key, read by JSON readers only, the same within one installation.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

# Deepest JSON document accepted (schemas, structural tags). SchemaStore's deepest schema has 27
# levels; native parsers and converters recurse, so an unbounded depth could crash the process.
MAX_NESTING = 128

_OPTIONS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_CONTAINERS = (dict, list)
_WALKED = frozenset((dict, list, tuple))  # the containers orjson writes (subclasses are refused)


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def _write_limit() -> int | None:
    """How many nested containers orjson writes (254 in orjson 3.x), probed once; None if more than
    4,096 (no depth bound to lean on)."""
    low, high = 1, 4096
    if _writes(high):
        return None
    while low + 1 < high:  # _writes(low) and not _writes(high)
        middle = (low + high) // 2
        low, high = (middle, high) if _writes(middle) else (low, middle)
    return low


def _writes(depth: int) -> bool:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True


def _large_exponents() -> tuple[bytes, ...] | None:
    """What precedes the exponent's digits when this orjson writes 2**64 as a float (orjson 3.13:
    ``1.8446744073709552e+19``, 3.9: ``...e19``); None if it writes it otherwise (read nothing)."""
    written = orjson.dumps(2.0**64)
    if written == b"1.8446744073709552e+19":
        return (b"e+",)
    if written == b"1.8446744073709552e19":
        return tuple(b"e%d" % digit for digit in range(1, 10))
    return None


_WRITE_LIMIT = _write_limit()
_LARGE_EXPONENTS = _large_exponents()
# None: orjson bounds no depth we can use, so every document takes the caller's path.
_WRAPPERS = _WRITE_LIMIT - MAX_NESTING if _WRITE_LIMIT is not None and _WRITE_LIMIT > MAX_NESTING else None


def read(text: str | bytes) -> tuple[Any, str] | None:
    """(document, compact text) of JSON `text` nested at most `MAX_NESTING` deep, read as
    ``json.loads`` reads it; None when that is not certain (the caller reads it itself)."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    written = _written(document, reading=True)
    if written is None:
        return None
    return document, written


def write(value: Any) -> str | None:
    """The compact JSON text orjson writes for `value` when it is JSON: str keys, JSON types (a
    tuple an array), finite numbers, valid Unicode, nested at most `MAX_NESTING` deep; None when
    orjson cannot write it or it may hold NaN or Infinity (the caller decides with the standard
    library)."""
    written = _written(value)
    if written is None or (has_null_literal(written) and not finite(value)):
        return None
    return written


def write_unchecked(value: Any) -> str | None:
    """`write`'s text before its NaN check: orjson's text for `value`, where NaN and Infinity are
    written as ``null``. Equal to `write(value)` when that text holds no null literal
    (`has_null_literal`) or `value` is `finite`; None where `write` is None for another reason."""
    return _written(value)


def has_null_literal(written: str) -> bool:
    """A ``null`` in compact JSON text follows ``:``, ``[`` or ``,`` (or starts it); inside a
    string it is only a false alarm. A pass over the text (~0.7 ms a megabyte: a four-letter
    search, not a memchr)."""
    at = written.find("null")
    while at != -1:
        if at == 0 or written[at - 1] in ":[,":
            return True
        at = written.find("null", at + 4)
    return False


def null_places(value: Any, limit: int) -> tuple[tuple, ...] | None:
    """Where orjson writes ``null`` for `value` (a None, NaN or Infinity): each place as its path of
    keys and indexes, in no particular order; None past `limit` places. A walk over the value
    (about as long as `finite`'s write), so the places of a text seen before are checked alone
    (`nulls_at`) instead of the whole value."""
    if value is None or (type(value) is float and not math.isfinite(value)):
        return ((),) if limit else None
    places: list[tuple] = []
    stack: list[tuple[Any, tuple]] = [(value, ())] if type(value) in _WALKED else []
    while stack:
        node, path = stack.pop()
        items = node.items() if type(node) is dict else enumerate(node)
        for step, child in items:
            kind = type(child)
            if child is None or (kind is float and not math.isfinite(child)):
                if len(places) == limit:
                    return None
                places.append((*path, step))
            elif kind in _WALKED:
                stack.append((child, (*path, step)))
    return tuple(places)


def nulls_at(value: Any, places: tuple[tuple, ...]) -> bool:
    """Every place in `places` (`null_places` of a value that wrote the same text) holds None in
    `value`: where a NaN or Infinity would be, the text cannot tell; here the value does."""
    try:
        for path in places:
            node = value
            for step in path:
                node = node[step]
            if node is not None:
                return False
    except (KeyError, IndexError, TypeError):
        return False
    return True


def finite(value: Any) -> bool:
    """No NaN or Infinity in `value` (orjson writes them as ``null``): the standard library's
    writer refuses them; anything else it cannot write reads as null here, as orjson wrote it."""
    try:
        json.dumps(value, allow_nan=False, check_circular=False, default=lambda _: None)
    except ValueError:
        return False
    return True


def _written(value: Any, reading: bool = False) -> str | None:
    if _WRAPPERS is None or (reading and _LARGE_EXPONENTS is None):
        return None
    wrapped = value
    if isinstance(value, _CONTAINERS):
        for _ in range(_WRAPPERS):
            wrapped = [wrapped]
    try:
        out = orjson.dumps(wrapped, default=_refuse, option=_OPTIONS)
    except orjson.JSONEncodeError:  # too deep (or a cycle), a long integer, a surrogate, a key
        return None
    if reading and _may_hold_a_long_integer(out):
        return None
    if wrapped is value:
        return out.decode()
    return str(memoryview(out)[_WRAPPERS:-_WRAPPERS], "utf-8")


def _may_hold_a_long_integer(written: bytes) -> bool:
    """orjson reads an integer past 64 bits as a float (the standard library keeps it exact); such
    a float is 9.2e18 or more, written with an exponent (`_LARGE_EXPONENTS`) after a digit. True
    for every such text (and for a string holding ``1e+5``: read again, at the standard library's
    cost)."""
    for mark in _LARGE_EXPONENTS or ():
        at = written.find(mark)
        while at != -1:
            if at > 0 and 0x30 <= written[at - 1] <= 0x39:
                return True
            at = written.find(mark, at + len(mark))
    return False
