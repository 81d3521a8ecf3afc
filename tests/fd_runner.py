"""A miniature FastDeploy model runner over the reference Paddle LM, for the adapter tests.

It calls the adapter exactly where FastDeploy's ``GPUModelRunner`` calls its guided-decoding
objects (research notes §1 step 4, §3, §4.1), unchanged: ``enable_thinking=False`` and no replay
tokens for a resumed request, FastDeploy's ``_get_p_done_idxs_gd`` rule (which misses a resumed
request). What the adapter's host hook adds to the real runner, binding the ``Request`` to the
future ``_init_logits_processor`` returns, is done here too (tests/test_fastdeploy_real.py shows
it on FastDeploy's own runner).

    insert_tasks_v1 (per PREFILL chunk, with prefill_start/end_index)
        -> get_logits_processor(key, enable_thinking=False) [+ bind_request] -> add_logits_processor
    execute_model:  p_done_idxs = _get_p_done_idxs_gd()
                    pre_process(p_done_idxs) -> forward -> apply_token_mask(logits, p_done_idxs)
                    -> sampling -> post_process(sampled_token_ids)

Logits row i is slot i, rows 0..highest running slot (empty slots give a zero row and a -1
token, FastDeploy's "stopped" marker). A ``decode`` role insert plays a PD decode instance:
the KV of the transferred tokens is rebuilt silently and the generated tokens are replayed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import paddle

from fd_guided.integrations.fastdeploy import GuidedDecoding, get_guided_backend, schemata_key_of
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.engine.model import SeqChunk, TinyDecoderLM, TinyLMConfig
from fd_guided.harness.engine.sampling import SamplingParams, sample_next_tokens
from fd_guided.harness.engine.token_prior import structural_token_prior

VOCAB = 129_280


@dataclass
class Request:
    """The fields of FastDeploy's ``Request`` the guided path reads, plus runner bookkeeping."""

    request_id: str
    prompt_token_ids: list[int]
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_json_object: Any = None
    structural_tag: Any = None
    disable_any_whitespace: Any = None  # an fd_guided per-request option (FastDeploy has none)
    enable_thinking: bool | None = None
    output_token_ids: list[int] = field(default_factory=list)
    max_tokens: int = 64
    seed: int = 0
    prefill_start_index: int = 0
    prefill_end_index: int = 0
    scripted_tokens: list[int] = field(default_factory=list)  # test hook: "the model says these next"
    finish_reason: str | None = None
    error: str | None = None


def fd_config(max_num_seqs: int = 8, *, backend: str = "xgrammar", disable_any_whitespace: Any = None,
              reasoning_parser: str | None = None, vocab_size: int = VOCAB) -> SimpleNamespace:
    """The minimal FastDeploy config shape the adapter reads."""
    return SimpleNamespace(
        structured_outputs_config=SimpleNamespace(
            guided_decoding_backend=backend, disable_any_whitespace=disable_any_whitespace, reasoning_parser=reasoning_parser),
        model_config=SimpleNamespace(model="deepseek", vocab_size=vocab_size),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


@functools.lru_cache(maxsize=2)
def tiny_model(seed: int = 0) -> TinyDecoderLM:
    """The reference engine's default LM ("tiny" preset) with its structural token prior."""
    tokenizer = load_tokenizer("deepseek")
    cfg = TinyLMConfig.preset("tiny", vocab_size=VOCAB, seed=seed)
    texts = list(tokenizer.token_bytes) + [None] * (VOCAB - tokenizer.vocab_size)
    return TinyDecoderLM(cfg, token_prior=structural_token_prior(texts, list(tokenizer.eos_token_ids), cfg.prior_strength))


@dataclass
class _Slot:
    request: Request
    cache: Any
    to_prefill: list[int]
    replay: list[int]
    rng: np.random.Generator
    prefilled: int = 0

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.to_prefill)


class MiniFastDeployRunner:
    """Continuous batching with chunked prefill, driving the adapter in FastDeploy's order."""

    def __init__(self, config: SimpleNamespace, *, chunk_budget: int = 512, role: str = "mixed",
                 handoff_after: int = 1, **backend_kwargs):
        self.config = config
        self.tokenizer = load_tokenizer("deepseek")
        self.model = tiny_model()
        self.chunk_budget = chunk_budget
        self.role = role
        self.handoff_after = handoff_after
        self.guided_backend = get_guided_backend(config, tokenizer=self.tokenizer, **backend_kwargs)
        self.guided_decoding = GuidedDecoding(config)  # what FastDeploy's Sampler.__init__ builds
        self.guided_decoding.apply_reasoning_parser(self.guided_backend.get_reasoning_parser())
        self.slots: list[_Slot | None] = [None] * config.scheduler_config.max_num_seqs
        self.finished: list[Request] = []
        self.handed_off: list[Request] = []
        self.masked_rows: list[dict[int, int]] = []  # per step: slot -> number of allowed tokens
        self.prefill_rows: list[dict[int, int]] = []  # per step: prefilling slot -> allowed tokens

    # ----- scheduling -----------------------------------------------------------------------

    def free_slot(self) -> int | None:
        return next((i for i, s in enumerate(self.slots) if s is None), None)

    def insert(self, request: Request, slot: int | None = None, *, resumed: bool = False) -> int:
        """insert_tasks_v1: a new, a resumed (preempted) or, on a decode role, a transferred request."""
        slot = self.free_slot() if slot is None else slot
        cache = self.model.new_cache()
        rng = np.random.default_rng([request.seed, len(request.output_token_ids)])
        if self.role == "decode":
            # The KV of prompt + P's tokens arrives from the prefill instance; rebuild it here.
            transferred = request.prompt_token_ids + request.output_token_ids[:-1]
            self.model.forward_batch([SeqChunk(cache, transferred, need_logits=False)])
            self.slots[slot] = _Slot(request, cache, transferred, [], rng, prefilled=len(transferred))
            request.prefill_start_index = 0
            request.prefill_end_index = len(request.prompt_token_ids) + len(request.output_token_ids)
            self._add_processor(slot, prefill_tokens=request.output_token_ids)  # FastDeploy's own D call
            return slot
        if not resumed:
            request.output_token_ids = []
        to_prefill = request.prompt_token_ids + request.output_token_ids
        self.slots[slot] = _Slot(request, cache, to_prefill, [], rng)
        return slot

    def preempt(self, slot: int) -> Request:
        """v1 preemption: the request goes back to the queue with its generated tokens.

        FastDeploy's runner handles the preempted task before ``apply_logits_processor`` and
        leaves the slot's guided state alone; its row then samples -1 (stopped).
        """
        request = self.slots[slot].request
        self.slots[slot] = None
        return request

    def _add_processor(self, slot: int, prefill_tokens=()) -> None:
        """_init_logits_processor + apply_logits_processor, as FastDeploy's runner calls them."""
        request = self.slots[slot].request
        key = schemata_key_of(request)
        future = None
        if key is not None:
            future = self.guided_backend.get_logits_processor(key, enable_thinking=False)  # "# TODO cfg"
            future.bind_request(request)  # what fd_guided's hook on _init_logits_processor adds
        self.guided_decoding.add_logits_processor(slot, future, list(prefill_tokens))

    # ----- execute_model ----------------------------------------------------------------------

    def step(self) -> None:
        running = [i for i, s in enumerate(self.slots) if s is not None]
        if not running:
            return
        chunks, p_done_idxs, prefilling = self._plan(running)
        self.guided_decoding.pre_process(p_done_idxs)
        logits = self._forward(chunks, running)
        logits = self.guided_decoding.apply_token_mask(logits, p_done_idxs)
        self._record_masks(logits, running, prefilling)
        tokens = self._sample(logits, running)
        self.guided_decoding.post_process(paddle.to_tensor(np.asarray(tokens, dtype=np.int64).reshape(-1, 1)))
        for slot in running:
            if slot not in prefilling:
                self._record_token(slot, tokens[slot])

    def _plan(self, running: list[int]):
        """The v1 scheduler: decode slots take one token; prefilling slots get a chunk and a PREFILL task."""
        chunks, p_done, prefilling = {}, [], set()
        budget = self.chunk_budget
        for slot in running:
            state = self.slots[slot]
            if not state.prefilling:
                last = state.request.output_token_ids[-1] if state.request.output_token_ids else state.to_prefill[-1]
                chunks[slot] = SeqChunk(state.cache, [last])
        for slot in running:
            state = self.slots[slot]
            if not state.prefilling:
                continue
            take = min(len(state.to_prefill) - state.prefilled, budget)
            if take <= 0:  # out of token budget: no chunk for this slot this step
                prefilling.add(slot)
                continue
            budget -= take
            request = state.request
            request.prefill_start_index, request.prefill_end_index = state.prefilled, state.prefilled + take
            self._add_processor(slot)  # the v1 scheduler re-sends the whole request per chunk
            chunks[slot] = SeqChunk(state.cache, state.to_prefill[state.prefilled:state.prefilled + take])
            state.prefilled += take
            # FastDeploy's _get_p_done_idxs_gd (v1): step_idx == 0 and not mid-prompt. A resumed
            # request's final chunk has step_idx = len(output) != 0, so FastDeploy misses it.
            step_idx = len(request.output_token_ids) if request.prefill_end_index >= len(state.to_prefill) else 0
            if step_idx == 0 and len(request.prompt_token_ids) <= request.prefill_end_index:
                p_done.append(slot)
            if state.prefilling:
                prefilling.add(slot)
        return chunks, p_done, prefilling

    def _forward(self, chunks: dict[int, SeqChunk], running: list[int]) -> paddle.Tensor:
        order = sorted(chunks)
        rows = self.model.forward_batch([chunks[slot] for slot in order]).numpy()
        full = np.zeros((max(running) + 1, VOCAB), dtype=np.float32)
        full[order] = rows
        return paddle.to_tensor(full)

    def _record_masks(self, logits, running, prefilling) -> None:
        host = logits.numpy()
        finite = {slot: int(np.isfinite(host[slot]).sum()) for slot in running}
        self.masked_rows.append({s: n for s, n in finite.items() if s not in prefilling})
        self.prefill_rows.append({s: n for s, n in finite.items() if s in prefilling})

    def _sample(self, logits, running) -> list[int]:
        rows = logits.shape[0]
        rngs = [self.slots[i].rng if i < len(self.slots) and self.slots[i] else np.random.default_rng(0) for i in range(rows)]
        tokens = sample_next_tokens(logits, [SamplingParams()] * rows, rngs)
        for slot in range(rows):
            state = self.slots[slot]
            if state is None:
                tokens[slot] = -1
            elif state.request.scripted_tokens and not state.prefilling:
                tokens[slot] = state.request.scripted_tokens.pop(0)
        return tokens

    def _record_token(self, slot: int, token: int) -> None:
        request = self.slots[slot].request
        finish = self.guided_decoding.finish_of(slot)
        if token in self.tokenizer.eos_token_ids:
            if finish is not None and finish.reason == "error":
                request.finish_reason, request.error = "error", finish.error
            else:
                request.finish_reason = "stop"
            return self._retire(slot, self.finished)
        request.output_token_ids.append(token)
        if self.role == "prefill" and len(request.output_token_ids) >= self.handoff_after:
            return self._retire(slot, self.handed_off)
        if len(request.output_token_ids) >= request.max_tokens:
            request.finish_reason = "length"
            self._retire(slot, self.finished)

    def _retire(self, slot: int, into: list) -> None:
        into.append(self.slots[slot].request)
        self.slots[slot] = None  # FastDeploy resets nothing: the slot's row samples -1 from now on

    # ----- driving ----------------------------------------------------------------------------

    def run(self, requests: list[Request], max_steps: int = 2000) -> list[Request]:
        """Admit `requests` as slots free up and step until all are finished (or handed off)."""
        waiting = list(requests)
        for _ in range(max_steps):
            while waiting and self.free_slot() is not None:
                self.insert(waiting.pop(0))
            if not waiting and all(s is None for s in self.slots):
                return requests
            self.step()
        raise AssertionError(f"requests did not finish in {max_steps} steps")

    def text(self, request: Request) -> str:
        """The generated text after the reasoning section (what a client receives as content)."""
        ids = request.output_token_ids
        think_end = self.tokenizer.think_end_id
        if think_end in ids:
            ids = ids[ids.index(think_end) + 1:]
        return self.tokenizer.decode(ids)

    def close(self) -> None:
        self.guided_decoding.close()
        self.guided_backend.close()
