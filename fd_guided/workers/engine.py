"""The reference engine: continuous batching with chunked prefill over the built-in Paddle LM.

It plays the serving stack's part end to end so guided decoding is exercised by real logits:
admission (bad requests fail alone with InvalidGrammarError's message), slot assignment,
prefill in chunks under a token budget, one decode token per running request per step, sampling,
and retirement on EOS, `max_tokens` (``length``) or a guided finish (``stop``/``error``).

Two ways to drive it: `generate(requests)` runs a batch to completion; `submit` / `step` /
`abort` serve requests that arrive over time (a server's loop calls `step` while requests come
and go; `submit` and `abort` may be called from other threads).
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..manager import GuidedDecodingManager
from ..metrics import GuidedMetrics
from ..registry import create_backend
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle, load_tokenizer
from .cpu import CPUModelRunner
from .model import SeqChunk, TinyDecoderLM, TinyLMConfig
from .sampling import SamplingParams, sample_next_tokens
from .token_prior import structural_token_prior

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
    """What one `ReferenceEngine.step` did for one request: tokens it added, and its result once done."""

    index: int
    new_token_ids: tuple[int, ...]
    finished: GenerationResult | None = None


@dataclass
class RunStats:
    """Totals of the last `generate` call, for the CLI summary and the benchmark."""

    wall_seconds: float = 0.0
    forward_seconds: float = 0.0
    sample_seconds: float = 0.0
    steps: int = 0
    generated_tokens: int = 0
    admission_seconds: float = 0.0
    guided: dict[str, float] = field(default_factory=dict)
    # One entry per step: (seconds, number of prompt tokens in the step); decode-only steps have 0.
    step_log: list[tuple[float, int]] = field(default_factory=list)

    def decode_step_seconds(self) -> list[float]:
        return [seconds for seconds, prompt_tokens in self.step_log if prompt_tokens == 0]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds if self.wall_seconds else 0.0


@dataclass
class _Sequence:
    index: int
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    rng: np.random.Generator
    spec: GrammarSpec | None
    enable_thinking: bool | None
    ignore_eos: bool = False
    cache: Any = None
    slot: int = -1
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    admitted_at: float = 0.0
    first_token_at: float | None = None


class ReferenceEngine:
    """A small serving engine around `TinyDecoderLM`, with guided decoding through a runner.

    Args:
        model: the Paddle LM; `tokenizer` must match its vocabulary.
        runner_cls: a `GuidedRunnerMixin` device runner class (CPU by default).
        guided_config: backend and whitespace defaults; `guided=False` runs with no manager.
        max_num_seqs: slots (concurrent requests); max_num_batched_tokens: tokens per forward.
    """

    def __init__(
        self,
        model: TinyDecoderLM,
        tokenizer: TokenizerBundle,
        *,
        runner_cls=CPUModelRunner,
        runner_kwargs: dict | None = None,
        guided_config: GuidedConfig | None = None,
        guided: bool = True,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 512,
        metrics: GuidedMetrics | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.guided_config = guided_config or GuidedConfig()
        self.runner = runner_cls(model, **(runner_kwargs or {}))
        self.manager: GuidedDecodingManager | None = None
        if guided:
            backend = create_backend(self.guided_config.backend, tokenizer, vocab_size=model.cfg.vocab_size, config=self.guided_config)
            self.manager = GuidedDecodingManager(
                backend, max_num_seqs, metrics=metrics, think_end_id=tokenizer.think_end_id
            )
        self.runner.attach_guided(self.manager)
        self.stats = RunStats()
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[int, _Sequence] = {}
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self._aborted: set[int] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()

    @classmethod
    def default(cls, *, preset: str = "small", tokenizer: str = "deepseek", seed: int = 0, **kwargs) -> "ReferenceEngine":
        """The embedded default: the `preset` LM with seeded random weights over a bundled tokenizer."""
        bundle = load_tokenizer(tokenizer)
        vocab_size = bundle.padded_vocab_size or bundle.vocab_size
        cfg = TinyLMConfig.preset(preset, vocab_size=vocab_size, seed=seed)
        prior = structural_token_prior(_padded(bundle.token_bytes, vocab_size), list(bundle.eos_token_ids), cfg.prior_strength)
        return cls(TinyDecoderLM(cfg, token_prior=prior), bundle, **kwargs)

    # ----- public API ---------------------------------------------------------------------------

    def generate(self, requests: Sequence[dict], max_tokens: int = 64, seed: int = 0) -> list[GenerationResult]:
        """Run `requests` (dicts with ``prompt`` plus guided fields) to completion; results in order.

        Per request, ``max_tokens``, ``seed``, ``temperature``, ``top_k``, ``top_p``,
        ``ignore_eos`` (keep decoding past EOS, for benchmarks) and ``enable_thinking`` (or
        ``chat_template_kwargs.enable_thinking``) override the defaults. A request that fails
        admission gets an ``error`` result; the others run.
        """
        started = time.perf_counter()
        self.stats = RunStats()
        timings_before = self.manager.timings.as_dict() if self.manager else {}
        results: dict[int, GenerationResult] = {}
        order: list[int] = []
        for request in requests:
            index = next(self._ids)
            order.append(index)
            try:
                self.submit(request, max_tokens=max_tokens, seed=seed, index=index, position=len(order) - 1)
            except Exception as error:  # noqa: BLE001 - one malformed request never loses the batch
                message = str(error) if isinstance(error, InvalidGrammarError) else f"invalid request: {type(error).__name__}: {error}"
                results[index] = GenerationResult(index, "", [], "error", message)
        self.stats.admission_seconds = time.perf_counter() - started
        while self.has_unfinished():
            for update in self.step():
                if update.finished is not None:
                    results[update.index] = update.finished
        self.stats.wall_seconds = time.perf_counter() - started
        if self.manager:
            after = self.manager.timings.as_dict()
            self.stats.guided = {k: after[k] - timings_before.get(k, 0.0) for k in after}
        return [_renumbered(results[index], position) for position, index in enumerate(order)]

    def submit(self, request: dict, *, max_tokens: int = 64, seed: int = 0, index: int | None = None,
               position: int | None = None) -> int:
        """Admit one request and queue it; returns its id (`GenerationResult.index`, `StepUpdate.index`).

        Raises InvalidGrammarError (nothing is queued then). The request's sampling seed is
        ``[seed, position]`` (`position` defaults to its id): `generate` passes the batch position,
        so a batch samples the same way whatever ran before. Thread-safe.
        """
        index = next(self._ids) if index is None else index
        seq = self._admit(index, request, max_tokens, seed, index if position is None else position)
        with self._lock:
            self._waiting.append(seq)
        return index

    def abort(self, index: int) -> None:
        """Stop request `index` at the next step (its result has reason ``abort``). Thread-safe."""
        with self._lock:
            self._aborted.add(index)

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._running)

    def step(self) -> list[StepUpdate]:
        """One engine step: assign free slots, one forward over decode tokens and prompt chunks,
        sampling, retirement. Returns an update per request that gained a token or finished. When
        every running request is waiting for its grammar it waits up to 50 ms and returns []."""
        updates = self._retire_aborted()
        with self._lock:
            while self._waiting and self._free_slots:
                self._start(self._waiting.popleft(), self._free_slots.pop())
        running = self._running
        chunks, rows, prefill_done, prompt_tokens = self._plan(running)
        if not chunks:
            if running and self.manager is not None:
                # Every running request holds its last prompt token until its grammar is ready.
                self.manager.wait_ready(list(running), timeout_s=0.05)
            return updates
        step_started = tick = time.perf_counter()
        logits = self.runner.execute_step(chunks, rows, prefill_done)
        self.stats.forward_seconds += time.perf_counter() - tick
        tokens = self._sample(logits, [running[slot] for slot in rows]) if rows else []
        finishes = {finish.slot: finish for finish in self.runner.after_sample(tokens)}
        now = time.perf_counter()
        self.stats.steps += 1
        self.stats.step_log.append((now - step_started, prompt_tokens))
        for slot, token in zip(rows, tokens):
            seq = running[slot]
            if seq.first_token_at is None:
                seq.first_token_at = now
            before = len(seq.output_ids)
            done = self._record(seq, token, finishes.get(slot))
            added = tuple(seq.output_ids[before:])
            if done:
                self._retire(slot)
            if added or done:
                updates.append(StepUpdate(seq.index, added, self._result(seq) if done else None))
        return updates

    def _retire(self, slot: int) -> None:
        with self._lock:
            del self._running[slot]
            self._free_slots.append(slot)
        if self.manager:
            self.manager.release(slot)

    def _retire_aborted(self) -> list[StepUpdate]:
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            queued = [seq for seq in self._waiting if seq.index in aborted]
            for seq in queued:
                self._waiting.remove(seq)
        updates = []
        for seq in queued + [seq for seq in list(self._running.values()) if seq.index in aborted]:
            if seq.slot >= 0 and seq.slot in self._running:
                self._retire(seq.slot)
            seq.finish_reason = "abort"
            updates.append(StepUpdate(seq.index, (), self._result(seq)))
        return updates

    def validate(self, request: dict) -> GrammarSpec | None:
        """Admission check of one request's guided fields (raises InvalidGrammarError)."""
        if self.manager is None:
            return None
        return self.manager.validate(request)

    # ----- scheduling ---------------------------------------------------------------------------

    def _admit(self, index: int, request: dict, max_tokens: int, seed: int, position: int) -> _Sequence:
        if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
            raise InvalidGrammarError("each request needs a string 'prompt'", part="prompt")
        spec = self.validate(request)
        admitted_at = time.perf_counter()  # before the compile starts and the prompt is encoded
        if spec is not None and self.manager is None:
            raise InvalidGrammarError("this engine runs without guided decoding", part="request")
        if spec is not None:
            self.manager.prefetch(spec)  # compiles while the request waits for a slot, too
        prompt_ids = self.tokenizer.encode(request["prompt"]) or list(self.tokenizer.eos_token_ids[:1])
        params = SamplingParams(**{k: request[k] for k in SAMPLING_FIELDS if k in request})
        thinking = request.get("enable_thinking", (request.get("chat_template_kwargs") or {}).get("enable_thinking"))
        return _Sequence(
            admitted_at=admitted_at,
            index=index,
            prompt_ids=prompt_ids,
            max_tokens=int(request.get("max_tokens", max_tokens)),
            params=params,
            rng=np.random.default_rng([int(request.get("seed", seed)), position]),
            spec=spec,
            enable_thinking=thinking,
            ignore_eos=bool(request.get("ignore_eos", False)),
        )

    def _start(self, seq: _Sequence, slot: int) -> None:
        seq.slot = slot
        seq.cache = self.model.new_cache()
        self._running[slot] = seq
        if self.manager is not None:
            self.manager.add_request(slot, seq.spec, request_id=seq.index, prompt_token_ids=seq.prompt_ids, enable_thinking=seq.enable_thinking)

    def _plan(self, running: dict[int, _Sequence]) -> tuple[list[SeqChunk], list[int], list[int], int]:
        """Decode tokens first (one per running request), then prompt chunks within the budget.

        A guided request whose grammar is not ready yet is prefilled up to its last prompt token
        and holds that one (the step that would sample its first token) until the manager says
        `is_ready`: its compile overlaps the prefill, and no step ever waits for a compile.

        Returns the chunks, the slot of each logits row, the slots finishing their prompt, and
        the number of prompt tokens scheduled.
        """
        chunks, rows, prefill_done = [], [], []
        budget = self.max_num_batched_tokens
        prompt_tokens = 0
        for slot, seq in running.items():
            if seq.prefilled == len(seq.prompt_ids):
                chunks.append(SeqChunk(seq.cache, [seq.output_ids[-1]], True))
                rows.append(slot)
                budget -= 1
        for slot, seq in running.items():
            remaining = len(seq.prompt_ids) - seq.prefilled
            if remaining == 0 or budget <= 0:
                continue
            schedulable = remaining if self.manager is None or self.manager.is_ready(slot) else remaining - 1
            if schedulable <= 0:
                continue
            take = min(schedulable, budget)
            final = take == remaining
            chunks.append(SeqChunk(seq.cache, seq.prompt_ids[seq.prefilled:seq.prefilled + take], final))
            seq.prefilled += take
            budget -= take
            prompt_tokens += take
            if final:
                rows.append(slot)
                prefill_done.append(slot)
        return chunks, rows, prefill_done, prompt_tokens

    def _sample(self, logits, seqs: list[_Sequence]) -> list[int]:
        tick = time.perf_counter()
        tokens = sample_next_tokens(logits, [seq.params for seq in seqs], [seq.rng for seq in seqs])
        self.stats.sample_seconds += time.perf_counter() - tick
        return tokens

    def _record(self, seq: _Sequence, token: int, finish) -> bool:
        """Apply one sampled token to `seq`; True when the request is done."""
        if finish is not None and finish.reason == "error":
            seq.finish_reason, seq.error = "error", finish.error
            return True
        if token in self.tokenizer.eos_token_ids and not seq.ignore_eos:
            seq.finish_reason = "stop"
            return True
        seq.output_ids.append(token)
        self.stats.generated_tokens += 1
        if finish is not None:
            seq.finish_reason = "stop"
            return True
        if len(seq.output_ids) >= seq.max_tokens:
            seq.finish_reason = "length"
            return True
        return False

    def _result(self, seq: _Sequence) -> GenerationResult:
        text = self.tokenizer.decode(seq.output_ids)
        ttft = seq.first_token_at - seq.admitted_at if seq.first_token_at is not None else None
        return GenerationResult(seq.index, text, list(seq.output_ids), seq.finish_reason, seq.error, len(seq.prompt_ids), seq.spec, ttft)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
            self.manager.backend.close()


def _renumbered(result: GenerationResult, position: int) -> GenerationResult:
    """`generate` numbers its results by batch position (the ids are the engine's own)."""
    return dataclasses.replace(result, index=position)


def _padded(token_bytes: Sequence[bytes | None], size: int) -> list[bytes | None]:
    return list(token_bytes) + [None] * (size - len(token_bytes))
