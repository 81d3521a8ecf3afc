"""The llguidance backend: grammars built at admission in microseconds, masks computed on the fly.

llguidance has no compile step worth caching: a "compiled" grammar is its serialized grammar text
plus one template matcher, and each slot gets a cheap `deep_copy` of that template. Unlike
xgrammar it refuses JSON-schema keywords it cannot enforce (unless `lenient`, which we never set),
so `check` asks `LLMatcher.validate_grammar_with_warnings` and turns every error or warning into
an `InvalidGrammarError` naming the feature.

What we add on top, so that what llguidance enforces is never looser than what `jsonschema`
(Python `re`) accepts:
  - regexes (``pattern``, ``patternProperties`` keys, ``guided_regex``) are rewritten so every
    character-class shorthand means the same as in Python: negated shorthands (``\\S``, ``\\D``,
    ``\\W``) and shorthands inside negated classes become Python's exact code-point sets, positive
    ones become their ASCII subsets; Rust-only class syntax (nested classes, ``&&``/``--``/``~~``,
    POSIX ``[:alpha:]``) is refused;
  - loose built-in formats (ipv4, date, time, date-time) become the strict patterns of
    `fd_guided.backends.formats`; ``format`` on a node that cannot be a string is dropped (format
    only constrains strings);
  - fractional ``multipleOf`` steps that are not powers of two are refused: `jsonschema` checks
    them in binary floating point and rejects exact decimal multiples such as 0.3 for 0.1;
  - strict mode (``additionalProperties: false`` by default) is applied by rewriting the schema,
    except on nodes that combine subschemas (allOf/anyOf/oneOf/$ref), where it would change them.
"""
from __future__ import annotations

import copy
import functools
import json
import logging
import re
import threading
from fractions import Fraction
from typing import Any, Iterator, Sequence

import llguidance
from llguidance import LLExecutor, LLMatcher, LLTokenizer

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec, JsonFormat, resolve_local_ref
from ..tokenizer import TokenizerBundle
from .formats import STRICT_FORMAT_PATTERNS

logger = logging.getLogger(__name__)

WHITESPACE_CHARS = r"[\x20\x0A\x0D\x09]"
_NOT_SCHEMA = ("const", "enum", "default", "examples")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_SINGLES = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains",
                   "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_COMBINERS = ("allOf", "anyOf", "oneOf", "$ref")


class _Refusal(Exception):
    """Raised while preparing a grammar: `feature` cannot be enforced faithfully."""

    def __init__(self, feature: str, location: str = ""):
        super().__init__(feature)
        self.feature = feature
        self.location = location


# ----- compiled grammar and matcher ---------------------------------------------------------------


class LLGuidanceCompiled(CompiledGrammar):
    """The llguidance grammar text and a template matcher at the start state (never advanced)."""

    __slots__ = ("spec", "grammar", "template")
    backend_name = "llguidance"

    def __init__(self, spec: GrammarSpec, grammar: str, template: LLMatcher):
        self.spec = spec
        self.grammar = grammar
        self.template = template

    @property
    def memory_bytes(self) -> int:
        # llguidance builds lexer states lazily per matcher; the shared part is the grammar.
        return 16 * 1024 + 4 * len(self.grammar)


class LLGuidanceMatcher(Grammar):
    """One slot's LLMatcher. A rejected token leaves the state unchanged (checked before consuming)."""

    __slots__ = ("matcher", "stop_token_ids", "vocab_size", "_terminated")

    def __init__(self, matcher: LLMatcher, stop_token_ids: frozenset[int], vocab_size: int):
        self.matcher = matcher
        self.stop_token_ids = stop_token_ids
        self.vocab_size = vocab_size
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        token_id = int(token_id)
        if self._terminated or not 0 <= token_id < self.vocab_size:
            return False
        if self.matcher.is_error():
            logger.warning("llguidance matcher is in its error state: %s", _first_line(self.matcher.get_error()))
            return False
        # validate_tokens never counts EOS; a stop token is valid exactly when the match is complete.
        is_stop = token_id in self.stop_token_ids
        if not (self.matcher.is_accepting() if is_stop else self.matcher.validate_tokens([token_id]) == 1):
            return False
        if not self.matcher.consume_token(token_id):
            logger.warning("llguidance rejected a validated token: %s", _first_line(self.matcher.get_error()))
            return False
        if is_stop:
            self._terminated = True
        return True

    def fill_bitmask(self, bitmask, row: int) -> None:
        pointer, row_bytes = _row_pointer(bitmask, row, self.vocab_size)
        self.matcher.unsafe_compute_mask_ptr(pointer, row_bytes)

    def is_terminated(self) -> bool:
        return self._terminated

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)
            self._terminated = False

    def reset(self) -> None:
        self.matcher.reset()
        self._terminated = False


# ----- the backend --------------------------------------------------------------------------------


class LLGuidanceBackend(GuidedBackend):
    """llguidance behind the `GuidedBackend` interface.

    The LLTokenizer is built from the bundle's `token_bytes` (the bytes the engine decodes; special
    tokens and padded ids can never match text) for the logits width `vocab_size`, with the
    engine's stop tokens as its EOS set, so a complete match allows exactly those.
    """

    name = "llguidance"

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ):
        super().__init__(tokenizer, vocab_size=vocab_size, config=config, stop_token_ids=stop_token_ids)
        if not self.stop_token_ids:
            raise ValueError("llguidance needs at least one stop token id")
        self.ll_tokenizer = build_lltokenizer(tokenizer, vocab_size, self.stop_token_ids)
        self._stop_set = frozenset(self.stop_token_ids)
        self._executor: LLExecutor | None = None
        self._executor_lock = threading.Lock()

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        _validate(spec, grammar_text(spec), None)

    def compile(self, spec: GrammarSpec) -> LLGuidanceCompiled:
        grammar = grammar_text(spec)
        # Building the template matcher validates the grammar against this tokenizer (and drops the GIL).
        template = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        problems = [template.get_error()] if template.is_error() else template.get_grammar_warnings()
        if problems:
            raise _invalid(spec, problems[0])
        return LLGuidanceCompiled(spec, grammar, template)

    def new_grammar(self, compiled: CompiledGrammar) -> LLGuidanceMatcher:
        if not isinstance(compiled, LLGuidanceCompiled):
            raise TypeError(f"llguidance cannot run a grammar compiled by {type(compiled).__name__}")
        return LLGuidanceMatcher(compiled.template.deep_copy(), self._stop_set, self.vocab_size)

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        if len(grammars) < self.config.parallel_fill_min_rows or not _is_contiguous(bitmask):
            super().fill_bitmasks(grammars, bitmask, rows)
            return
        pointer, row_bytes = _row_pointer(bitmask, 0, self.vocab_size)
        pairs = [(grammar.matcher, int(row)) for grammar, row in zip(grammars, rows)]
        # One executor (a thread pool) per backend; serialise its use across callers.
        with self._executor_lock:
            if self._executor is None:
                self._executor = LLExecutor(num_threads=self.config.fill_threads)
            self._executor.unsafe_compute_mask_ptr(pairs, pointer, row_bytes, int(bitmask.shape[0]))

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        if not isinstance(compiled, LLGuidanceCompiled):
            return None
        return compiled.grammar.encode("utf-8")

    def deserialize(self, spec: GrammarSpec, data: bytes) -> LLGuidanceCompiled | None:
        try:
            grammar = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        template = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if template.is_error():
            return None  # another llguidance version's grammar: compile instead
        return LLGuidanceCompiled(spec, grammar, template)


@functools.lru_cache(maxsize=8)
def build_lltokenizer(tokenizer: TokenizerBundle, vocab_size: int, stop_token_ids: tuple[int, ...]) -> LLTokenizer:
    """An LLTokenizer over `tokenizer.token_bytes`, `vocab_size` ids wide, with `stop_token_ids` as EOS.

    Cached per (bundle, width, stops): LLTokenizer is immutable and shared by every matcher.
    Built from the bundle rather than `llguidance.hf.from_tokenizer` so both backends and the
    engine agree on which ids are text (the HF loader treats some added tokens as text).
    """
    return LLTokenizer(_BundleTokenizer(tokenizer, vocab_size, stop_token_ids[0]), n_vocab=vocab_size, eos_token=list(stop_token_ids))


class _BundleTokenizer:
    """The duck type `llguidance.LLTokenizer` reads (what `llguidance.TokenizerWrapper` provides)."""

    is_tokenizer_wrapper = True
    bos_token_id = None

    def __init__(self, bundle: TokenizerBundle, vocab_size: int, eos_token_id: int):
        specials = [i for i, text in enumerate(bundle.token_bytes) if text is None] + list(range(bundle.vocab_size, vocab_size))
        self.special_token_ids = specials
        # Special and padded ids get a placeholder name; llguidance marks them so text never matches them.
        self.tokens = [text if text is not None else b"<[%d]>" % i for i, text in enumerate(bundle.token_bytes)]
        self.tokens += [b"<[%d]>" % i for i in range(bundle.vocab_size, vocab_size)]
        self.eos_token_id = eos_token_id
        self._encode = bundle.encode

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._encode(text))


# ----- grammar text per spec kind -----------------------------------------------------------------


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for `spec` (no tokenizer needed). Raises InvalidGrammarError."""
    try:
        return _GRAMMAR_BUILDERS[spec.kind](spec)
    except (ValueError, TypeError, RuntimeError) as error:
        if isinstance(error, InvalidGrammarError):
            raise
        # llguidance's builders raise on input they cannot read (e.g. integers past 64 bits).
        raise InvalidGrammarError(f"llguidance cannot read the grammar: {_first_line(error)}", part=_part_of(spec),
                                  feature=f"input llguidance cannot read ({_first_line(error)[:80]})" if spec.kind in ("json_schema", "structural_tag") else None) from None
    except _Refusal as refusal:
        part = f"json schema {refusal.location}" if refusal.location else _part_of(spec)
        raise InvalidGrammarError(f"llguidance cannot enforce {refusal.feature}", part=part, feature=refusal.feature) from None


def json_options(fmt: JsonFormat) -> dict[str, Any]:
    """llguidance JSON options for a request's layout: bounded whitespace or fixed separators."""
    if fmt.any_whitespace:
        bound = "*" if fmt.max_whitespace_cnt is None else f"{{0,{fmt.max_whitespace_cnt}}}"
        return {"whitespace_flexible": True, "whitespace_pattern": WHITESPACE_CHARS + bound,
                "item_separator": ",", "key_separator": ":", "coerce_one_of": False, "lenient": False}
    item, key = fmt.separators or (",", ":")
    return {"whitespace_flexible": False, "item_separator": item, "key_separator": key, "coerce_one_of": False, "lenient": False}


def _json_schema_grammar(spec: GrammarSpec) -> str:
    schema = prepare_schema(spec.schema, strict=spec.json_format.strict)
    # As text: llguidance's own JSON reader takes numbers that its dict converter refuses.
    return LLMatcher.grammar_from_json_schema(json.dumps(schema, ensure_ascii=False), overrides=json_options(spec.json_format))


def _json_object_grammar(spec: GrammarSpec) -> str:
    return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=json_options(spec.json_format))


def _regex_grammar(spec: GrammarSpec) -> str:
    _python_compiles(spec.source, "guided_regex")
    return LLMatcher.grammar_from_regex(python_exact_regex(spec.source))


def _choice_grammar(spec: GrammarSpec) -> str:
    # Lark string literals take JSON escapes; non-ASCII text stays literal.
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choices))


def _ebnf_grammar(spec: GrammarSpec) -> str:
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        lark = gbnf_to_lark(spec.source)
    except Exception as error:  # the converter raises plain exceptions on grammars it cannot read
        raise InvalidGrammarError(f"llguidance could not convert the EBNF grammar to Lark: {_first_line(error)}", part="guided_grammar") from None
    return LLMatcher.grammar_from_lark(lark)


def _lark_grammar(spec: GrammarSpec) -> str:
    return LLMatcher.grammar_from_lark(spec.source)


def _structural_tag_grammar(spec: GrammarSpec) -> str:
    tag = spec.structural_tag
    if "format" in tag:
        return LLMatcher.grammar_from_lark(format_to_lark(tag["format"], spec.json_format))
    options = json_options(spec.json_format)
    tags = []
    for index, structure in enumerate(tag["structures"]):
        trigger = next(t for t in tag["triggers"] if structure["begin"].startswith(t))
        schema = prepare_schema(structure["schema"], strict=spec.json_format.strict, path=f"structures[{index}].schema")
        schema["x-guidance"] = options
        tags.append(llguidance.StructTag(trigger=trigger, begin=structure["begin"], grammar=schema, end=structure["end"]))
    # Triggers are plain text here (our tokenizers have no special tokens spelled like them).
    return LLMatcher.grammar_from_lark(llguidance.StructTag.to_grammar(tags, assume_special=False))


_GRAMMAR_BUILDERS = {
    "json_schema": _json_schema_grammar,
    "json_object": _json_object_grammar,
    "regex": _regex_grammar,
    "choice": _choice_grammar,
    "ebnf": _ebnf_grammar,
    "lark": _lark_grammar,
    "structural_tag": _structural_tag_grammar,
}


def _validate(spec: GrammarSpec, grammar: str, tokenizer: LLTokenizer | None) -> None:
    _, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if messages:
        # A warning would stand for an unenforced constraint: refuse it like an error.
        raise _invalid(spec, messages[0])


def _invalid(spec: GrammarSpec, message: str) -> InvalidGrammarError:
    feature = _feature_of(message, spec)
    text = f"llguidance cannot enforce {feature}" if feature else f"rejected by llguidance: {_first_line(message)}"
    return InvalidGrammarError(text, part=_part_of(spec), feature=feature)


_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (.*)")


def _feature_of(message: str, spec: GrammarSpec) -> str | None:
    """The unsupported feature an llguidance message names; None for syntax errors in the request."""
    match = _UNIMPLEMENTED.search(message)
    if match:
        keys = [key.strip().strip('"') for key in match.group(1).split(",")]
        return ("keyword " if len(keys) == 1 else "keywords ") + ", ".join(keys)
    match = _UNKNOWN_FORMAT.search(message)
    if match:
        return f"format {match.group(1).strip()!r}"
    if "oneOf constraints are not supported" in message:
        return "oneOf whose subschemas may overlap"
    if "min/maxProperties only supported" in message:
        return "minProperties/maxProperties together with optional properties"
    if "look-around" in message:
        return "regex look-around"
    if "Unsatisfiable schema" in message:
        return None  # the schema admits no instance: a request error, not a missing feature
    if spec.kind in ("json_schema", "structural_tag"):
        # The schema already passed jsonschema's meta-schema check: what llguidance refuses is a limit.
        return _first_line(message)
    return None


# ----- JSON-schema preparation --------------------------------------------------------------------


def prepare_schema(schema: Any, *, strict: bool, path: str = "$") -> dict:
    """A copy of `schema` that llguidance enforces exactly as jsonschema validates (module docstring).

    Raises `_Refusal` for constructs that cannot be made faithful.
    """
    if not isinstance(schema, dict):
        return schema
    doc = copy.deepcopy(schema)
    doc.pop("x-guidance", None)  # request-level options must not be overridden from inside the schema
    in_combination: set[int] = set()
    roots = [(doc, path)] + [(node, f"{path}{ref[1:]}") for ref, node in _ref_targets(doc)]
    for node, _ in roots:
        _mark_combined(node, doc, in_combination, set())
    seen: set[int] = set()
    for node, where in roots:
        _prepare_node(node, where, strict, seen, in_combination)
    # The draft jsonschema validates with, by its canonical URI: llguidance would try to download
    # a meta-schema it does not know (https variants, "http://json-schema.org/schema").
    doc["$schema"] = validator_class(schema).META_SCHEMA["$schema"]
    return doc


def validator_class(schema: dict):
    """The jsonschema validator class that checks outputs of `schema` (as `fd_guided.validate` does)."""
    import jsonschema

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _ref_targets(doc: dict) -> Iterator[tuple[str, Any]]:
    refs: set[str] = set()
    _collect_refs(doc, refs)
    for ref in sorted(refs):
        node = resolve_local_ref(doc, ref)
        if node is not None:
            yield ref, node


def _collect_refs(node: Any, refs: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            refs.add(ref)
        for key, child in node.items():
            if key not in _NOT_SCHEMA:
                _collect_refs(child, refs)
    elif isinstance(node, list):
        for child in node:
            _collect_refs(child, refs)


def _mark_combined(node: Any, doc: dict, marked: set[int], visiting: set[int]) -> None:
    """Mark (by id) every subschema that is a branch of a combinator, following $refs from branches.

    Strict mode must not close those: ``allOf: [{$ref: base}, {properties: ...}]`` would become
    unsatisfiable if `base` forbade the other branch's properties.
    """
    for child, _ in _children(node, ""):
        _mark_combined(child, doc, marked, visiting)
    if not isinstance(node, dict):
        return
    # Closing a branch is harmless when it alone decides which keys are allowed: a single allOf
    # branch, or anyOf/oneOf branches (each validated on its own) under a parent without keys.
    parent_has_keys = any(k in node for k in ("properties", "patternProperties", "additionalProperties"))
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = node.get(keyword)
        if not isinstance(branches, list):
            continue
        if not parent_has_keys and (keyword != "allOf" or len(branches) == 1):
            continue
        for branch in branches:
            _mark_branch(branch, doc, marked, visiting)


def _mark_branch(branch: Any, doc: dict, marked: set[int], visiting: set[int]) -> None:
    if not isinstance(branch, dict) or id(branch) in visiting:
        return
    visiting.add(id(branch))
    marked.add(id(branch))
    ref = branch.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        _mark_branch(resolve_local_ref(doc, ref), doc, marked, visiting)


def _children(node: Any, path: str) -> Iterator[tuple[Any, str]]:
    if not isinstance(node, dict):
        return
    for keyword in _SCHEMA_MAPS:
        children = node.get(keyword)
        if isinstance(children, dict):
            for name, child in children.items():
                yield child, f"{path}.{keyword}.{name}"
    for keyword in _SCHEMA_LISTS + ("items",):
        children = node.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield child, f"{path}.{keyword}[{index}]"
    for keyword in _SCHEMA_SINGLES:
        if isinstance(node.get(keyword), dict):
            yield node[keyword], f"{path}.{keyword}"
    dependencies = node.get("dependencies")
    if isinstance(dependencies, dict):
        for name, child in dependencies.items():
            if isinstance(child, dict):
                yield child, f"{path}.dependencies.{name}"


def _prepare_node(node: Any, path: str, strict: bool, seen: set[int], combined: set[int]) -> None:
    if not isinstance(node, dict) or id(node) in seen:
        return
    seen.add(id(node))
    node.pop("$schema", None)  # one draft per document: the root's, set by prepare_schema
    _prepare_format(node, path)
    _prepare_patterns(node, path)
    _check_multiple_of(node, path)
    if strict and id(node) not in combined and _is_closable_object(node):
        node["additionalProperties"] = False
    for child, child_path in _children(node, path):
        _prepare_node(child, child_path, strict, seen, combined)


def _is_closable_object(node: dict) -> bool:
    if "additionalProperties" in node or "unevaluatedProperties" in node or any(k in node for k in _COMBINERS):
        return False
    kind = node.get("type")
    return isinstance(node.get("properties"), dict) or kind == "object" or (isinstance(kind, list) and "object" in kind)


def _prepare_format(node: dict, path: str) -> None:
    fmt = node.get("format")
    if not isinstance(fmt, str):
        return
    kind = node.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is not None and "string" not in kinds:
        del node["format"]  # format constrains strings only: on a number it is an annotation
        return
    if fmt in STRICT_FORMAT_PATTERNS:
        del node["format"]
        strict_pattern = {"pattern": f"^{STRICT_FORMAT_PATTERNS[fmt]}$"}
        if "pattern" in node:
            node["allOf"] = list(node.get("allOf") or []) + [strict_pattern]
        else:
            node.update(strict_pattern)


def _prepare_patterns(node: dict, path: str) -> None:
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        _python_compiles(pattern, f"json schema {path}.pattern")
        try:
            node["pattern"] = python_exact_regex(pattern)
        except _Refusal as refusal:
            raise _Refusal(refusal.feature, f"{path}.pattern") from None
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        rewritten = {}
        for key, child in patterns.items():
            _python_compiles(key, f"json schema {path}.patternProperties")
            try:
                rewritten[python_exact_regex(key)] = child
            except _Refusal as refusal:
                raise _Refusal(refusal.feature, f"{path}.patternProperties") from None
        node["patternProperties"] = rewritten


def _check_multiple_of(node: dict, path: str) -> None:
    step = node.get("multipleOf")
    if not isinstance(step, float) or step.is_integer():
        return
    denominator = Fraction(str(step)).denominator
    if denominator & (denominator - 1):
        raise _Refusal(f"multipleOf {step!r} (a decimal step that binary floating-point validators check inexactly)", f"{path}.multipleOf")


def _python_compiles(pattern: str, where: str) -> None:
    # Outputs are validated with Python's `re`: a pattern it cannot read cannot be checked.
    try:
        re.compile(pattern)
    except re.error as error:
        raise InvalidGrammarError(f"not a valid (Python) regular expression: {error}", part=where) from None


# ----- regexes with Python's meaning --------------------------------------------------------------

_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": r"\t\n\x0B\x0C\r\x20"}
_PYTHON_PREDICATES = {"d": str.isdecimal, "w": lambda c: c.isalnum() or c == "_", "s": str.isspace}


def _python_class(kind: str) -> str:
    """Python `re`'s ``\\d``/``\\w``/``\\s`` for str patterns as explicit code-point ranges."""
    return _code_point_ranges(kind, False)


def _python_complement(kind: str) -> str:
    """The complement of `_python_class(kind)` (Unicode scalar values only)."""
    return _code_point_ranges(kind, True)


@functools.lru_cache(maxsize=6)
def _code_point_ranges(kind: str, negate: bool) -> str:
    predicate = _PYTHON_PREDICATES[kind]
    ranges, start = [], None
    for point in range(0x110000 + 1):
        inside = point <= 0x10FFFF and not 0xD800 <= point <= 0xDFFF and predicate(chr(point)) != negate
        if inside and start is None:
            start = point
        elif not inside and start is not None:
            ranges.append((start, point - 1))
            start = None
    return "".join(f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges)


@functools.lru_cache(maxsize=4096)
def python_exact_regex(pattern: str) -> str:
    """`pattern` rewritten so llguidance's (Rust) regex never matches more than Python's `re` does.

    Positive shorthands become ASCII classes (a subset of Python's Unicode ones); negated
    shorthands, and shorthands inside negated classes, become Python's exact sets. Rust-only class
    syntax is refused (`_Refusal`).
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = negated = False
    class_start = 0
    while i < n:
        char = pattern[i]
        if char == "\\":
            if i + 1 >= n:
                raise _Refusal("a regex ending in a lone backslash")
            escaped = pattern[i + 1]
            lower = escaped.lower()
            if lower in _ASCII_CLASSES:
                is_negated_shorthand = escaped.isupper()
                if not in_class:
                    out.append(f"[^{_python_class(lower)}]" if is_negated_shorthand else f"[{_ASCII_CLASSES[lower]}]")
                elif is_negated_shorthand:
                    out.append(_python_complement(lower))
                else:
                    out.append(_python_class(lower) if negated else _ASCII_CLASSES[lower])
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if char == "[":
                raise _Refusal("a nested character class or POSIX class in a regex (Rust and Python read it differently)")
            if char in "&~-" and pattern[i + 1:i + 2] == char and i > class_start:
                raise _Refusal(f"the class operator {char * 2!r} in a regex (Rust and Python read it differently)")
            if char == "]" and i > class_start:
                in_class = False
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            negated = pattern[i + 1:i + 2] == "^"
            out.append("[^" if negated else "[")
            i += 2 if negated else 1
            class_start = i  # a "]" right here is a literal in both dialects
            continue
        out.append(char)
        i += 1
    return "".join(out)


# ----- helpers ------------------------------------------------------------------------------------


def _row_pointer(bitmask, row: int, vocab_size: int) -> tuple[int, int]:
    """Address and byte size of `bitmask[row]` (a CPU int32 torch tensor or numpy array)."""
    words = (vocab_size + 31) // 32
    if int(bitmask.shape[1]) != words:
        raise ValueError(f"bitmask rows have {bitmask.shape[1]} words; vocab_size {vocab_size} needs {words}")
    if hasattr(bitmask, "data_ptr"):
        import torch

        if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.stride(1) != 1:
            raise ValueError("the bitmask must be a CPU int32 tensor with contiguous rows")
        return bitmask.data_ptr() + row * bitmask.stride(0) * 4, words * 4
    if str(bitmask.dtype) != "int32" or bitmask.strides[1] != 4:
        raise ValueError("the bitmask must be an int32 array with contiguous rows")
    return bitmask.ctypes.data + row * bitmask.strides[0], words * 4


def _is_contiguous(bitmask) -> bool:
    if hasattr(bitmask, "is_contiguous"):
        return bool(bitmask.is_contiguous())
    return bool(bitmask.flags["C_CONTIGUOUS"])


def _part_of(spec: GrammarSpec) -> str:
    return {"json_schema": "guided_json", "json_object": "json_object", "regex": "guided_regex", "choice": "guided_choice",
            "ebnf": "guided_grammar", "lark": "guided_grammar", "structural_tag": "structural_tag"}[spec.kind]


def _first_line(error: Any) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__ if isinstance(error, Exception) else "unknown error"
    for line in lines:  # regex errors put the reason on an "error: ..." line after the pattern
        if line.startswith("error:"):
            return f"{lines[0].rstrip(':')}: {line[len('error:'):].strip()}"
    return lines[0]


# ----- format-style structural tags (xgrammar's "format" JSON) as Lark ----------------------------

_TEXT_REGEX = r"/(.|\n)*/"


def format_to_lark(fmt: Any, json_format: JsonFormat) -> str:
    """Lark for the subset of xgrammar's structural-tag formats llguidance can express exactly.

    Supported: const_string, json_schema (style "json"), regex, sequence, or, optional, plus,
    star, repeat, tag (string begin/end), any_text as a tag's content, triggered_tags and
    tags_with_separator (without ``excludes``). Token-level formats, dispatch, the XML styles,
    ``excludes`` and any_text limits raise `_Refusal` naming the format.
    """
    builder = _LarkBuilder(json_format)
    start = builder.expr(fmt, "format")
    return "%llguidance {}\n" + f"start: {start}\n" + "\n".join(builder.rules) + "\n"


class _LarkBuilder:
    def __init__(self, json_format: JsonFormat):
        self.json_format = json_format
        self.rules: list[str] = []
        self.count = 0

    def rule(self, body: str, prefix: str = "r", lazy: bool = False) -> str:
        self.count += 1
        name = f"{prefix}_{self.count}"
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def terminal(self, body: str) -> str:
        self.count += 1
        name = f"TEXT_{self.count}"
        self.rules.append(f"{name}: {body}")
        return name

    def expr(self, fmt: Any, where: str) -> str:
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise _Refusal(f"a structural-tag format without a type at {where}")
        kind = fmt["type"]
        method = getattr(self, f"_{kind}", None)
        if method is None:
            raise _Refusal(f"structural-tag format {kind!r}")
        for option in ("excludes", "exclude_tokens"):
            if fmt.get(option):
                raise _Refusal(f"{option!r} in structural-tag format {kind!r}")
        return method(fmt, f"{where}.{kind}")

    def _const_string(self, fmt: dict, where: str) -> str:
        value = fmt.get("value")
        if not isinstance(value, str):
            raise _Refusal(f"a const_string without a string value at {where}")
        return _literal(value)

    def _json_schema(self, fmt: dict, where: str) -> str:
        if fmt.get("style", "json") != "json" or fmt.get("any_order"):
            raise _Refusal(f"json_schema style {fmt.get('style')!r} / any_order in a structural tag")
        schema = fmt.get("json_schema")
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise _Refusal(f"json_schema {schema!r} in a structural tag")
        prepared = prepare_schema(schema, strict=self.json_format.strict, path=where)
        layout = self.json_format
        if fmt.get("max_whitespace_cnt") is not None:
            layout = JsonFormat(True, int(fmt["max_whitespace_cnt"]), layout.separators, layout.strict)
        prepared["x-guidance"] = json_options(layout)
        return "%json " + json.dumps(prepared, ensure_ascii=False)

    def _regex(self, fmt: dict, where: str) -> str:
        pattern = fmt.get("pattern")
        if not isinstance(pattern, str):
            raise _Refusal(f"a regex without a pattern at {where}")
        return self.terminal("/" + llguidance.regex_to_lark(python_exact_regex(pattern), "") + "/")

    def _sequence(self, fmt: dict, where: str) -> str:
        parts = [p for p in (self.expr(e, f"{where}[{i}]") for i, e in enumerate(fmt.get("elements") or [])) if p]
        if not parts:
            raise _Refusal(f"an empty sequence at {where}")
        return self.rule(" ".join(parts))

    def _or(self, fmt: dict, where: str) -> str:
        parts = [self.expr(e, f"{where}[{i}]") for i, e in enumerate(fmt.get("elements") or [])]
        if not parts:
            raise _Refusal(f"an empty 'or' at {where}")
        return self.rule(" | ".join(parts))

    def _optional(self, fmt: dict, where: str) -> str:
        return self.rule(f"({self.expr(fmt.get('content'), where)})?")

    def _plus(self, fmt: dict, where: str) -> str:
        return self.rule(f"({self.expr(fmt.get('content'), where)})+")

    def _star(self, fmt: dict, where: str) -> str:
        return self.rule(f"({self.expr(fmt.get('content'), where)})*")

    def _repeat(self, fmt: dict, where: str) -> str:
        low, high = fmt.get("min"), fmt.get("max")
        if not isinstance(low, int) or not isinstance(high, int) or low < 0 or (high != -1 and high < low):
            raise _Refusal(f"a repeat without valid min/max at {where}")
        inner = self.expr(fmt.get("content"), where)
        return self.rule(f"({inner}){{{low},}}" if high == -1 else f"({inner}){{{low},{high}}}")

    def _tag(self, fmt: dict, where: str, begin_rest: str | None = None) -> str:
        begin, end = fmt.get("begin"), fmt.get("end")
        ends = [end] if isinstance(end, str) else end
        if not isinstance(begin, str) or not isinstance(ends, list) or not ends or not all(isinstance(e, str) for e in ends):
            raise _Refusal(f"a tag with token begin/end at {where}")
        head = _literal(begin if begin_rest is None else begin_rest)  # "" when the trigger is the whole begin
        end_expr = " | ".join(_literal(e) for e in ends if e)
        content = fmt.get("content")
        if isinstance(content, dict) and content.get("type") == "any_text":
            if content.get("max_tokens") is not None or content.get("max_chars") is not None or content.get("excludes"):
                raise _Refusal("any_text with limits or excludes in a structural tag")
            if not end_expr:
                raise _Refusal(f"any_text in a tag without an end string at {where}")
            # Lazy: the text ends at the first end string, as in xgrammar.
            body = self.rule(f"{_TEXT_REGEX} ({end_expr})", prefix="any_text", lazy=True)
            return self.rule(f"{head} {body}")
        inner = self.expr(content, where)
        return self.rule(f"{head} {inner} {('(' + end_expr + ')') if end_expr else ''}".rstrip())

    def _triggered_tags(self, fmt: dict, where: str) -> str:
        triggers, tags = fmt.get("triggers") or [], fmt.get("tags") or []
        if not tags or not all(isinstance(t, str) and t for t in triggers):
            raise _Refusal(f"triggered_tags without triggers or tags at {where}")
        text = self.terminal(_TEXT_REGEX)
        heads: dict[str, str] = {}
        alternatives, direct = [], []
        for index, tag in enumerate(tags):
            begin = tag.get("begin") if isinstance(tag, dict) else None
            trigger = next((t for t in triggers if isinstance(begin, str) and begin.startswith(t)), None)
            if trigger is None:
                raise _Refusal(f"a triggered tag whose begin starts with no trigger at {where}[{index}]")
            if trigger not in heads:
                # Lazy: free text ends at the first occurrence of the trigger, which must open a tag.
                heads[trigger] = self.rule(f"{text} {_literal(trigger)}", prefix="trigger", lazy=True)
            body = self._tag(tag, f"{where}[{index}]", begin_rest=begin[len(trigger):])
            alternatives.append(f"{heads[trigger]} {body}")
            direct.append(self._tag(tag, f"{where}[{index}]"))
        one = self.rule(" | ".join(alternatives), prefix="tagged")
        if not fmt.get("at_least_one"):
            return self.rule(f"{text} | {one}" if fmt.get("stop_after_first") else f"{one}* {text}")
        # at_least_one (as xgrammar reads it): the output opens with a tag, no text before it.
        first = self.rule(" | ".join(direct), prefix="first")
        return first if fmt.get("stop_after_first") else self.rule(f"{first} {one}* {text}")

    def _tags_with_separator(self, fmt: dict, where: str) -> str:
        tags = fmt.get("tags") or []
        separator = fmt.get("separator")
        if not tags or not isinstance(separator, str):
            raise _Refusal(f"tags_with_separator without tags or separator at {where}")
        one = self.rule(" | ".join(self._tag(t, f"{where}[{i}]") for i, t in enumerate(tags)))
        if fmt.get("stop_after_first"):
            return self.rule(one if fmt.get("at_least_one") else f"({one})?")
        repeated = f"{one} ({_literal(separator)} {one})*" if separator else f"({one})+"
        return self.rule(repeated if fmt.get("at_least_one") else f"({repeated})?")


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else ""
