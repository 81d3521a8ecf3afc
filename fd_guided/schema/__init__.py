"""JSON Schema -> the exact schema an engine enforces, or a refusal that names the keyword.

The one public entry point the backends call, at admission and again at compile:

    for_engine(engine, schema, json_format) -> dict

`engine` is ``"xgrammar"`` or ``"llguidance"``; `schema` a JSON schema (dict or bool, any draft
4 to 2020-12, read through its ``$schema``); `json_format` the request's `spec.JsonFormat`
(``strict``: objects that declare properties admit no others and tuples no extra items;
``unknown_formats``: ``"refuse"`` or ``"annotate"``). The result is a 2020-12 schema in which
every node the engine sees is one it enforces exactly (`capabilities.TABLE`), so an output the
engine admits validates against the original schema under `jsonschema` with format checking.
It raises `InvalidGrammarError` with ``feature`` (the keyword or construct, so ``auto`` may try
the other engine) and ``part`` (``json schema $.properties.a.pattern``), or without ``feature``
when the schema admits no value at all.

Pure Python, deterministic (same input, same output: it is on the cache-key path), bounded in
time and memory by the caps of `leaves`, `normalise`, `rules`, `regex` and `emit`; it never calls
a native engine.

Layout: `drafts` (draft, keywords, references), `walk` (which values are subschemas),
`normalise` + `type_part` + `leaves` + `intersection` + `complement` + `rules` + `one_of` +
`unique_items` (the normal form and its rewrite rules), `instance` (its validator), `regex` +
`regex_reading` + `boundaries` + `languages` + `automaton` + `dfa` + `state_elimination` and
`formats` (patterns for engines), `emit` + `emit_scalars` + `pattern_properties` + `emitted` (per
engine), `capabilities` (the keyword table).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ..errors import InvalidGrammarError, UnsatisfiableGrammarError
from .deadline import Overrun
from .emit import Emitter
from .normalise import Normaliser
from .refusal import Refusal, Unsatisfiable

ENGINES = ("xgrammar", "llguidance")
UNKNOWN_FORMAT_POLICIES = ("refuse", "annotate")


def for_engine(
    engine: str, schema: Any, json_format=None, *, part: str = "json schema", unique_guard: bool = False
) -> dict:
    """The schema to hand `engine` for `schema` under the request's `json_format` (module docstring).
    `unique_guard`: the output is this one JSON value and `fd_guided.unique_guard` will run around
    the engine's matcher, so ``uniqueItems`` over open item domains is accepted (left to it)."""
    return json.loads(_run(engine, schema, json_format, part, unique_guard)[0])


def regex_for_engine(engine: str, pattern: str, *, part: str = "guided_regex") -> str:
    """A whole-output regex (``guided_regex``: Python's ``re.fullmatch``) as `engine` must see it:
    Python's exact reading re-printed, never admitting a string Python rejects
    (`regex.translate_full_match`). Raises `InvalidGrammarError` (``feature`` set for a construct
    the engine cannot be given, `UnsatisfiableGrammarError` when the regex matches nothing)."""
    from .regex import translate_full_match

    try:
        return translate_full_match(pattern, engine)
    except Refusal as refusal:
        raise InvalidGrammarError(
            f"{engine} cannot enforce {refusal.feature}", part=part, feature=refusal.feature
        ) from None
    except Unsatisfiable as error:
        raise UnsatisfiableGrammarError(error.reason, part=part) from None


def narrows(engine: str, schema: Any, json_format=None, *, unique_guard: bool = False) -> bool:
    """True when `engine`'s schema admits only a sound *subset* of the valid values: it left out
    alternatives it cannot express (parts of a ``not``/``if``/``oneOf`` rewrite), or (xgrammar) a
    length-bounded string admits no JSON escapes. Another engine may enforce the whole (``auto``
    prefers it then). Raises as `for_engine` does."""
    return _run(engine, schema, json_format, "json schema", unique_guard)[1]


def _run(engine: str, schema: Any, json_format, part: str, unique_guard: bool | str = False) -> tuple[str, bool]:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    strict = True if json_format is None else bool(json_format.strict)
    unknown = "refuse" if json_format is None else getattr(json_format, "unknown_formats", "refuse")
    text = json.dumps(schema, sort_keys=False, ensure_ascii=False, separators=(",", ":"))
    if unique_guard and getattr(json_format, "any_order", False):
        unique_guard = "any_order"  # the guard cannot count on the last property coming last
    return _cached(engine, text, strict, unknown, part, unique_guard)


@functools.lru_cache(maxsize=8)
def _normaliser(text: str, strict: bool, unknown: str, unique_guard: bool | str) -> Normaliser:
    """One normaliser per schema and layout, shared by both engines' emitters (auto asks both)."""
    return Normaliser(json.loads(text), strict=strict, unknown_formats=unknown, unique_guard=unique_guard)


@functools.lru_cache(maxsize=64)
def _cached(
    engine: str, text: str, strict: bool, unknown: str, part: str, unique_guard: bool | str
) -> tuple[str, bool]:
    # Cached as text: callers get a fresh dict each time, and a refusal is recomputed.
    try:
        normaliser = _normaliser(text, strict, unknown, unique_guard)
        with normaliser.lock:  # its memo and recursion guards are not for two threads at once
            if normaliser.interrupted:  # a deadline stopped it half-way: its memo and work count are not whole
                normaliser = Normaliser(
                    json.loads(text), strict=strict, unknown_formats=unknown, unique_guard=unique_guard
                )
            emitter = Emitter(normaliser, engine)
            try:
                document = emitter.document()
            except Overrun:  # admission's deadline (`deadline`): no verdict; the worker decides
                normaliser.interrupted = True
                _normaliser.cache_clear()
                raise
    except Refusal as refusal:
        raise InvalidGrammarError(
            f"{engine} cannot enforce {refusal.feature}", part=f"{part} {refusal.location}", feature=refusal.feature
        ) from None
    except Unsatisfiable as error:
        raise UnsatisfiableGrammarError(
            f"the schema admits no value ({error.reason})", part=f"{part} {error.location}"
        ) from None
    except RecursionError:
        raise InvalidGrammarError(
            f"{engine} cannot enforce a schema nested this deeply",
            part=part,
            feature="schema nesting too deep to normalise",
        ) from None
    except (TypeError, ValueError, AttributeError) as error:
        # A keyword value of the wrong type ("minLength": "#/x"). Admission meta-validates first
        # (`meta.check_schema`), so this is for direct callers: a typed refusal, never a crash.
        raise InvalidGrammarError(
            f"{engine} cannot read this schema: a keyword value of the wrong type ({type(error).__name__})", part=part
        ) from None
    return json.dumps(document, ensure_ascii=False), emitter.narrowed


__all__ = [
    "for_engine",
    "regex_for_engine",
    "narrows",
    "ENGINES",
    "UNKNOWN_FORMAT_POLICIES",
    "Refusal",
    "Unsatisfiable",
]
