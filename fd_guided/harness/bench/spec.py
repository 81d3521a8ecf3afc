"""Speculative decoding under a grammar: acceptance length with and without masked drafts, and what
guidance costs per speculative step.

Per drafter and K:
  - ``acceptance_len_*``: tokens emitted per target forward per request (accepted drafts + one),
    greedy, over JSON requests that finish on their own, with unmasked drafts and with drafts
    that obey the grammar (`fd_guided.harness.engine.speculative`). Same requests, same seed.
  - ``guided_over_unguided_step``: median decode-step time of the guided speculative engine
    (masked drafts; drafting, masking of K+1 rows per request, verification all included) over
    the unguided speculative engine with the same drafter and K, at `batch` requests that decode
    for the whole window, interleaved round by round. Both propose exactly K drafts per request
    every step (`SpeculativeConfig.fixed_draft_length`): unguided gibberish finds other n-grams
    than JSON does, and steps that verify different numbers of rows would not compare.
  - ``invalid_outputs``: finished guided outputs that fail validation, over every run of the row.
"""

from __future__ import annotations

import statistics

from fd_guided.config import GuidedConfig
from fd_guided.harness.bench.steps import ITEM_SCHEMAS, long_running_requests
from fd_guided.harness.validate import validate_output

KS = (1, 3, 5, 7)
DRAFTERS = ("ngram", "draft_model")


def acceptance_requests(count: int) -> list[dict]:
    """Small arrays of records: keys repeat, so n-gram lookups find them; all finish by themselves."""
    return [
        {
            "prompt": f"Records, batch {i % 7}:",
            "temperature": 0,
            "guided_json": {
                "type": "array",
                "items": ITEM_SCHEMAS[i % len(ITEM_SCHEMAS)],
                "minItems": 2,
                "maxItems": 3,
            },
        }
        for i in range(count)
    ]


def _engine(model, tokenizer, drafter: str, k: int, masked: bool, guided: bool, batch: int, fixed: bool = False):
    from fd_guided.harness.engine.engine import ReferenceEngine, SpeculativeConfig

    return ReferenceEngine(
        model,
        tokenizer,
        guided=guided,
        max_num_seqs=batch,
        max_num_batched_tokens=max(512, batch * (k + 16)),
        guided_config=GuidedConfig(backend="xgrammar"),
        speculative=SpeculativeConfig(drafter, k, masked_drafts=masked, fixed_draft_length=fixed),
    )


def _invalid(results) -> int:
    return sum(
        1
        for r in results
        if r.spec is not None and r.finish_reason == "stop" and not validate_output(r.spec, r.text).valid
    )


def bench_spec(
    model,
    tokenizer,
    ks=KS,
    drafters=DRAFTERS,
    batch: int = 32,
    acceptance_batch: int = 16,
    decode_steps: int = 16,
    rounds: int = 3,
    max_tokens: int = 160,
    progress=print,
) -> list[dict]:
    rows = []
    for drafter in drafters:
        for k in ks:
            invalid, lengths = 0, {}
            for masked in (False, True):
                engine = _engine(model, tokenizer, drafter, k, masked, True, acceptance_batch)
                results = engine.generate(acceptance_requests(acceptance_batch), max_tokens=max_tokens, seed=0)
                invalid += _invalid(results) + sum(r.finish_reason == "error" for r in results)
                lengths[masked] = engine.stats.acceptance_length
                engine.close()
            steps = {"guided": [], "unguided": []}
            # Exactly K drafts per request and step in both modes: the same rows to verify, so the
            # ratio is what guidance costs (masked drafting, K+1 masks per request, accept).
            engines = {
                mode: _engine(model, tokenizer, drafter, k, True, mode == "guided", batch, fixed=True) for mode in steps
            }
            for round_index in range(rounds + 1):  # round 0 warms caches and allocators up
                for mode, engine in engines.items():
                    requests = long_running_requests(batch, mode == "guided")
                    results = engine.generate(requests, max_tokens=decode_steps * (k + 1) + 1, seed=0)
                    invalid += sum(r.finish_reason == "error" for r in results)
                    if round_index:
                        # Skip the first decode steps: they include the (cold) compile joins.
                        steps[mode].append(statistics.median(engine.stats.decode_step_seconds()[2:decode_steps]))
            for engine in engines.values():
                engine.close()
            guided, unguided = statistics.median(steps["guided"]), statistics.median(steps["unguided"])
            rows.append(
                {
                    "drafter": drafter,
                    "k": k,
                    "acceptance_len_unmasked_drafts": lengths[False],
                    "acceptance_len_masked_drafts": lengths[True],
                    "guided_over_unguided_step": guided / unguided,
                    "invalid_outputs": invalid,
                    "batch": batch,
                    "guided_step_ms": 1e3 * guided,
                    "unguided_step_ms": 1e3 * unguided,
                }
            )
            progress(
                f"  spec {drafter} k={k}: acceptance {lengths[False]:.2f} -> {lengths[True]:.2f} (masked drafts), "
                f"step guided/unguided {guided / unguided:.3f} ({1e3 * guided:.1f} / {1e3 * unguided:.1f} ms), "
                f"invalid {invalid}"
            )
    return rows
