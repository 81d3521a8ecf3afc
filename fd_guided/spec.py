"""Moved to `fd_guided.admission` (`admission.spec`: `GrammarSpec`, `JsonFormat`; `admission.parse`:
`parse_guided_request`); these names stay importable from here for hosts and plugins."""

from __future__ import annotations

from .admission.fields import COMPACT_SEPARATORS, KIND_FIELDS, UNKNOWN_FORMAT_POLICIES, grammar_is_lark
from .admission.parse import check_with_backend, parse_guided_request
from .admission.spec import FIELD_OF_KIND, JSON_KINDS, KINDS, GrammarSpec, JsonFormat

__all__ = [
    "COMPACT_SEPARATORS",
    "FIELD_OF_KIND",
    "JSON_KINDS",
    "KINDS",
    "KIND_FIELDS",
    "UNKNOWN_FORMAT_POLICIES",
    "GrammarSpec",
    "JsonFormat",
    "check_with_backend",
    "grammar_is_lark",
    "parse_guided_request",
]
