"""Drafters for the reference engine's speculative decoding: n-gram (prompt lookup) and a draft model.

Each decode step a drafter proposes up to K tokens per running request; the target model scores
them in one forward (a chunk [pending tokens, d1..dK] with K + 1 logits rows), the guided manager
masks those rows (`begin_speculative_step`) and `verify` keeps what the target agrees with.

Masked drafting (`SpeculativeConfig.masked_drafts`) makes the drafts obey the grammar, so fewer
are wasted on tokens the target's masked rows give probability 0:
  - n-gram: among the candidate continuations (every earlier occurrence of the longest matching
    suffix), take the one whose grammar-valid prefix is longest, cut there
    (`GuidedDecodingManager.valid_draft_prefix`);
  - draft model: its logits are masked step by step with the request's grammar advanced by the
    drafts so far (`GuidedDecodingManager.begin_drafting`), with the same kernel.
Unmasked, the n-gram drafter takes the most recent candidate as it is and the draft model samples
from its raw logits.

The draft model is a second `TinyDecoderLM` with its own KV caches: the target's config cut to
`draft_layers` layers with the same seed, so it shares the target's token embeddings, LM head and
prior, and its first layer's weights up to scale (an early-exit draft, correlated with the target
as a trained draft model would be). Its caches are kept to the tokens the request really has:
after every verification they are truncated to the longest prefix they share with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fd_guided.harness.engine.model import SeqChunk, TinyDecoderLM
from fd_guided.harness.engine.sampling import candidate_count, candidate_distribution, draw, top_candidates

DRAFTERS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """drafter: ``ngram`` (prompt lookup) or ``draft_model``; num_draft_tokens: K (1..16);
    masked_drafts: drafts obey the grammar (see the module docstring); draft_layers: the draft
    model's depth; ngram_min/ngram_max: suffix lengths the n-gram drafter matches, longest first;
    ngram_candidates: continuations it considers when masked. fixed_draft_length: always propose
    exactly K drafts (a short proposal is padded with its last token, grammar-invalid drafts are
    kept): for benchmarks, so guided and unguided steps verify the same number of rows."""

    drafter: str = "ngram"
    num_draft_tokens: int = 4
    masked_drafts: bool = True
    draft_layers: int = 1
    ngram_min: int = 1
    ngram_max: int = 4
    ngram_candidates: int = 8
    fixed_draft_length: bool = False

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}, got {self.drafter!r}")
        if not 1 <= self.num_draft_tokens <= 16:
            raise ValueError(f"num_draft_tokens must be in 1..16, got {self.num_draft_tokens}")
        if self.draft_layers < 1 or not 1 <= self.ngram_min <= self.ngram_max or self.ngram_candidates < 1:
            raise ValueError("draft_layers, ngram_min <= ngram_max and ngram_candidates must be positive")


@dataclass
class Proposal:
    """Drafts for one request, and the draft distribution of each (None: point masses)."""

    tokens: list[int]
    dists: list[tuple[np.ndarray, np.ndarray]] | None = None


class NgramDrafter:
    """Prompt lookup: continue the request's longest suffix that occurred before in its tokens."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config

    def candidates(self, tokens: Sequence[int], k: int) -> list[list[int]]:
        """Continuations (up to k tokens) after earlier occurrences of the longest matching suffix
        (ngram_max down to ngram_min), most recent first, distinct."""
        cfg, found = self.config, []
        length = len(tokens)
        for n in range(min(cfg.ngram_max, length - 1), cfg.ngram_min - 1, -1):
            suffix = list(tokens[length - n :])
            for start in range(length - n - 1, -1, -1):
                if tokens[start] == suffix[0] and list(tokens[start : start + n]) == suffix:
                    continuation = list(tokens[start + n : start + n + k])
                    if continuation and continuation not in found:
                        found.append(continuation)
                        if len(found) >= cfg.ngram_candidates:
                            return found
            if found:
                return found
        return found

    def propose(self, seqs, ks: Sequence[int], manager, masked: bool) -> list[Proposal]:
        proposals = []
        for seq, k in zip(seqs, ks):
            candidates = self.candidates(seq.prompt_ids + seq.output_ids, k) if k > 0 else []
            if not candidates:
                proposals.append(Proposal([]))
            elif masked and manager is not None and manager.is_guided(seq.slot):
                valid = [manager.valid_draft_prefix(seq.slot, c) for c in candidates]
                best = int(np.argmax(valid))
                proposals.append(Proposal(candidates[best][: valid[best]]))
            else:
                proposals.append(Proposal(candidates[0]))
            if self.config.fixed_draft_length and k > 0:
                tokens = proposals[-1].tokens
                tokens += [tokens[-1] if tokens else (seq.prompt_ids + seq.output_ids)[-1]] * (k - len(tokens))
        return proposals


class DraftModelDrafter:
    """K autoregressive steps of a small draft model over every drafting request at once."""

    def __init__(self, target: TinyDecoderLM, config: SpeculativeConfig):
        self.config = config
        draft_cfg = replace(target.cfg, num_layers=min(config.draft_layers, target.cfg.num_layers))
        self.model = TinyDecoderLM(draft_cfg, token_prior=target.token_prior.numpy())

    def new_cache(self):
        return self.model.new_cache()

    def propose(self, seqs, ks: Sequence[int], manager, masked: bool) -> list[Proposal]:
        proposals = [Proposal([], [] if not seq.params.greedy else None) for seq in seqs]
        drafting = [i for i, k in enumerate(ks) if k > 0]
        if not drafting:
            return proposals
        steps = max(ks[i] for i in drafting)
        session = manager.begin_drafting([seqs[i].slot for i in drafting]) if masked and manager is not None else None
        try:
            for step in range(steps):
                chunks = []
                for i in drafting:
                    seq = seqs[i]
                    fed = seq.draft_fed
                    tokens = (seq.prompt_ids + seq.output_ids)[len(fed) :] if step == 0 else [proposals[i].tokens[-1]]
                    chunks.append(SeqChunk(seq.draft_cache, tokens))
                    fed.extend(tokens)
                logits = self.model.forward_batch(chunks)
                if session is not None:
                    session.apply(logits)
                params = [seqs[i].params for i in drafting]
                values, indices = top_candidates(logits, params)
                tokens = []
                for row, i in enumerate(drafting):
                    seq, vocab = seqs[i], logits.shape[1]
                    candidates = (values[row, : candidate_count(seq.params, vocab)], indices[row])
                    if seq.params.greedy:
                        token = int(indices[row, 0])
                    else:
                        dist = candidate_distribution(*candidates, seq.params)
                        token = draw(*dist, seq.draft_rng)
                        proposals[i].dists.append(dist)
                    proposals[i].tokens.append(token)
                    tokens.append(token)
                if session is not None:
                    session.advance(tokens)
        finally:
            valid = session.close() if session is not None else None
        for row, i in enumerate(drafting):
            keep = (
                ks[i]
                if valid is None or self.config.fixed_draft_length or not manager.is_guided(seqs[i].slot)
                else min(ks[i], valid[row])
            )
            proposals[i].tokens = proposals[i].tokens[:keep]
            if proposals[i].dists is not None:
                proposals[i].dists = proposals[i].dists[:keep]
        return proposals


def truncate_to_shared_prefix(cache, fed: list[int], tokens: Sequence[int]) -> None:
    """Keep only the leading positions of `cache` (holding `fed`) that `tokens` still has."""
    shared = 0
    limit = min(len(fed), len(tokens))
    while shared < limit and fed[shared] == tokens[shared]:
        shared += 1
    if shared < len(fed):
        del fed[shared:]
        cache.truncate(shared)


def make_drafter(config: SpeculativeConfig, target: TinyDecoderLM):
    return NgramDrafter(config) if config.drafter == "ngram" else DraftModelDrafter(target, config)
