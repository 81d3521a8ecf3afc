"""Sampler hooks: FastDeploy's ``Sampler.guided_decoding`` (``GuidedDecoding``) over one manager.

FastDeploy's runner drives it, logits row i = slot i::

    insert_tasks_v1, per PREFILL task (one per chunk): add_logits_processor(idx, future, prefill_tokens)
    execute_model:  pre_process(p_done_idxs)                 # before the forward: fills start
                    apply_token_mask(logits, p_done_idxs)    # inside Sampler.forward_cuda, in place
                    ... FastDeploy's post_process (may overwrite sampled tokens: EOS at max length,
                        thinking-length limits) ...
                    update_output_tokens(sampled_token_ids)  # Sampler.post_process

All guided state is the `GuidedDecodingManager`'s. A request joins the manager only when its
prefill ends (its next sample is a generated token): the compile started at the first chunk, so
nothing waits. Which chunk ends it comes from the request itself (`RequestContext`, bound by
`hooks.py`), because FastDeploy's ``p_done_idxs`` misses a resumed (preempted) request; without a
context FastDeploy's rule holds (``p_done_idxs``, or at once when ``prefill_tokens`` are given).
The request's generated tokens are replayed, so a resumed or PD-decode request is masked from the
right state; its own ``enable_thinking`` decides whether it thinks first.

Host reads (device-to-host transfers, each a sync on a GPU): none in a step whose batch holds no
slot of the manager (nothing guided: the sampled tokens are not read); one otherwise, the
sampled tokens, read once as one array. Tokens FastDeploy writes over a sample are accepted as
host-forced only when FastDeploy is known to write them (`host_forced_tokens`); any other token
outside its row's mask fails its request with an error (see `GuidedDecodingManager.accept`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...errors import SlotStateError
from ...manager import GuidedDecodingManager, GuidedFinish
from .backend import FDGuidedBackend, HandoffCompileService, ProcessorFuture
from .config import max_num_seqs_of, read, tensor_parallel_rank_of
from .reports import ErrorReports

if TYPE_CHECKING:
    from ...compile import CompileService

logger = logging.getLogger(__name__)


class GuidedDecoding:
    """Slot-indexed guided decoding for one FastDeploy sampler (one worker / TP rank)."""

    def __init__(self, fd_config: Any = None, backend: FDGuidedBackend | None = None):
        self.fd_config = fd_config
        self.backend: FDGuidedBackend | None = None
        self.manager: GuidedDecodingManager | None = None
        self.reports = ErrorReports.for_this_deployment()
        self._reporter = tensor_parallel_rank_of(fd_config) == 0  # every rank fails alike; one reports
        self._think_end_id: int | None = None
        self._parser_set = False
        self._pending: dict[int, ProcessorFuture] = {}  # prefilling: joins the manager at its final chunk
        self._active: dict[int, ProcessorFuture] = {}  # in the manager
        self._stopped: dict[int, GuidedFinish] = {}  # finished by guided decoding, until FastDeploy resets them
        self._planned_rows: int | None = None
        self._last_rows = 0
        self.host_forced_tokens: dict[int, str] = {}  # token -> name; set when a backend is bound
        warm_up_cuda_kernels(fd_config)  # FastDeploy builds the sampler, hence this, at worker start
        if backend is not None:
            self._bind(backend)

    # ----- insertion --------------------------------------------------------------------------

    def apply_reasoning_parser(self, reasoning_parser: Any = None) -> None:
        """FastDeploy's name: the parser's ``think_end_token_id`` gates requests that think."""
        self._think_end_id = getattr(reasoning_parser, "think_end_token_id", None) if reasoning_parser else None
        self._parser_set = True
        if self.manager is not None:
            self.manager.think_end_id = self._think_end_id
            self.host_forced_tokens = host_forced_tokens(self.fd_config, self._think_end_id)

    set_reasoning_parser = apply_reasoning_parser

    def add_logits_processor(
        self, idx: int, future: ProcessorFuture | None = None, prefill_tokens: Sequence[int] = ()
    ) -> None:
        """Guide slot `idx` with the request behind `future` (None: the slot is unguided).

        FastDeploy sends one call per prefill chunk: a later chunk of the request already pending
        here changes nothing but the context; a PREFILL task for a slot that is decoding means the
        request in it is (re)prefilled from scratch, so the slot starts over.
        """
        if future is None:
            self.reset_processor(idx)
            return
        self._bind(future.backend)
        manager = self.manager
        assert manager is not None  # `_bind` set it
        if not isinstance(idx, int) or not 0 <= idx < manager.max_num_seqs:
            raise SlotStateError(f"slot must be an int in [0, {manager.max_num_seqs}), got {idx!r}")
        pending = self._pending.get(idx)
        if pending is None or pending.spec != future.spec or _request_id(pending) != _request_id(future):
            self.reset_processor(idx)
            if future.spec is None:  # the key did not parse: fail the request, never run it unconstrained
                message = f"invalid guided request: {future.exception()}"
                manager.add_failed_request(idx, message, request_id=_request_id(future))
                self._finish(idx, future, GuidedFinish(idx, "error", message), 400)
                return
        self._pending[idx] = future
        context = future.request
        if context is not None and context.final_chunk is not None:
            final = context.final_chunk
        else:
            final = bool(prefill_tokens)  # FastDeploy's rule: tokens from a prefill node -> decoding now
        if final:
            self._activate(idx, prefill_tokens)

    def reset_processor(self, idx: int) -> None:
        """Forget slot `idx` (finished, aborted, preempted or reused)."""
        if self.manager is not None:
            self.manager.release(idx)
        for state in (self._pending, self._active, self._stopped):
            state.pop(idx, None)

    def _activate(self, idx: int, prefill_tokens: Sequence[int] = ()) -> None:
        future = self._pending.pop(idx)
        context = future.request
        replay = list(context.output_token_ids) if context is not None else [int(t) for t in prefill_tokens]
        thinking = (
            context.enable_thinking
            if context is not None and context.enable_thinking is not None
            else future.enable_thinking
        )
        prompt = list(context.prompt_token_ids) if context is not None else []
        spec, compiling = future.spec, future.compile_future
        # Only a future whose key parsed waits here (`add_logits_processor`), and it compiles.
        assert spec is not None and compiling is not None and self.manager is not None
        self._handoff.hand_over(spec, compiling)
        self.manager.add_request(
            idx,
            spec,
            request_id=_request_id(future),
            prompt_token_ids=prompt,
            output_token_ids=replay,
            enable_thinking=thinking,
            prefill_done=True,
            # FastDeploy reports "length" for an EOS at its max_dec_len-th token (it
            # forces one there), so the output and its EOS must end one token sooner.
            max_tokens=context.max_tokens - 1 if context is not None and context.max_tokens else None,
            fit_budget=context.fit_budget if context is not None else True,
        )
        self._active[idx] = future

    # ----- the step ---------------------------------------------------------------------------

    def pre_process(self, prefill_done_idxs: Sequence[int] = ()) -> None:
        """Before the forward: requests whose prefill ends now join; bitmask fills start."""
        if self.manager is None:
            return
        self._activate_done(prefill_done_idxs)
        self._plan(max(self._last_rows, max([*self._pending, *self._active, *self._stopped], default=-1) + 1))

    update_vocab_mask = pre_process

    def apply_token_mask(self, logits, prefill_done_idxs: Sequence[int] = ()):
        """Mask `logits` in place; returns `logits`. A first sample whose compile is still running
        waits for it up to ``first_token_wait_s`` (see `guided_config_from_fd`); rows of finished
        or failed slots allow only stop tokens (the manager's rule)."""
        if self.manager is None:
            return logits
        rows = int(logits.shape[0])
        if self._planned_rows is None:  # a runner that skips pre_process (FastDeploy's GCU runner)
            self._activate_done(prefill_done_idxs)
        if self._planned_rows != rows:
            self._plan(rows)
        self._last_rows = rows
        self.manager.apply(logits)
        return logits

    def update_output_tokens(self, next_tokens) -> list[GuidedFinish]:
        """Advance every guided slot by its row's token; returns the slots guided decoding finished.

        A negative token means FastDeploy stopped the slot: it is released. A token the row's
        mask forbade was forced by FastDeploy (EOS at max length or a stop sequence, the
        thinking-length limit): it is not a grammar rejection. A forced stop token ends the slot,
        another forced token is not fed to the matcher. Failures are reported to the engine.
        """
        if self.manager is None or self._planned_rows is None:
            return []
        rows, self._planned_rows = self._planned_rows, None
        if not guides_any(self.manager, rows):
            return []  # nothing guided in the batch: the sampled tokens are not read (no sync)
        tokens = _token_list(next_tokens)
        if len(tokens) != rows:
            raise SlotStateError(f"update_output_tokens got {len(tokens)} tokens for {rows} logits rows")
        for idx, token in enumerate(tokens):
            if token < 0 and (idx in self._pending or idx in self._active or idx in self._stopped):
                self.reset_processor(idx)  # FastDeploy stopped the slot
        # A token outside its row's applied mask: FastDeploy's own (a stop token, its thinking
        # limit's) or an error (the manager fails the request).
        finishes = self.manager.accept(tokens, masked_out="host", host_forced=self.host_forced_tokens)
        return self._report(finishes)

    def _report(self, finishes: list[GuidedFinish]) -> list[GuidedFinish]:
        manager = self.manager
        assert manager is not None  # only a bound sampler has finishes to report
        for finish in finishes:
            if finish.slot not in self._stopped:  # a request refused at insertion was reported then
                self._finish(finish.slot, self._active.get(finish.slot), finish, 500)
        for idx in [idx for idx in self._active if getattr(manager.finish_of(idx), "reason", None) == "forced"]:
            self._active.pop(idx)  # FastDeploy ended it with a forced stop token (length, stop sequence)
        return finishes

    post_process = update_output_tokens

    def join_async_fillmask(self) -> None:
        """FastDeploy's name; fills are joined inside `apply_token_mask`."""

    # ----- queries ----------------------------------------------------------------------------

    def finish_of(self, idx: int) -> GuidedFinish | None:
        """How guided decoding finished slot `idx` (``stop``, or ``error`` with the reason), or None."""
        return self._stopped.get(idx)

    @property
    def metrics(self):
        return self.backend.metrics if self.backend else None

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()

    # ----- internals --------------------------------------------------------------------------

    def _bind(self, backend: FDGuidedBackend) -> None:
        if self.backend is backend:
            return
        if self.backend is not None:
            raise SlotStateError("this GuidedDecoding is bound to another guided backend")
        self.backend = backend
        self._handoff = HandoffCompileService(backend.compile_service)
        think_end = self._think_end_id if self._parser_set else backend.think_end_id
        size = max_num_seqs_of(self.fd_config) if read(self.fd_config, "scheduler_config") else backend.max_num_seqs
        self.manager = GuidedDecodingManager(
            backend.guided_backend,
            size,
            metrics=backend.metrics,
            think_end_id=think_end,
            # A stand-in for the service: submit, close and metrics are all the manager uses.
            compile_service=cast("CompileService", self._handoff),
            **self._manager_options(),
        )
        self.host_forced_tokens = host_forced_tokens(self.fd_config, think_end)

    def _manager_options(self) -> dict:
        """Extra `GuidedDecodingManager` arguments (the speculative sampler's draft rows)."""
        return {}

    def _activate_done(self, prefill_done_idxs: Sequence[int]) -> None:
        for idx in prefill_done_idxs:
            future = self._pending.get(idx)
            # With a context, the request itself says which chunk is final: FastDeploy's
            # p_done_idxs is wrong for a resumed request (step_idx = len(output) != 0).
            if future is not None and (future.request is None or future.request.final_chunk is None):
                self._activate(idx)

    def _plan(self, rows: int) -> None:
        assert self.manager is not None  # the step hooks plan only with a manager
        self.manager.begin_step(range(rows))
        self._planned_rows = rows

    def _finish(self, idx: int, future: ProcessorFuture | None, finish: GuidedFinish, error_code: int) -> None:
        self._stopped[idx] = finish
        self._active.pop(idx, None)
        if finish.reason != "error":
            return
        request_id = _request_id(future) if future is not None else None
        if request_id is None:
            logger.warning("guided request in slot %d failed (no request id to report it): %s", idx, finish.error)
        elif self._reporter:
            error = finish.error or ""
            message = error if error.startswith("guided decoding") else f"guided decoding failed: {error}"
            self.reports.post(request_id, message, error_code)


def _request_id(future: ProcessorFuture | None) -> str | None:
    return future.request.request_id if future is not None and future.request is not None else None


# FastDeploy's thinking-length limit (``limit_thinking_content_length_v1``/``_v2``, chosen by
# FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR) writes model_config.think_end_id, and for "\n</think>\n\n"
# also model_config.line_break_id, over the sampled tokens; the last two line breaks land in the
# constrained part.
_LINE_BREAK_STRATEGY = "\n</think>\n\n"


def host_forced_tokens(fd_config: Any, think_end_id: int | None = None) -> dict[int, str]:
    """The tokens FastDeploy may write over a sample, each named (besides the stop tokens, which the
    manager always takes as ``stop``): the thinking limit's ``</think>`` (``think_end``) and, with
    the line-break strategy (``_LINE_BREAK_STRATEGY``), its line break (``line_break``)."""
    model = read(fd_config, "model_config")
    named: dict[int, str] = {}
    for token in (read(model, "think_end_id"), think_end_id):
        if isinstance(token, int) and token >= 0:
            named[token] = "think_end"
    line_break = read(model, "line_break_id")
    strategy = os.environ.get("FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR", "</think>")
    if isinstance(line_break, int) and line_break >= 0 and strategy == _LINE_BREAK_STRATEGY:
        named.setdefault(line_break, "line_break")
    return named


def warm_up_cuda_kernels(fd_config: Any) -> None:
    """On a CUDA worker, launch the mask kernel's variants once for the served vocabulary
    (`fd_guided.kernels.warm_up_cuda`), so no Triton compile lands inside a step. Off with
    ``FD_GUIDED_CUDA_WARMUP=0``; a failure is logged and never stops the worker."""
    if os.environ.get("FD_GUIDED_CUDA_WARMUP", "1") == "0" or importlib.util.find_spec("torch") is None:
        return
    vocab_size = read(read(fd_config, "model_config"), "vocab_size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        return
    try:
        import torch

        if not torch.cuda.is_available():
            return
        from ...kernels import warm_up_cuda

        warm_up_cuda(vocab_size)
    except Exception as error:  # noqa: BLE001 - a warm-up must never take the worker down
        logger.warning(
            "fd_guided: CUDA mask kernel warm-up failed (%s: %s); kernels compile on first use",
            type(error).__name__,
            error,
        )


def guides_any(manager: GuidedDecodingManager, rows: int | None = None) -> bool:
    """Whether the manager holds any slot among the first `rows` (all slots by default): pure host
    bookkeeping, so a batch with nothing guided costs no device read."""
    return any(manager.is_guided(slot) for slot in range(manager.max_num_seqs if rows is None else rows))


def host_array(tensor) -> np.ndarray:
    """A host (numpy) copy of a FastDeploy tensor (Paddle: ``.numpy()``) or an array-like; empty for None."""
    if tensor is None:
        return np.zeros(0, dtype=np.int64)
    return tensor.numpy() if hasattr(tensor, "numpy") else np.asarray(tensor)


def host_arrays(*tensors) -> list[np.ndarray]:
    """Host copies of several integer tensors in ONE device-to-host transfer: Paddle tensors are
    flattened, cast to int64 and concatenated on their device first (asynchronous kernels), then
    read once. Each comes back with its own shape, as int64; None gives an empty array. Inputs
    that are not all Paddle tensors (numpy arrays) are read one by one."""
    present = [t for t in tensors if t is not None]
    paddle = sys.modules.get("paddle")
    if not present or paddle is None or not all(isinstance(t, paddle.Tensor) for t in present):
        return [host_array(t).astype(np.int64, copy=False) for t in tensors]
    flat = [t.reshape([-1]).astype("int64") for t in present]
    host = (paddle.concat(flat) if len(flat) > 1 else flat[0]).numpy()
    out, offset = [], 0
    for tensor in tensors:
        if tensor is None:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        shape = [int(d) for d in tensor.shape]
        size = int(np.prod(shape, dtype=np.int64))
        out.append(host[offset : offset + size].reshape(shape))
        offset += size
    return out


def _token_list(sampled_token_ids) -> list[int]:
    return [int(t) for t in host_array(sampled_token_ids).reshape(-1)]
