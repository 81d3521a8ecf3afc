"""Masked drafting inside FastDeploy's MTP proposer (``MTPProposer`` -> ``MTPSampler``).

FastDeploy's runner, per step: the target's verification (`speculative.py`), ``post_process``,
``sampler.post_process`` (each request's accepted tokens are pushed onto its matcher), then
``proposer.run``: for ``substep`` in ``range(num_model_steps)`` the MTP head computes logits and
``MTPSampler.forward_cuda`` takes each request's next draft as the argmax of its row. Unmasked,
those drafts ignore the grammar and the target's masked rows reject them. Here each draft row is
masked with the request's grammar *as advanced by its drafts so far*, through the manager's
`DraftingSession` on the same matchers, rolled back to the accepted state after the last substep::

    MTPSampler.forward_cuda(logits, ..., share_inputs)    # share_inputs: the proposer's inputs
      -> DraftMasking.mask(logits, share_inputs)           # before FastDeploy's penalties and argmax
      -> FastDeploy's forward_cuda                         # returns (next_tokens, sampler_output)
      -> DraftMasking.advance(next_tokens)                 # the drafts taken, pushed; closed after
                                                           # the last substep (rolled back)

Row layout (FastDeploy's speculative output layout, as ``speculate_verify`` reads it, and as
``draft_model_update`` takes a request's draft from the last of its rows): a request with
``seq_lens_this_time`` n > 0 has one row if it is prefilling (``seq_lens_encoder`` > 0), else n
rows; requests come in slot order. Only the last row of each request is the draft; it is masked.
Written from FastDeploy's Python call sites, not run on a GPU: a batch whose row count matches
neither this layout nor one row per request is left unmasked (logged once), which costs only
acceptance, never validity: the target's verification rows are masked all the same.

The draft of a request that is not guided, not yet compiled, finished or failed is left alone.
A session left open (FastDeploy's loop stopped early) is closed before the next verification
and before a slot is reset. Host reads (each a sync on a GPU): none while the manager holds no
slot, or after substep 0 when no session opened; otherwise one batched transfer before the mask
(``seq_lens_this_time`` and ``seq_lens_encoder`` together) and one after FastDeploy's argmax (the
drafts taken).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import read
from .patching import install_methods
from .sampler import guides_any, host_array, host_arrays

if TYPE_CHECKING:
    from ...manager import DraftingSession

logger = logging.getLogger(__name__)

# fd_config -> the target sampler's guided decoding. FastDeploy builds ``SpeculativeSampler``
# and ``MTPSampler`` from the same config object in one worker; nothing else links them.
_by_config: dict[int, tuple[weakref.ref, Any]] = {}


def link(fd_config: Any, guided) -> None:
    """Record the target sampler's `SpeculativeGuidedDecoding` for MTP samplers built from `fd_config`."""
    for key, (config_ref, _) in list(_by_config.items()):
        if config_ref() is None:
            del _by_config[key]
    try:
        _by_config[id(fd_config)] = (weakref.ref(fd_config), weakref.ref(guided))
    except TypeError:  # a config that takes no weak reference: no masked drafting, nothing breaks
        pass


def linked(fd_config: Any):
    entry = _by_config.get(id(fd_config))
    if entry is None or entry[0]() is not fd_config:
        return None
    return entry[1]()


class DraftMasking:
    """The MTP substeps of one worker over the target sampler's manager (module docstring)."""

    def __init__(self, guided, num_model_steps: int):
        self.guided = guided
        self.num_model_steps = max(1, int(num_model_steps))
        self.session: DraftingSession | None = None
        self._rows: list[int] = []  # per session row: its logits row this substep (-1: none)
        self._substep = 0
        self._warned = False

    def mask(self, logits, share_inputs) -> None:
        """Mask each guided request's draft row of this substep's `logits`, in place."""
        manager = self.guided.manager
        self._rows = []
        if manager is None:
            return
        substep = self._substep = int(_get(share_inputs, "substep", 0))
        if substep == 0:
            self.close()
        if self.session is None and (substep != 0 or not guides_any(manager)):
            return  # nothing to mask: no device read (no sync)
        lens, encoder = host_arrays(_get(share_inputs, "seq_lens_this_time"), _get(share_inputs, "seq_lens_encoder"))
        layout = draft_rows(lens, encoder, int(logits.shape[0]))
        if layout is None:
            self._unmasked("the logits rows match no known layout")
            return
        if self.session is None:
            if substep != 0 or not any(manager.is_guided(slot) for slot in layout):
                return
            self.session = manager.begin_drafting(list(layout))
        self._rows = [-1 if slot is None else layout.get(slot, -1) for slot in self.session.slots]
        for index, row in enumerate(self._rows):
            if row < 0:
                self.session.retire(index)  # gone from the batch (stopped): no later drafts
        _apply_rows(self.session, logits, self._rows)

    def advance(self, next_tokens) -> None:
        """Push the drafts FastDeploy took; close the session after the last substep."""
        if self.session is None or not self._rows:
            return
        tokens = host_array(next_tokens).reshape(-1)
        self.session.advance([int(tokens[row]) if row >= 0 else -1 for row in self._rows])
        if self._substep >= self.num_model_steps - 1:
            self.close()

    def guarded(self, step, *args) -> None:
        """Run `step`; a failure leaves this substep's drafts unmasked (logged once) rather than
        failing FastDeploy's draft step: drafts are proposals, verified under the mask anyway."""
        try:
            step(*args)
        except Exception as error:  # noqa: BLE001 - never take the worker down for a draft
            self._unmasked(f"{type(error).__name__}: {error}")

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        self._rows = []

    def _unmasked(self, why: str) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the session is dropped either way
            self.session, self._rows = None, []
        if not self._warned:
            self._warned = True
            logger.warning(
                "fd_guided: MTP drafts are not masked (%s); the verification step still masks every row", why
            )


def draft_rows(lens: np.ndarray, encoder: np.ndarray, num_rows: int) -> dict[int, int] | None:
    """Slot -> the logits row its draft is taken from, in FastDeploy's layout (module docstring),
    or None when `num_rows` matches neither the speculative layout nor one row per request."""
    lens, encoder = lens.reshape(-1), encoder.reshape(-1)
    slots = [i for i, n in enumerate(lens.tolist()) if n > 0]
    counts = [1 if encoder[i] > 0 else int(lens[i]) for i in slots]
    if sum(counts) == num_rows:
        ends = np.cumsum(counts) - 1
        return {slot: int(end) for slot, end in zip(slots, ends)}
    if len(slots) == num_rows:
        return {slot: row for row, slot in enumerate(slots)}
    return None


def _apply_rows(session, logits, rows: Sequence[int]) -> None:
    """`session.apply` on the rows `rows` names: in place when they are the logits' rows in order,
    else gathered, masked and written back (only substeps where a request has several rows)."""
    if list(rows) == list(range(int(logits.shape[0]))):
        session.apply(logits)
        return
    import paddle

    index = paddle.to_tensor([max(row, 0) for row in rows], dtype="int64", place=logits.place)
    compact = paddle.gather(logits, index, axis=0)
    session.apply(compact)
    kept = [i for i, row in enumerate(rows) if row >= 0]
    if kept:
        back = paddle.to_tensor([rows[i] for i in kept], dtype="int64", place=logits.place)
        picked = paddle.gather(compact, paddle.to_tensor(kept, dtype="int64", place=logits.place), axis=0)
        paddle.scatter_(logits, back, picked, overwrite=True)  # in place: the rows FastDeploy samples from


def install(sampler_cls, mark: str) -> None:
    """Wrap FastDeploy's ``MTPSampler.forward_cuda`` with `DraftMasking` (idempotent through `mark`).
    ``MTPSampler.__init__`` binds ``self.forward`` to ``forward_cuda`` at construction, so this
    must run before the proposer is built (`hooks` patches the sampler module on import)."""
    if getattr(sampler_cls, mark, False):
        return
    original_init, original_forward = sampler_cls.__init__, sampler_cls.forward_cuda

    @functools.wraps(original_init)
    def __init__(self, fd_config, *args, **kwargs):
        original_init(self, fd_config, *args, **kwargs)
        self._fd_guided_config = fd_config
        self._fd_guided_drafts = None

    @functools.wraps(original_forward)
    def forward_cuda(self, logits, sampling_metadata, max_model_len, share_inputs, *args, **kwargs):
        masking = _masking_of(self)
        if masking is not None:
            masking.guarded(masking.mask, logits, share_inputs)
        result = original_forward(self, logits, sampling_metadata, max_model_len, share_inputs, *args, **kwargs)
        if masking is not None:
            masking.guarded(masking.advance, result[0] if isinstance(result, tuple) else result)
        return result

    install_methods(sampler_cls, mark, {"__init__": __init__, "forward_cuda": forward_cuda})


def _masking_of(sampler) -> DraftMasking | None:
    masking = getattr(sampler, "_fd_guided_drafts", None)
    if masking is None:
        guided = linked(getattr(sampler, "_fd_guided_config", None))
        if guided is None or guided.manager is None:
            return None  # no guided request was inserted yet, or guided decoding is off
        steps = read(getattr(guided.fd_config, "speculative_config", None), "num_model_steps") or 1
        masking = sampler._fd_guided_drafts = DraftMasking(guided, int(steps))
        guided.draft_masking = masking
    return masking


def _get(inputs, key: str, default=None):
    try:
        return inputs[key]
    except (KeyError, TypeError, IndexError):
        return default
