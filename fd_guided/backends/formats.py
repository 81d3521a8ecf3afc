"""Strict regexes for JSON-schema string formats that grammar engines enforce too loosely.

xgrammar's built-in ``ipv4`` admits leading zeros (``1.02.3.4``) and its ``date`` admits days a
month does not have (``2023-02-30``); JSON Schema (and Python's validators behind `jsonschema`)
refuse both. A backend rewrites these formats to the patterns below before compiling, so what it
enforces is exactly the format, never looser. Each pattern was checked against Python's
`datetime.date.fromisoformat` / `ipaddress.IPv4Address` on random inputs (tests/test_formats.py).
"""
from __future__ import annotations

import copy
from typing import Any

from .schema_walk import for_each_schema_node

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_YEAR = r"([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)"
DATE = (
    rf"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
DATE_TIME = rf"{DATE}T{TIME}"

STRICT_FORMAT_PATTERNS = {"ipv4": IPV4, "date": DATE, "date-time": DATE_TIME, "time": TIME}


def with_strict_formats(schema: Any) -> Any:
    """A copy of `schema` where every string ``format`` listed above becomes an anchored ``pattern``."""
    schema = copy.deepcopy(schema)
    for_each_schema_node(schema, _format_to_pattern)
    return schema


def _format_to_pattern(node: dict) -> None:
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in STRICT_FORMAT_PATTERNS and "pattern" not in node:
        del node["format"]
        node["pattern"] = f"^{STRICT_FORMAT_PATTERNS[fmt]}$"
