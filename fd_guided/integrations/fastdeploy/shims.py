"""What the sampler hooks need from the manager that its API does not offer yet. TODO(lead-api).

Each function is written against the manager's current public surface (``bitmask``, ``config``,
``is_ready`` when present) and goes away when the manager provides it:

- `mask_allows`: whether this step's mask row allowed a token, i.e. whether FastDeploy forced it.
  Wanted: ``manager.accept(tokens, forced="skip")``, where a token outside its row's applied mask
  is the host's, is not fed and not counted as a rejection, and a forced stop token ends the slot.
- `stop_only_bitmask`: rows that allow only stop tokens, for finished slots. Wanted: the manager
  masks finished (complete or failed) slots to stop tokens itself.
- `wait_for_first_samples`: FastDeploy samples every row each step and cannot hold a request back,
  so a slot's compile must be done before its first sample. Wanted: ``manager.is_ready(slot)`` and
  an ``apply`` that masks a row whose compile completed after ``begin_step``.
"""
from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np


def host_view(bitmask) -> np.ndarray:
    """The bitmask as a host int32 array (zero-copy for numpy and CPU torch tensors)."""
    return bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)


def mask_allows(view: np.ndarray, row: int, token: int) -> bool:
    """Whether this step's bitmask row `row` (filled this step for a constrained slot) allows `token`."""
    word, bit = divmod(int(token), 32)
    return word < view.shape[1] and bool((int(view[row, word]) >> bit) & 1)


def stop_only_bitmask(backend, rows: int):
    """A bitmask whose every row allows only `backend`'s stop tokens."""
    bitmask = backend.allocate_token_bitmask(rows)
    view = host_view(bitmask)
    view[:] = 0
    for token in backend.stop_token_ids:
        word, bit = divmod(int(token), 32)
        view[:, word] |= np.array(1 << bit, dtype=np.uint32).view(np.int32)
    return bitmask


def wait_for_first_samples(manager, active: dict, rows: int) -> None:
    """Wait (up to the compile timeout) for the compiles of active slots in the first `rows` rows."""
    is_ready = getattr(manager, "is_ready", None)
    for slot, future in active.items():
        ready = is_ready(slot) if is_ready is not None else future.compile_future.done()
        if slot < rows and not ready:
            try:
                future.compile_future.exception(timeout=manager.config.compile_timeout_s)
            except FutureTimeout:
                pass  # the manager fails the slot on its own deadline
