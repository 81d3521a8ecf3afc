"""The admitted constraint: `GrammarSpec` (frozen; the cache key of compiled grammars) and
`JsonFormat` (how JSON text may be laid out). Built by `fd_guided.admission.parse`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import InvalidGrammarError
from .deferred import Pending, finish_deferred_checks

KINDS = ("json_schema", "json_object", "regex", "choice", "ebnf", "lark", "structural_tag")
JSON_KINDS = ("json_schema", "json_object", "structural_tag")

FIELD_OF_KIND = {
    "json_schema": "guided_json",
    "json_object": "json_object",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "ebnf": "guided_grammar",
    "lark": "guided_grammar",
    "structural_tag": "structural_tag",
}


@dataclass(frozen=True)
class JsonFormat:
    """How JSON text may be laid out and read: whitespace, separators, strictness, formats, order.

    `unknown_formats` ``"annotate"`` drops a ``format`` that no validator knows (it cannot be
    checked, so it is an annotation) instead of refusing the schema; `any_order` lets an object's
    properties come in any order where the engine supports it (xgrammar).
    """

    any_whitespace: bool
    max_whitespace_cnt: int | None
    separators: tuple[str, str] | None
    strict: bool
    unknown_formats: str = "refuse"
    any_order: bool = False


@dataclass(frozen=True)
class GrammarSpec:
    """A validated constraint: the cache key of compiled grammars (frozen, hashable, comparable).

    `source` is canonical text: compact JSON for ``json_schema``/``structural_tag``, a JSON list
    for ``choice``, the pattern for ``regex`` and the grammar text for ``ebnf``/``lark``.
    `json_format` is set for the JSON kinds and None otherwise.

    `pending` (not part of equality, hash or repr) is set when admission's checks (a schema's, a
    grammar's) did not finish within its budget (`fd_guided.admission.deferred`): compiles run
    them first, and so does ``schema``, so a pending spec is never compiled unchecked.
    """

    kind: str
    source: str
    json_format: JsonFormat | None = None
    pending: Pending | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidGrammarError(f"unknown grammar kind {self.kind!r}; expected one of {KINDS}")

    @property
    def schema(self) -> dict:
        """The JSON schema of a ``json_schema`` spec; for a pending one, once its deferred schema
        checks passed (they run here if they have not: InvalidGrammarError if they refuse)."""
        if self.kind != "json_schema":
            raise AttributeError(f"a {self.kind} spec has no JSON schema")
        finish_deferred_checks(self)
        return json.loads(self.source)

    @property
    def choices(self) -> list[str]:
        if self.kind != "choice":
            raise AttributeError(f"a {self.kind} spec has no choices")
        return json.loads(self.source)

    @property
    def structural_tag(self) -> dict:
        if self.kind != "structural_tag":
            raise AttributeError(f"a {self.kind} spec has no structural tag")
        return json.loads(self.source)

    def describe(self) -> str:
        """A short, log-safe description (kind and size, never the whole user text)."""
        return f"{self.kind}({len(self.source)} chars)"
