"""The reference engine's device runner: `TinyDecoderLM` (or another reference model) on one Paddle device,
with the library's `GuidedRunnerMixin` calling the manager around its forward."""

from __future__ import annotations

from fd_guided.runner import GuidedRunnerMixin

__all__ = ["GuidedRunnerMixin", "ModelRunner"]


class ModelRunner(GuidedRunnerMixin):
    """A runner of the reference `TinyDecoderLM` on one Paddle device."""

    def __init__(self, model):
        import paddle

        self.model = model
        self.place = paddle.set_device(self.device)
        self.model.to(device=self.place)

    def device_forward(self, chunks):
        return self.model.forward_batch(list(chunks))
