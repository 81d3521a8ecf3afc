"""A logits processor for FastDeploy's processor chain (``--logits-processors
fastdeploy_processors:ForceTokenLogitsProcessor``), loaded by FastDeploy's own ``load_class``.

It writes a logit instead of adding to it, so it can un-mask a token after fd_guided's apply:
FastDeploy's ``Sampler.forward_cuda`` runs ``apply_token_mask`` first, then each processor's
``apply``. (FastDeploy's built-in ``LogitBiasLogitsProcessor`` adds, and -inf + bias stays -inf.)
A request opts in with ``logits_processors_args={"force_token": id}``.
"""
from __future__ import annotations

from fastdeploy.model_executor.logits_processor import LogitsProcessor


class ForceTokenLogitsProcessor(LogitsProcessor):
    def __init__(self, fd_config):
        self.rows: list[tuple[int, int]] = []

    def update_state(self, share_inputs: dict) -> None:
        args, stops = share_inputs["logits_processors_args"], share_inputs["stop_flags"].numpy().reshape(-1)
        self.rows = [(row, int(a["force_token"])) for row, a in enumerate(args)
                     if row < len(stops) and not stops[row] and a and "force_token" in a]

    def apply(self, logits):
        top = float(logits.max())  # a host-side read: this is the test's processor, not fd_guided
        for row, token in self.rows:
            if row < logits.shape[0]:
                logits[row, token] = top + 10.0
        return logits
