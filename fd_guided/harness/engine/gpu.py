"""GPU runner: Paddle logits cross to torch by DLPack, zero-copy, for xgrammar's CUDA kernel."""

from fd_guided.harness.engine.runner import ModelRunner


class GPUModelRunner(ModelRunner):
    device = "gpu"
    kernel_impl = "cuda"
