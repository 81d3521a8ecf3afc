"""Fill cost per decode step with and without the ``uniqueItems`` guard, side by side.

    python tools/unique_guard_cost.py [--items 12] [--repeats 5]

One JSON output (an object holding an array of similar strings: the guard's worst realistic case,
every item sharing a long prefix with the earlier ones) is tokenized by deepseek's tokenizer
(129,280 tokens) and walked token by token on each engine, twice: under a schema with
``uniqueItems: true`` (the guard runs) and under the same schema without it. Each step times
`fill_bitmask` only. Prints p50/p90/max per engine and schema.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.registry import get_backend_class
from fd_guided.tokenizer import load_tokenizer


def schema(unique: bool) -> dict:
    array = {"type": "array", "items": {"type": "string"}, **({"uniqueItems": True} if unique else {})}
    return {"type": "object", "properties": {"tags": array}, "required": ["tags"]}


def fill_times(backend, spec, ids: list[int], repeats: int) -> list[float]:
    grammar = backend.new_grammar(backend.compile(spec))
    bitmask = torch.zeros((1, (backend.vocab_size + 31) // 32), dtype=torch.int32)
    times = []
    for _ in range(repeats):
        grammar.reset()
        for token in ids:
            started = time.perf_counter()
            grammar.fill_bitmask(bitmask, 0)
            times.append(time.perf_counter() - started)
            assert grammar.accept_token(token)
    return sorted(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer = load_tokenizer("deepseek")
    text = '{"tags": [' + ", ".join(json.dumps(f"tag number {i} of the list") for i in range(args.items)) + "]}"
    ids = tokenizer.encode(text)
    for name in ("xgrammar", "llguidance"):
        backend = get_backend_class(name)(tokenizer, vocab_size=tokenizer.padded_vocab_size, config=GuidedConfig(backend=name))
        for label, unique in (("uniqueItems (guarded)", True), ("no uniqueItems", False)):
            times = fill_times(backend, parse_guided_request({"guided_json": schema(unique)}), ids, args.repeats)
            print(f"{name:10s} {label:22s} {len(ids)} steps x {args.repeats}: fill p50 {statistics.median(times) * 1e3:.3f} ms, "
                  f"p90 {times[int(0.9 * len(times))] * 1e3:.3f} ms, max {times[-1] * 1e3:.3f} ms")
        backend.close()


if __name__ == "__main__":
    main()
