"""The small built-in Paddle decoder-only LM that the reference engine runs ("embedded default").

No weights can be downloaded, so the weights are random but seeded: the same `TinyLMConfig` gives the
same logits in every process. The architecture is a real one (pre-norm RMSNorm blocks, multi-head
causal attention with rotary positions, SwiGLU MLP, LM head tied to the embedding), so a serving loop
built on it pays realistic costs: the LM head over a 129,280-token vocabulary dominates a decode step,
as it does for small trained models.

Continuous batching with chunked prefill: `TinyDecoderLM.forward_batch` takes one `SeqChunk` per
running sequence (a whole prompt, a piece of a prompt, or one decoded token), packs all new tokens into
one [total_tokens, hidden] batch for the dense matmuls, attends per sequence over its `SequenceCache`
plus its new tokens, appends the new keys/values to the caches in place and returns the last-token
logits of the chunks that asked for them.

Raw logits have a standard deviation of about 1 (token vectors have unit norm), so the additive
`token_prior` (see `token_prior.py`) is calibrated in those units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import paddle
import paddle.nn.functional as F

_SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")

# Decode attention strategy. Measured on 2 CPU cores, "small" preset, forward ms loop / padded batch
# (runs vary by ~20%): B=8 ctx 64: 21/21, ctx 256: 24/18; B=32 ctx 64: 31/24, ctx 256: 45/32,
# ctx 1024: 68/75 and 84/67, ctx 2048: 160/160; B=128 ctx 64: 110/83, ctx 256: 133/119. The loop costs
# ~8 Paddle ops per sequence and layer, the padded batch a copy of every cached position: even at
# 1-2k positions. Beyond 1024 positions, or a context copy above 256 MiB, loop (bounded memory).
_BATCHED_DECODE_MIN_SEQS = 2
_BATCHED_DECODE_MAX_CONTEXT = 1024
_BATCHED_DECODE_MAX_BYTES = 256 << 20
# Padding beyond this fraction of the gathered context is wasted copying: loop instead.
_BATCHED_DECODE_MAX_PAD_FRACTION = 0.5


@dataclass(frozen=True)
class TinyLMConfig:
    """Shape and seed of a `TinyDecoderLM`.

    vocab_size: logit width (129,280 = the DeepSeek-V3 tokenizer including added tokens).
    hidden_size / num_layers / num_heads / ffn_size: transformer shape; hidden_size must divide by
        num_heads and the head size must be even (rotary positions rotate pairs).
    max_seq_len: longest sequence (prompt + output) a cache may hold; longer raises ValueError.
    seed: weight seed; the same config gives bit-identical weights in every process.
    dtype: compute dtype of weights and caches; logits are always returned as float32. Paddle's CPU
        matmul only has float32 kernels, so float16/bfloat16 need an accelerator.
    prior_strength: scale the engine passes to `structural_token_prior` (0 = no prior); the model only
        stores the resulting bias, it does not compute it (that needs the tokenizer).

    `TinyLMConfig()` is the "small" preset; `TinyLMConfig.preset(name, **overrides)` gives the others.
    """

    vocab_size: int = 129_280
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    ffn_size: int = 384
    max_seq_len: int = 4096
    seed: int = 0
    dtype: str = "float32"
    prior_strength: float = 1.0
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TinyLMConfig.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"hidden_size={self.hidden_size} must split into num_heads={self.num_heads} heads "
                "of even size (rotary positions rotate pairs of dimensions)"
            )
        if self.dtype not in _SUPPORTED_DTYPES:
            raise ValueError(f"TinyLMConfig.dtype must be one of {_SUPPORTED_DTYPES}, got {self.dtype!r}")
        if self.prior_strength < 0:
            raise ValueError(f"TinyLMConfig.prior_strength must be >= 0, got {self.prior_strength}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def preset(cls, name: str, **overrides) -> TinyLMConfig:
        """A named shape: "tiny" (unit tests, a few ms per step), "small" (the default, a realistic
        small model: tens of ms per decode step at batch 32 on 2 CPU cores) or "base" (about twice
        "small"). Keyword overrides replace single fields, e.g. `preset("tiny", seed=3)`."""
        if name not in _PRESETS:
            raise ValueError(f"unknown TinyLMConfig preset {name!r}; choose one of {sorted(_PRESETS)}")
        return replace(_PRESETS[name], **overrides)


_PRESETS = {
    "tiny": TinyLMConfig(hidden_size=64, num_layers=2, num_heads=2, ffn_size=128),
    "small": TinyLMConfig(),
    "base": TinyLMConfig(hidden_size=256, num_layers=8, num_heads=4, ffn_size=768),
}


class SequenceCache:
    """Keys and values of one sequence, for every layer.

    Storage is one tensor `kv` of shape [num_layers, 2, num_heads, capacity, head_dim] (index 0 of
    axis 1 holds keys, 1 holds values), so `keys(layer)` / `values(layer)` are views and a batched
    decode step copies or appends every layer of a sequence in one operation. Capacity grows on
    demand (doubling, rounded up to 64 positions, capped at max_seq_len): preallocating max_seq_len
    for every sequence would cost 16 MiB each for the "small" preset, 64 MiB for "base". Only
    `TinyDecoderLM.forward_batch` appends; `length` counts the positions that hold real entries.
    """

    _GROWTH_GRANULE = 64

    def __init__(self, cfg: TinyLMConfig):
        self._cfg = cfg
        self.kv: paddle.Tensor | None = None
        self.length = 0

    @property
    def max_seq_len(self) -> int:
        return self._cfg.max_seq_len

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[3]

    @property
    def remaining(self) -> int:
        """How many more tokens this sequence may take before reaching max_seq_len."""
        return self._cfg.max_seq_len - self.length

    def keys(self, layer: int) -> paddle.Tensor:
        """[num_heads, length, head_dim] view of the cached keys of `layer`."""
        return self._filled()[layer, 0]

    def values(self, layer: int) -> paddle.Tensor:
        """[num_heads, length, head_dim] view of the cached values of `layer`."""
        return self._filled()[layer, 1]

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (e.g. to roll back rejected tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def reset(self) -> None:
        """Empty the cache and release its memory."""
        self.kv = None
        self.length = 0

    def _filled(self) -> paddle.Tensor:
        if self.kv is None:
            cfg = self._cfg
            return paddle.zeros([cfg.num_layers, 2, cfg.num_heads, 0, cfg.head_dim], dtype=cfg.dtype)
        return self.kv[:, :, :, : self.length]

    def _reserve(self, total_length: int) -> None:
        """Make room for `total_length` positions, keeping the filled ones."""
        if total_length <= self.capacity:
            return
        granule = self._GROWTH_GRANULE
        wanted = max(total_length, 2 * self.capacity)
        new_capacity = min(self._cfg.max_seq_len, -(-wanted // granule) * granule)
        cfg = self._cfg
        grown = paddle.zeros([cfg.num_layers, 2, cfg.num_heads, new_capacity, cfg.head_dim], dtype=cfg.dtype)
        if self.length:
            grown[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = grown


@dataclass
class SeqChunk:
    """New tokens of one sequence for one `forward_batch` call.

    need_logits=False for a non-final prefill chunk: no LM-head work is done for it.
    num_logits: how many of the chunk's last positions return a logits row (a speculative
    verification chunk [last token, d1..dK] asks for K + 1; jump-forward chunks for 1).
    """

    cache: SequenceCache
    token_ids: list[int]
    need_logits: bool = True
    num_logits: int = 1


class _RMSNorm(paddle.nn.Layer):
    def __init__(self, size: int, eps: float, dtype: str):
        super().__init__()
        self.eps = eps
        self.weight = _parameter(self, np.ones([size], dtype=np.float32), dtype)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        # Written out: Paddle 3.3 has no CPU kernel for F.rms_norm.
        return x * paddle.rsqrt(x.square().mean(axis=-1, keepdim=True) + self.eps) * self.weight


class _Block(paddle.nn.Layer):
    """One pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: TinyLMConfig, rng: np.random.Generator):
        super().__init__()
        h, f = cfg.hidden_size, cfg.ffn_size
        # Residual-branch outputs are scaled down by depth so the stream does not blow up at init.
        out_std = 1.0 / math.sqrt(2 * cfg.num_layers)
        self.attn_norm = _RMSNorm(h, cfg.rms_norm_eps, cfg.dtype)
        self.qkv = _parameter(self, _normal(rng, [h, 3 * h], 1 / math.sqrt(h)), cfg.dtype)
        self.attn_out = _parameter(self, _normal(rng, [h, h], out_std / math.sqrt(h)), cfg.dtype)
        self.mlp_norm = _RMSNorm(h, cfg.rms_norm_eps, cfg.dtype)
        self.gate_up = _parameter(self, _normal(rng, [h, 2 * f], 1 / math.sqrt(h)), cfg.dtype)
        self.down = _parameter(self, _normal(rng, [f, h], out_std / math.sqrt(f)), cfg.dtype)

    def mlp(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(F.swiglu(paddle.matmul(self.mlp_norm(x), self.gate_up)), self.down)


class TinyDecoderLM(paddle.nn.Layer):
    """Seeded random decoder-only LM with a packed, cache-appending batched forward.

    `TinyDecoderLM(cfg, token_prior=None)`; `token_prior` (a [vocab_size] array, e.g. from
    `structural_token_prior`) is added to every returned logit row; it defaults to zeros and can be
    replaced later with `set_token_prior`. Use `new_cache()` for each sequence and `forward_batch` for
    every step. Not thread-safe: one engine loop drives it.
    """

    def __init__(self, cfg: TinyLMConfig | None = None, token_prior: np.ndarray | None = None):
        super().__init__()
        self.cfg = cfg = cfg or TinyLMConfig()
        rng = np.random.default_rng(cfg.seed)
        # Tied embedding / LM head, stored [hidden + 1, vocab]. Column t holds token t's unit-norm
        # vector (with the RMS-normalised final hidden state, logits then have a standard deviation
        # of ~1, the unit the token prior is calibrated in) and, in the last row, its prior. The LM
        # head multiplies [h, 1] by it, so the prior costs no separate pass over [rows, vocab] logits
        # (Paddle's CPU broadcast add took 7 ms at batch 32). [hidden, vocab] rather than
        # [vocab, hidden]: on CPU `x @ W` is up to 2.5x faster than `x @ E^T` for small batches.
        token_vectors = _normal(rng, [cfg.hidden_size, cfg.vocab_size], 1 / math.sqrt(cfg.hidden_size))
        prior_row = np.zeros([1, cfg.vocab_size], dtype=np.float32)
        self.lm_head = _parameter(self, np.concatenate([token_vectors, prior_row]), cfg.dtype)
        self.blocks = paddle.nn.LayerList([_Block(cfg, rng) for _ in range(cfg.num_layers)])
        self.final_norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        cos, sin = _rotary_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", paddle.to_tensor(cos).astype(cfg.dtype), persistable=False)
        self.register_buffer("rope_sin", paddle.to_tensor(sin).astype(cfg.dtype), persistable=False)
        if token_prior is not None:
            self.set_token_prior(token_prior)
        self._workspace = _HostWorkspace()
        self.eval()

    def set_token_prior(self, prior: np.ndarray) -> None:
        """Replace the additive per-token logit bias (a float array of shape [vocab_size])."""
        prior = np.asarray(prior, dtype=np.float32)
        if prior.shape != (self.cfg.vocab_size,):
            raise ValueError(f"token_prior must have shape ({self.cfg.vocab_size},), got {prior.shape}")
        if not np.isfinite(prior).all():
            raise ValueError("token_prior must be finite (mask tokens with the bitmask, not the prior)")
        self.lm_head[self.cfg.hidden_size] = paddle.to_tensor(prior).astype(self.lm_head.dtype)

    @property
    def token_prior(self) -> paddle.Tensor:
        """The additive per-token logit bias, float32 [vocab_size] (zeros unless set)."""
        return self.lm_head[self.cfg.hidden_size].astype("float32")

    def new_cache(self) -> SequenceCache:
        """An empty KV cache for one new sequence."""
        return SequenceCache(self.cfg)

    @paddle.no_grad()
    def forward_batch(self, chunks: list[SeqChunk]) -> paddle.Tensor:
        """Run one continuous-batching step and append every chunk's tokens to its cache.

        All chunks' tokens are packed into one [total_tokens, hidden] batch; each token attends to its
        own sequence's cache and the earlier tokens of its chunk (causal). Returns float32 logits of
        shape [sum of num_logits over chunks with need_logits, vocab_size]: per such chunk, in chunk
        order, rows for its last `num_logits` tokens (in token order), with `token_prior` added.

        Raises ValueError (before touching any cache) for an empty chunk list or chunk, a token id
        outside the vocabulary, a cache that appears twice or belongs to another config, or a chunk
        that would grow its sequence past max_seq_len.
        """
        plan = _StepPlan(self.cfg, chunks, self._workspace)
        x = paddle.index_select(self.lm_head[: self.cfg.hidden_size], plan.token_ids, axis=1).t()
        # [T, 1, 1, d]: broadcasts over the (q, k) axis and the heads axis.
        cos = paddle.index_select(self.rope_cos, plan.positions).reshape([-1, 1, 1, self.cfg.head_dim])
        sin = paddle.index_select(self.rope_sin, plan.positions).reshape([-1, 1, 1, self.cfg.head_dim])
        for layer, block in enumerate(self.blocks):
            attn = self._attention(block, layer, block.attn_norm(x), cos, sin, plan)
            x = x + paddle.matmul(attn, block.attn_out)
            x = x + block.mlp(x)
        plan.commit()
        return self._logits(x, plan.logit_rows)

    def _attention(self, block, layer, h, cos, sin, plan: _StepPlan) -> paddle.Tensor:
        cfg = self.cfg
        qkv = paddle.matmul(h, block.qkv).reshape([-1, 3, cfg.num_heads, cfg.head_dim])
        qk = _apply_rotary(qkv[:, :2], cos, sin)
        # Fold the 1/sqrt(d) score scale into q once instead of scaling every score matrix.
        q = qk[:, 0] * (1.0 / math.sqrt(cfg.head_dim))
        k, v = qk[:, 1], qkv[:, 2]
        parts = []
        if plan.num_batched:
            parts.append(
                _attend_decode_batched(q[: plan.num_batched], k[: plan.num_batched], v[: plan.num_batched], layer, plan)
            )
        if plan.num_batched < plan.total_tokens:
            start = plan.num_batched
            parts.append(_attend_per_sequence(q[start:], k[start:], v[start:], layer, plan))
        out = parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)
        return out.reshape([-1, cfg.hidden_size])

    def _logits(self, x: paddle.Tensor, rows: list[int]) -> paddle.Tensor:
        if not rows:
            return paddle.zeros([0, self.cfg.vocab_size], dtype="float32")
        last = paddle.index_select(x, paddle.to_tensor(np.asarray(rows, dtype=np.int64)))
        last = self.final_norm(last)
        with_bias_input = paddle.concat([last, paddle.ones([last.shape[0], 1], dtype=last.dtype)], axis=1)
        logits = paddle.matmul(with_bias_input, self.lm_head)
        return logits if logits.dtype == paddle.float32 else logits.astype("float32")


class _StepPlan:
    """Where each chunk's tokens sit in the packed batch, validated up front.

    Chunks are packed in a processing order that puts the 1-token (decode) chunks first, so the batched
    decode attention works on a contiguous prefix; `logit_rows` maps back to the caller's chunk order.
    """

    def __init__(self, cfg: TinyLMConfig, chunks: list[SeqChunk], workspace: _HostWorkspace):
        _validate_chunks(cfg, chunks)
        decode = [c for c in chunks if len(c.token_ids) == 1]
        prefill = [c for c in chunks if len(c.token_ids) != 1]
        batched_decode = _use_batched_decode(cfg, decode)
        self.batched = decode if batched_decode else []
        self.looped = prefill if batched_decode else decode + prefill
        self.ordered = self.batched + self.looped
        self.num_batched = len(self.batched)

        lengths = np.fromiter((len(c.token_ids) for c in self.ordered), dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.total_tokens = int(self.offsets[-1])
        self.starts = [c.cache.length for c in self.ordered]
        ids = np.fromiter((t for c in self.ordered for t in c.token_ids), dtype=np.int64)
        self.token_ids = paddle.to_tensor(ids)
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(self.starts, lengths)])
        self.positions = paddle.to_tensor(positions.astype(np.int64))

        last_row = {id(c): int(self.offsets[i + 1]) - 1 for i, c in enumerate(self.ordered)}
        self.logit_rows = [
            row
            for c in chunks
            if c.need_logits
            for row in range(last_row[id(c)] - c.num_logits + 1, last_row[id(c)] + 1)
        ]
        for c in self.ordered:
            c.cache._reserve(c.cache.length + len(c.token_ids))
        self._workspace = workspace
        self._dtype = cfg.dtype
        self._decode_context: tuple | None = None
        self._causal_masks: dict[int, paddle.Tensor] = {}
        self._new_kv: list[paddle.Tensor] = []

    def decode_context(self) -> tuple[paddle.Tensor | None, paddle.Tensor | None]:
        """The batched decode sequences' cached K/V, all layers, padded to the longest:
        ([layers, 2, B, heads, Lmax, d] or None when every cache is empty, additive mask [B,1,1,Lmax]).
        Built on first use and shared by all layers of the step."""
        if self._decode_context is None:
            self._decode_context = _gather_padded(self.batched, self._workspace, self._dtype)
        return self._decode_context

    def causal_mask(self, index: int) -> paddle.Tensor | None:
        """Additive [n, start + n] mask for the looped chunk `index` (None for one token)."""
        n = len(self.looped[index].token_ids)
        if n == 1:
            return None
        if index not in self._causal_masks:
            start = self.starts[self.num_batched + index]
            allowed = np.arange(start + n)[None, :] <= (start + np.arange(n))[:, None]
            mask = paddle.to_tensor(np.where(allowed, 0.0, -np.inf).astype(np.float32))
            self._causal_masks[index] = mask.astype(self._dtype)
        return self._causal_masks[index]

    def stash_decode_kv(self, k: paddle.Tensor, v: paddle.Tensor) -> None:
        """Keep one layer's new decode K/V ([B, heads, d] each) to write into the caches at the end."""
        self._new_kv.append(paddle.stack([k, v], axis=1))

    def commit(self) -> None:
        """Write the batched decode tokens' K/V into their caches and advance every cache length."""
        if self._new_kv:
            _write_decode_kv(self.batched, paddle.stack(self._new_kv, axis=1))
        for chunk in self.ordered:
            chunk.cache.length += len(chunk.token_ids)


def _validate_chunks(cfg: TinyLMConfig, chunks: list[SeqChunk]) -> None:
    if not chunks:
        raise ValueError("forward_batch needs at least one SeqChunk")
    seen: set[int] = set()
    for i, chunk in enumerate(chunks):
        if id(chunk.cache) in seen:
            raise ValueError(f"chunk {i}: the same SequenceCache appears twice in one batch")
        seen.add(id(chunk.cache))
        if chunk.cache._cfg != cfg:
            raise ValueError(f"chunk {i}: the SequenceCache was made by a model with another config")
        n = len(chunk.token_ids)
        if n == 0:
            raise ValueError(f"chunk {i}: token_ids is empty")
        if not 1 <= chunk.num_logits <= n:
            raise ValueError(f"chunk {i}: num_logits={chunk.num_logits} must be in [1, {n}] (its token count)")
        if chunk.cache.length + n > cfg.max_seq_len:
            raise ValueError(
                f"chunk {i}: {n} new tokens would grow the sequence from {chunk.cache.length} to "
                f"{chunk.cache.length + n} tokens, beyond max_seq_len={cfg.max_seq_len}"
            )
        low, high = min(chunk.token_ids), max(chunk.token_ids)
        if low < 0 or high >= cfg.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"chunk {i}: token id {bad} is outside the vocabulary [0, {cfg.vocab_size})")


def _use_batched_decode(cfg: TinyLMConfig, decode: list[SeqChunk]) -> bool:
    """Padded batching beats the per-sequence loop once there are a few sequences, unless contexts are
    long or their lengths differ so much that much of the gathered context would be padding."""
    if len(decode) < _BATCHED_DECODE_MIN_SEQS:
        return False
    lengths = [c.cache.length for c in decode]
    longest = max(lengths)
    if longest == 0:
        return True
    context_bytes = len(decode) * longest * cfg.num_layers * 2 * cfg.hidden_size * 4
    if longest > _BATCHED_DECODE_MAX_CONTEXT or context_bytes > _BATCHED_DECODE_MAX_BYTES:
        return False
    pad_fraction = 1.0 - sum(lengths) / (longest * len(lengths))
    return pad_fraction <= _BATCHED_DECODE_MAX_PAD_FRACTION


class _HostWorkspace:
    """A zero-initialised float32 buffer reused across steps for the gathered decode context.

    Reuse matters on CPU: a fresh multi-MiB tensor every step costs more in page faults than the copy.
    Only finite K/V values are ever written, so stale entries past a sequence's length are finite and
    their -inf-masked scores give exactly zero weight.
    """

    def __init__(self) -> None:
        self._flat = np.zeros(0, dtype=np.float32)

    def array(self, shape: list[int]) -> np.ndarray:
        size = math.prod(shape)
        if size > self._flat.size:
            self._flat = np.zeros(size + size // 4, dtype=np.float32)
        return self._flat[:size].reshape(shape)


def _gather_padded(chunks: list[SeqChunk], workspace: _HostWorkspace, dtype: str):
    """See `_StepPlan.decode_context`.

    On CPU the copy goes through numpy views of the caches (DLPack, zero-copy) into the reused
    workspace: Paddle's CPU stack over strided slices ran at ~1 GB/s, 5-15x slower (15 ms vs 1 ms for
    32 sequences x 64 positions of the "small" preset).
    """
    lengths = np.asarray([c.cache.length for c in chunks])
    longest = int(lengths.max())
    if longest == 0:
        return None, None
    mask = np.where(np.arange(longest)[None, :] < lengths[:, None], 0.0, -np.inf).astype(np.float32)
    mask = paddle.to_tensor(mask.reshape(len(chunks), 1, 1, longest)).astype(dtype)
    views = [_host_array(c.cache.kv) for c in chunks]
    if all(v is not None for v in views):
        layers, _, heads, _, head_dim = views[0].shape
        context = workspace.array([layers, 2, len(chunks), heads, longest, head_dim])
        for i, (view, length) in enumerate(zip(views, lengths)):
            context[:, :, i, :, :length] = view[:, :, :, :length]
        return paddle.from_dlpack(context), mask
    pieces = []
    for c in chunks:  # accelerator path: device copies are cheap
        kv = c.cache.kv
        if kv.shape[3] < longest:  # each cache was reserved for its own length + 1 only
            pad_shape = list(kv.shape)
            pad_shape[3] = longest - kv.shape[3]
            kv = paddle.concat([kv, paddle.zeros(pad_shape, dtype=kv.dtype)], axis=3)
        pieces.append(kv[:, :, :, :longest])
    return paddle.stack(pieces, axis=2), mask


def _write_decode_kv(chunks: list[SeqChunk], new_kv: paddle.Tensor) -> None:
    """Append one position ([B, layers, 2, heads, d]) to each decode chunk's cache: one write per
    sequence for all layers, through numpy on CPU (a Paddle setitem costs ~20 us each)."""
    host = _host_array(new_kv)
    for i, chunk in enumerate(chunks):
        pos, kv = chunk.cache.length, chunk.cache.kv
        view = _host_array(kv) if host is not None else None
        if view is not None:
            view[:, :, :, pos] = host[i]
        else:
            kv[:, :, :, pos : pos + 1] = new_kv[i].unsqueeze(3)


def _attend_decode_batched(q, k, v, layer: int, plan: _StepPlan) -> paddle.Tensor:
    """Attention for B one-token chunks at once ([B, heads, d] each) over their padded caches.

    The new token's own key is scored separately and joined to the cached scores before the softmax,
    so the caches are written once per step (in `_StepPlan.commit`) instead of once per layer.
    """
    plan.stash_decode_kv(k, v)
    self_score = (q * k).sum(axis=-1, keepdim=True).unsqueeze(2)  # [B, heads, 1, 1]
    context, mask = plan.decode_context()
    if context is None:
        return v  # every cache is empty: each token attends only to itself
    cached_k, cached_v = context[layer, 0], context[layer, 1]  # [B, heads, Lmax, d], contiguous
    scores = paddle.matmul(q.unsqueeze(2), cached_k, transpose_y=True) + mask
    probs = F.softmax(paddle.concat([scores, self_score], axis=-1), axis=-1)
    longest = cached_k.shape[2]
    out = paddle.matmul(probs[..., :longest], cached_v) + probs[..., longest:] * v.unsqueeze(2)
    return out.squeeze(2)


def _attend_per_sequence(q, k, v, layer: int, plan: _StepPlan) -> paddle.Tensor:
    """Attention for the looped chunks (packed [tokens, heads, d]): write each chunk's K/V into its
    cache, then attend over cache[:start + n] with a causal mask."""
    base = int(plan.offsets[plan.num_batched])
    qt = q.transpose([1, 0, 2])  # [heads, T, d]
    kvt = paddle.stack([k, v]).transpose([0, 2, 1, 3])  # [2, heads, T, d]
    outs = []
    for i, chunk in enumerate(plan.looped):
        lo = int(plan.offsets[plan.num_batched + i]) - base
        n = len(chunk.token_ids)
        start = plan.starts[plan.num_batched + i]
        cache_kv = chunk.cache.kv
        cache_kv[layer, :, :, start : start + n] = kvt[:, :, lo : lo + n]
        scores = paddle.matmul(qt[:, lo : lo + n], cache_kv[layer, 0, :, : start + n], transpose_y=True)
        mask = plan.causal_mask(i)
        if mask is not None:
            scores = scores + mask
        outs.append(paddle.matmul(F.softmax(scores, axis=-1), cache_kv[layer, 1, :, : start + n]))
    out = outs[0] if len(outs) == 1 else paddle.concat(outs, axis=1)
    return out.transpose([1, 0, 2])


def _host_array(tensor: paddle.Tensor) -> np.ndarray | None:
    """A zero-copy, WRITABLE numpy view of a contiguous float32 CPU tensor, else None.

    numpy < 2.1 marks every `np.from_dlpack` result read-only (its DLPack import had no way to
    ask for write access), so the KV-cache writes through it failed with "assignment destination
    is read-only". The memory is the tensor's own and writable: rebuild the view over the same
    address, keeping the tensor alive for as long as the view.
    """
    if tensor.dtype != paddle.float32 or not tensor.place.is_cpu_place() or not tensor.is_contiguous():
        return None
    view = np.from_dlpack(tensor)
    if view.flags.writeable:
        return view
    return np.asarray(_WritableBuffer(tensor, view))


class _WritableBuffer:
    """The array interface of a read-only DLPack view, declared writable; holds the tensor."""

    def __init__(self, tensor: paddle.Tensor, view: np.ndarray):
        self.tensor = tensor  # the view's memory lives as long as this object
        interface = dict(view.__array_interface__)
        interface["data"] = (interface["data"][0], False)  # (address, read_only=False)
        self.__array_interface__ = interface


def _apply_rotary(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """Rotate-half rotary embedding on the last axis (cos/sin hold each frequency twice)."""
    half = x.shape[-1] // 2
    rotated = paddle.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _rotary_tables(max_len: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(max_len, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _normal(rng: np.random.Generator, shape: list[int], std: float) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _parameter(layer: paddle.nn.Layer, value: np.ndarray, dtype: str) -> paddle.Tensor:
    param = layer.create_parameter(
        shape=list(value.shape), dtype=dtype, default_initializer=paddle.nn.initializer.Constant(0.0)
    )
    param.set_value(paddle.to_tensor(value).astype(dtype))
    param.stop_gradient = True
    return param
