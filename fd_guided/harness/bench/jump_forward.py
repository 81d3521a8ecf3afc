"""Jump-forward on and off: forward passes per output token, tokens/s, validity.

Per schema the same requests (seeded sampling) run with `GuidedConfig.jump_forward` off and on,
interleaved round by round. ``forward_passes_per_token`` counts, per request, the forwards that
gave it a logits row (the final prefill chunk and every decode step) over its output tokens;
jump-forward tokens cost no forward of their own (they ride in the next step's chunk).
``tokens_per_s_ratio`` is on over off, wall clock of the whole batch.
"""

from __future__ import annotations

import statistics

from fd_guided.config import GuidedConfig
from fd_guided.harness.validate import validate_output

_NAMES = (
    "customer_identifier",
    "subscription_status",
    "billing_country_code",
    "is_email_verified",
    "preferred_language",
)
SCHEMAS = {
    # Long keys around short values: what jump-forward is for.
    "key_heavy_flags": {
        "type": "object",
        "properties": {name: {"type": "boolean"} for name in _NAMES},
        "required": list(_NAMES),
    },
    "key_heavy_record": {
        "type": "object",
        "properties": {
            "customer_identifier": {"type": "integer", "minimum": 0, "maximum": 9999},
            "subscription_status": {"enum": ["active", "cancelled"]},
            "billing_address": {
                "type": "object",
                "properties": {
                    "country_code": {"enum": ["DE", "FR", "US"]},
                    "postal_code": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["country_code", "postal_code"],
            },
            "api_version": {"const": "2024-06-01"},
        },
        "required": ["customer_identifier", "subscription_status", "billing_address", "api_version"],
    },
    "array_of_records": {
        "type": "array",
        "minItems": 2,
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {
                "item_number": {"type": "integer", "minimum": 0, "maximum": 99},
                "is_available": {"type": "boolean"},
            },
            "required": ["item_number", "is_available"],
        },
    },
    # Free-form values dominate: little is forced (an honest lower end).
    "string_heavy": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 20, "maxLength": 40},
            "body": {"type": "string", "minLength": 20, "maxLength": 60},
        },
        "required": ["title", "body"],
    },
}


def _requests(schema: dict, batch: int, compact: bool) -> list[dict]:
    return [
        {"prompt": f"Fill record {i}:", "guided_json": schema, "disable_any_whitespace": compact} for i in range(batch)
    ]


def bench_jump_forward(
    model, tokenizer, batch: int = 16, rounds: int = 3, max_tokens: int = 200, progress=print
) -> list[dict]:
    from fd_guided.harness.engine.engine import ReferenceEngine

    rows = []
    for compact in (True, False):
        for name, schema in SCHEMAS.items():
            engines = {
                on: ReferenceEngine(
                    model,
                    tokenizer,
                    max_num_seqs=batch,
                    guided_config=GuidedConfig(backend="xgrammar", jump_forward=on),
                )
                for on in (False, True)
            }
            passes = {False: [], True: []}
            speed = {False: [], True: []}
            invalid = 0
            for round_index in range(rounds + 1):  # round 0 compiles and warms up
                for on, engine in engines.items():
                    results = engine.generate(
                        _requests(schema, batch, compact), max_tokens=max_tokens, seed=round_index
                    )
                    invalid += sum(
                        1
                        for r in results
                        if r.finish_reason == "error"
                        or (r.finish_reason == "stop" and not validate_output(r.spec, r.text).valid)
                    )
                    if round_index:
                        passes[on].append(engine.stats.forward_passes_per_token)
                        speed[on].append(engine.stats.tokens_per_second)
            for engine in engines.values():
                engine.close()
            off, on = statistics.median(passes[False]), statistics.median(passes[True])
            ratio = statistics.median(speed[True]) / statistics.median(speed[False])
            label = name if compact else f"{name}_any_whitespace"
            rows.append(
                {
                    "schema": label,
                    "forward_passes_per_token_on": on,
                    "forward_passes_per_token_off": off,
                    "tokens_per_s_ratio": ratio,
                    "invalid_outputs": invalid,
                    "batch": batch,
                }
            )
            progress(
                f"  jump_forward {label}: forward passes per token {off:.3f} -> {on:.3f} "
                f"({100 * (1 - on / off):.0f}% fewer), tokens/s x{ratio:.2f}, invalid {invalid}"
            )
    return rows
