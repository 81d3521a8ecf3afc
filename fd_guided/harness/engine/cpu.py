"""CPU runner: logits stay on the host; the C mask kernel writes -inf in place."""

from fd_guided.harness.engine.runner import ModelRunner


class CPUModelRunner(ModelRunner):
    device = "cpu"
    kernel_impl = "cpu"
