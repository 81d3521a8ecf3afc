"""The two interfaces every grammar engine implements, split by lifetime.

`GuidedBackend` lives as long as the serving engine: it owns the tokenizer view, the compiler and
its bounded cache, and knows how to fill many bitmask rows at once. `Grammar` lives as long as one
request in one slot: it is that request's matcher, advanced token by token.

Threading contract (the reason LMDeploy crashed with tensor parallel):
  - `GuidedBackend.compile` may run concurrently on pool threads and must not write shared
    mutable state except its own thread-safe cache;
  - a `CompiledGrammar` is immutable and shared read-only by every slot and rank;
  - each `Grammar` belongs to exactly one slot (and one tensor-parallel rank) and is touched by
    one thread at a time; `fill_bitmasks` may run matchers of *different* slots in parallel.

Bitmask layout (the de-facto standard): int32 CPU tensor of shape (rows, ceil(vocab_size / 32)),
bit j of word w set means token ``32 * w + j`` is allowed. `vocab_size` is the model's logits
width (padded vocab), not the tokenizer's length; ids past the tokenizer are never allowed.
"""
from __future__ import annotations

import abc
from typing import Any, ClassVar, Sequence

from .config import GuidedConfig
from .spec import GrammarSpec
from .tokenizer import TokenizerBundle


class CompiledGrammar(abc.ABC):
    """An immutable compiled constraint, safe to share across slots, ranks and threads.

    `backend_name` names the engine that compiled it (the per-request choice of ``auto``).
    """

    spec: GrammarSpec
    backend_name: str = "unknown"

    @property
    @abc.abstractmethod
    def memory_bytes(self) -> int:
        """Approximate size, for cache accounting."""


class Grammar(abc.ABC):
    """One request's matcher. Not thread-safe; owned by one slot."""

    @abc.abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token. Returns False (state unchanged) if the grammar rejects it."""

    @abc.abstractmethod
    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed-token bits of the next step into `bitmask[row]`."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token was accepted after a complete match: the request is done."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (speculative decoding, preemption)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Back to the start state, as if no token was accepted."""


class GuidedBackend(abc.ABC):
    """An engine-level grammar backend: compile specs, create matchers, fill bitmask rows.

    Subclasses register under `name` (built-ins in `fd_guided.registry`, third parties through
    the ``fd_guided.backends`` entry-point group) and are built with
    ``Backend(tokenizer, vocab_size=..., config=..., stop_token_ids=...)``. `stop_token_ids` are
    the engine's stop tokens (default: the tokenizer's EOS ids): a complete match allows exactly
    those, so grammar completion and the engine agree on what ends a request.
    """

    name: ClassVar[str]

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ):
        if vocab_size < tokenizer.vocab_size:
            raise ValueError(
                f"vocab_size {vocab_size} (the logits width) is smaller than the tokenizer's {tokenizer.vocab_size} ids"
            )
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.config = config or GuidedConfig()
        self.stop_token_ids = tuple(stop_token_ids if stop_token_ids is not None else tokenizer.eos_token_ids)
        self.metrics = None  # set by the CompileService that owns this backend

    @classmethod
    @abc.abstractmethod
    def check(cls, spec: GrammarSpec) -> None:
        """Admission check without a tokenizer: raise InvalidGrammarError if this backend cannot
        enforce `spec` faithfully (syntax errors, keywords it would silently ignore)."""

    @abc.abstractmethod
    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile (or fetch from cache). Thread-safe; raises InvalidGrammarError on bad input."""

    @abc.abstractmethod
    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        """A fresh matcher at the start state of `compiled`."""

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        """Fill `bitmask[rows[i]]` from `grammars[i]`. Backends override with a parallel version."""
        for grammar, row in zip(grammars, rows):
            grammar.fill_bitmask(bitmask, row)

    def allocate_bitmask(self, rows: int):
        """A zeroed host bitmask for `rows` rows (pinned when CUDA is available)."""
        from .kernels import allocate_pinned_bitmask

        return allocate_pinned_bitmask(rows, self.vocab_size)

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        """Bytes another process can `deserialize` (for a shared L2 cache); None if unsupported."""
        return None

    def deserialize(self, spec: GrammarSpec, data: bytes) -> CompiledGrammar | None:
        """Rebuild a compiled grammar from `serialize` output; None if the data does not fit
        this backend (other version, other tokenizer): the caller then compiles."""
        return None

    def cache_stats(self) -> dict[str, Any]:
        """Backend-specific cache figures (bytes used, limit); empty if the backend has no cache."""
        return {}

    def close(self) -> None:
        """Release threads and caches. Idempotent."""
