"""The xgrammar backend: one GrammarCompiler with a bounded cache, one matcher per slot.

xgrammar logs and then *ignores* JSON-schema keywords it cannot enforce (checked by feeding
valid and invalid instances to its matcher, see tests/schema/test_engine_keywords.py). Every JSON
schema it receives therefore comes from `fd_guided.schema.for_engine("xgrammar", ...)`: rewritten
into the keywords xgrammar enforces exactly, or refused at admission with the feature named.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import xgrammar as xgr

from ..admission.meta import schema_objects
from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..schema import for_engine, regex_for_engine
from ..schema.walk import subschemas
from ..spec import FIELD_OF_KIND, GrammarSpec, JsonFormat
from ..tokenizer import TokenizerBundle
from ..unique_guard import restrict_rows, with_unique_guard


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
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def reset(self) -> None:
        self.matcher.reset()

    def forced_bytes(self) -> bytes:
        if self.matcher.is_terminated():
            return b""
        return self.matcher.find_jump_forward_string().encode("utf-8")


class XGrammarBackend(GuidedBackend):
    """xgrammar behind the `GuidedBackend` interface.

    The TokenizerInfo is built for the model's logits width (`vocab_size`, the padded vocab) with
    the engine's stop tokens (`stop_token_ids`, default the tokenizer's EOS ids), so grammar
    completion allows exactly the tokens that end a request in the engine.
    """

    name = "xgrammar"
    # SchemaStore compile times (docs/coverage.md): xgrammar's p50 is ~3x llguidance's, its
    # p90 ~50x and its p99 ~140x; 32 puts a schema's xgrammar job five size classes later.
    compile_cost_weight = 32

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
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=self.config.compile_threads, cache_enabled=False
        )
        self._batch_matcher = xgr.BatchGrammarMatcher(max_threads=self.config.fill_threads)
        self._batch_lock = threading.Lock()

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        """Pure Python: the schema normaliser's refusals for xgrammar, and regex features it
        misreads. Its own parsers run in `compile`."""
        if spec.kind == "json_schema":
            _enforced_schema(spec)
        elif spec.kind == "structural_tag":
            structural_tag_json(spec)
        elif spec.kind == "regex":
            regex_for_engine("xgrammar", spec.source)
        if any(has_unicode_property_escape(text) for text in _regex_texts(spec)):
            feature = "Unicode property escapes (\\p{...}, \\P{...})"
            raise InvalidGrammarError(f"xgrammar cannot enforce {feature}", part=_part_of(spec), feature=feature)

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        if spec.kind == "json_schema":
            check_schema_patterns(xgrammar_schema(spec.schema, _json_format(spec), "json schema", unique_guard=True))
        try:
            native = _compile(self.compiler, spec)
        except (RuntimeError, ValueError, TypeError) as error:
            message = _first_line(error)
            # "... is not supported yet" is a limit of xgrammar, not a mistake in the request:
            # marked as a feature, so `auto` can serve the request with llguidance.
            feature = message if "not supported" in message else None
            raise InvalidGrammarError(
                f"rejected by xgrammar: {message}", part=_part_of(spec), feature=feature
            ) from None
        return XGrammarCompiled(spec, native)

    @classmethod
    def from_tokenizer_info_json(
        cls,
        tokenizer_info_json: str,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> XGrammarBackend:
        """A backend over a serialized TokenizerInfo (`worker_recipe`'s factory): the parent's exact
        TokenizerInfo, so compiled grammars deserialize there (one rebuilt from raw bytes would not match)."""
        return cls(
            tokenizer,
            vocab_size=vocab_size,
            config=config,
            stop_token_ids=stop_token_ids,
            tokenizer_info=xgr.TokenizerInfo.deserialize_json(tokenizer_info_json),
        )

    def worker_recipe(self) -> tuple[str, dict]:
        """`ProcessCompilable` (`fd_guided.backends.composite`): rebuilt by `from_tokenizer_info_json`."""
        return "fd_guided.backends.xgrammar:backend_from_recipe", {
            "tokenizer": self.tokenizer.portable(),
            "vocab_size": self.vocab_size,
            "config": self.config,
            "stop_token_ids": self.stop_token_ids,
            "tokenizer_info_json": self.tokenizer_info.serialize_json(),
        }

    def with_config(self, config: GuidedConfig) -> XGrammarBackend:
        if config == self.config:
            return self
        return XGrammarBackend(
            self.tokenizer,
            vocab_size=self.vocab_size,
            config=config,
            stop_token_ids=self.stop_token_ids,
            tokenizer_info=self.tokenizer_info,
        )

    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        if not isinstance(compiled, XGrammarCompiled):
            raise TypeError(f"xgrammar cannot run a grammar compiled by {type(compiled).__name__}")
        return with_unique_guard(XGrammarMatcher(compiled), compiled.spec, self.tokenizer.token_bytes, self.vocab_size)

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        if len(grammars) < self.config.parallel_fill_min_rows:
            super().fill_bitmasks(grammars, bitmask, rows)
            return
        # This backend's grammars (an XGrammarMatcher, or a uniqueItems guard over one) carry
        # `matcher`, which `Grammar` does not declare.
        matchers = [grammar.matcher for grammar in grammars]  # type: ignore[attr-defined]
        # One BatchGrammarMatcher owns a thread pool; serialise its use across callers.
        with self._batch_lock:
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask, list(rows))
        restrict_rows(grammars, bitmask, rows)

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        if not isinstance(compiled, XGrammarCompiled):
            return None
        return compiled.native.serialize_json().encode("utf-8")

    def deserialize(self, spec: GrammarSpec, data: bytes) -> XGrammarCompiled | None:
        try:
            native = xgr.CompiledGrammar.deserialize_json(data.decode("utf-8"), self.tokenizer_info)
        except (
            xgr.DeserializeVersionError,
            xgr.DeserializeFormatError,
            xgr.InvalidJSONError,
            RuntimeError,
            ValueError,
            UnicodeDecodeError,
        ):
            return None  # other xgrammar version or tokenizer: compile instead
        return XGrammarCompiled(spec, native)


def backend_from_recipe(*, tokenizer_info_json: str, tokenizer: TokenizerBundle, **kwargs) -> XGrammarBackend:
    """`XGrammarBackend.worker_recipe`'s factory (`XGrammarBackend.from_tokenizer_info_json`)."""
    return XGrammarBackend.from_tokenizer_info_json(tokenizer_info_json, tokenizer, **kwargs)


def _tokenizer_info(tokenizer: TokenizerBundle, vocab_size: int, stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    if tokenizer.hf_tokenizer is not None:
        return xgr.TokenizerInfo.from_huggingface(
            tokenizer.hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
    # Special tokens map to b"": xgrammar then never matches them against grammar text.
    encoded = [token or b"" for token in tokenizer.token_bytes]
    return xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop_token_ids)


def _json_format(spec: GrammarSpec) -> JsonFormat:
    """`spec.json_format` of a JSON kind (json_schema, json_object, structural_tag): admission sets it."""
    assert spec.json_format is not None, f"a {spec.kind} spec without json_format"
    return spec.json_format


def _json_options(spec: GrammarSpec) -> dict[str, Any]:
    fmt = _json_format(spec)
    # Strictness is already explicit in the normalised schema (additionalProperties/items: false).
    options: dict[str, Any] = {"any_whitespace": fmt.any_whitespace, "strict_mode": False}
    if fmt.any_order:
        options["any_order"] = True
    if fmt.separators is not None:
        options["separators"] = fmt.separators
    if fmt.any_whitespace and fmt.max_whitespace_cnt is not None:
        options["max_whitespace_cnt"] = fmt.max_whitespace_cnt
    return options


# json_object: any JSON object, with the request's whitespace bounds (the builtin JSON grammar
# would allow unbounded whitespace).
_ANY_OBJECT_SCHEMA = '{"type":"object"}'


def _enforced_schema(spec: GrammarSpec) -> str:
    """The request's schema as xgrammar must see it (`fd_guided.schema.for_engine`); raises
    InvalidGrammarError naming what xgrammar cannot enforce."""
    return json.dumps(xgrammar_schema(spec.schema, _json_format(spec), "json schema", unique_guard=True))


def xgrammar_schema(schema: Any, json_format: JsonFormat, part: str, *, unique_guard: bool = False) -> dict:
    """`schema` normalised for xgrammar (`unique_guard`: see `fd_guided.schema.for_engine`); any-order
    needs exact property counts (see below)."""
    normalised = for_engine("xgrammar", schema, json_format, part=part, unique_guard=unique_guard)
    if json_format.any_order and "minProperties" in json.dumps(normalised):
        # With any_order xgrammar admits a repeated key ({"a":1,"a":2}), which parses as one.
        raise InvalidGrammarError(
            "xgrammar cannot count properties in any order (a key may repeat)",
            part=part,
            feature="minProperties with guided_any_order",
        )
    return normalised


def _compile(compiler: xgr.GrammarCompiler, spec: GrammarSpec) -> xgr.CompiledGrammar:
    kind = spec.kind
    if kind == "json_schema":
        return compiler.compile_json_schema(_enforced_schema(spec), **_json_options(spec))
    if kind == "json_object":
        return compiler.compile_json_schema(_ANY_OBJECT_SCHEMA, **{**_json_options(spec), "strict_mode": False})
    if kind == "regex":
        return compiler.compile_regex(regex_for_engine("xgrammar", spec.source))
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
    """The spec as xgrammar's structural-tag JSON (legacy structures/triggers become triggered_tags).

    Every JSON schema inside goes through `xgrammar_schema`, legacy structures and the
    ``json_schema`` elements of format-style tags alike: a tag is not a way around the checks.
    """
    tag = spec.structural_tag
    if "format" in tag:
        return json.dumps(
            {**tag, "format": _normalised_format(tag["format"], spec.json_format, "structural_tag.format")}
        )
    tags = [
        {
            "type": "tag",
            "begin": s["begin"],
            "content": {
                "type": "json_schema",
                "json_schema": xgrammar_schema(
                    s["schema"], _json_format(spec), f"structural_tag.structures[{i}].schema"
                ),
            },
            "end": s["end"],
        }
        for i, s in enumerate(tag["structures"])
    ]
    return json.dumps(
        {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}}
    )


def _normalised_format(node: Any, json_format: JsonFormat | None, where: str) -> Any:
    """A copy of a structural-tag format tree whose ``json_schema`` elements are normalised."""
    if isinstance(node, list):
        return [_normalised_format(item, json_format, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and "json_schema" in node:
        schema = node["json_schema"]
        if schema is True:
            schema = {}
        assert json_format is not None  # admission sets it on every structural tag
        return {**node, "json_schema": xgrammar_schema(schema, json_format, f"{where}.json_schema")}
    return {key: _normalised_format(value, json_format, f"{where}.{key}") for key, value in node.items()}


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


def check_schema_patterns(schema: Any, path: str = "$") -> None:
    """Defence in depth behind the normaliser's regex analysis: inside a JSON schema xgrammar drops
    what its regex parser refuses (lookaround, backreferences) with only a log line, so a pattern
    its parser rejects is refused, not weakened. Native: runs in `compile` (a compile worker)."""
    for node, where in _pattern_nodes(schema, path):
        try:
            xgr.Grammar.from_regex(node["pattern"])
        except (RuntimeError, ValueError) as error:
            feature = f"pattern {node['pattern']!r} ({_first_line(error)})"
            raise InvalidGrammarError(
                f"xgrammar cannot enforce {feature}", part=f"json schema {where}.pattern", feature=feature
            ) from None


def _pattern_nodes(schema: Any, path: str) -> Iterator[tuple[dict, str]]:
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("pattern"), str):
        yield schema, path
    for child, child_path in subschemas(schema, path):
        yield from _pattern_nodes(child, child_path)


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
