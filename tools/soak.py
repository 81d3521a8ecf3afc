"""Memory soak: thousands of distinct schemas through one compile service; RSS against the bounds.

    python tools/soak.py --schemas 8000 --cache-mb 64 --json docs/soak.json
    python tools/soak.py --schemas 6000 --cache-mb 64 --description-kb 256 --json docs/soak-big.json

Every schema is new (a fresh property name), so every request compiles and the caches churn. The
serving process's RSS is sampled as it goes (and the compile workers' private memory, which the
pool recycles), and the growth is compared with what the configuration bounds: the compiled-grammar
cache plus the memory of failed compiles (`GuidedConfig.cache_limit_bytes` and 1/16 of it).
Not part of CI: it takes minutes. Results: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE


def private_bytes(pid: int) -> int:
    """Memory only this process holds (pages shared with the zygote do not count)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            return sum(int(line.split()[1]) * 1024 for line in handle if line.startswith(("Private_Clean", "Private_Dirty")))
    except OSError:
        return 0


def schema(index: int, description_bytes: int) -> dict:
    kinds = ["string", "integer", "boolean", "number"]
    properties = {f"f{index}_{j}": {"type": kinds[(index + j) % 4]} for j in range(8)}
    properties[f"f{index}_0"]["description"] = ("lorem ipsum " * (description_bytes // 12 + 1))[:description_bytes] or "x"
    if index % 5 == 0:
        properties[f"tags{index}"] = {"type": "array", "items": {"type": "string", "enum": [f"t{index}", "u", "v"]}, "maxItems": 4}
    return {"type": "object", "properties": properties, "required": [f"f{index}_0", f"f{index}_1"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemas", type=int, default=8000)
    parser.add_argument("--cache-mb", type=int, default=64)
    parser.add_argument("--description-kb", type=int, default=0)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import logging

    logging.disable(logging.WARNING)
    from fd_guided import GuidedConfig, load_tokenizer, parse_guided_request
    from fd_guided.compile import CompileService
    from fd_guided.registry import create_backend

    config = GuidedConfig(backend=args.backend, cache_limit_bytes=args.cache_mb << 20)
    service = CompileService(create_backend(args.backend, load_tokenizer("deepseek"), vocab_size=129_280, config=config))
    bound = config.cache_limit_bytes + max(1 << 20, config.cache_limit_bytes // 16)
    service.compile_now(parse_guided_request({"guided_json": schema(-1, 0)}, config))
    baseline = rss_bytes()
    samples, failures, started = [], 0, time.perf_counter()
    pending = []
    for index in range(args.schemas):
        pending.append(service.submit(parse_guided_request({"guided_json": schema(index, args.description_kb << 10)}, config)))
        if len(pending) >= args.in_flight:
            for ticket in pending:
                try:
                    ticket.result(timeout=120)
                except Exception:  # noqa: BLE001 - a failed compile is counted, the soak goes on
                    failures += 1
            pending = []
        if index % 250 == 0 or index == args.schemas - 1:
            workers = service._runner.worker_pids() if hasattr(service._runner, "worker_pids") else []
            samples.append({"schemas": index + 1, "seconds": round(time.perf_counter() - started, 1),
                            "rss_growth_mb": round((rss_bytes() - baseline) / 2**20, 1),
                            "cache_mb": round(service.cache.size_bytes / 2**20, 1),
                            "workers_private_mb": round(sum(private_bytes(pid) for pid in workers) / 2**20, 1)})
            print(json.dumps(samples[-1]), flush=True)
    service.close()
    peak = max(sample["rss_growth_mb"] for sample in samples)
    report = {"schemas": args.schemas, "description_kb": args.description_kb, "backend": args.backend,
              "cache_limit_mb": args.cache_mb, "bound_mb": round(bound / 2**20, 1), "peak_rss_growth_mb": peak,
              "peak_over_bound": round(peak / (bound / 2**20), 2), "failures": failures, "samples": samples}
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
