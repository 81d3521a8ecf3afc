"""Speculative verification for the reference engine: exactly as good as decoding without drafts.

For one request with drafts d1..dK the target forward gives K + 1 rows (already masked by the
guided manager): row j is the distribution p_j of the token after d1..dj. The verifier walks the
chain and returns the tokens the request emits: the accepted drafts and one more token.

  - greedy (temperature 0): accept d_{j+1} while it is the argmax of row j; the emitted token is
    the argmax of the first row whose draft is not accepted (or of row K). No random number is
    drawn, so the output is the non-speculative greedy output token for token.
  - sampling: standard speculative (rejection) sampling (Leviathan et al. 2023; Chen et al.
    2023): accept d with probability min(1, p(d) / q(d)), where q is the draft distribution (a
    point mass for n-gram drafts, the draft model's processed distribution otherwise); on a
    rejection sample from max(0, p - q) renormalised and stop; if every draft is accepted sample
    the bonus token from p_K. Each emitted token is then distributed exactly as p: the output is
    equal in distribution to non-speculative sampling with the same parameters (not equal per
    seed: the random numbers are used differently).

p is the distribution `sample_next_tokens` samples from (temperature, top-k, top-p over the
masked logits: `candidate_distribution`), so a draft the grammar rejects has p = 0 and is always
rejected. `limit` (the manager's `draft_limits`) caps acceptance for drafts past the end of the
grammar chain, as defence in depth. A request without drafts draws exactly as `_pick` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fd_guided.harness.engine.sampling import (
    SamplingParams,
    candidate_count,
    candidate_distribution,
    draw,
    top_candidates,
)


def verify(
    logits,
    offsets: Sequence[int],
    drafts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    rngs,
    draft_dists: Sequence[Sequence[tuple[np.ndarray, np.ndarray]] | None],
    limits: Sequence[int],
) -> list[list[int]]:
    """Tokens each request emits. Request i owns logits rows ``offsets[i] .. offsets[i] + len(drafts[i])``;
    `draft_dists[i][j]` is the draft's (ids, probs) for draft j (None: point masses, n-gram)."""
    rows, vocab = logits.shape
    row_params = [params[i] for i, d in enumerate(drafts) for _ in range(len(d) + 1)]
    values, indices = top_candidates(logits, row_params)
    emitted = []
    for i, chain in enumerate(drafts):
        p = params[i]
        count = candidate_count(p, vocab)
        target = [(values[offsets[i] + j, :count], indices[offsets[i] + j]) for j in range(len(chain) + 1)]
        if p.greedy:
            emitted.append(_greedy(chain, target, limits[i]))
        else:
            emitted.append(_sampled(chain, target, p, rngs[i], draft_dists[i], limits[i]))
    return emitted


def _greedy(chain, target, limit: int) -> list[int]:
    out = []
    for j, draft in enumerate(chain):
        best = int(target[j][1][0])
        if j >= limit or draft != best:
            out.append(best)
            return out
        out.append(draft)
    out.append(int(target[len(chain)][1][0]))
    return out


def _sampled(chain, target, params: SamplingParams, rng, dists, limit: int) -> list[int]:
    out = []
    for j, draft in enumerate(chain):
        ids, probs = candidate_distribution(*target[j], params)
        p_draft = float(probs[ids == draft].sum())
        q_ids, q_probs = dists[j] if dists is not None else (np.asarray([draft]), np.ones(1))
        q_draft = float(q_probs[q_ids == draft].sum()) or 1.0
        if j < limit and p_draft > 0 and rng.random() * q_draft < p_draft:
            out.append(draft)
            continue
        # Rejected: the residual max(0, p - q) over p's support (q outside it does not matter).
        q_on_p = np.zeros_like(probs)
        position = {int(t): k for k, t in enumerate(ids)}
        for token, mass in zip(q_ids, q_probs):
            k = position.get(int(token))
            if k is not None:
                q_on_p[k] = mass
        residual = np.maximum(probs - q_on_p, 0.0)
        out.append(draw(ids, residual if residual.sum() > 0 else probs, rng))
        return out
    ids, probs = candidate_distribution(*target[len(chain)], params)
    out.append(draw(ids, probs, rng))
    return out
