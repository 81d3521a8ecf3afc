"""JSON Schema documents checked against their draft's meta-schema, and their references resolved.

`check_json_schema` is admission's schema check: jsonschema-rs accepts quickly what is certainly
valid, `jsonschema` decides the rest and words the error; every ``$ref`` must resolve inside the
document (remote references are never fetched).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema

from ..errors import InvalidGrammarError
from ..schema.deadline import afford, checkpoint
from ..schema.drafts import VALIDATORS, Document, declares_draft, first_unresolvable_reference, meta_valid
from ..schema.refusal import Refusal
from ..schema.walk import schema_regexes, subschemas

try:  # fast meta-validation at admission; `jsonschema` alone gives the same verdicts, slower
    import jsonschema_rs as _jsonschema_rs
except ImportError:
    _jsonschema_rs = None  # type: ignore[assignment]


def _offline_registry() -> Any:
    """jsonschema-rs fetches a ``$schema`` it does not know over the network (HTTP, on the
    caller's thread: a request could make the host connect anywhere, and wait for it). Given a
    registry it retrieves nothing: an unknown meta-schema fails at once and `jsonschema` decides.
    None where this jsonschema-rs takes no registry (`_fast_meta_valid` then leaves every schema
    that names its ``$schema`` to `jsonschema`)."""
    try:
        registry = _jsonschema_rs.Registry([])
        _jsonschema_rs.meta.is_valid({}, registry=registry)
    except (AttributeError, TypeError):
        return None
    return registry


_OFFLINE = _offline_registry() if _jsonschema_rs is not None else None

# What meta-validation costs per byte of compact schema text, for a deadline (`deadline.afford`):
# jsonschema-rs (native, ~4-11 ns/byte measured on 0.3-1.4 MB schemas) and `jsonschema`: CPU time
# on the 25 SchemaStore schemas jsonschema-rs does not accept at once (a loaded 2-core host),
# 0.3-4 us/byte under drafts 4-7, up to 15 under 2019-09 and 2020-12 (what a `$schema` it does not
# know reads as) and without `$schema` (every draft is tried).
RS_SECONDS_PER_BYTE = 1e-8
JSONSCHEMA_SECONDS_PER_BYTE = 4e-6
JSONSCHEMA_LATE_DRAFT_SECONDS_PER_BYTE = 1.5e-5
# ``re.compile`` of a schema's patterns (each must compile where jsonschema-rs judged ECMA-262).
REGEX_SECONDS_PER_CHAR = 6e-6
_EARLY_DRAFTS = (
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
)

# Keywords whose values are JSON instances, not subschemas: never entered by `schema_objects`.
_VALUE_KEYWORDS = ("const", "enum", "default", "examples")


def check_json_schema(schema: dict, part: str, source_bytes: int = 0) -> None:
    """Valid against its draft's meta-schema (without ``$schema``: against some draft's), every
    reference resolvable inside the document, and, without ``$schema``, no keyword that two drafts
    read differently (`fd_guided.schema.drafts`).

    Under admission's deadline (`fd_guided.schema.deadline`) the walks stop themselves; the
    meta-validators cannot, so each starts only if `source_bytes` of schema fit what is left."""
    afford(source_bytes * RS_SECONDS_PER_BYTE)
    if not _fast_meta_valid(schema):
        afford(source_bytes * _jsonschema_seconds_per_byte(schema))
        _check_meta_schema(schema, part)
    try:
        if not declares_draft(schema):
            _check_inferred_reading(schema)  # first: a conflict explains an unresolvable reference
        _check_references(schema, part)
    except Refusal as refusal:
        raise InvalidGrammarError(refusal.feature, part=f"{part}{refusal.location[1:]}") from None


def warm_meta_validators() -> None:
    """Pay `jsonschema`'s first use of each draft's meta-validation now (its vocabularies are read
    lazily: the first 2020-12 schema it judged took ~50 ms): each meta-schema checked against
    itself, which uses nearly every keyword (~60 ms, once)."""
    for validator_class in VALIDATORS:
        validator_class.check_schema(validator_class.META_SCHEMA)


def _jsonschema_seconds_per_byte(schema: dict) -> float:
    declared = schema.get("$schema")
    if isinstance(declared, str) and declared.rstrip("#") in _EARLY_DRAFTS:
        return JSONSCHEMA_SECONDS_PER_BYTE
    return JSONSCHEMA_LATE_DRAFT_SECONDS_PER_BYTE


def _check_inferred_reading(schema: dict) -> None:
    """Read every node as the normaliser will (drafts.Document.keywords), so a conflict between
    drafts is refused here, at admission, naming its path. Iterative, linear in the schema."""
    document = Document(schema)
    stack = [(schema, "$")]
    seen: set[int] = set()
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        checkpoint()
        document.keywords(node, where)
        stack.extend(subschemas(node, where))


def _fast_meta_valid(schema: dict) -> bool:
    """True when `schema` is certainly valid against its draft's meta-schema, found quickly.

    Meta-validation in `jsonschema` costs ~1 ms per KB of schema (the 2020-12 meta-schema's
    $dynamicRef chains): tens of ms per cold request at admission. jsonschema-rs does it in well
    under a millisecond, but judges the "regex" format by ECMA-262 where `jsonschema` uses Python's
    `re`, which our output validation also uses; so every `pattern` and `patternProperties` key
    must also compile with `re`. This only ever accepts: whatever fails here goes to `jsonschema`,
    which has the last word and writes the error message.
    """
    if _jsonschema_rs is None or (_OFFLINE is None and declares_draft(schema)):
        return False
    try:
        if not _jsonschema_rs.meta.is_valid(schema, registry=_OFFLINE) and (
            declares_draft(schema)
            or not any(_jsonschema_rs.meta.is_valid({**schema, "$schema": uri}, registry=_OFFLINE) for uri in _URIS)
        ):
            return False
    except Exception:  # an unknown $schema URI, unexpected input: let jsonschema decide
        return False
    except BaseException as error:  # a Rust panic arrives as pyo3's PanicException, a BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        return False
    for pattern in _schema_regexes(schema):
        afford(len(pattern) * REGEX_SECONDS_PER_CHAR)  # re.compile cannot stop itself
        if not _compiles(pattern):
            return False
    return True


def _schema_regexes(schema: dict) -> Iterator[str]:
    """Every `pattern` value and `patternProperties` key in a schema document (by keyword position)."""
    return (pattern for pattern, _ in schema_regexes(schema))


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):  # 500 nested groups overflow re's parser
        return False
    return True


_URIS = tuple(cls.META_SCHEMA.get("$id") or cls.META_SCHEMA["id"] for cls in VALIDATORS[:-1])


def _check_meta_schema(schema: dict, part: str) -> None:
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if (
        not declares_draft(schema)
        and any(meta_valid(cls, schema) for cls in VALIDATORS[:-1])
        and all(_compiles(pattern) for pattern in _schema_regexes(schema))
    ):
        return  # valid in an older draft: read keyword by keyword (fd_guided.schema.drafts)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as error:
        location = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise InvalidGrammarError(f"not a valid JSON schema: {error.message}", part=f"{part}{location}") from None
    except RecursionError:
        # The meta-schema's "regex" format check runs Python's re parser, which recurses per group.
        raise InvalidGrammarError("a pattern nested too deeply for Python's re", part=part) from None


def _check_references(schema: dict, part: str) -> None:
    """Every ``$ref`` in a schema position must resolve inside the document (JSON pointers, ``$id``,
    ``$anchor``): remote references are never fetched. Walked by keyword position, so a ``$ref``
    under a property *named* ``enum`` or ``default`` is checked too."""
    found = first_unresolvable_reference(schema)
    if found is not None:
        ref, where = found
        raise InvalidGrammarError(
            f"reference {ref[:200]!r} does not resolve inside the schema (remote references are not fetched)",
            part=f"{part}{where[1:]}",
        )


def schema_objects(node: Any, path: str = "") -> Iterator[tuple[dict, str]]:
    """Every object of a structural tag's tree with its path (``.a[0].b``), parents first; the
    values of `_VALUE_KEYWORDS` are not entered. (JSON schemas are walked by keyword position:
    `fd_guided.schema.walk`.)"""
    if isinstance(node, dict):
        yield node, path
        for key, child in node.items():
            if key not in _VALUE_KEYWORDS:
                yield from schema_objects(child, f"{path}.{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from schema_objects(child, f"{path}[{index}]")
