"""Host-side next-token sampling for the reference engine: temperature, top-k, top-p, greedy.

The heavy part is the top-k over the whole [rows, vocab] batch at once; the rest works on at most
`top_k` candidates per row in numpy. On an accelerator that top-k is one `paddle.topk` call. On CPU,
Paddle's topk (and even its max reduction) is single-threaded and slow: 32 ms for 32 x 129,280 logits
on 2 cores, as long as the whole forward. There the logits are viewed zero-copy through DLPack and a
blocked numpy top-k does the same work in 1.6 ms (see `_host_top_k`).

Each row draws from its own request's `numpy.random.Generator`, exactly once per sampled token, so a
request's output depends only on its seed and its logits, never on which other requests share the
batch.

Masked tokens carry -inf logits (the guided-decoding bitmask writes them) and are never sampled, even
when fewer than `top_k` tokens are finite; a row with no finite logit is an error, not a silent pick.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle


@dataclass(frozen=True)
class SamplingParams:
    """temperature: 0 = greedy argmax; > 0 divides the logits before the softmax.
    top_k: keep the k highest logits (<= 0 = the whole vocabulary, a full sort: slow).
    top_p: then keep the smallest prefix of those whose probability mass reaches top_p (1 = all)."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_next_tokens(
    logits: paddle.Tensor, params: list[SamplingParams], rngs: list[np.random.Generator]
) -> list[int]:
    """One token id per row of `logits` ([rows, vocab], any float dtype, -inf = masked).

    Row i uses params[i] and draws one number from rngs[i] (greedy rows draw nothing). Raises
    ValueError if the three lengths differ, or naming the first row whose logits are all -inf or
    hold NaN / +inf.
    """
    rows, vocab = logits.shape
    if not len(params) == len(rngs) == rows:
        raise ValueError(f"got {rows} logit rows, {len(params)} SamplingParams and {len(rngs)} generators")
    if rows == 0:
        return []
    k = max(_candidate_count(p, vocab) for p in params)
    values, indices = _top_candidates(logits, k)
    _check_rows(values)
    return [
        _pick(values[row, : _candidate_count(p, vocab)], indices[row], p, rng)
        for row, (p, rng) in enumerate(zip(params, rngs))
    ]


def _check_rows(values: np.ndarray) -> None:
    """Reject rows whose candidates are all -inf, or that hold NaN or +inf (NaN and +inf rank as
    largest in both top-k paths, so a row holding one has it among its candidates)."""
    all_masked = np.isneginf(values).all(axis=1)
    broken = (np.isnan(values) | np.isposinf(values)).any(axis=1)
    for row in np.flatnonzero(all_masked | broken):
        what = "holds NaN or +inf" if broken[row] else "has no finite entry (every token is masked)"
        raise ValueError(f"logits row {int(row)} {what}")


def _top_candidates(logits: paddle.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[rows, k] float32 values in descending order and their token ids, as numpy arrays."""
    if logits.dtype != paddle.float32:
        logits = logits.astype("float32")  # numpy has no bfloat16; half precision gains nothing here
    if logits.place.is_cpu_place():
        return _host_top_k(np.from_dlpack(logits), k)
    return _device_top_k(logits, k)


def _device_top_k(logits: paddle.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    values, indices = paddle.topk(logits, k=k, axis=-1)
    return values.numpy(), indices.numpy()


# Strided blocks for the host top-k: enough of them that k blocks are a small part of the row.
_HOST_BLOCK_ROWS = 32


def _host_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of a [rows, vocab] float32 array (a zero-copy view of the logits; never written).

    View each row as S x G (S = 32, G = vocab // S) and take the max of each of the G columns: a
    vectorised pass at memory speed. Every top-k entry lies in one of the k columns with the largest
    maxima (a column outside them has k larger entries above its max), so only those S * k
    candidates, plus the vocab % S tail entries, are partitioned. -inf and NaN pass through: NaN
    counts as largest, so the caller sees it.
    """
    rows, vocab = logits.shape
    logits = np.ascontiguousarray(logits)
    width = vocab // _HOST_BLOCK_ROWS
    if width < 4 * k:  # small vocab or huge k: blocking would not save anything
        candidates = np.broadcast_to(np.arange(vocab), (rows, vocab))
    else:
        body = np.lib.stride_tricks.as_strided(
            logits,
            shape=(rows, _HOST_BLOCK_ROWS, width),
            strides=(logits.strides[0], width * logits.strides[1], logits.strides[1]),
            writeable=False,
        )
        best_columns = _top_unsorted(body.max(axis=1), k)  # [rows, k]
        offsets = np.arange(_HOST_BLOCK_ROWS)[None, :, None] * width
        candidates = (offsets + best_columns[:, None, :]).reshape(rows, -1)
        tail = np.arange(_HOST_BLOCK_ROWS * width, vocab)
        if tail.size:
            candidates = np.concatenate([candidates, np.broadcast_to(tail, (rows, tail.size))], axis=1)
    values = np.take(logits.reshape(-1), candidates + np.arange(rows)[:, None] * vocab)
    keep = _top_unsorted(values, k)
    values = np.take_along_axis(values, keep, axis=1)
    indices = np.take_along_axis(candidates, keep, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")  # NaN sorts last here; the caller checks for it
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(indices, order, axis=1)


def _top_unsorted(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries of each row, in no particular order."""
    if k >= values.shape[1]:
        return np.broadcast_to(np.arange(values.shape[1]), values.shape)
    return np.argpartition(_unique_order_keys(values), -k, axis=1)[:, -k:]


def _unique_order_keys(values: np.ndarray) -> np.ndarray:
    """int64 keys ordered like the float32 `values`, ties broken by column.

    Why: argpartition slows down ~10x on rows full of equal values, which is what a masked row is
    (mostly -inf); unique keys keep it linear. Float bits become sortable integers by flipping the
    magnitude bits of negative numbers. A NaN with its sign bit clear (the kind arithmetic makes)
    stays largest, as before, so `_check_rows` still sees it.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.int32)
    sortable = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))
    keys = sortable.astype(np.int64)
    keys <<= 32
    keys |= np.arange(values.shape[1], dtype=np.int64)
    return keys


def _candidate_count(params: SamplingParams, vocab: int) -> int:
    if params.greedy:
        return 1
    return vocab if params.top_k <= 0 else min(params.top_k, vocab)


def _pick(values: np.ndarray, indices: np.ndarray, params: SamplingParams, rng) -> int:
    """Choose among one row's candidates: sorted by descending logit, the first one finite."""
    if params.greedy:
        return int(indices[0])
    ids, probs = candidate_distribution(values, indices, params)
    return draw(ids, probs, rng)


def candidate_distribution(
    values: np.ndarray, indices: np.ndarray, params: SamplingParams
) -> tuple[np.ndarray, np.ndarray]:
    """The distribution `params` samples one row from: (token ids, probabilities summing to 1),
    over the row's candidates (`values` sorted descending, as `top_candidates` returns them).
    Greedy rows are a point mass on the best token. Speculative verification compares these."""
    if params.greedy:
        return indices[:1], np.ones(1)
    finite = values[np.isfinite(values)]  # sorted, so the finite ones form a prefix
    scaled = (finite.astype(np.float64) - finite[0]) / params.temperature
    probs = np.exp(scaled)
    probs /= probs.sum()
    if params.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (always at least the best token).
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        probs = probs[:keep] / probs[:keep].sum()
    return indices[: len(probs)], probs


def draw(ids: np.ndarray, probs: np.ndarray, rng) -> int:
    """One token from (ids, probs), using exactly one number of `rng`."""
    cumulative = np.cumsum(probs)
    choice = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[min(choice, len(cumulative) - 1)])


def top_candidates(logits: paddle.Tensor, params: list[SamplingParams]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: enough candidates for the widest of `params` ([rows, k] values, descending, and
    their ids), checked like `sample_next_tokens` checks them (ValueError naming a bad row)."""
    rows, vocab = logits.shape
    k = max(_candidate_count(p, vocab) for p in params)
    values, indices = _top_candidates(logits, k)
    _check_rows(values)
    return values, indices


def candidate_count(params: SamplingParams, vocab: int) -> int:
    """How many of a row's top candidates `params` samples among."""
    return _candidate_count(params, vocab)


def ban_tokens(logits: paddle.Tensor, rows, token_ids) -> None:
    """Set `token_ids` to -inf in `rows` of `logits`, in place (e.g. stop tokens before min_tokens)."""
    ids = [int(t) for t in token_ids if 0 <= int(t) < logits.shape[1]]
    for row in rows:
        for token in ids:
            logits[int(row), token] = float("-inf")
