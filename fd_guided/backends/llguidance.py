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
import logging
import threading
from collections.abc import Sequence

from llguidance import LLExecutor, LLMatcher, LLTokenizer

from ..config import GuidedConfig
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle
from ..unique_guard import restrict_rows, with_unique_guard
from .llguidance_grammar import first_line, grammar_text, invalid_grammar, static_check

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
            logger.warning("llguidance matcher is in its error state: %s", first_line(self.matcher.get_error()))
            return False
        if token_id in self.stop_token_ids:
            # validate_tokens never counts EOS; a stop token is valid exactly when the match is complete.
            self._terminated = bool(self.matcher.is_accepting())
            return self._terminated
        if self.matcher.validate_tokens([token_id]) != 1:
            return False
        if not self.matcher.consume_token(token_id):
            logger.warning("llguidance rejected a validated token: %s", first_line(self.matcher.get_error()))
            return False
        return True

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        tokens = [int(t) for t in token_ids]
        text = next(
            (i for i, t in enumerate(tokens) if t in self.stop_token_ids or not 0 <= t < self.vocab_size), len(tokens)
        )
        if self._terminated or self.matcher.is_error():
            return 0
        # One native call validates the text tokens before the first stop token, one consumes them.
        valid = self.matcher.validate_tokens(tokens[:text]) if text else 0
        if valid and not self.matcher.consume_tokens(tokens[:valid]):
            logger.warning("llguidance rejected validated tokens: %s", first_line(self.matcher.get_error()))
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

    def canonical_forced_token(self) -> int | None:
        # llguidance's mask is its first fast-forward token alone whenever there is one (its
        # TokenParser::compute_mask), where validate_tokens accepts any spelling of the forced
        # bytes. There is one only where bytes are forced (~1.5 us to ask); computing it
        # tokenizes them through the Python tokenizer (~60 us, as the fill itself does there).
        if self._terminated or self.matcher.is_error() or not self.matcher.compute_ff_bytes():
            return None
        tokens = self.matcher.compute_ff_tokens()
        return int(tokens[0]) if tokens else None


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
        static_check(spec)

    def compile(self, spec: GrammarSpec) -> LLGuidanceCompiled:
        grammar = grammar_text(spec)
        # Building the template matcher validates the grammar against this tokenizer (and drops the GIL).
        template = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        problems = [template.get_error()] if template.is_error() else template.get_grammar_warnings()
        if problems:
            raise invalid_grammar(spec, problems[0])
        return LLGuidanceCompiled(spec, grammar, template)

    def warm_up(self) -> None:
        # The first matcher over a tokenizer builds its token trie (~1 s for 129k tokens).
        LLMatcher(self.ll_tokenizer, LLMatcher.grammar_from_regex("a"), log_level=0)

    def worker_recipe(self) -> tuple[str, dict]:
        """`ProcessCompilable` (`fd_guided.backends.composite`): rebuilt by the constructor."""
        return "fd_guided.backends.llguidance:LLGuidanceBackend", {
            "tokenizer": self.tokenizer.portable(),
            "vocab_size": self.vocab_size,
            "config": self.config,
            "stop_token_ids": self.stop_token_ids,
        }

    def with_config(self, config: GuidedConfig) -> LLGuidanceBackend:
        """This backend with `config` (its LLTokenizer is cached per tokenizer: shared)."""
        if config == self.config:
            return self
        return LLGuidanceBackend(
            self.tokenizer, vocab_size=self.vocab_size, config=config, stop_token_ids=self.stop_token_ids
        )

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
        # This backend's grammars (an LLGuidanceMatcher, or a uniqueItems guard over one) carry
        # `matcher`, which `Grammar` does not declare.
        pairs = [(grammar.matcher, int(row)) for grammar, row in zip(grammars, rows)]  # type: ignore[attr-defined]
        # One executor (a thread pool) per backend; serialise its use across callers.
        with self._executor_lock:
            if self._executor is None:
                self._executor = LLExecutor(num_threads=self.config.fill_threads)
            self._executor.unsafe_compute_mask_ptr(pairs, pointer, row_bytes, int(bitmask.shape[0]))
        for grammar, row in zip(grammars, rows):
            if grammar.matcher.is_error():  # type: ignore[attr-defined]  # as above
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
    # LLTokenizer reads the duck type (`is_tokenizer_wrapper`), which its stub names TokenizerWrapper.
    return LLTokenizer(
        _BundleTokenizer(tokenizer, vocab_size, stop_token_ids[0]),  # type: ignore[arg-type]
        n_vocab=vocab_size,
        eos_token=list(stop_token_ids),
    )


class _BundleTokenizer:
    """The duck type `llguidance.LLTokenizer` reads (what `llguidance.TokenizerWrapper` provides)."""

    is_tokenizer_wrapper = True
    bos_token_id = None

    def __init__(self, bundle: TokenizerBundle, vocab_size: int, eos_token_id: int):
        specials = [i for i, text in enumerate(bundle.token_bytes) if text is None] + list(
            range(bundle.vocab_size, vocab_size)
        )
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
