"""Request documents as plain JSON: decoding, types, depth and text, checked before anything else.

Every later stage (meta-validation, the normaliser, the engines' converters) recurses over a
document and assumes JSON values; a value that is not one, or nests past `MAX_NESTING`, is an
`InvalidGrammarError` here, found iteratively (the check itself cannot overflow).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidGrammarError

# Deepest JSON document accepted (schemas, structural tags). SchemaStore's deepest schema has 27
# levels; native parsers and converters recurse, so an unbounded depth could crash the process.
MAX_NESTING = 128


def load_json(text: str | bytes, part: str) -> Any:
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidGrammarError(f"not valid UTF-8 ({error.reason} at byte {error.start})", part=part) from None
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


def as_dict(value: Any, part: str) -> dict:
    if isinstance(value, (str, bytes)):
        value = load_json(value, part)
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True)
    if not isinstance(value, dict):
        raise InvalidGrammarError(f"must be an object, got {type(value).__name__}", part=part)
    check_document(value, part)
    return value


def load_schema(value: Any, part: str) -> dict:
    """A request's JSON schema as a checked document: a pydantic model class, JSON text, `true`
    (any value) or an object; `false` and non-objects refused."""
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        return value.model_json_schema()
    if isinstance(value, (str, bytes)):
        value = load_json(value, part)
    if value is True:
        return {}  # any JSON value (json_object would allow only objects)
    if value is False:
        raise InvalidGrammarError("the schema `false` admits no value", part=part)
    if not isinstance(value, dict):
        raise InvalidGrammarError(f"a JSON schema must be an object, got {type(value).__name__}", part=part)
    check_document(value, part)
    return value


def schema_and_source(value: Any, part: str, written: str | None = None) -> tuple[dict, str]:
    """`load_schema`'s document and its compact JSON text (a spec's source), cheaper for text.

    What `json.loads` builds holds only JSON types under string keys, so only its depth is walked
    (containers only: `check_depth`); NaN, Infinity and lone surrogates show when the source is
    written (``allow_nan=False``, one UTF-8 encode), and only then is the document walked for the
    path to name (`check_document`). A 1 MB schema text costs ~10 ms less on the caller's thread.
    `written`: `value` (a dict) already written that way (admission's cache key): only its depth
    and key types are walked then, and it is not written again.
    """
    if written is not None and isinstance(value, dict):
        try:
            check_depth(value, part, keys=True)
            written.encode("utf-8")
        except (InvalidGrammarError, ValueError):
            check_document(value, part)  # names the value and where it is
            raise InvalidGrammarError("not a plain JSON document", part=part) from None
        return value, written
    if isinstance(value, (str, bytes)):
        parsed = load_json(value, part)
        if isinstance(parsed, dict):
            check_depth(parsed, part)
            try:
                source = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                source.encode("utf-8")
            except ValueError:  # UnicodeEncodeError is one
                check_document(parsed, part)  # raises, naming the value and where it is
                raise InvalidGrammarError("not a plain JSON document", part=part) from None
            return parsed, source
        value = parsed
    schema = load_schema(value, part)
    return schema, json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def check_depth(value: Any, part: str, *, keys: bool = False) -> None:
    """Refuse a document nested deeper than `MAX_NESTING`, level by level (iterative; only
    containers are kept, no per-node bookkeeping); with `keys`, an object key that is not a
    string too."""
    level, depth = [value], 1
    while level:
        if depth > MAX_NESTING:
            raise InvalidGrammarError(f"nested more than {MAX_NESTING} levels deep", part=part)
        below: list = []
        for node in level:
            if isinstance(node, dict):
                if keys and not all(isinstance(key, str) for key in node):
                    raise InvalidGrammarError("object keys must be strings", part=part)
                below += [child for child in node.values() if isinstance(child, _CONTAINERS)]
            else:
                below += [child for child in node if isinstance(child, _CONTAINERS)]
        level, depth = below, depth + 1


_CONTAINERS = (dict, list, tuple)
