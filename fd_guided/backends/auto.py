"""The ``auto`` backend: xgrammar when it enforces the whole constraint, llguidance when it cannot.

The choice is a pure function of the spec (`choose_backend`), made at admission by `check` and
again, identically, by `compile`, so the compile cache keyed by spec stays valid and one
request's fallback never changes another's engine. xgrammar is preferred: its compiled masks
are fastest per step on long generations. llguidance takes over only when xgrammar refuses a
*feature* (a keyword it would ignore, a format it lacks, a schema it cannot build), never for a
syntax error, which is reported as xgrammar reports it. When both refuse, the error names what
each could not enforce.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Sequence

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle
from .xgrammar import XGrammarBackend, XGrammarMatcher, check_schema_keywords

logger = logging.getLogger(__name__)

PREFERRED = "xgrammar"
FALLBACK = "llguidance"
_SERIAL_SEPARATOR = b"\n"


def _fallback_class():
    """The llguidance backend class, or None when llguidance is not installed (auto = xgrammar)."""
    try:
        from .llguidance import LLGuidanceBackend
    except ImportError:
        return None
    return LLGuidanceBackend


@functools.lru_cache(maxsize=4096)
def choose_backend(spec: GrammarSpec) -> str:
    """``"xgrammar"`` or ``"llguidance"`` for `spec`; raises InvalidGrammarError if neither can enforce it.

    Memoised: a pure function of the (frozen) spec, so admission and compile agree and repeated
    schemas cost one check.
    """
    try:
        XGrammarBackend.check(spec)
        gap = xgrammar_gap(spec)
        if gap is None:
            return PREFERRED
        first = InvalidGrammarError(f"xgrammar cannot enforce {gap[0]}", part=f"json schema {gap[1]}", feature=gap[0])
    except InvalidGrammarError as refused:
        first = refused
    # A schema already passed the JSON-Schema meta-schema check, so xgrammar refusing it is a
    # limit of xgrammar; for regexes and grammars only an explicit feature refusal is.
    is_limit = first.feature is not None or spec.kind == "json_schema"
    fallback = _fallback_class()
    if not is_limit or fallback is None:
        raise first
    try:
        fallback.check(spec)
        return FALLBACK
    except InvalidGrammarError as second:
        features = [f"xgrammar: {first.feature or _reason(first)}", f"llguidance: {second.feature or _reason(second)}"]
        raise InvalidGrammarError(
            "no backend can enforce this constraint faithfully (" + "; ".join(features) + ")",
            part=second.part if second.feature and not first.feature else first.part,
            feature=" / ".join(f for f in (first.feature, second.feature) if f) or None,
        ) from None


def _reason(error: InvalidGrammarError) -> str:
    text = str(error)
    return text.split(": ", 1)[1] if error.part and text.startswith(f"{error.part}: ") else text


class AutoBackend(GuidedBackend):
    """Per-request choice between an xgrammar and an llguidance backend over one tokenizer.

    Both sub-backends are built from the same tokenizer, logits width, config and stop tokens;
    they share no mutable state. Compiled grammars keep their engine's type and `backend_name`,
    so `new_grammar` and `fill_bitmasks` dispatch on it.
    """

    name = "auto"

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ):
        super().__init__(tokenizer, vocab_size=vocab_size, config=config)
        self.backends: dict[str, GuidedBackend] = {
            PREFERRED: XGrammarBackend(tokenizer, vocab_size=vocab_size, config=self.config, stop_token_ids=stop_token_ids)
        }
        fallback = _fallback_class()
        if fallback is not None:
            self.backends[FALLBACK] = fallback(tokenizer, vocab_size=vocab_size, config=self.config, stop_token_ids=stop_token_ids)
        else:
            logger.warning("llguidance is not installed: the auto backend uses xgrammar only")

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        choose_backend(spec)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        name = choose_backend(spec)
        logger.info("auto backend: %s compiles %s", name, spec.describe())
        if self.metrics is not None:
            self.metrics.inc_labelled("auto_choice_total", "backend", name)
        return self.backends[name].compile(spec)

    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        return self._owner(compiled).new_grammar(compiled)

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        groups: dict[str, tuple[list[Grammar], list[int]]] = {}
        for grammar, row in zip(grammars, rows):
            name = PREFERRED if isinstance(grammar, XGrammarMatcher) else FALLBACK
            group = groups.setdefault(name, ([], []))
            group[0].append(grammar)
            group[1].append(row)
        for name, (members, member_rows) in groups.items():
            self.backends[name].fill_bitmasks(members, bitmask, member_rows)

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        data = self._owner(compiled).serialize(compiled)
        return None if data is None else compiled.backend_name.encode("ascii") + _SERIAL_SEPARATOR + data

    def deserialize(self, spec: GrammarSpec, data: bytes) -> CompiledGrammar | None:
        name, _, payload = data.partition(_SERIAL_SEPARATOR)
        backend = self.backends.get(name.decode("ascii", errors="replace"))
        if backend is None or name.decode("ascii", errors="replace") != _safe_choice(spec):
            return None  # written by another choice rule or without llguidance: compile instead
        return backend.deserialize(spec, payload)

    def cache_stats(self) -> dict[str, Any]:
        return {f"{name}_{key}": value for name, backend in self.backends.items() for key, value in backend.cache_stats().items()}

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()

    def _owner(self, compiled: CompiledGrammar) -> GuidedBackend:
        backend = self.backends.get(compiled.backend_name)
        if backend is None:
            raise TypeError(f"auto cannot run a grammar compiled by {compiled.backend_name!r}")
        return backend


def _safe_choice(spec: GrammarSpec) -> str | None:
    try:
        return choose_backend(spec)
    except InvalidGrammarError:
        return None


# ----- what xgrammar's own checker lets through but xgrammar does not enforce ----------------------
# Found by generating from ~580 SchemaStore schemas and validating with jsonschema (docs/coverage.md)
# and confirmed on minimal schemas in tests/test_auto_backend.py.

_ASSERTIONS = frozenset({
    "type", "enum", "const", "properties", "patternProperties", "additionalProperties", "required",
    "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "uniqueItems", "contains", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then", "else", "dependentRequired",
    "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "allOf", "anyOf", "oneOf", "$ref",
})
_COMBINATORS = ("anyOf", "oneOf", "allOf")
# Drafts whose $ref replaces its siblings (jsonschema ignores them, as xgrammar does).
_LEGACY_REF_VALIDATORS = ("Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SINGLES = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains",
            "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def xgrammar_gap(spec: GrammarSpec) -> tuple[str, str] | None:
    """(feature, location) of the first construct xgrammar accepts but does not enforce, or None.

    - ``oneOf``: xgrammar falls back to anyOf semantics when it cannot prove the branches
      disjoint, so an output may match two branches;
    - a combinator (anyOf/oneOf/allOf) next to other assertions (``type: object`` beside
      ``anyOf: [{required: [a]}, ...]``): xgrammar keeps only the combinator;
    - ``$ref`` next to other assertions in drafts where they apply (2019-09 and later);
    - ``required`` names that ``properties`` does not declare: xgrammar drops them, or with
      declared ones admits no object at all;
    - ``minLength``/``maxLength``: xgrammar's length-bounded string admits raw control characters
      (``"a\x00"``), which is not JSON.
    """
    if spec.kind == "json_schema":
        schemas = [(spec.schema, "$")]
    elif spec.kind == "structural_tag" and "structures" in spec.structural_tag:
        schemas = [(s["schema"], f"structures[{i}].schema") for i, s in enumerate(spec.structural_tag["structures"])]
    else:
        return None
    for schema, path in schemas:
        if not isinstance(schema, dict):
            continue
        legacy_ref = _validator_name(schema) in _LEGACY_REF_VALIDATORS
        seen: set[int] = set()
        for node, where in _schema_nodes(schema, path, schema, seen):
            gap = _node_gap(node, legacy_ref)
            if gap is not None:
                return gap, where
            if where.startswith("#"):
                # xgrammar's checker walks keywords, not $refs into other places (e.g. definitions.x.full).
                try:
                    check_schema_keywords(node, where)
                except InvalidGrammarError as refused:
                    return refused.feature or str(refused), where
    return None


def _node_gap(node: dict, legacy_ref: bool) -> str | None:
    if "oneOf" in node:
        return "oneOf (xgrammar falls back to anyOf when it cannot prove the branches disjoint)"
    if "minLength" in node or "maxLength" in node:
        return "minLength/maxLength (xgrammar admits raw control characters in length-bounded strings)"
    required = node.get("required")
    if isinstance(required, list) and required:
        declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        undeclared = [name for name in required if name not in declared]
        if undeclared:
            return f"required properties missing from properties ({', '.join(map(str, undeclared[:3]))})"
    combinators = [k for k in _COMBINATORS if k in node]
    if combinators:
        siblings = sorted(k for k in node if k in _ASSERTIONS and k != combinators[0])
        if siblings:
            return f"{combinators[0]} together with sibling keywords ({', '.join(siblings)})"
    if "$ref" in node and not legacy_ref:
        siblings = sorted(k for k in node if k in _ASSERTIONS and k != "$ref")
        if siblings:
            return f"$ref together with sibling keywords ({', '.join(siblings)})"
    return None


def _schema_nodes(node: Any, path: str, root: dict, seen: set[int]):
    """Every subschema reachable from `node` (through keywords and local $refs), once each."""
    if not isinstance(node, dict) or id(node) in seen:
        return
    seen.add(id(node))
    yield node, path
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        yield from _schema_nodes(_resolve_pointer(root, ref), ref, root, seen)
    for keyword in _MAPS:
        children = node.get(keyword)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _schema_nodes(child, f"{path}.{keyword}.{name}", root, seen)
    for keyword in _LISTS:
        children = node.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield from _schema_nodes(child, f"{path}.{keyword}[{index}]", root, seen)
    for keyword in _SINGLES:
        yield from _schema_nodes(node.get(keyword), f"{path}.{keyword}", root, seen)


def _resolve_pointer(root: dict, ref: str) -> Any:
    node: Any = root
    for token in ref[2:].split("/") if len(ref) > 2 else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _validator_name(schema: dict) -> str:
    import jsonschema

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).__name__
