"""llguidance's JSON options for a request's layout, a schema normalised for it, and the refusal its
grammar builders raise.

Regexes get Python's exact reading from `fd_guided.schema.regex_for_engine` (``guided_regex``,
structural-tag regexes) and JSON schemas from `fd_guided.schema.for_engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidGrammarError
from ..schema import for_engine
from ..schema.refusal import Refusal
from ..spec import JsonFormat

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of llguidance's stub only

__all__ = ["Refusal", "WHITESPACE_CHARS", "json_options", "llguidance_schema"]

WHITESPACE_CHARS = r"[\x20\x0A\x0D\x09]"


def json_options(fmt: JsonFormat) -> JsonCompileOptions:
    """llguidance JSON options for a request's layout: bounded whitespace or fixed separators."""
    if fmt.any_whitespace:
        bound = "*" if fmt.max_whitespace_cnt is None else f"{{0,{fmt.max_whitespace_cnt}}}"
        return {
            "whitespace_flexible": True,
            "whitespace_pattern": WHITESPACE_CHARS + bound,
            "item_separator": ",",
            "key_separator": ":",
            "coerce_one_of": False,
            "lenient": False,
        }
    item, key = fmt.separators or (",", ":")
    return {
        "whitespace_flexible": False,
        "item_separator": item,
        "key_separator": key,
        "coerce_one_of": False,
        "lenient": False,
    }


def llguidance_schema(schema: Any, json_format, part: str, *, unique_guard: bool = False) -> dict:
    """`schema` normalised for llguidance (`fd_guided.schema.for_engine`, `unique_guard` included);
    InvalidGrammarError if it cannot be."""
    if json_format.any_order:
        raise InvalidGrammarError("llguidance keeps properties in schema order", part=part, feature="guided_any_order")
    return for_engine("llguidance", schema, json_format, part=part, unique_guard=unique_guard)
