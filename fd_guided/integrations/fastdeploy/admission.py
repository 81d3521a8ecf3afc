"""Admission: FastDeploy's ``schema_checker`` / ``BaseChecker.schema_format`` in the engine process.

``EngineService`` builds ``schema_checker(backend_name, disable_any_whitespace=...)`` once and calls
``checker.schema_format(request)`` for every request; a returned message goes to the client as an
error result (``_send_error_response``). Our message is an `AdmissionError`, a ``str`` that
`hooks.py` turns into ``error_code=400``. The message names the field and, for a constraint that is
well-formed but not enforceable, the feature (e.g. ``uniqueItems``).

On success exactly one of the fields FastDeploy's runner reads is set (``guided_json``,
``guided_regex``, ``guided_grammar``, ``structural_tag``): choices become an EBNF grammar;
json_object and the JSON options (whitespace, separators, strictness) travel inside the written JSON
under `OPTIONS_KEY`, so the worker rebuilds exactly the admitted spec from FastDeploy's
``(key_type, text)`` key whatever its own defaults. Checking twice is harmless (a decode instance
re-admits what a prefill instance admitted).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from ...admission.parse import check_if_known, warm_up
from ...config import GuidedConfig
from ...errors import InvalidGrammarError
from ...registry import get_backend_class
from ...spec import GrammarSpec, parse_guided_request
from .config import as_bool, backend_name_for, guided_config_from_fd, read, write
from .registration import ensure_host_patched

logger = logging.getLogger(__name__)

OPTIONS_KEY = "x-fd-guided"
KIND_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_json_object",
    "structural_tag",
    "response_format",
)
OPTION_FIELDS = ("disable_any_whitespace", "any_whitespace", "max_whitespace_cnt", "separators", "guided_strict")
# The request fields FastDeploy's runner turns into a schemata key, in its priority order.
KEY_FIELDS = (
    ("guided_json", "json"),
    ("guided_regex", "regex"),
    ("guided_grammar", "grammar"),
    ("structural_tag", "structural_tag"),
)


# Admission is bounded by default (`GuidedConfig.admission_budget_s`, 2 ms; env
# FD_GUIDED_ADMISSION_BUDGET_MS, "inline" for every verdict here): what does not finish in the
# budget is decided in the compile worker, beside the compile (`fd_guided.admission.deferred`).
# DEFER_ENV=1 goes further: the backend's check (the schema normaliser) never runs on the engine's
# request-insertion thread, even when it would fit the budget; only the verdicts it remembers.
DEFER_ENV = "FD_GUIDED_DEFER_SCHEMA_CHECKS"


class AdmissionError(str):
    """A refusal message that is the client's fault: FastDeploy sends it with ``error_code=400``."""

    http_status = 400


def schema_checker(backend_name: str, **kwargs) -> SchemaChecker:
    """FastDeploy's ``schema_checker``: the admission checker for `backend_name`.

    kwargs: ``disable_any_whitespace`` (what FastDeploy passes: its config's bool), ``fd_config``
    (read as the worker reads it) or ``config`` (a `GuidedConfig`). An unknown backend fails here,
    at engine start-up.
    """
    ensure_host_patched()  # the engine module calling us is loaded by now, whatever the import order
    config = kwargs.pop("config", None)
    fd_config = kwargs.pop("fd_config", None)
    disable = kwargs.pop("disable_any_whitespace", None)
    if kwargs:
        raise TypeError(f"schema_checker got unexpected options {sorted(kwargs)}")
    if config is None and fd_config is not None:
        config = guided_config_from_fd(fd_config, **({} if disable is None else {"disable_any_whitespace": disable}))
    if config is None:
        config = GuidedConfig(backend=backend_name_for(backend_name))
        if disable is not None:
            config = config.replace(any_whitespace=not as_bool(disable, "disable_any_whitespace"))
    get_backend_class(config.backend)
    warm_up(config)  # engine start-up pays admission's one-time costs, not its first requests
    return SchemaChecker(config)


class SchemaChecker:
    """FastDeploy's ``BaseChecker``: validate and normalise a request's guided fields.

    Works on FastDeploy's ``Request`` or anything with its ``guided_*`` attributes (or a dict).
    """

    def __init__(self, config: GuidedConfig, defer_backend_check: bool | None = None):
        self.config = config
        if defer_backend_check is None:
            defer_backend_check = os.environ.get(DEFER_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        self.defer_backend_check = defer_backend_check
        self.backend_class = get_backend_class(config.backend)

    def schema_format(self, request: Any) -> tuple[Any, str | None]:
        """``(request, None)`` with the fields normalised, or ``(request, AdmissionError)``.

        Never raises for a bad request: every failure, whatever its type, becomes the message.
        """
        try:
            spec = parse_guided_request(
                request_fields(request), self.config, check_backend=not self.defer_backend_check
            )
            if spec is not None and self.defer_backend_check:
                check_if_known(self.backend_class, spec)  # unknown: the worker's compile decides
            if spec is not None:
                write_spec_to_request(request, spec)
        except InvalidGrammarError as error:
            return request, AdmissionError(f"invalid guided decoding request: {error}")
        except Exception as error:  # a checker must never take the engine's admission loop down
            logger.warning("guided request rejected by an unexpected %s: %s", type(error).__name__, error)
            return request, AdmissionError(f"invalid guided decoding request: {type(error).__name__}: {error}")
        return request, None


def request_fields(request: Any) -> dict[str, Any]:
    """The guided fields of `request`, with options a previous admission stored read back."""
    fields = {}
    for name in KIND_FIELDS + OPTION_FIELDS:
        value = read(request, name)
        if value is not None:
            fields[name] = value
    for name in ("guided_json", "structural_tag"):
        if name in fields and _has_options(fields[name]):
            fields.update(document_fields(fields.pop(name), name))
    return fields


def _has_options(value: Any) -> bool:
    if isinstance(value, (str, bytes)):
        return OPTIONS_KEY in (value if isinstance(value, str) else value.decode("utf-8", "replace"))
    return isinstance(value, Mapping) and OPTIONS_KEY in value


def write_spec_to_request(request: Any, spec: GrammarSpec) -> None:
    """Store `spec` in the one request field FastDeploy's runner reads, clearing the others."""
    field, value = request_field_for(spec)
    for name in KIND_FIELDS + OPTION_FIELDS:
        if read(request, name) is not None:
            write(request, name, None)
    write(request, field, value)


def request_field_for(spec: GrammarSpec) -> tuple[str, str]:
    """The (request field, text) that carries `spec` through FastDeploy unchanged."""
    from ...backends.xgrammar import choice_ebnf

    if spec.kind == "json_schema":
        return "guided_json", _schema_with_options(spec)
    if spec.kind == "json_object":
        return "guided_json", _with_options({"type": "object"}, spec, kind="json_object")
    if spec.kind == "structural_tag":
        return "structural_tag", _with_options(spec.structural_tag, spec)
    if spec.kind == "regex":
        return "guided_regex", spec.source
    if spec.kind == "choice":
        return "guided_grammar", choice_ebnf(spec.choices)
    return "guided_grammar", spec.source


def _schema_with_options(spec: GrammarSpec) -> str:
    """`_with_options` for a JSON schema, written from the spec's compact source: not through
    ``spec.schema``, which would run checks admission left to the worker (`admission.deferred`)
    here, on the engine's thread; and without reading and writing the whole schema again."""
    source = spec.source.strip(" \t\n\r")  # a large text admitted unread is as sent (`admission.unread`)
    if not (source.startswith("{") and source.endswith("}")) or f'"{OPTIONS_KEY}"' in source:
        return _with_options(json.loads(source), spec)
    options = _with_options({}, spec)[1:-1]  # '"x-fd-guided":{...}'
    return source[:-1] + ("" if _EMPTY_OBJECT.fullmatch(source) else ",") + options + "}"


_EMPTY_OBJECT = re.compile(r"\{[ \t\n\r]*\}")


def _with_options(document: dict, spec: GrammarSpec, kind: str | None = None) -> str:
    fmt = spec.json_format
    assert fmt is not None  # set for the JSON kinds, the only ones sent with options
    options: dict[str, Any] = {
        "any_whitespace": fmt.any_whitespace,
        "max_whitespace_cnt": fmt.max_whitespace_cnt,
        "separators": list(fmt.separators) if fmt.separators else None,
        "strict": fmt.strict,
    }
    if kind:
        options["kind"] = kind
    return json.dumps({**document, OPTIONS_KEY: options}, ensure_ascii=False, separators=(",", ":"))


def schemata_key_of(request: Any) -> tuple[str, str] | None:
    """FastDeploy's ``_init_logits_processor`` key: the first set of json, regex, grammar, structural_tag."""
    for field, key_type in KEY_FIELDS:
        value = read(request, field)
        if value is not None:
            return key_type, value
    return None


def spec_from_schemata_key(schemata_key: Any, config: GuidedConfig) -> GrammarSpec:
    """Rebuild the admission spec from a runner's ``(key_type, schemata)`` key.

    Keys written by `SchemaChecker` round-trip exactly; a bare ``("json", '{"type": "object"}')``
    (what FastDeploy's own checker writes for json_object) means any JSON object.
    """
    if not isinstance(schemata_key, (tuple, list)) or len(schemata_key) != 2:
        raise InvalidGrammarError(f"must be a (key_type, schemata) pair, got {schemata_key!r}", part="schemata_key")
    key_type, schemata = schemata_key
    if key_type in ("json", "structural_tag"):
        fields = document_fields(schemata, "guided_json" if key_type == "json" else "structural_tag")
    elif key_type == "regex":
        fields = {"guided_regex": schemata}
    elif key_type == "grammar":
        fields = {"guided_grammar": schemata}
    else:
        raise InvalidGrammarError(
            f"unknown key type {key_type!r}; expected json, regex, grammar or structural_tag", part="schemata_key"
        )
    spec = parse_guided_request(fields, config, check_backend=False)
    if spec is None:
        raise InvalidGrammarError("the key holds no constraint", part="schemata_key")
    return spec


def document_fields(schemata: Any, field: str) -> dict[str, Any]:
    """Request fields for a JSON document carried in `field`, its `OPTIONS_KEY` options unpacked."""
    if isinstance(schemata, (str, bytes)):
        try:
            schemata = json.loads(schemata)
        except json.JSONDecodeError as error:
            raise InvalidGrammarError(f"malformed JSON: {error}", part=field) from None
    if not isinstance(schemata, dict):
        return {field: schemata}  # the spec parser names the type error
    document = dict(schemata)
    options = document.pop(OPTIONS_KEY, None)
    is_object = (options or {}).get("kind") == "json_object" or (options is None and document == {"type": "object"})
    fields: dict[str, Any] = {"guided_json_object": True} if field == "guided_json" and is_object else {field: document}
    if isinstance(options, dict):
        fields["any_whitespace"] = options.get("any_whitespace")
        fields["max_whitespace_cnt"] = options.get("max_whitespace_cnt")
        fields["guided_strict"] = options.get("strict")
        if options.get("separators") is not None:
            fields["separators"] = options["separators"]
    return fields
