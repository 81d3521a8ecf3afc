"""Check a generated text against the spec it was generated under, independently of the matcher.

JSON is checked with the `jsonschema` validator of the schema's draft with format checking on;
with the ``jsonschema[format]`` extras installed (the ``test`` extra of this package) that covers
``date-time``, ``time``, ``uri``, ``iri``, ``hostname``, ``duration``, ``json-pointer`` ... and not
only the formats jsonschema checks without them (`missing_format_checkers` says which are
absent; a warning is logged once). References never leave the document (no network). Regexes are
checked with Python's ``re.fullmatch``, choices by membership, and EBNF/Lark grammars by
re-parsing the text character by character (not through tokens). Used by the CLI summary, the
tests and the coverage and conformance tools.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass

from fd_guided.spec import GrammarSpec

logger = logging.getLogger(__name__)
# Formats jsonschema checks only with the [format] extras installed.
EXTRA_FORMATS = (
    "date-time",
    "time",
    "duration",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "hostname",
    "idn-hostname",
    "json-pointer",
    "relative-json-pointer",
    "uri-template",
)


def missing_format_checkers() -> list[str]:
    """Formats `jsonschema` would silently accept because its optional checkers are not installed."""
    import jsonschema

    return [name for name in EXTRA_FORMATS if name not in jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers]


@functools.lru_cache(maxsize=1)
def _warn_missing_format_checkers() -> None:
    missing = missing_format_checkers()
    if missing:
        logger.warning(
            "jsonschema cannot check the formats %s: install jsonschema[format] (pip install 'fd-guided[test]')",
            ", ".join(missing),
        )


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reason: str = ""


def validate_output(spec: GrammarSpec, text: str) -> Verdict:
    """Is `text` a complete, valid instance of `spec`?"""
    return _CHECKS[spec.kind](spec, text)


def _json_schema(spec: GrammarSpec, text: str) -> Verdict:
    import jsonschema
    import referencing

    _warn_missing_format_checkers()
    try:
        instance = json.loads(text)
    except json.JSONDecodeError as error:
        return Verdict(False, f"not JSON: {error}")
    schema = spec.schema
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    # An empty registry: jsonschema's default one would fetch remote $refs over the network.
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER, registry=referencing.Registry())
    errors = sorted(validator.iter_errors(instance), key=str)
    if errors:
        return Verdict(False, f"schema violation at {list(errors[0].absolute_path)}: {errors[0].message}")
    return Verdict(True)


def _json_object(spec: GrammarSpec, text: str) -> Verdict:
    try:
        instance = json.loads(text)
    except json.JSONDecodeError as error:
        return Verdict(False, f"not JSON: {error}")
    return Verdict(isinstance(instance, dict), "" if isinstance(instance, dict) else "not a JSON object")


def _regex(spec: GrammarSpec, text: str) -> Verdict:
    matched = re.fullmatch(spec.source, text, flags=re.DOTALL) is not None
    return Verdict(matched, "" if matched else "no full match")


def _choice(spec: GrammarSpec, text: str) -> Verdict:
    ok = text in spec.choices
    return Verdict(ok, "" if ok else "not one of the choices")


def _grammar(spec: GrammarSpec, text: str) -> Verdict:
    import xgrammar as xgr

    grammar = xgr.Grammar.from_lark(spec.source) if spec.kind == "lark" else xgr.Grammar.from_ebnf(spec.source)
    ok = xgr.testing._is_grammar_accept_string(grammar, text)
    return Verdict(ok, "" if ok else "the grammar does not derive the text")


_TAG_BODY = "(.*?)"


def _structural_tag(spec: GrammarSpec, text: str) -> Verdict:
    tag = spec.structural_tag
    if "structures" not in tag:
        return Verdict(True, "format-style structural tags are checked by the grammar only")
    for structure in tag["structures"]:
        pattern = re.escape(structure["begin"]) + _TAG_BODY + re.escape(structure["end"])
        for body in re.findall(pattern, text, flags=re.DOTALL):
            verdict = _json_schema(GrammarSpec("json_schema", json.dumps(structure["schema"])), body)
            if not verdict.valid:
                return Verdict(False, f"inside {structure['begin']!r}: {verdict.reason}")
    return Verdict(True)


_CHECKS = {
    "json_schema": _json_schema,
    "json_object": _json_object,
    "regex": _regex,
    "choice": _choice,
    "ebnf": _grammar,
    "lark": _grammar,
    "structural_tag": _structural_tag,
}
