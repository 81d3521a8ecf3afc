"""What a worker's xgrammar grammar costs to reach the serving process: its bytes vs a second compile.

    python tools/transfer_cost.py SCHEMA_DIR [--names a.json b.json ...] [--sample N] [--seed S]
                                  [--timeout 120] [--json OUT.json]

Two compile services in this process, side by side, each with its own worker pool and cache
(xgrammar backend, process isolation, DeepSeek's vocabulary): ``send`` with
``compile_transfer_max_bytes=None`` (every grammar sent as its serialized bytes: the path before
fd_guided.compile.transfer) and ``rule`` with the default (16 MiB, or over twice the compile's time
to send: compiled again here). For every schema, in turn (the two modes alternate which goes
first), each service compiles it once (cold) and is timed from submit to the grammar usable here;
this process's peak resident growth during it is read from VmHWM (reset by ``clear_refs`` before
each compile). Reported per schema: outcome (compiled or the error's type), seconds, this
process's peak growth (MiB), whether `rule` compiled it here; and the totals, medians and p90s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _compile_once(service, spec, timeout_s: float) -> dict:
    from fd_guided.compile.supervisor import peak_rss, reset_peak_rss

    before = reset_peak_rss()
    rebuilt = service.metrics.value("compiles_rebuilt_here_total")
    started = time.perf_counter()
    try:
        service.submit(spec).result(timeout=timeout_s)
        outcome = "compiled"
    except Exception as error:  # noqa: BLE001 - recorded per schema
        outcome = type(error).__name__
    seconds = time.perf_counter() - started
    return {
        "outcome": outcome,
        "seconds": round(seconds, 3),
        "peak_growth_mib": round((peak_rss() - before) / (1 << 20), 1),
        "compiled_here": service.metrics.value("compiles_rebuilt_here_total") > rebuilt,
    }


def _summary(rows: list[dict], mode: str) -> dict:
    done = [row[mode] for row in rows if row[mode]["outcome"] == "compiled"]
    seconds = sorted(item["seconds"] for item in done)
    growth = sorted(item["peak_growth_mib"] for item in done)

    def p90(values):
        return values[min(len(values) - 1, int(0.9 * len(values)))] if values else None

    return {
        "compiled": len(done),
        "failed": len(rows) - len(done),
        "compiled_here": sum(row[mode]["compiled_here"] for row in rows),
        "seconds_total": round(sum(seconds), 2),
        "seconds_median": statistics.median(seconds) if seconds else None,
        "seconds_p90": p90(seconds),
        "peak_growth_mib_median": statistics.median(growth) if growth else None,
        "peak_growth_mib_max": max(growth) if growth else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("schema_dir", type=Path)
    parser.add_argument("--names", nargs="*", default=[], help="these files of SCHEMA_DIR first")
    parser.add_argument("--sample", type=int, default=0, help="plus this many other files, drawn with --seed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0, help="the compile budget (and the wait) in seconds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import logging

    logging.disable(logging.WARNING)
    from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
    from fd_guided.compile import CompileService
    from fd_guided.registry import create_backend
    from fd_guided.tokenizer import load_tokenizer

    files = [args.schema_dir / name for name in args.names]
    others = sorted(set(args.schema_dir.glob("*.json")) - set(files))
    random.Random(args.seed).shuffle(others)
    files += others[: args.sample]

    tokenizer = load_tokenizer("deepseek")
    modes = {"send": None, "rule": GuidedConfig().compile_transfer_max_bytes}
    services = {}
    for mode, bound in modes.items():
        config = GuidedConfig(backend="xgrammar", compile_timeout_s=args.timeout, compile_transfer_max_bytes=bound)
        services[mode] = CompileService(create_backend("xgrammar", tokenizer, vocab_size=129_280, config=config))
    rows = []
    try:
        for service in services.values():  # workers up, first-use costs paid
            service.compile_now(parse_guided_request({"guided_regex": "[a-z]+"}, service.backend.config))
        for index, path in enumerate(files):
            try:
                spec = parse_guided_request({"guided_json": path.read_text()}, services["send"].backend.config)
            except InvalidGrammarError:
                continue
            row = {"schema": path.name}
            order = list(modes) if index % 2 == 0 else list(reversed(modes))
            for mode in order:
                row[mode] = _compile_once(services[mode], spec, args.timeout + 30)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for service in services.values():
            service.close()
    result = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "files": len(files),
            "timeout_s": args.timeout,
        },
        "summary": {mode: _summary(rows, mode) for mode in modes},
        "rows": rows,
    }
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
