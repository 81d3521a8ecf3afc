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

import json
import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..limits import AdmissionLimits, check_choices, check_grammar, check_size
from ..registry import get_backend_class
from ..schema.deadline import Overrun, checkpoint, until
from .cache import CHECKED, PARSED, VerdictCache, canonical_key
from .deferred import Pending, check_schema_document, count
from .documents import as_dict, check_text, schema_and_source
from .spec import FIELD_OF_KIND, GrammarSpec, JsonFormat
from .syntax import check_regex_syntax, check_syntax
from .tags import parse_structural_tag

logger = logging.getLogger(__name__)

KIND_FIELDS = ("guided_json", "guided_json_object", "guided_regex", "guided_choice", "guided_grammar", "structural_tag")
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
COMPACT_SEPARATORS = (",", ":")
UNKNOWN_FORMAT_POLICIES = ("refuse", "annotate")

# (backend class, spec) whose check ran out of admission's budget once: under a budget it is left
# to the compile worker at once (a lookup), not retried until the budget is spent again.
LEFT_TO_WORKER = VerdictCache()

# This thread's admission in progress: `deadline` (a perf_counter value, or None) while the fields
# are parsed; `last` = (the spec returned, that deadline) for a `check_with_backend` right after.
_request = threading.local()


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
    found = canonical_key(fields, CACHED_FIELDS)
    key, size = (None, 0) if found is None else ((found[0], config), found[1])
    _request.deadline = deadline_at
    _request.written = dict(found[0]) if found is not None else {}  # the key's JSON text, reused as a source
    try:
        spec = PARSED.verdict(key, size, lambda: _parse(fields, config))
    finally:
        _request.deadline, _request.written = None, {}
    if spec is not None and spec.pending is not None:
        spec.pending.raise_if_refused()  # decided since, in a compile worker or by a compile here
    _request.last = (spec, deadline_at)
    if spec is not None and check_backend:
        check_with_backend(get_backend_class(config.backend), spec)
    return spec


def _parse(fields: Mapping[str, Any], config: GuidedConfig) -> GrammarSpec | None:
    try:
        json_format = _json_format(fields, config)
        return _spec_from_fields(fields, json_format, config.limits)
    except InvalidGrammarError:
        raise
    except Exception as error:  # noqa: BLE001 - hostile input must never escape as another type
        logger.info("guided request rejected by an unexpected %s: %s", type(error).__name__, error)
        raise InvalidGrammarError(
            f"could not read the guided fields ({type(error).__name__}: {_short(error)})", part="request"
        ) from None


FIT_BUDGET_FIELD = "guided_fit_budget"


# Requests whose first admission in a process would pay one-time costs (the imports of both
# engines' checkers, Python's exact \d \w \s sets built over every code point: ~0.1 s).
_WARM_UP_REQUESTS = (
    {"guided_json": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[\\w.-]+@\\S+$"}}}},
    {"guided_json": {"type": "object", "patternProperties": {"^\\w+$": {"type": "integer"}}}},
    {"guided_regex": "(?a)\\d+\\s\\w+\\D\\W\\S"},
    {"guided_regex": "\\d+\\s\\w+\\D\\W\\S[^\\w\\d\\s]"},
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
    last = getattr(_request, "last", None)
    _request.last = None
    deadline_at = last[1] if last is not None and last[0] is spec else None
    if spec.pending is not None and not spec.pending.schema_checked:
        return  # the worker runs the schema checks first, then the engine's
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


def _spec_from_fields(
    fields: Mapping[str, Any], json_format: JsonFormat, limits: AdmissionLimits
) -> GrammarSpec | None:
    if fields.get("guided_json") is False:
        # The schema `false`: nothing is valid. Not "no constraint" (as guided_json_object: false is).
        raise InvalidGrammarError("the schema `false` admits no value", part="guided_json")
    given = [name for name in KIND_FIELDS if _is_set(fields.get(name))]
    response_format = fields.get("response_format")
    if response_format is not None and _response_format_type(response_format) != "text":
        given.append("response_format")
    if len(given) > 1:
        raise InvalidGrammarError(
            f"only one kind of guided decoding per request, got {', '.join(given)}", part="request"
        )
    if not given:
        return None
    name = given[0]
    value = fields[name]
    if name == "response_format":
        return _from_response_format(value, json_format, limits)
    return _FIELD_PARSERS[name](value, json_format, limits)


def _is_set(value: Any) -> bool:
    return value is not None and value is not False


def _response_format_type(response_format: Any) -> str:
    response_format = as_dict(response_format, "response_format")
    kind = response_format.get("type")
    if kind not in ("text", "json_object", "json_schema", "structural_tag"):
        raise InvalidGrammarError(
            f"type must be one of text, json_object, json_schema, structural_tag; got {kind!r}",
            part="response_format.type",
        )
    return kind


def _from_response_format(response_format: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    response_format = as_dict(response_format, "response_format")
    kind = _response_format_type(response_format)
    if kind == "json_object":
        return GrammarSpec("json_object", "", json_format)
    if kind == "structural_tag":
        body = {key: value for key, value in response_format.items() if key != "type"}
        return parse_structural_tag(body, json_format, limits, part="response_format")
    json_schema = as_dict(response_format.get("json_schema"), "response_format.json_schema")
    schema = json_schema.get("schema", json_schema.get("json_schema"))
    if schema is None:
        raise InvalidGrammarError("missing 'schema'", part="response_format.json_schema")
    strict = json_schema.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise InvalidGrammarError("must be a boolean", part="response_format.json_schema.strict")
        json_format = JsonFormat(
            json_format.any_whitespace, json_format.max_whitespace_cnt, json_format.separators, strict
        )
    return _parse_json_schema(schema, json_format, limits, part="response_format.json_schema.schema")


def _parse_guided_json(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    return _parse_json_schema(value, json_format, limits, part="guided_json")


def _parse_json_object(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if value is not True:
        raise InvalidGrammarError("must be true when given", part="guided_json_object")
    return GrammarSpec("json_object", "", json_format)


def _parse_regex(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise InvalidGrammarError("must be a non-empty string", part="guided_regex")
    check_regex_syntax(value, limits, "guided_regex")
    return GrammarSpec("regex", value)


def _parse_choice(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidGrammarError("must be a list of strings", part="guided_choice")
    if not value:
        raise InvalidGrammarError("must offer at least one choice", part="guided_choice")
    if len(value) > limits.max_choices:
        check_choices(list(value), limits, "guided_choice")  # refused by count before any choice is read
    for index, choice in enumerate(value):
        if not isinstance(choice, str):
            raise InvalidGrammarError(f"must be a string, got {type(choice).__name__}", part=f"guided_choice[{index}]")
        if not choice:
            raise InvalidGrammarError("must not be empty", part=f"guided_choice[{index}]")
        check_text(choice, f"guided_choice[{index}]")
    check_choices(list(value), limits, "guided_choice")
    return GrammarSpec("choice", json.dumps(list(value), ensure_ascii=False))


def _parse_grammar(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    if not isinstance(value, str) or not value.strip():
        raise InvalidGrammarError("must be a non-empty grammar string", part="guided_grammar")
    check_text(value, "guided_grammar")
    lark = grammar_is_lark(value)
    check_size(value, limits.max_constraint_bytes, "guided_grammar", "grammar")
    check_grammar(value, lark, limits, "guided_grammar", rules=check_syntax(value, lark, "guided_grammar").rules)
    return GrammarSpec("lark" if lark else "ebnf", value)


def _parse_structural_tag_field(value: Any, json_format: JsonFormat, limits: AdmissionLimits) -> GrammarSpec:
    return parse_structural_tag(value, json_format, limits, part="structural_tag")


_FIELD_PARSERS = {
    "guided_json": _parse_guided_json,
    "guided_json_object": _parse_json_object,
    "guided_regex": _parse_regex,
    "guided_choice": _parse_choice,
    "guided_grammar": _parse_grammar,
    "structural_tag": _parse_structural_tag_field,
}

_EBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w-]*\s*::=", re.MULTILINE)
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w]*(\.\d+)?\s*:(?!:)", re.MULTILINE)


def grammar_is_lark(text: str) -> bool:
    """True when the grammar uses Lark rule syntax (``name: ...``) rather than EBNF (``name ::= ...``)."""
    if _EBNF_RULE.search(text):
        return False
    return bool(_LARK_RULE.search(text)) or text.lstrip().startswith("%")


# Schema text this many times the byte limit is refused before it is parsed: indentation rarely
# doubles a schema, and reading a 5 MB text into Python objects costs ~1 s on the caller's thread.
TEXT_SLACK = 2


def _parse_json_schema(value: Any, json_format: JsonFormat, limits: AdmissionLimits, *, part: str) -> GrammarSpec:
    if isinstance(value, (str, bytes)) and len(value) > TEXT_SLACK * limits.max_constraint_bytes:
        limit = limits.max_constraint_bytes
        raise InvalidGrammarError(
            f"the schema is at least {len(value):,} bytes, over the limit of {limit:,}",
            part=part,
            feature=f"schema larger than {limit:,} bytes",
        )
    written = getattr(_request, "written", {}).get(f"{part}:json") if isinstance(value, dict) else None
    schema, source = schema_and_source(value, part, written)
    check_size(source, limits.max_constraint_bytes, part, "schema")
    pending = None
    try:
        with until(getattr(_request, "deadline", None)):
            checkpoint()
            check_schema_document(schema, limits, part, source_bytes=len(source))
    except Overrun:  # the budget is spent: the compile worker decides (`deferred`)
        count("deferred")
        pending = Pending(part, limits)
    return GrammarSpec("json_schema", source, json_format, pending)


def _json_format(fields: Mapping[str, Any], config: GuidedConfig) -> JsonFormat:
    any_whitespace = config.any_whitespace
    if fields.get("disable_any_whitespace") is not None:
        any_whitespace = not _bool_field(fields, "disable_any_whitespace")
    if fields.get("any_whitespace") is not None:
        any_whitespace = _bool_field(fields, "any_whitespace")
    max_ws = config.max_whitespace_cnt
    if "max_whitespace_cnt" in fields:
        max_ws = fields["max_whitespace_cnt"]
        if max_ws is not None and (isinstance(max_ws, bool) or not isinstance(max_ws, int) or max_ws < 1):
            raise InvalidGrammarError("must be a positive integer or null", part="max_whitespace_cnt")
    separators = _separators(fields.get("separators"), config.separators)
    if not any_whitespace and separators is None:
        # xgrammar's default without free whitespace forces ", " and ": " (spaces mandatory);
        # compact separators are what "no whitespace" means to a user.
        separators = COMPACT_SEPARATORS
    strict = config.strict_mode
    if fields.get("guided_strict") is not None:
        strict = _bool_field(fields, "guided_strict")
    unknown_formats = getattr(config, "unknown_formats", "refuse")
    if fields.get("guided_unknown_formats") is not None:
        unknown_formats = fields["guided_unknown_formats"]
        if unknown_formats not in UNKNOWN_FORMAT_POLICIES:
            raise InvalidGrammarError(f"must be one of {UNKNOWN_FORMAT_POLICIES}", part="guided_unknown_formats")
    any_order = getattr(config, "any_order", False)
    if fields.get("guided_any_order") is not None:
        any_order = _bool_field(fields, "guided_any_order")
    return JsonFormat(
        any_whitespace, max_ws if any_whitespace else None, separators, strict, unknown_formats, any_order
    )


def _separators(value: Any, default: tuple[str, str] | None) -> tuple[str, str] | None:
    if value is None:
        return default
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(s, str) and s.strip() in (",", ":") for s in value)
        or value[0].strip() != ","
        or value[1].strip() != ":"
    ):
        raise InvalidGrammarError(
            "must be [item_separator, key_separator], e.g. [',', ':'] or [', ', ': ']", part="separators"
        )
    return (value[0], value[1])


def _bool_field(fields: Mapping[str, Any], name: str) -> bool:
    value = fields[name]
    if not isinstance(value, bool):
        raise InvalidGrammarError(f"must be a boolean, got {type(value).__name__}", part=name)
    return value
