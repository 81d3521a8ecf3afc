"""The xgrammar backend: one GrammarCompiler with a bounded cache, one matcher per slot.

xgrammar logs and then *ignores* JSON-schema keywords it cannot enforce (checked by feeding
valid and invalid instances to its matcher, see tests/schema/test_engine_keywords.py). Every JSON
schema it receives therefore comes from `fd_guided.schema.for_engine("xgrammar", ...)`: rewritten
into the keywords xgrammar enforces exactly, or refused at admission with the feature named.

The spec's translation into what xgrammar reads, and the checks on it: `xgrammar_input`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import xgrammar as xgr

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..schema import regex_for_engine
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle
from ..unique_guard import restrict_rows, with_unique_guard
from .xgrammar_input import (  # noqa: F401 - choice_ebnf: re-exported (admission and tests import it from here)
    check_schema_patterns,
    choice_ebnf,
    compile_native,
    enforced_schema,
    first_line,
    has_unicode_property_escape,
    json_format_of,
    part_of,
    regex_texts,
    structural_tag_json,
    xgrammar_schema,
)


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
            enforced_schema(spec)
        elif spec.kind == "structural_tag":
            structural_tag_json(spec)
        elif spec.kind == "regex":
            regex_for_engine("xgrammar", spec.source)
        if any(has_unicode_property_escape(text) for text in regex_texts(spec)):
            feature = "Unicode property escapes (\\p{...}, \\P{...})"
            raise InvalidGrammarError(f"xgrammar cannot enforce {feature}", part=part_of(spec), feature=feature)

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        if spec.kind == "json_schema":
            check_schema_patterns(xgrammar_schema(spec.schema, json_format_of(spec), "json schema", unique_guard=True))
        try:
            native = compile_native(self.compiler, spec)
        except (RuntimeError, ValueError, TypeError) as error:
            message = first_line(error)
            # "... is not supported yet" is a limit of xgrammar, not a mistake in the request:
            # marked as a feature, so `auto` can serve the request with llguidance.
            feature = message if "not supported" in message else None
            raise InvalidGrammarError(f"rejected by xgrammar: {message}", part=part_of(spec), feature=feature) from None
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

    def serialized_size_estimate(self, compiled: CompiledGrammar) -> int | None:
        """Rules x printed grammar length x 2, plus twice `memory_size_bytes`. xgrammar writes the
        grammar's character FSM once per rule (its size follows the printed grammar's), then the
        token-mask cache (about twice its bytes in memory): within 0.7-1.7x of the written size on
        30 SchemaStore schemas of 0.9-876 MB (xgrammar 0.2.9). Printing costs milliseconds."""
        if not isinstance(compiled, XGrammarCompiled):
            return None
        printed = str(compiled.native.grammar)
        return printed.count("\n") * len(printed) * 2 + 2 * int(compiled.native.memory_size_bytes)

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
    """xgrammar's view of the vocabulary, with the bundle's special tokens (None bytes) spelling no text.

    Special tokens map to b"": xgrammar then never matches them against grammar text (it allows
    them only as stop tokens). `from_huggingface` reads an HF tokenizer's added and special tokens
    as their literal text (deepseek: all 1,283, `<think>` and BOS included, were allowed inside any
    JSON string), while the bundle, llguidance (`build_lltokenizer`), the uniqueItems guard and
    `TokenizerBundle.decode` treat them as no text: its decoded text tokens are kept and those ids blanked.
    """
    if tokenizer.hf_tokenizer is not None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer.hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
        special = [i for i in tokenizer.special_token_ids() if i < vocab_size]
        decoded = info.decoded_vocab
        if not any(decoded[i] for i in special):
            return info
        encoded = list(decoded)
        for i in special:
            encoded[i] = b""
    else:
        encoded = [token or b"" for token in tokenizer.token_bytes]
    return xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
