"""Request documents as plain JSON: decoding, types, depth and text, checked before anything else.

Every later stage (meta-validation, the normaliser, the engines' converters) recurses over a
document and assumes JSON values; a value that is not one, or nests past `MAX_NESTING`, is an
`InvalidGrammarError` here, found iteratively (the check itself cannot overflow).

Each function first asks `json_text` (orjson: a megabyte read, checked and written in a few ms)
and takes the standard library's path, which words every refusal and reads what orjson cannot
(integers past 64 bits), only when that says it cannot be sure.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidGrammarError
from . import json_text
from .json_text import MAX_NESTING


def load_json(text: str | bytes, part: str) -> Any:
    found = json_text.read(text)
    if found is not None:
        return found[0]
    return _load_json_exactly(text, part)


def utf8_text(text: str | bytes, part: str) -> str:
    """`text` as a str: bytes decoded as UTF-8, or an InvalidGrammarError naming the first bad byte."""
    if not isinstance(text, (bytes, bytearray)):
        return text
    try:
        return bytes(text).decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidGrammarError(f"not valid UTF-8 ({error.reason} at byte {error.start})", part=part) from None


def _load_json_exactly(text: str | bytes, part: str) -> Any:
    text = utf8_text(text, part)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidGrammarError(f"malformed JSON: {error}", part=part) from None
    except RecursionError:
        raise InvalidGrammarError(f"JSON nested more than {MAX_NESTING} levels deep", part=part) from None


def check_document(value: Any, part: str) -> None:
    """Refuse what is not a plain JSON document, iteratively (the check itself cannot overflow).

    Deeper than MAX_NESTING: every later stage (meta-validation, checkers, the engines'
    converters) recurses over the document, and past a few hundred levels that is a RecursionError
    or, in native code, a crash of the whole process; a cyclic dict is caught here too. Keys must be
    strings, values JSON values (a tuple reads as an array), numbers finite and strings valid Unicode.
    """
    stack = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_NESTING:
            raise InvalidGrammarError(f"nested more than {MAX_NESTING} levels deep", part=part)
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise InvalidGrammarError(
                        f"object keys must be strings, got {type(key).__name__} {key!r:.40}", part=f"{part}{path}"
                    )
                check_text(key, f"{part}{path}")
                stack.append((child, depth + 1, f"{path}.{key}"))
        elif isinstance(node, (list, tuple)):
            stack.extend((child, depth + 1, f"{path}[{index}]") for index, child in enumerate(node))
        elif isinstance(node, str):
            check_text(node, f"{part}{path}")
        elif isinstance(node, float):
            if node != node or node in (float("inf"), float("-inf")):
                raise InvalidGrammarError(f"{node!r} is not a JSON number", part=f"{part}{path}")
        elif node is not None and not isinstance(node, (bool, int)):
            raise InvalidGrammarError(f"{type(node).__name__} is not a JSON value", part=f"{part}{path}")


def check_text(text: str, part: str) -> None:
    """Constraint text must be valid Unicode (a lone surrogate cannot be UTF-8 encoded for an engine)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidGrammarError(
            f"not valid Unicode text ({error.reason} at position {error.start})", part=part
        ) from None


def compact(value: Any) -> str | None:
    """The compact JSON text of `value` (a spec's source, admission's cache key), or None when
    `value` is not a JSON document nested at most `MAX_NESTING` deep (`check_document` then names
    why). orjson's (`json_text.write`: what a check of `value` reads, see `document_of`); else the
    document is walked and written by the standard library (integers past 64 bits, subclasses of
    str/int/dict/list, NaN), and its JSON form written by orjson where it can be, so equal
    documents get one text whatever form they came in."""
    text = json_text.write(value)
    if text is not None:
        return text
    try:
        check_document(value, "")
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        text.encode("utf-8")
    except (InvalidGrammarError, TypeError, ValueError, RecursionError):
        return None
    return json_text.write(json.loads(text)) or text


def document_of(text: str) -> Any:
    """The document of a text `compact` wrote (read by orjson where it reads as json does)."""
    found = json_text.read(text)
    return found[0] if found is not None else json.loads(text)


def plain_text(value: Any, part: str) -> str:
    """`compact(value)`, or an InvalidGrammarError naming what in `value` is not plain JSON."""
    text = compact(value)
    if text is None:
        check_document(value, part)  # raises, naming the value and where it is
        raise InvalidGrammarError("not a plain JSON document", part=part)
    return text


def as_dict(value: Any, part: str) -> dict:
    if isinstance(value, (str, bytes)):
        found = json_text.read(value)
        if found is not None and isinstance(found[0], dict):
            return found[0]  # plain and within MAX_NESTING
        value = found[0] if found is not None else _load_json_exactly(value, part)
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True)
    if not isinstance(value, dict):
        raise InvalidGrammarError(f"must be an object, got {type(value).__name__}", part=part)
    plain_text(value, part)
    return value


def load_schema(value: Any, part: str) -> dict:
    """A request's JSON schema as a checked document: a pydantic model class, JSON text, `true`
    (any value) or an object; `false` and non-objects refused."""
    return schema_and_source(value, part)[0]


def schema_and_source(value: Any, part: str) -> tuple[dict, str]:
    """`load_schema`'s document and its compact JSON text (a spec's source, `compact`).

    JSON text orjson reads for sure (`json_text.read`) is checked and written in native code; other
    text is read by the standard library, its depth walked first (containers only: `check_depth`),
    then the rest (NaN, lone surrogates) with the path named.
    """
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        value = value.model_json_schema()
        return value, plain_text(value, part)
    if isinstance(value, (str, bytes)):
        found = json_text.read(value)
        if found is not None and isinstance(found[0], dict):
            return found
        value = found[0] if found is not None else _load_json_exactly(value, part)
        if isinstance(value, dict):
            check_depth(value, part)
            return value, _read_text(value, part)
    if value is True:
        return {}, "{}"  # any JSON value (json_object would allow only objects)
    if value is False:
        raise InvalidGrammarError("the schema `false` admits no value", part=part)
    if not isinstance(value, dict):
        raise InvalidGrammarError(f"a JSON schema must be an object, got {type(value).__name__}", part=part)
    return value, plain_text(value, part)


def _read_text(document: dict, part: str) -> str:
    """`compact` of a document ``json.loads`` read (JSON types under string keys, its depth checked
    by the caller): NaN and lone surrogates show when it is written, and only then is it walked to
    name them; its integers past 64 bits keep it from orjson."""
    text = json_text.write(document)
    if text is not None:
        return text
    try:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        text.encode("utf-8")
    except ValueError:  # UnicodeEncodeError is one
        check_document(document, part)  # raises, naming the value and where it is
        raise InvalidGrammarError("not a plain JSON document", part=part) from None
    return text


# Schema text this many times the byte limit is refused before it is parsed: indentation rarely
# doubles a schema, and reading a 5 MB text into Python objects costs ~1 s on the caller's thread.
TEXT_SLACK = 2


def surely_too_long(text: str | bytes, limit: int) -> bool:
    """Whether schema text is refused by its length alone: past `TEXT_SLACK` times the byte limit."""
    return len(text) > TEXT_SLACK * limit


def check_text_size(text: str | bytes, limit: int, part: str) -> None:
    """Refuse schema text whose compact form is surely over `limit` bytes, unread (reading 2 MB:
    ~20 ms): by its length past `TEXT_SLACK` times the limit, else by `compact_size_at_least`."""
    if len(text) <= limit:
        return
    at_least = len(text) if surely_too_long(text, limit) else compact_size_at_least(text, limit)
    if at_least > limit:
        raise InvalidGrammarError(
            f"the schema is at least {at_least:,} bytes, over the limit of {limit:,}",
            part=part,
            feature=f"schema larger than {limit:,} bytes",
        )


def compact_size_at_least(text: str | bytes, limit: int = -1) -> int:
    """A lower bound of the UTF-8 size of `text`'s compact form, found without reading it: a
    character is at least a byte, reading drops at most the whitespace (space, tab, newline,
    return: JSON allows no other) and shortens an escape by at most 5 bytes per backslash
    (``\\u0041`` -> ``A``; a surrogate pair, 12 -> 4). Given `limit`, a bound that is at most
    `limit` before tabs and returns are counted is returned as it is (only "within `limit`" is
    certain then): each count is a pass over the text, ~1 ms a megabyte."""
    if isinstance(text, bytes):
        return compact_size_at_least(text.decode("latin-1"), limit)  # one character a byte
    bound = len(text) - text.count(" ") - text.count("\n") - 5 * text.count("\\")
    if bound <= limit:
        return bound
    return bound - text.count("\t") - text.count("\r")


def check_depth(value: Any, part: str) -> None:
    """Refuse a document nested deeper than `MAX_NESTING`, level by level (iterative; only
    containers are kept, no per-node bookkeeping)."""
    level, depth = [value], 1
    while level:
        if depth > MAX_NESTING:
            raise InvalidGrammarError(f"nested more than {MAX_NESTING} levels deep", part=part)
        below: list = []
        for node in level:
            if isinstance(node, dict):
                below += [child for child in node.values() if isinstance(child, _CONTAINERS)]
            else:
                below += [child for child in node if isinstance(child, _CONTAINERS)]
        level, depth = below, depth + 1


_CONTAINERS = (dict, list, tuple)
