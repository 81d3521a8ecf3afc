"""Turn the guided fields of a request into one frozen `GrammarSpec`, validating at admission.

Accepted forms (exactly one kind per request):
  - OpenAI ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``,
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``,
    ``{"type": "structural_tag", ...}`` (legacy ``structures``/``triggers`` or the ``format`` form);
  - FastDeploy/vLLM-style fields: ``guided_json`` (str, dict or a pydantic model class),
    ``guided_json_object`` (bool), ``guided_regex``, ``guided_choice`` (list of str),
    ``guided_grammar`` (EBNF; Lark syntax is detected), ``structural_tag`` (str or dict);
  - options: ``any_whitespace`` / ``disable_any_whitespace``, ``max_whitespace_cnt``,
    ``separators`` (item, key), ``guided_strict`` (strict JSON: objects that declare properties
    admit no others, tuples no extra items; ``false`` gives plain JSON Schema semantics),
    ``guided_unknown_formats`` (``"refuse"`` or ``"annotate"``: treat a ``format`` no validator
    knows as an annotation), ``guided_any_order`` (properties in any order, where the engine can).

`parse_guided_request` checks what every backend needs (one kind, well-formed JSON, a valid JSON
Schema with resolvable local ``$ref``s, non-empty choices, string types) and then asks the chosen
backend's checker whether it can enforce the spec faithfully (regex/EBNF syntax, unsupported
schema keywords). Every failure is an `InvalidGrammarError` naming the offending part.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..registry import get_backend_class
from ..schema.deadline import Overrun, until
from ..schema.formats import FORMAT_PATTERNS
from .cache import CHECKED, PARSED, VerdictCache, canonical_key
from .deferred import count
from .documents import surely_too_long
from .fields import (
    KIND_FIELDS,
    as_written,
    json_format_of,
    request_state,
    spec_from_fields,
)
from .meta import warm_meta_validators
from .spec import FIELD_OF_KIND, GrammarSpec

logger = logging.getLogger(__name__)

OPTION_FIELDS = (
    "disable_any_whitespace",
    "any_whitespace",
    "max_whitespace_cnt",
    "separators",
    "guided_strict",
    "guided_unknown_formats",
    "guided_any_order",
)
CACHED_FIELDS = (*KIND_FIELDS, "response_format", *OPTION_FIELDS)  # every field a spec depends on

# (backend class, spec) whose check ran out of admission's budget once: under a budget it is left
# to the compile worker at once (a lookup), not retried until the budget is spent again.
LEFT_TO_WORKER = VerdictCache()


def parse_guided_request(
    fields: Mapping[str, Any],
    config: GuidedConfig | None = None,
    *,
    check_backend: bool = True,
) -> GrammarSpec | None:
    """Validate a request's guided fields and return its `GrammarSpec`, or None if unconstrained.

    None is returned only when the request asks for no constraint at all (no guided field, or
    ``response_format`` of type ``text``). With `check_backend` the spec is also passed to the
    checker of ``config.backend`` (looked up in `fd_guided.registry`), so a constraint the
    backend would silently weaken is refused here, at admission, not discovered while decoding.

    Bounded: with ``config.admission_budget_s`` (the default) the checks whose cost is not bounded
    by construction (a JSON schema's bounds, meta-schema and references; the backend's check)
    stop once the budget is spent, and what is left is decided in the compile worker before the
    compile (`fd_guided.admission.deferred`): the spec then carries ``pending``, and a refusal
    found there fails that request alone and is remembered here, so the next identical request is
    refused at admission. ``admission_budget_s=None`` decides everything here.

    Raises:
        InvalidGrammarError: naming the offending field or schema location.
    """
    config = config or GuidedConfig()
    if not isinstance(fields, Mapping):
        raise InvalidGrammarError(f"request fields must be a mapping, got {type(fields).__name__}")
    budget = config.admission_budget_s
    deadline_at = None if budget is None else time.perf_counter() + budget
    fit_budget_requested(fields)  # a bad value is this request's 400 too
    found = None if refused_by_length(fields, config.limits) else canonical_key(fields, CACHED_FIELDS)
    key, size = (None, 0) if found is None else ((found[0], config), found[1])
    request_state.deadline = deadline_at
    # The key's JSON text per field, reused as a source.
    request_state.written = {name: getattr(text, "text", text) for name, text in found[0]} if found is not None else {}
    try:
        spec = PARSED.verdict(key, size, lambda: _parse(fields, config))
    finally:
        request_state.deadline, request_state.written = None, {}
    if spec is not None and spec.pending is not None:
        spec.pending.raise_if_refused()  # decided since, in a compile worker or by a compile here
    request_state.last = (spec, deadline_at)
    if spec is not None and check_backend:
        check_with_backend(get_backend_class(config.backend), spec)
    return spec


def refused_by_length(fields: Mapping[str, Any], limits) -> bool:
    """A request refused by a length alone (text `TEXT_SLACK` times the byte limit, a choice list
    past the limit): not remembered, since finding it again in the cache (comparing megabytes of
    text, writing 100,000 choices to find their key) costs more than refusing it again."""
    for name in CACHED_FIELDS:
        value = fields.get(name)
        if isinstance(value, (str, bytes)) and surely_too_long(value, limits.max_constraint_bytes):
            return True
    choices = fields.get("guided_choice")
    return isinstance(choices, (list, tuple)) and len(choices) > limits.max_choices


def _parse(fields: Mapping[str, Any], config: GuidedConfig) -> GrammarSpec | None:
    try:
        fields = as_written(fields, config.limits)
        json_format = json_format_of(fields, config)
        return spec_from_fields(fields, json_format, config.limits)
    except InvalidGrammarError:
        raise
    except Exception as error:  # noqa: BLE001 - hostile input must never escape as another type
        logger.info("guided request rejected by an unexpected %s: %s", type(error).__name__, error)
        raise InvalidGrammarError(
            f"could not read the guided fields ({type(error).__name__}: {_short(error)})", part="request"
        ) from None


FIT_BUDGET_FIELD = "guided_fit_budget"


# Requests whose first admission in a process would pay one-time costs (the imports of both
# engines' checkers, Python's exact \d \w \s sets built over every code point: ~0.1 s; each
# format's regex translated for both engines, cached per process: "uri-reference" alone held the
# first request that used it ~25 ms, a sixth of SchemaStore's schemas use one).
_WARM_UP_REQUESTS: tuple[dict[str, Any], ...] = (
    {"guided_json": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[\\w.-]+@\\S+$"}}}},
    {"guided_json": {"type": "object", "patternProperties": {"^\\w+$": {"type": "integer"}}}},
    {"guided_regex": "(?a)\\d+\\s\\w+\\D\\W\\S"},
    {"guided_regex": "\\d+\\s\\w+\\D\\W\\S[^\\w\\d\\s]"},
    *({"guided_json": {"type": "string", "format": name}} for name in FORMAT_PATTERNS),
)


_warmed: set[str] = set()


def warm_up(config: GuidedConfig | None = None) -> None:
    """Pay admission's one-time costs now (engine start-up, a compile zygote), not in the first
    requests' admissions: a few representative requests admitted inline, their verdicts dropped.
    Once per process and backend (~1-2 s the first time)."""
    config = (config or GuidedConfig()).replace(admission_budget_s=None)
    if config.backend in _warmed:
        return
    _warmed.add(config.backend)
    warm_meta_validators()
    for fields in _WARM_UP_REQUESTS:
        try:
            parse_guided_request(fields, config)
        except InvalidGrammarError:  # a backend that refuses one of them: its costs are paid too
            pass
    PARSED.clear()
    CHECKED.clear()


def fit_budget_requested(fields: Mapping[str, Any]) -> bool:
    """Whether the guided output is steered to end complete within the request's ``max_tokens``
    (`fd_guided.budget`): ``guided_fit_budget``, default true. Raises InvalidGrammarError for a
    value that is not a boolean."""
    value = fields.get(FIT_BUDGET_FIELD)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InvalidGrammarError(f"must be a boolean, got {type(value).__name__}", part=FIT_BUDGET_FIELD)
    return value


def check_with_backend(backend_class, spec: GrammarSpec) -> None:
    """Run a backend's admission check; an unexpected exception in it fails this request only.

    A checker bug triggered by odd input must not escape as a TypeError and take down the caller's
    whole batch: it becomes an InvalidGrammarError (the traceback is logged for the developers).
    The verdict is remembered per (backend, spec) (`cache.CHECKED`): a spec seen before costs a lookup.

    Called right after `parse_guided_request` on the same thread with the spec it returned (as
    `GuidedDecodingManager.validate` does), the check runs within what is left of that request's
    admission budget; past it, or for a spec whose schema checks are pending, the verdict is left
    to the compile worker, which runs the engine's check before it compiles (`compile.worker`).
    """
    last = getattr(request_state, "last", None)
    request_state.last = None
    deadline_at = last[1] if last is not None and last[0] is spec else None
    if spec.pending is not None and not spec.pending.checked:
        return  # the worker runs the deferred checks first, then the engine's
    key = (backend_class, spec)
    if deadline_at is not None and not CHECKED.known(key) and LEFT_TO_WORKER.known(key):
        count("deferred")
        return
    try:
        with until(deadline_at):
            CHECKED.verdict(key, len(spec.source), lambda: _check(backend_class, spec))
    except Overrun:
        count("deferred")
        LEFT_TO_WORKER.verdict(key, len(spec.source), lambda: None)


def check_if_known(backend_class, spec: GrammarSpec) -> bool:
    """The remembered verdict of `backend_class`'s check on `spec`, if any: raises a remembered
    refusal, returns True for a remembered pass and False when the check has not run (the caller
    leaves it to the compile, which runs the same check in a worker process)."""
    key = (backend_class, spec)
    if not CHECKED.known(key):
        return False
    CHECKED.verdict(key, len(spec.source), lambda: _check(backend_class, spec))
    return True


def _check(backend_class, spec: GrammarSpec) -> None:
    try:
        backend_class.check(spec)
    except (InvalidGrammarError, Overrun):
        raise
    except Exception as error:  # noqa: BLE001 - any checker failure is this request's failure
        logger.exception("the %s checker failed on %s", getattr(backend_class, "name", backend_class), spec.describe())
        raise InvalidGrammarError(
            f"the {getattr(backend_class, 'name', 'backend')} checker could not check this constraint "
            f"({type(error).__name__}: {error})",
            part=FIELD_OF_KIND.get(spec.kind, "request"),
        ) from None


def _short(error: BaseException, limit: int = 200) -> str:
    text = str(error)
    return text if len(text) <= limit else text[:limit] + "..."
