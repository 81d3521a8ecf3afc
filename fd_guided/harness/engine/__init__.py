"""Per-device runners (one shared guided mixin) and the reference engine with its built-in Paddle LM.

Exports resolve lazily so importing a light submodule (e.g. `token_prior`) does not load Paddle.
"""

import importlib

_EXPORTS = {
    "CPUModelRunner": ".cpu",
    "GPUModelRunner": ".gpu",
    "XPUModelRunner": ".xpu",
    "GuidedRunnerMixin": ".runner",  # re-exported from fd_guided.runner
    "ModelRunner": ".runner",
    "GenerationResult": ".sequence",
    "ReferenceEngine": ".engine",
    "RunStats": ".sequence",
    "SeqChunk": ".model",
    "SpeculativeConfig": ".speculative",
    "StepUpdate": ".sequence",
    "TinyDecoderLM": ".model",
    "TinyLMConfig": ".model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
