"""The xgrammar backend: one GrammarCompiler with a bounded cache, one matcher per slot.

xgrammar logs and then *ignores* JSON-schema keywords it cannot enforce (checked by feeding
valid and invalid instances to its matcher, see tests/test_xgrammar_backend.py). `check` refuses
those keywords at admission so a warning never stands in for enforcement.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Iterator, Sequence

import xgrammar as xgr

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import FIELD_OF_KIND, GrammarSpec, resolve_local_ref, schema_objects
from ..tokenizer import TokenizerBundle
from .formats import STRICT_FORMAT_PATTERNS, with_strict_formats
from .schema_walk import for_each_schema_node, subschemas

# Formats xgrammar turns into real string grammars (anything else would be ignored).
SUPPORTED_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
    "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
# Keywords xgrammar accepts but does not enforce.
IGNORED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "contains", "minContains", "maxContains", "patternProperties", "propertyNames",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef",
})


class XGrammarCompiled(CompiledGrammar):
    __slots__ = ("spec", "native")
    backend_name = "xgrammar"

    def __init__(self, spec: GrammarSpec, native: xgr.CompiledGrammar):
        self.spec = spec
        self.native = native

    @property
    def memory_bytes(self) -> int:
        return int(self.native.memory_size_bytes)


class XGrammarMatcher(Grammar):
    __slots__ = ("matcher",)

    def __init__(self, compiled: XGrammarCompiled):
        self.matcher = xgr.GrammarMatcher(compiled.native)

    def accept_token(self, token_id: int) -> bool:
        return bool(self.matcher.accept_token(int(token_id)))

    def fill_bitmask(self, bitmask, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def reset(self) -> None:
        self.matcher.reset()


class XGrammarBackend(GuidedBackend):
    """xgrammar behind the `GuidedBackend` interface.

    The TokenizerInfo is built for the model's logits width (`vocab_size`, the padded vocab) with
    the engine's stop tokens (`stop_token_ids`, default the tokenizer's EOS ids), so grammar
    completion allows exactly the tokens that end a request in the engine.
    """

    name = "xgrammar"

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
        tokenizer_info: xgr.TokenizerInfo | None = None,
    ):
        super().__init__(tokenizer, vocab_size=vocab_size, config=config, stop_token_ids=stop_token_ids)
        self.tokenizer_info = tokenizer_info or _tokenizer_info(tokenizer, vocab_size, list(self.stop_token_ids))
        # No compiler cache: the compile service's byte-bounded LRU is the one cache (a second
        # one here would hold every grammar twice).
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=self.config.compile_threads, cache_enabled=False)
        self._batch_matcher = xgr.BatchGrammarMatcher(max_threads=self.config.fill_threads)
        self._batch_lock = threading.Lock()

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        """Pure Python: keywords and constructs xgrammar would not enforce. Its own parsers run in `compile`."""
        for schema, part in _schemas_of(spec):
            check_schema_keywords(schema, part)
        gap = xgrammar_gap(spec)
        if gap is not None:
            _refuse(*gap)
        if any(has_unicode_property_escape(text) for text in _regex_texts(spec)):
            feature = "Unicode property escapes (\\p{...}, \\P{...})"
            raise InvalidGrammarError(f"xgrammar cannot enforce {feature}", part=_part_of(spec), feature=feature)

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        for schema, part in _schemas_of(spec):
            check_schema_patterns(schema, part)
        try:
            native = _compile(self.compiler, spec)
        except (RuntimeError, ValueError, TypeError) as error:
            message = _first_line(error)
            # "... is not supported yet" is a limit of xgrammar, not a mistake in the request:
            # marked as a feature, so `auto` can serve the request with llguidance.
            feature = message if "not supported" in message else None
            raise InvalidGrammarError(f"rejected by xgrammar: {message}", part=_part_of(spec), feature=feature) from None
        return XGrammarCompiled(spec, native)

    def worker_recipe(self) -> tuple[str, dict]:
        return "fd_guided.backends.xgrammar:backend_from_recipe", self._recipe_kwargs()

    def _recipe_kwargs(self) -> dict:
        return {"tokenizer": self.tokenizer.portable(), "vocab_size": self.vocab_size, "config": self.config,
                "stop_token_ids": self.stop_token_ids, "tokenizer_info_json": self.tokenizer_info.serialize_json()}

    def with_config(self, config: GuidedConfig) -> "XGrammarBackend":
        if config == self.config:
            return self
        return XGrammarBackend(self.tokenizer, vocab_size=self.vocab_size, config=config, stop_token_ids=self.stop_token_ids,
                               tokenizer_info=self.tokenizer_info)

    def new_grammar(self, compiled: CompiledGrammar) -> XGrammarMatcher:
        if not isinstance(compiled, XGrammarCompiled):
            raise TypeError(f"xgrammar cannot run a grammar compiled by {type(compiled).__name__}")
        return XGrammarMatcher(compiled)

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        if len(grammars) < self.config.parallel_fill_min_rows:
            super().fill_bitmasks(grammars, bitmask, rows)
            return
        matchers = [grammar.matcher for grammar in grammars]
        # One BatchGrammarMatcher owns a thread pool; serialise its use across callers.
        with self._batch_lock:
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask, list(rows))

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        if not isinstance(compiled, XGrammarCompiled):
            return None
        return compiled.native.serialize_json().encode("utf-8")

    def deserialize(self, spec: GrammarSpec, data: bytes) -> XGrammarCompiled | None:
        try:
            native = xgr.CompiledGrammar.deserialize_json(data.decode("utf-8"), self.tokenizer_info)
        except (xgr.DeserializeVersionError, xgr.DeserializeFormatError, xgr.InvalidJSONError, RuntimeError, ValueError, UnicodeDecodeError):
            return None  # other xgrammar version or tokenizer: compile instead
        return XGrammarCompiled(spec, native)



def backend_from_recipe(*, tokenizer_info_json: str, **kwargs) -> XGrammarBackend:
    """`XGrammarBackend.worker_recipe`'s factory: the parent's exact TokenizerInfo, so compiled
    grammars deserialize there (a TokenizerInfo rebuilt from raw bytes would not match)."""
    return XGrammarBackend(tokenizer_info=xgr.TokenizerInfo.deserialize_json(tokenizer_info_json), **kwargs)


def _tokenizer_info(tokenizer: TokenizerBundle, vocab_size: int, stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    if tokenizer.hf_tokenizer is not None:
        return xgr.TokenizerInfo.from_huggingface(tokenizer.hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    # Special tokens map to b"": xgrammar then never matches them against grammar text.
    encoded = [token or b"" for token in tokenizer.token_bytes]
    return xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop_token_ids)


def _json_options(spec: GrammarSpec) -> dict[str, Any]:
    fmt = spec.json_format
    options: dict[str, Any] = {"any_whitespace": fmt.any_whitespace, "strict_mode": fmt.strict}
    if fmt.separators is not None:
        options["separators"] = fmt.separators
    if fmt.any_whitespace and fmt.max_whitespace_cnt is not None:
        options["max_whitespace_cnt"] = fmt.max_whitespace_cnt
    return options


# json_object: any JSON object, with the request's whitespace bounds (the builtin JSON grammar
# would allow unbounded whitespace).
_ANY_OBJECT_SCHEMA = '{"type":"object"}'


def _enforced_schema(spec: GrammarSpec) -> str:
    return json.dumps(_enforceable_schema(spec.schema))


# A JSON string character that needs no escape: what a length-bounded string may contain.
_PLAIN_JSON_CHAR = '[^\\x00-\\x1f"\\\\]'


def _enforceable_schema(schema: Any) -> Any:
    """The schema handed to xgrammar: loose formats and length-bounded strings become patterns.

    xgrammar's own ``minLength``/``maxLength`` string admits raw control characters (not JSON)
    and its mask costs milliseconds per token (most tokens become context dependent); the
    pattern ``^[plain char]{min,max}$`` is exact for strings without escapes and ~300x faster.
    """
    schema = with_strict_formats(schema)
    for_each_schema_node(schema, _length_to_pattern)
    return schema


def _length_to_pattern(node: dict) -> None:
    if ("minLength" in node or "maxLength" in node) and "pattern" not in node and "format" not in node:
        low, high = node.pop("minLength", 0), node.pop("maxLength", None)
        node["pattern"] = f"^{_PLAIN_JSON_CHAR}{{{low},{'' if high is None else high}}}$"


def _compile(compiler: xgr.GrammarCompiler, spec: GrammarSpec) -> xgr.CompiledGrammar:
    kind = spec.kind
    if kind == "json_schema":
        return compiler.compile_json_schema(_enforced_schema(spec), **_json_options(spec))
    if kind == "json_object":
        return compiler.compile_json_schema(_ANY_OBJECT_SCHEMA, **{**_json_options(spec), "strict_mode": False})
    if kind == "regex":
        return compiler.compile_regex(spec.source)
    if kind == "choice":
        return compiler.compile_grammar(choice_ebnf(spec.choices))
    if kind == "ebnf":
        return compiler.compile_grammar(spec.source)
    if kind == "lark":
        return compiler.compile_lark(spec.source)
    return compiler.compile_structural_tag(structural_tag_json(spec))


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar matching exactly one of `choices`.

    Every non-printable or non-ASCII character is written as a ``\\uXXXX`` escape: xgrammar reads
    ``\\x`` escapes greedily (``"a\\x00f"`` would parse as ``\\x0f``).
    """
    return "root ::= " + " | ".join(_ebnf_literal(choice) for choice in choices)


def _ebnf_literal(text: str) -> str:
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def structural_tag_json(spec: GrammarSpec) -> str:
    """The spec as xgrammar's structural-tag JSON (legacy structures/triggers become triggered_tags)."""
    tag = spec.structural_tag
    if "format" in tag:
        return json.dumps(tag)
    tags = [
        {"type": "tag", "begin": s["begin"], "content": {"type": "json_schema", "json_schema": _enforceable_schema(s["schema"])}, "end": s["end"]}
        for s in tag["structures"]
    ]
    return json.dumps({"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}})


def _schemas_of(spec: GrammarSpec) -> Iterator[tuple[Any, str]]:
    if spec.kind == "json_schema":
        yield spec.schema, "$"
    elif spec.kind == "structural_tag" and "structures" in spec.structural_tag:
        for index, structure in enumerate(spec.structural_tag["structures"]):
            yield structure["schema"], f"structures[{index}].schema"


def check_schema_keywords(schema: Any, path: str = "$") -> None:
    """Raise InvalidGrammarError at the first keyword xgrammar would not enforce, naming its location."""
    if not isinstance(schema, dict):
        return
    for keyword in schema:
        if keyword in IGNORED_KEYWORDS:
            _refuse(keyword, f"{path}.{keyword}")
    if schema.get("uniqueItems") is True:
        _refuse("uniqueItems", f"{path}.uniqueItems")
    if "multipleOf" in schema and schema.get("type") != "integer":
        _refuse("multipleOf on numbers (it is enforced only for type integer)", f"{path}.multipleOf")
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        _refuse("allOf with more than one subschema", f"{path}.allOf")
    fmt = schema.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt not in SUPPORTED_FORMATS):
        _refuse(f"format {fmt!r} (supported: {', '.join(sorted(SUPPORTED_FORMATS))})", f"{path}.format")
    if isinstance(fmt, str) and fmt in STRICT_FORMAT_PATTERNS and "pattern" in schema:
        _refuse(f"format {fmt!r} together with pattern", f"{path}.format")
    if "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
        _refuse("pattern together with minLength/maxLength", f"{path}.pattern")
    if isinstance(schema.get("pattern"), str):
        _check_pattern(schema["pattern"], f"{path}.pattern")
    if isinstance(schema.get("items"), list):
        _refuse("items as a list (use prefixItems)", f"{path}.items")
    if "unevaluatedProperties" in schema and not isinstance(schema["unevaluatedProperties"], bool):
        _refuse("unevaluatedProperties with a schema", f"{path}.unevaluatedProperties")
    for child, child_path in subschemas(schema, path):
        check_schema_keywords(child, child_path)


def _regex_texts(spec: GrammarSpec) -> Iterator[str]:
    """Text xgrammar reads with its regex parser, outside JSON schemas (see `_check_pattern`):
    a regex, a Lark grammar (its /.../ terminals) and the regex elements of a structural tag."""
    if spec.kind in ("regex", "lark"):
        yield spec.source
    elif spec.kind == "structural_tag":
        for node, _ in schema_objects(spec.structural_tag):
            if node.get("type") == "regex" and isinstance(node.get("pattern"), str):
                yield node["pattern"]


def has_unicode_property_escape(pattern: str) -> bool:
    """True if `pattern` uses ``\\p``/``\\P``: xgrammar refuses them at top level but, inside a
    character class, silently reads ``[\\p{L}]`` as the characters ``p{L}`` (it admits ``{``)."""
    escaped = False
    for char in pattern:
        if escaped and char in "pP":
            return True
        escaped = not escaped and char == "\\"
    return False


def _check_pattern(pattern: str, location: str) -> None:
    if has_unicode_property_escape(pattern):
        _refuse(f"pattern {pattern!r} (Unicode property escapes)", location)


def check_schema_patterns(schema: Any, path: str = "$") -> None:
    """Inside a JSON schema xgrammar drops what its regex parser refuses (lookaround, backreferences,
    word boundaries) with only a log line; such a pattern must be refused, not weakened. Native:
    runs in `compile` (a compile worker), never at admission."""
    for node, where in _pattern_nodes(schema, path):
        try:
            xgr.Grammar.from_regex(node["pattern"])
        except (RuntimeError, ValueError) as error:
            _refuse(f"pattern {node['pattern']!r} ({_first_line(error)})", f"{where}.pattern")


def _pattern_nodes(schema: Any, path: str) -> Iterator[tuple[dict, str]]:
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("pattern"), str):
        yield schema, path
    for child, child_path in subschemas(schema, path):
        yield from _pattern_nodes(child, child_path)


def _refuse(feature: str, location: str) -> None:
    raise InvalidGrammarError(f"xgrammar cannot enforce {feature}", part=f"json schema {location}", feature=feature)


def _part_of(spec: GrammarSpec) -> str:
    return FIELD_OF_KIND[spec.kind]


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else type(error).__name__
    # xgrammar prefixes C++ errors with "[time] /project/cpp/file.cc:line: "; keep the message.
    if message.startswith("[") and ": " in message:
        message = message.split(": ", 1)[1]
        if ".cc:" in message and ": " in message:
            message = message.split(": ", 1)[1]
    return message


# ----- what xgrammar's own checker lets through but xgrammar does not enforce ----------------------
# Found by generating from ~580 SchemaStore schemas and validating with jsonschema (docs/coverage.md)
# and confirmed on minimal schemas in tests/test_auto_backend.py and tests/test_xgrammar_backend.py.
# `check` runs it on the schema as compiled (after `_enforceable_schema`'s rewrites).

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


def xgrammar_gap(spec: GrammarSpec) -> tuple[str, str] | None:
    """See `_xgrammar_gap_in`; applied to every JSON schema of `spec` as xgrammar will see it."""
    if spec.kind == "json_schema":
        schemas = [(_enforceable_schema(spec.schema), "$")]
    elif spec.kind == "structural_tag" and "structures" in spec.structural_tag:
        schemas = [(_enforceable_schema(s["schema"]), f"structures[{i}].schema") for i, s in enumerate(spec.structural_tag["structures"])]
    else:
        return None
    return _xgrammar_gap_in(schemas)


def _xgrammar_gap_in(schemas) -> tuple[str, str] | None:
    """(feature, location) of the first construct xgrammar accepts but does not enforce, or None.

    - ``oneOf``: xgrammar falls back to anyOf semantics when it cannot prove the branches
      disjoint, so an output may match two branches;
    - a combinator (anyOf/oneOf/allOf) next to other assertions (``type: object`` beside
      ``anyOf: [{required: [a]}, ...]``): xgrammar keeps only the combinator;
    - ``$ref`` next to other assertions in drafts where they apply (2019-09 and later);
    - ``required`` names that ``properties`` does not declare: xgrammar drops them, or with
      declared ones admits no object at all;
    - ``minLength``/``maxLength`` left after the rewrite to a pattern (i.e. beside a ``format``):
      xgrammar's own length-bounded string admits raw control characters (``"a\x00"``), not JSON.
    """
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
        yield from _schema_nodes(resolve_local_ref(root, ref), ref, root, seen)
    for child, child_path in subschemas(node, path):
        yield from _schema_nodes(child, child_path, root, seen)


def _validator_name(schema: dict) -> str:
    import jsonschema

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).__name__
