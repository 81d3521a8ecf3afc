"""Admission's checks when they did not finish within the admission budget: left to the compile
worker, decided there, and remembered for the next identical request.

`parse_guided_request` runs the checks whose cost it cannot bound by construction under
`GuidedConfig.admission_budget_s` (`fd_guided.schema.deadline`): a JSON schema's bounds,
meta-schema and references (`check_schema_document`), a grammar's syntax and bounds
(`syntax.check_grammar_text`), a regex's bounds and syntax (`syntax.check_regex_syntax`). When
they overrun, the `GrammarSpec` it returns carries a `Pending` (``spec.pending``; not part of the
spec's equality or hash). A pending spec is never compiled unchecked: the compile worker runs the
checks before it compiles (`fd_guided.compile.worker`, and the in-process compile of thread
isolation), and reading ``spec.schema`` (what every engine's check and compile of a schema does
first) runs them too, unbounded, once per spec object (`finish_deferred_checks`). The worker tags
a refusal with `DEFERRED_TAG`, which the serving process strips and remembers on its own spec
object (`learned`). Admission caches specs by request text (`cache.PARSED`), so the next identical
request finds the refusal on the spec it gets back and is refused at admission
(`Pending.raise_if_refused`)."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from ..errors import InvalidGrammarError
from ..limits import AdmissionLimits, check_schema, check_size
from ..schema.deadline import afford, unbounded
from .cache import CHECKED, _Refused
from .documents import check_text_size, schema_and_source
from .meta import check_json_schema
from .syntax import REGEX_SECONDS_PER_CHAR, check_grammar_text, check_regex_syntax

if TYPE_CHECKING:
    from .spec import GrammarSpec

# Prefix of a worker's message for a refusal of admission's deferred checks (stripped in `learned`).
DEFERRED_TAG = "[deferred admission check] "

# What `limits.check_schema`'s walks cost per byte of compact schema text (measured: 8-21 ms for
# 0.3-0.9 MB SchemaStore schemas on a 2-core x86 host; rounded up). It cannot stop itself, so it
# starts under a deadline only when it is expected to end in time.
BOUNDS_SECONDS_PER_BYTE = 1e-7

STATS = {"deferred": 0, "refused_later": 0}  # process-wide counts (admission has no metrics sink)
_stats_lock = threading.Lock()


def count(name: str) -> None:
    with _stats_lock:
        STATS[name] += 1


class Pending:
    """What admission left undone for one spec: the checks of its kind (`checked` False until they
    pass), with the request field they name (`part`) and the limits they apply; `unread`: the
    spec's source is a schema text as the request gave it, not read yet (`admission.unread`). The
    verdict is remembered here; a copy sent to a compile worker carries `checked` only."""

    def __init__(self, part: str, limits: AdmissionLimits, checked: bool = False, unread: bool = False):
        self.part, self.limits, self.checked, self.unread = part, limits, checked, unread
        self._refused: _Refused | None = None
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        return {"part": self.part, "limits": self.limits, "checked": self.checked, "unread": self.unread}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["part"], state["limits"], state["checked"], state.get("unread", False))  # type: ignore[misc]

    @property
    def refused(self) -> bool:
        return self._refused is not None

    def raise_if_refused(self) -> None:
        """Raise the refusal remembered for this spec (found by a worker or a later check), if any."""
        refused = self._refused
        if refused is not None:
            refused.raise_again()

    def remember(self, error: InvalidGrammarError) -> None:
        with self._lock:
            if self._refused is None:
                self._refused = _Refused(error)
                count("refused_later")


def check_schema_document(schema: dict, limits: AdmissionLimits, part: str, *, source_bytes: int = 0) -> None:
    """The schema checks every backend relies on: bounds (reference depth, the regexes), the
    draft's meta-schema and every reference resolving inside the document. Under a deadline the
    bounds walk starts only if `source_bytes` of schema are expected to fit (`afford`); the others
    stop themselves (`fd_guided.schema.deadline.checkpoint`)."""
    afford(source_bytes * BOUNDS_SECONDS_PER_BYTE)
    check_schema(schema, limits, part, before_regex=_afford_regex)
    check_json_schema(schema, part, source_bytes)


def _afford_regex(pattern: str) -> None:
    """`Overrun` unless a schema regex's bounds check (``re``'s parser, which cannot stop itself)
    is expected to end in time: the per-byte estimate of the walks leaves the patterns out, and a
    24 KB schema's 12 patterns (2,600 characters) held the caller's thread ~9 ms."""
    afford(len(pattern) * REGEX_SECONDS_PER_CHAR)


def finish_deferred_checks(spec: GrammarSpec) -> None:
    """Run `spec`'s deferred checks (no deadline) if they have not run on this object; raise their
    refusal (now and for every later caller). No-op for a spec without `pending`."""
    pending = spec.pending
    if pending is None or pending.checked:
        return
    with pending._lock:
        pending.raise_if_refused()
        if pending.checked:
            return
        try:
            with unbounded():
                _run_checks(spec, pending)
        except InvalidGrammarError as error:
            pending.remember(error)
            raise
        pending.checked = True


def _run_checks(spec: GrammarSpec, pending: Pending) -> None:
    if spec.kind == "json_schema" and pending.unread:
        check_schema_document(read_schema_text(spec.source, pending.limits, pending.part), pending.limits, pending.part)
    elif spec.kind == "json_schema":
        check_schema_document(json.loads(spec.source), pending.limits, pending.part)
    elif spec.kind in ("ebnf", "lark"):
        check_grammar_text(spec.source, spec.kind == "lark", pending.limits, pending.part)
    elif spec.kind == "regex":
        check_regex_syntax(spec.source, pending.limits, pending.part)
    else:
        raise TypeError(f"no deferred checks for a {spec.kind} spec")


def read_schema_text(text: str, limits: AdmissionLimits, part: str) -> dict:
    """A schema text admission left unread (`admission.unread`), read and refused as admission
    reads a text (`fields._parse_json_schema`): its size bound, its reading (UTF-8, JSON, depth,
    an object, valid Unicode) and its compact size; returns the document."""
    check_text_size(text, limits.max_constraint_bytes, part)
    schema, source = schema_and_source(text, part)
    check_size(source, limits.max_constraint_bytes, part, "schema")
    return schema


def learned(spec: GrammarSpec, error: InvalidGrammarError) -> tuple[InvalidGrammarError, bool]:
    """(the error as the client should read it, whether it is a refusal of admission's deferred
    checks). Such a refusal, tagged by the compile worker, loses its tag and is remembered on
    `spec` (the serving process's own object: admission's cache holds it), so the next identical
    request is refused at admission."""
    text = str(error)
    prefix = f"{error.part}: " if error.part else ""
    message = text[len(prefix) :] if prefix and text.startswith(prefix) else text
    if not message.startswith(DEFERRED_TAG):
        return error, False
    message = message[len(DEFERRED_TAG) :]
    try:
        cleaned = type(error)(message, part=error.part, feature=error.feature)
    except TypeError:  # a subclass with another signature
        cleaned = InvalidGrammarError(message, part=error.part, feature=error.feature)
    if spec.pending is not None:
        spec.pending.remember(cleaned)
    return cleaned, True


def remember_refusal(backend_class, spec: GrammarSpec, error: InvalidGrammarError) -> None:
    """A refusal of `backend_class`'s checks decided after admission (in a compile worker, where
    admission left them): remembered where the next identical request's admission finds it, on
    `spec`'s `Pending` (`parse_guided_request` raises it) or else in the backend checks' cache."""
    if spec.pending is not None:
        spec.pending.remember(error)
        return

    def refuse() -> None:
        raise error

    try:
        CHECKED.verdict((backend_class, spec), len(spec.source), refuse)
    except InvalidGrammarError:
        pass
