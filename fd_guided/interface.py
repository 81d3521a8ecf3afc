"""The two interfaces every grammar engine implements, split by lifetime.

`GuidedBackend` lives as long as the serving engine: it owns the tokenizer view, the compiler and
its bounded cache, and knows how to fill many bitmask rows at once. `Grammar` lives as long as one
request in one slot: it is that request's matcher, advanced token by token.

Process contract (untrusted constraints may crash or stall native compilers):
  - `check` runs at admission on the caller's thread: pure Python, cheap, bounded, no native
    compiler calls. Native validation and compiling happen in `compile`, which the compile
    service runs in a killable worker process built from the backend's `worker_recipe()` (the
    `ProcessCompilable` protocol of `fd_guided.backends.composite`); the result comes back through
    `serialize`/`deserialize`. A backend without a recipe compiles in threads instead. A backend
    over several engines (``auto``) implements `CompositeBackend` from the same module.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .config import GuidedConfig
from .spec import FIELD_OF_KIND, GrammarSpec
from .tokenizer import TokenizerBundle

if TYPE_CHECKING:
    from .metrics import GuidedMetrics


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
    """One request's matcher. Not thread-safe; owned by one slot.

    Speculative decoding and jump-forward use the state as a stack: `accept_tokens` pushes drafts,
    `rollback` pops them (a stop token counts as one token), `validate_tokens` and `forced_bytes`
    look without moving. The abstract methods are enough; engines override the others with native
    calls where they have them.
    """

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

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Advance by `token_ids` in order, up to the first one the grammar rejects (which leaves
        the state as it was) or through a stop token that terminates it. Returns how many were
        accepted: the state is the one after that many tokens."""
        accepted = 0
        for token in token_ids:
            if self.is_terminated() or not self.accept_token(token):
                break
            accepted += 1
        return accepted

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of `token_ids` `accept_tokens` would accept; the state is unchanged."""
        accepted = self.accept_tokens(token_ids)
        if accepted:
            self.rollback(accepted)
        return accepted

    def forced_bytes(self) -> bytes:
        """The bytes every continuation from this state begins with (what jump-forward may emit
        without sampling); b"" when the next byte is not determined, or the engine cannot tell.
        The state is unchanged."""
        return b""

    def canonical_forced_token(self) -> int | None:
        """The one token `fill_bitmask` allows here where this engine keeps forced bytes to their
        canonical tokenization (llguidance: the first of its fast-forward tokens); None where
        the filled row is exactly the tokens `validate_tokens` accepts (every other engine).
        So a caller that needs only a few bits of the row (`fd_guided.budget.closing`) can ask
        about those tokens and write the bits the fill would have. The state is unchanged."""
        return None


class GuidedBackend(abc.ABC):
    """An engine-level grammar backend: compile specs, create matchers, fill bitmask rows.

    Subclasses register under `name` (built-ins in `fd_guided.registry`, third parties through
    the ``fd_guided.backends`` entry-point group) and are built with
    ``Backend(tokenizer, vocab_size=..., config=..., stop_token_ids=...)``. `stop_token_ids` are
    the engine's stop tokens (default: the tokenizer's EOS ids): a complete match allows exactly
    those, so grammar completion and the engine agree on what ends a request.
    """

    name: ClassVar[str]
    # How much a compile of this engine costs relative to others for the same constraint size.
    # The compile pool runs cheaper jobs first (shortest expected job first), so a cold request
    # that llguidance serves in milliseconds never queues behind xgrammar jobs that only warm the
    # cache for later requests.
    compile_cost_weight: ClassVar[int] = 1

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
        self.metrics: GuidedMetrics | None = None  # set by the CompileService that owns this backend

    @classmethod
    @abc.abstractmethod
    def check(cls, spec: GrammarSpec) -> None:
        """Admission check without a tokenizer: raise InvalidGrammarError if this backend cannot
        enforce `spec` faithfully (keywords it would silently ignore, syntax Python can judge).

        Runs on the caller's thread: pure Python, bounded cost, no native compiler calls (those
        belong in `compile`, which runs where a crash or a runaway costs only the request)."""

    @abc.abstractmethod
    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Validate natively and compile. Thread-safe; raises InvalidGrammarError on bad input."""

    def compile_checked(self, spec: GrammarSpec) -> CompiledGrammar:
        """`compile`, then refuse a grammar no output can satisfy (what compile workers run)."""
        compiled = self.compile(spec)
        check_satisfiable(self, compiled)
        return compiled

    def warm_up(self) -> None:  # noqa: B027 - optional hook: most backends have nothing to warm up
        """Pay one-time native set-up costs now (compile workers call it before forking)."""

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

    def serialized_size_estimate(self, compiled: CompiledGrammar) -> int | None:
        """Roughly how many bytes `serialize` would write for `compiled` (within ~2x), found without
        writing them; None when they are few (the default). A compile worker compares it with the
        compile's time to choose between sending the bytes and having the serving process compile
        again (`fd_guided.compile.transfer`)."""
        return None

    def deserialize(self, spec: GrammarSpec, data: bytes) -> CompiledGrammar | None:
        """Rebuild a compiled grammar from `serialize` output; None if the data does not fit
        this backend (other version, other tokenizer): the caller then compiles."""
        return None

    def cache_stats(self) -> dict[str, Any]:
        """Backend-specific cache figures (bytes used, limit); empty if the backend has no cache."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook: a backend without threads or caches has nothing to release
        """Release threads and caches. Idempotent."""


def check_satisfiable(backend: GuidedBackend, compiled: CompiledGrammar) -> None:
    """Refuse a compiled grammar whose first step allows nothing (an empty language, e.g.
    ``{"$ref": "#"}`` or ``[^\\s\\S]``), or only a stop token where the empty output is not in
    the language (JSON, choices, a regex that does not match ""): no request could succeed under it.
    """
    import torch

    from .errors import UnsatisfiableGrammarError

    spec = compiled.spec
    bitmask = torch.zeros((1, (backend.vocab_size + 31) // 32), dtype=torch.int32)
    backend.new_grammar(compiled).fill_bitmask(bitmask, 0)
    words = bitmask[0].numpy().view("uint32").copy()
    part = FIELD_OF_KIND.get(spec.kind)
    if not words.any():
        raise UnsatisfiableGrammarError("the constraint is unsatisfiable: no output can match it", part=part)
    for token in backend.stop_token_ids:
        if 0 <= token < backend.vocab_size:
            words[token >> 5] &= ~(1 << (token & 31)) & 0xFFFFFFFF
    if not words.any() and not _empty_output_allowed(spec):
        raise UnsatisfiableGrammarError(
            "the constraint is unsatisfiable: it admits only an empty output, which it does not match", part=part
        )


def _empty_output_allowed(spec: GrammarSpec) -> bool:
    if spec.kind == "regex":
        import re

        try:
            return re.fullmatch(spec.source, "") is not None
        except (re.error, RecursionError):
            return False
    return spec.kind in ("ebnf", "lark", "structural_tag")
