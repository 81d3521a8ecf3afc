"""XPU-like runner (XPU, NPU, DCU, custom devices): masks with Paddle ops on the logits' device.

`device` defaults to ``xpu``; pass another Paddle device string (``npu:0``, or ``cpu`` to exercise
the Paddle-native kernel on a machine without such a device).
"""

from fd_guided.harness.engine.runner import ModelRunner


class XPUModelRunner(ModelRunner):
    device = "xpu"
    kernel_impl = "paddle"

    def __init__(self, model, device: str | None = None):
        if device is not None:
            self.device = device
        super().__init__(model)
