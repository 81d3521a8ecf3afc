"""Large schema texts admitted unread: their reading is the compile worker's, with the same verdicts.

Reading a JSON schema text on the caller's thread (orjson: 3-5 ms a megabyte of non-ASCII text),
writing its compact source and decoding it (1-4 ms a megabyte) cost more than admission's whole
budget past a few hundred kilobytes, and leave tens of thousands of Python objects that live
through the admission: the garbage collector promotes them, and a full collection (0.1-0.2 s over
a serving process's heap) then falls in some later request's admission. So under an admission
budget a schema text over `UNREAD_TEXT_CHARS` is not read here: its spec's `source` is the text
as given, marked ``pending`` with ``unread`` (`deferred.Pending`), and the compile worker (or the
first reader of ``spec.schema``) reads it as admission would have, through the very functions
admission uses (`deferred.read_schema_text`): the size bound, UTF-8, malformed JSON, depth, lone
surrogates, the compact size, then the schema checks, each refusal worded as before.

On the thread: the length, UTF-8 decoding of bytes (bytes that are not UTF-8 are read here, to be
refused as before), and two
scans of the text in C (``re``): it must open an object (anything else, ``true`` with padding or a
100,000-deep array, is read here as before: its verdict may be an admission), and may spell no
ASCII letter as a ``\\u00XX`` escape (such a text's compact source unescapes it, and a source read
by its text, such as the ``uniqueItems`` guard's test, must find a keyword as the document spells
it; rare, read here).

The cost: a spec's source is the text as sent, so two spellings of one schema (indentation, key
escapes) are two cache keys and two compiles of the same grammar, not one.
"""

from __future__ import annotations

import re

from ..limits import AdmissionLimits
from .deferred import Pending
from .spec import GrammarSpec, JsonFormat

# Texts over this many characters are read by the compile worker (under an admission budget).
# Measured on SchemaStore (2-core x86 host): reading, checking and writing a 64 KB schema here
# takes ~0.3 ms of orjson and C; from ~300 KB on it alone passes the 5 ms bound on a loaded core.
UNREAD_TEXT_CHARS = 64 << 10

_OPENS_AN_OBJECT = re.compile(r"[ \t\n\r]*\{")
_ESCAPED_ASCII_LETTER = re.compile(r"\\u00[4-7][0-9A-Fa-f]")


def unread_schema(
    value: str | bytes, json_format: JsonFormat, limits: AdmissionLimits, part: str
) -> GrammarSpec | None:
    """The pending spec of a large schema text left unread, or None when it is read here (small,
    not UTF-8, not an object, or spelling a letter with an escape)."""
    if len(value) <= UNREAD_TEXT_CHARS:
        return None
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else value
    except UnicodeDecodeError:
        return None  # refused by its reading here, in the order admission reads (size first)
    if not _OPENS_AN_OBJECT.match(text) or _ESCAPED_ASCII_LETTER.search(text):
        return None
    return GrammarSpec("json_schema", text, json_format, Pending(part, limits, unread=True))
