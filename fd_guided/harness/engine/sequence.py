"""What the reference engine keeps per request, what it reports, and how it reads a request dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fd_guided.budget import fit_budget_requested
from fd_guided.errors import InvalidGrammarError
from fd_guided.harness.engine.sampling import SamplingParams
from fd_guided.spec import GrammarSpec

SAMPLING_FIELDS = ("temperature", "top_k", "top_p")


@dataclass
class GenerationResult:
    """One request's outcome. `finish_reason` is ``stop``, ``length``, ``error`` or ``abort``."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    error: str | None = None
    prompt_tokens: int = 0
    spec: GrammarSpec | None = field(default=None, repr=False)
    # From admission (fields validated, spec built) to the first sampled token.
    ttft_seconds: float | None = None


@dataclass(frozen=True)
class StepUpdate:
    """What one `ReferenceEngine.step` did for one request: tokens it added, and its result once done.

    With speculative decoding or jump-forward a step may add several tokens. A jump-forward that
    re-encodes its boundary replaces only a token added in the same step, so `new_token_ids`
    always extend what earlier updates reported."""

    index: int
    new_token_ids: tuple[int, ...]
    finished: GenerationResult | None = None


@dataclass
class RunStats:
    """Totals of the last `generate` call, for the CLI summary and the benchmarks.

    `logit_forwards`: per request, the forward passes that gave it a logits row (its final
    prefill chunk and every decode step), summed; `decode_forwards` / `decode_tokens`: decode steps
    and the tokens their verification emitted (accepted drafts + one), so `acceptance_length` is
    tokens per target forward per request (1.0 without drafts). `draft_tokens`: drafts proposed;
    `jump_tokens`: tokens jump-forward emitted without a sample."""

    wall_seconds: float = 0.0
    forward_seconds: float = 0.0
    draft_seconds: float = 0.0
    sample_seconds: float = 0.0
    steps: int = 0
    generated_tokens: int = 0
    admission_seconds: float = 0.0
    logit_forwards: int = 0
    decode_forwards: int = 0
    decode_tokens: int = 0
    draft_tokens: int = 0
    jump_tokens: int = 0
    guided: dict[str, float] = field(default_factory=dict)
    # One entry per step: (seconds, number of prompt tokens in the step); decode-only steps have 0.
    step_log: list[tuple[float, int]] = field(default_factory=list)

    def decode_step_seconds(self) -> list[float]:
        return [seconds for seconds, prompt_tokens in self.step_log if prompt_tokens == 0]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def acceptance_length(self) -> float:
        return self.decode_tokens / self.decode_forwards if self.decode_forwards else 0.0

    @property
    def forward_passes_per_token(self) -> float:
        return self.logit_forwards / self.generated_tokens if self.generated_tokens else 0.0


@dataclass
class SequenceState:
    """One request inside the engine. Its target KV cache holds ``(prompt_ids + output_ids)[:cache.length]``;
    the tokens past that (the last sampled one, jump-forward tokens) go into the next chunk."""

    index: int
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    rng: np.random.Generator
    spec: GrammarSpec | None
    enable_thinking: bool | None
    ignore_eos: bool = False
    min_tokens: int = 0
    reasoning_budget: int | None = None
    jump_forward: bool | None = None
    fit_budget: bool = True  # steer the guided output to end complete within max_tokens (fd_guided.budget)
    draft_rng: np.random.Generator | None = None
    cache: Any = None
    draft_cache: Any = None
    draft_fed: list[int] = field(default_factory=list)
    slot: int = -1
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    admitted_at: float = 0.0
    first_token_at: float | None = None

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt_ids)

    def pending_ids(self) -> list[int]:
        """Tokens of the request not yet in its KV cache (at least the last sampled one)."""
        return (self.prompt_ids + self.output_ids)[self.cache.length :]


def read_request(
    index: int,
    request: dict,
    *,
    spec: GrammarSpec | None,
    prompt_ids: list[int],
    max_tokens: int,
    seed: int,
    position: int,
    admitted_at: float,
) -> SequenceState:
    """A `SequenceState` from a request dict's engine fields (see `ReferenceEngine.generate`)."""
    params = SamplingParams(**{k: request[k] for k in SAMPLING_FIELDS if k in request})
    thinking = request.get("enable_thinking", (request.get("chat_template_kwargs") or {}).get("enable_thinking"))
    min_tokens = int(request.get("min_tokens", 0))
    budget = request.get("reasoning_budget")
    if min_tokens < 0 or (budget is not None and int(budget) < 0):
        raise InvalidGrammarError(
            "min_tokens and reasoning_budget must be >= 0", part="min_tokens" if min_tokens < 0 else "reasoning_budget"
        )
    jump = request.get("jump_forward")
    seed = int(request.get("seed", seed))
    return SequenceState(
        admitted_at=admitted_at,
        index=index,
        prompt_ids=prompt_ids,
        max_tokens=int(request.get("max_tokens", max_tokens)),
        params=params,
        rng=np.random.default_rng([seed, position]),
        spec=spec,
        enable_thinking=thinking,
        ignore_eos=bool(request.get("ignore_eos", False)),
        min_tokens=min_tokens,
        reasoning_budget=None if budget is None else int(budget),
        jump_forward=None if jump is None else bool(jump),
        fit_budget=fit_budget_requested(request),
        # Drafts draw from their own stream, so the target's draws stay those of its seed.
        draft_rng=np.random.default_rng([seed, position, 1]),
    )
