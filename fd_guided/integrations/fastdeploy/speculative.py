"""Guided decoding inside FastDeploy's speculative sampler (``SpeculativeSampler``, ``speculate_verify``).

FastDeploy refuses guided decoding with speculative decoding (``config.py``: "speculative
decoding currently do not support guided_decoding"; ``postprocess`` turns it off). `hooks.py`
lifts that, and installs these methods on ``SpeculativeSampler``, whose own guided hooks are
no-ops. The runner's calls then go::

    insert_tasks_v1:    sampler.apply_logits_processor(idx, future, prefill_tokens)   # as without drafts
    execute_model:      sampler.pre_process(p_done_idxs)          # requests whose prefill ends join
                        sampler.forward_cuda(logits, ..., share_inputs)
                          -> mask_verification_rows: request i has seq_lens_this_time[i] rows
                             (1 for a prefill chunk); its drafts are draft_tokens[i, 1:n]. The
                             manager masks row j with the grammar after drafts 0..j-1, in place,
                             before FastDeploy's softmax, top-p candidates and speculate_verify.
                             Drafts past the end of the grammar's chain are overwritten with -1 in
                             draft_tokens: FastDeploy's verifier accepts a draft that is among a
                             row's top-p *candidates*, which is not an exact rule (a probability-0
                             token can be a candidate when fewer tokens carry the mass), and -1
                             matches no candidate.
                          -> FastDeploy's own verification (speculate_verify) fills accept_tokens/accept_num
                        post_process(...)                          # FastDeploy's stop/length rules
                        sampler.post_process(accept_tokens)        # -> accept_verified: each request's
                             accept_tokens[i, :accept_num[i]] pushed at once (masked_out="host": a
                             token FastDeploy forced is not a grammar rejection)

Every guided request keeps one matcher; rows of finished or failed requests allow only stop tokens;
nothing waits for a compile beyond ``first_token_wait_s``, as in the non-speculative sampler.
The MTP proposer's own draft sampling is masked too (`mtp.py`); a draft session it left open
is closed here before the verification rows are planned and before a slot is reset.

Host reads (each a sync on a GPU): none in a step while the manager holds no slot (nothing is
read, planned or masked); otherwise one batched transfer before the mask (``seq_lens_this_time``,
``seq_lens_encoder`` and ``draft_tokens`` together, `host_arrays`) and one after verification
(``accept_tokens`` and ``accept_num`` together). Cut drafts are written back from that host copy
(one host-to-device copy, only when a draft is cut).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import SlotStateError
from ...manager import GuidedFinish
from . import mtp
from .config import read
from .patching import install_methods
from .sampler import GuidedDecoding, guides_any, host_arrays


class SpeculativeGuidedDecoding(GuidedDecoding):
    """`GuidedDecoding` for FastDeploy's speculative sampler: K + 1 rows per decoding request."""

    def __init__(self, fd_config: Any = None, backend=None):
        self._spec_slots: list[int] = []
        self._share_inputs = None
        self.draft_masking: mtp.DraftMasking | None = None  # set by the MTP sampler's first step
        super().__init__(fd_config, backend)

    def _manager_options(self) -> dict:
        drafts = read(getattr(self.fd_config, "speculative_config", None), "num_speculative_tokens")
        return {"max_draft_tokens": int(drafts or 0)}

    def pre_process(self, prefill_done_idxs: Sequence[int] = ()) -> None:
        """Requests whose prefill ends now join. The rows are known only in `mask_verification_rows`."""
        if self.manager is not None:
            self._activate_done(prefill_done_idxs)

    update_vocab_mask = pre_process

    def reset_processor(self, idx: int) -> None:
        self._close_drafting()
        super().reset_processor(idx)

    def _close_drafting(self) -> None:
        if self.draft_masking is not None:
            self.draft_masking.close()

    def mask_verification_rows(self, logits, share_inputs) -> None:
        """Mask FastDeploy's verification logits in place (see the module docstring)."""
        if self.manager is None:
            return
        self._close_drafting()
        self._planned_rows, self._share_inputs, self._spec_slots = None, None, []
        if not guides_any(self.manager):
            return  # nothing guided: no read, no mask (no sync)
        draft_tokens = share_inputs["draft_tokens"]
        lens, encoder, drafts_host = host_arrays(
            share_inputs["seq_lens_this_time"], share_inputs["seq_lens_encoder"], draft_tokens
        )
        lens, encoder = lens.reshape(-1), encoder.reshape(-1)
        slots, drafts = [], []
        for idx, count in enumerate(lens.tolist()):
            if count <= 0:
                continue
            slots.append(idx)
            drafts.append([] if encoder[idx] > 0 else [int(t) for t in drafts_host[idx, 1:count]])
        rows = sum(len(d) + 1 for d in drafts)
        if rows != int(logits.shape[0]):
            raise SlotStateError(
                f"FastDeploy's verification logits have {int(logits.shape[0])} rows; its inputs say {rows}"
            )
        self.manager.begin_speculative_step(slots, drafts)
        self.manager.apply(logits)
        cut = False
        for idx, chain, limit in zip(slots, drafts, self.manager.draft_limits()):
            if limit < len(chain):
                drafts_host[idx, 1 + limit : 1 + len(chain)] = -1
                cut = True
        if cut:
            _write_back(draft_tokens, drafts_host)
        self._spec_slots, self._share_inputs = slots, share_inputs
        self._planned_rows = len(slots)

    def accept_verified(self, accept_tokens=None) -> list[GuidedFinish]:
        """After FastDeploy's verification and post-processing: push each request's accepted tokens."""
        if self.manager is None or self._planned_rows is None or self._share_inputs is None:
            return []
        tokens, counts = host_arrays(
            accept_tokens if accept_tokens is not None else self._share_inputs["accept_tokens"],
            self._share_inputs["accept_num"],
        )
        counts = counts.reshape(-1)
        accepted = []
        for idx in self._spec_slots:
            row = [int(t) for t in tokens[idx, : max(0, int(counts[idx]))]]
            if any(t < 0 for t in row) and (idx in self._pending or idx in self._active or idx in self._stopped):
                self.reset_processor(idx)  # FastDeploy stopped the slot
                row = []
            accepted.append(row)
        finishes = self.manager.accept_speculative(accepted, masked_out="host", host_forced=self.host_forced_tokens)
        self._planned_rows, self._share_inputs = None, None
        return self._report(finishes)

    # FastDeploy passes the tokens positionally; the base names its parameter `next_tokens`.
    post_process = accept_verified  # type: ignore[assignment]
    update_output_tokens = accept_verified  # type: ignore[assignment]


def install(sampler_cls, mark: str) -> None:
    """Give FastDeploy's ``SpeculativeSampler`` our guided hooks (idempotent through `mark`)."""
    if getattr(sampler_cls, mark, False):
        return
    original_init, original_forward = sampler_cls.__init__, sampler_cls.forward_cuda

    @functools.wraps(original_init)
    def __init__(self, fd_config, *args, **kwargs):
        original_init(self, fd_config, *args, **kwargs)
        self.guided_decoding = SpeculativeGuidedDecoding(fd_config)
        mtp.link(fd_config, self.guided_decoding)  # the MTP sampler built from this config drafts under it

    @functools.wraps(original_forward)
    def forward_cuda(self, logits, sampling_metadata, max_model_len, share_inputs, *args, **kwargs):
        self.guided_decoding.mask_verification_rows(logits, share_inputs)
        return original_forward(self, logits, sampling_metadata, max_model_len, share_inputs, *args, **kwargs)

    def apply_logits_processor(self, ids: int, future=None, prefill_tokens=()):
        self.guided_decoding.add_logits_processor(ids, future, list(prefill_tokens))

    def pre_process(self, skip_idx_list=()):
        self.guided_decoding.pre_process(skip_idx_list)

    def set_reasoning_parser(self, reasoning_parser=None):
        self.guided_decoding.apply_reasoning_parser(reasoning_parser)

    def post_process(self, next_tokens=None, skip_idx_list=()):
        self.guided_decoding.accept_verified(next_tokens)

    install_methods(
        sampler_cls,
        mark,
        {
            "__init__": __init__,
            "forward_cuda": forward_cuda,
            "apply_logits_processor": apply_logits_processor,
            "pre_process": pre_process,
            "set_reasoning_parser": set_reasoning_parser,
            "post_process": post_process,
        },
    )


def _write_back(tensor, array: np.ndarray) -> None:
    """`array` into FastDeploy's tensor, in place, in the tensor's own dtype (read from its
    metadata: no device read) and place: one host-to-device copy."""
    if isinstance(tensor, np.ndarray):
        tensor[...] = array
        return
    import paddle

    paddle.assign(paddle.to_tensor(array, dtype=tensor.dtype, place=tensor.place), tensor)
