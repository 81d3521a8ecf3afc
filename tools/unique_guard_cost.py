"""Fill cost per decode step with and without the ``uniqueItems`` guard, side by side.

    python tools/unique_guard_cost.py [--items 12] [--repeats 5] [--finite 500] [--batch 32]

One JSON output (an object holding an array of similar strings: the guard's worst realistic case,
every item sharing a long prefix with the earlier ones) is tokenized by deepseek's tokenizer
(129,280 tokens) and walked token by token on each engine, twice: under a schema with
``uniqueItems: true`` (the guard runs) and under the same schema without it. Each step times
`fill_bitmask` only. Prints p50/p90/max per engine and schema.

With ``--finite N`` the items are an ``enum`` of N strings instead (too many unique arrays to
enumerate, so the guard serves it and, inside the array, tries every allowed token for a dead
end, not only those that can finish an item). With ``--batch B`` B requests walk the output in
lockstep and each step times one batched `fill_bitmasks` over their B rows (the engine's native
batch fill, then the guard row by row).
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


def schema(unique: bool, values: list[str] | None = None) -> dict:
    items = {"type": "string"} if values is None else {"type": "string", "enum": values}
    array = {"type": "array", "items": items, **({"uniqueItems": True} if unique else {})}
    return {"type": "object", "properties": {"tags": array}, "required": ["tags"]}


def fill_times(backend, spec, ids: list[int], repeats: int, batch: int = 1) -> list[float]:
    compiled = backend.compile(spec)
    grammars = [backend.new_grammar(compiled) for _ in range(batch)]
    bitmask = torch.zeros((batch, (backend.vocab_size + 31) // 32), dtype=torch.int32)
    rows = list(range(batch))
    times = []
    for _ in range(repeats):
        for grammar in grammars:
            grammar.reset()
        for token in ids:
            started = time.perf_counter()
            if batch == 1:
                grammars[0].fill_bitmask(bitmask, 0)
            else:
                backend.fill_bitmasks(grammars, bitmask, rows)
            times.append(time.perf_counter() - started)
            for grammar in grammars:
                assert grammar.accept_token(token)
    return sorted(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--finite", type=int, default=0, help="items from an enum of this many strings")
    parser.add_argument("--batch", type=int, default=1, help="requests filled together per step")
    args = parser.parse_args()
    tokenizer = load_tokenizer("deepseek")
    values = [f"tag number {i} of the list" for i in range(max(args.items, args.finite))]
    enum = values if args.finite else None
    text = '{"tags": [' + ", ".join(json.dumps(value) for value in values[:args.items]) + "]}"
    ids = tokenizer.encode(text)
    for name in ("xgrammar", "llguidance"):
        backend = get_backend_class(name)(tokenizer, vocab_size=tokenizer.padded_vocab_size, config=GuidedConfig(backend=name))
        for label, unique in (("uniqueItems (guarded)", True), ("no uniqueItems", False)):
            times = fill_times(backend, parse_guided_request({"guided_json": schema(unique, enum)}), ids, args.repeats, args.batch)
            print(f"{name:10s} {label:22s} {len(ids)} steps x {args.repeats}, {args.batch} row(s): fill p50 {statistics.median(times) * 1e3:.3f} ms, "
                  f"p90 {times[int(0.9 * len(times))] * 1e3:.3f} ms, max {times[-1] * 1e3:.3f} ms")
        backend.close()


if __name__ == "__main__":
    main()
