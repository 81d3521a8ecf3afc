"""The llguidance backend: grammars built at admission in microseconds, masks computed on the fly.

llguidance has no compile step worth caching: a "compiled" grammar is its serialized grammar text
plus one template matcher, and each slot gets a cheap `deep_copy` of that template. Unlike
xgrammar it refuses JSON-schema keywords it cannot enforce (unless `lenient`, which we never set),
so `check` asks `LLMatcher.validate_grammar_with_warnings` and turns every error or warning into
an `InvalidGrammarError` naming the feature.

Every JSON schema it receives comes from `fd_guided.schema.for_engine("llguidance", ...)`, so
what llguidance enforces is never looser than what `jsonschema` (Python `re`, format checking on)
accepts: patterns re-printed from Python's parse, formats as exact patterns, numbers compared
exactly (bounds and enum integers past 2^53 refused: llguidance compares them as doubles),
strictness and oneOf/not/if/dependencies/unevaluated* rewritten into keywords it enforces.
``guided_regex`` gets Python's exact reading through `fd_guided.schema.regex_for_engine`;
format-style structural tags become Lark in `llguidance_tags`.
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import re
import threading
from typing import Any, Sequence

import llguidance
from llguidance import LLExecutor, LLMatcher, LLTokenizer

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle
from ..schema import regex_for_engine
from ..unique_guard import restrict_rows, with_unique_guard
from .llguidance_schema import Refusal, json_options, llguidance_schema
from .llguidance_tags import format_to_lark

logger = logging.getLogger(__name__)



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
        # Measured: a template matcher holds ~60 KiB beside its grammar text (600 twelve-property
        # schemas grew RSS by 74 KiB each); the text is held twice (ours and llguidance's).
        return 64 * 1024 + 2 * len(self.grammar)


class LLGuidanceMatcher(Grammar):
    """One slot's LLMatcher. A rejected token leaves the state unchanged (checked before consuming).

    A stop token is never consumed by llguidance: it is accepted when the match is complete and
    only marks the matcher terminated. Why: llguidance does not count a consumed EOS in its
    rollback history (``rollback(1)`` after EOS undid the last *text* token), and speculative
    decoding rolls back through stop tokens.
    """

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
        if token_id in self.stop_token_ids:
            # validate_tokens never counts EOS; a stop token is valid exactly when the match is complete.
            self._terminated = bool(self.matcher.is_accepting())
            return self._terminated
        if self.matcher.validate_tokens([token_id]) != 1:
            return False
        if not self.matcher.consume_token(token_id):
            logger.warning("llguidance rejected a validated token: %s", _first_line(self.matcher.get_error()))
            return False
        return True

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        tokens = [int(t) for t in token_ids]
        text = next((i for i, t in enumerate(tokens) if t in self.stop_token_ids or not 0 <= t < self.vocab_size), len(tokens))
        if self._terminated or self.matcher.is_error():
            return 0
        # One native call validates the text tokens before the first stop token, one consumes them.
        valid = self.matcher.validate_tokens(tokens[:text]) if text else 0
        if valid and not self.matcher.consume_tokens(tokens[:valid]):
            logger.warning("llguidance rejected validated tokens: %s", _first_line(self.matcher.get_error()))
            return 0
        if valid == text < len(tokens) and self.accept_token(tokens[text]):
            return valid + 1
        return valid

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        tokens = [int(t) for t in token_ids]
        if self._terminated or self.matcher.is_error():
            return 0
        if any(t in self.stop_token_ids or not 0 <= t < self.vocab_size for t in tokens):
            return super().validate_tokens(tokens)  # a stop token needs the state before it
        return int(self.matcher.validate_tokens(tokens))

    def fill_bitmask(self, bitmask, row: int) -> None:
        pointer, row_bytes = _row_pointer(bitmask, row, self.vocab_size)
        if self.matcher.is_error():
            # A matcher in its error state (e.g. a parser limit hit) allows nothing: the manager
            # fails the request, instead of letting a stop token end it as if it were complete.
            ctypes.memset(pointer, 0, row_bytes)
            return
        self.matcher.unsafe_compute_mask_ptr(pointer, row_bytes)

    def is_terminated(self) -> bool:
        return self._terminated

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if self._terminated:  # the stop token is ours, not llguidance's (see the class docstring)
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def reset(self) -> None:
        self.matcher.reset()
        self._terminated = False

    def forced_bytes(self) -> bytes:
        if self._terminated or self.matcher.is_error():
            return b""
        return bytes(self.matcher.compute_ff_bytes())


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
        """Pure Python: the rewrites and refusals of `grammar_text` without llguidance's own
        parsers, which run in `compile` (a compile worker), never at admission."""
        _STATIC_CHECKS[spec.kind](spec)

    def compile(self, spec: GrammarSpec) -> LLGuidanceCompiled:
        grammar = grammar_text(spec)
        # Building the template matcher validates the grammar against this tokenizer (and drops the GIL).
        template = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        problems = [template.get_error()] if template.is_error() else template.get_grammar_warnings()
        if problems:
            raise _invalid(spec, problems[0])
        return LLGuidanceCompiled(spec, grammar, template)

    def warm_up(self) -> None:
        # The first matcher over a tokenizer builds its token trie (~1 s for 129k tokens).
        LLMatcher(self.ll_tokenizer, LLMatcher.grammar_from_regex("a"), log_level=0)

    def worker_recipe(self) -> tuple[str, dict]:
        return "fd_guided.backends.llguidance:LLGuidanceBackend", {
            "tokenizer": self.tokenizer.portable(), "vocab_size": self.vocab_size, "config": self.config,
            "stop_token_ids": self.stop_token_ids}

    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        if not isinstance(compiled, LLGuidanceCompiled):
            raise TypeError(f"llguidance cannot run a grammar compiled by {type(compiled).__name__}")
        matcher = LLGuidanceMatcher(compiled.template.deep_copy(), self._stop_set, self.vocab_size)
        return with_unique_guard(matcher, compiled.spec, self.tokenizer.token_bytes, self.vocab_size)

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
        for grammar, row in zip(grammars, rows):
            if grammar.matcher.is_error():
                ctypes.memset(pointer + int(row) * row_bytes, 0, row_bytes)  # see LLGuidanceMatcher.fill_bitmask
        restrict_rows(grammars, bitmask, rows)

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
    except Refusal as refusal:
        part = _part_of(spec) if refusal.location in ("", "$") else f"json schema {refusal.location}"
        raise InvalidGrammarError(f"llguidance cannot enforce {refusal.feature}", part=part, feature=refusal.feature) from None


def _json_schema_grammar(spec: GrammarSpec) -> str:
    schema = llguidance_schema(spec.schema, spec.json_format, "json schema", unique_guard=True)
    # As text: llguidance's own JSON reader takes numbers that its dict converter refuses.
    return LLMatcher.grammar_from_json_schema(json.dumps(schema, ensure_ascii=False), overrides=json_options(spec.json_format))


def _json_object_grammar(spec: GrammarSpec) -> str:
    return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=json_options(spec.json_format))


def _regex_grammar(spec: GrammarSpec) -> str:
    return LLMatcher.grammar_from_regex(regex_for_engine("llguidance", spec.source))


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
        schema = llguidance_schema(structure["schema"], spec.json_format, f"structural_tag.structures[{index}].schema")
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


def _check_json_schema(spec: GrammarSpec) -> None:
    llguidance_schema(spec.schema, spec.json_format, "json schema", unique_guard=True)


def _check_regex(spec: GrammarSpec) -> None:
    regex_for_engine("llguidance", spec.source)


def _check_structural_tag(spec: GrammarSpec) -> None:
    tag = spec.structural_tag
    if "format" in tag:
        format_to_lark(tag["format"], spec.json_format)
        return
    for index, structure in enumerate(tag["structures"]):
        llguidance_schema(structure["schema"], spec.json_format, f"structural_tag.structures[{index}].schema")


def _static(builder):
    """A static check that runs `builder`'s Python-only part and turns its Refusals into errors."""
    def check(spec: GrammarSpec) -> None:
        try:
            builder(spec)
        except Refusal as refusal:
            part = _part_of(spec) if refusal.location in ("", "$") else f"json schema {refusal.location}"
            raise InvalidGrammarError(f"llguidance cannot enforce {refusal.feature}", part=part, feature=refusal.feature) from None
    return check


_STATIC_CHECKS = {
    "json_schema": _static(_check_json_schema),
    "json_object": _static(lambda spec: None),
    "regex": _static(_check_regex),
    "choice": _static(lambda spec: None),
    "ebnf": _static(lambda spec: None),
    "lark": _static(lambda spec: None),
    "structural_tag": _static(_check_structural_tag),
}


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


