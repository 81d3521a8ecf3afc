"""llguidance options and regexes with Python's meaning.

`json_options` turns a request's JSON layout into llguidance's options; `python_exact_regex` gives
``guided_regex`` and structural-tag regexes Python's class meanings (JSON schemas are prepared by
`fd_guided.schema.for_engine`, whose `fd_guided.schema.regex` does the same for ``pattern``).
"""
from __future__ import annotations

import functools
import re
from typing import Any

from ..errors import InvalidGrammarError
from ..spec import JsonFormat

WHITESPACE_CHARS = r"[\x20\x0A\x0D\x09]"


class Refusal(Exception):
    """Raised while preparing a grammar: `feature` cannot be enforced faithfully."""

    def __init__(self, feature: str, location: str = ""):
        super().__init__(feature)
        self.feature = feature
        self.location = location


def json_options(fmt: JsonFormat) -> dict[str, Any]:
    """llguidance JSON options for a request's layout: bounded whitespace or fixed separators."""
    if fmt.any_whitespace:
        bound = "*" if fmt.max_whitespace_cnt is None else f"{{0,{fmt.max_whitespace_cnt}}}"
        return {"whitespace_flexible": True, "whitespace_pattern": WHITESPACE_CHARS + bound,
                "item_separator": ",", "key_separator": ":", "coerce_one_of": False, "lenient": False}
    item, key = fmt.separators or (",", ":")
    return {"whitespace_flexible": False, "item_separator": item, "key_separator": key, "coerce_one_of": False, "lenient": False}



def python_compiles(pattern: str, where: str) -> None:
    # Outputs are validated with Python's `re`: a pattern it cannot read cannot be checked.
    try:
        re.compile(pattern)
    except re.error as error:
        raise InvalidGrammarError(f"not a valid (Python) regular expression: {error}", part=where) from None


# ----- regexes with Python's meaning --------------------------------------------------------------

_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": r"\t\n\x0B\x0C\r\x20"}
_PYTHON_PREDICATES = {"d": str.isdecimal, "w": lambda c: c.isalnum() or c == "_", "s": str.isspace}


def _python_class(kind: str) -> str:
    """Python `re`'s ``\\d``/``\\w``/``\\s`` for str patterns as explicit code-point ranges."""
    return _code_point_ranges(kind, False)


def _python_complement(kind: str) -> str:
    """The complement of `_python_class(kind)` (Unicode scalar values only)."""
    return _code_point_ranges(kind, True)


@functools.lru_cache(maxsize=6)
def _code_point_ranges(kind: str, negate: bool) -> str:
    predicate = _PYTHON_PREDICATES[kind]
    ranges, start = [], None
    for point in range(0x110000 + 1):
        inside = point <= 0x10FFFF and not 0xD800 <= point <= 0xDFFF and predicate(chr(point)) != negate
        if inside and start is None:
            start = point
        elif not inside and start is not None:
            ranges.append((start, point - 1))
            start = None
    return "".join(f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges)


@functools.lru_cache(maxsize=4096)
def python_exact_regex(pattern: str) -> str:
    """`pattern` rewritten so llguidance's (Rust) regex never matches more than Python's `re` does.

    Positive shorthands become ASCII classes (a subset of Python's Unicode ones); negated
    shorthands, and shorthands inside negated classes, become Python's exact sets. Rust-only class
    syntax is refused (`Refusal`).
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = negated = False
    class_start = 0
    while i < n:
        char = pattern[i]
        if char == "\\":
            if i + 1 >= n:
                raise Refusal("a regex ending in a lone backslash")
            escaped = pattern[i + 1]
            lower = escaped.lower()
            if lower in _ASCII_CLASSES:
                is_negated_shorthand = escaped.isupper()
                if not in_class:
                    out.append(f"[^{_python_class(lower)}]" if is_negated_shorthand else f"[{_ASCII_CLASSES[lower]}]")
                elif is_negated_shorthand:
                    out.append(_python_complement(lower))
                else:
                    out.append(_python_class(lower) if negated else _ASCII_CLASSES[lower])
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if char == "[":
                raise Refusal("a nested character class or POSIX class in a regex (Rust and Python read it differently)")
            if char in "&~-" and pattern[i + 1:i + 2] == char and i > class_start:
                raise Refusal(f"the class operator {char * 2!r} in a regex (Rust and Python read it differently)")
            if char == "]" and i > class_start:
                in_class = False
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            negated = pattern[i + 1:i + 2] == "^"
            out.append("[^" if negated else "[")
            i += 2 if negated else 1
            class_start = i  # a "]" right here is a literal in both dialects
            continue
        out.append(char)
        i += 1
    return "".join(out)


