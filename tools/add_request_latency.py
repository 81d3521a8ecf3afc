"""How long `GuidedDecodingManager.add_request` holds the caller's thread, per request, cold and warm.

    flock /tmp/fd_bench.lock python tools/add_request_latency.py SCHEMA_DIR [SCHEMA_DIR ...] \\
        [--backend auto] [--limit N] [--sample N --seed S] [--heaviest K] [--json out.json]

What a host's step or insertion thread pays to add a guided request (FastDeploy's model runner, the
reference engine's step thread): every ``*.json`` under the directories is admitted as
``{"guided_json": text}`` with ``manager.validate`` (not timed here: tools/admission_latency.py
times admission), then added to a slot with ``manager.add_request`` (timed on the caller's thread:
wall clock, the garbage collector's pauses apart, and the thread's own CPU time). Each schema is
new to the manager (cold: its compile service has never seen it); the request then waits until
it `is_ready` (its time to ready and its outcome, the engine that serves it or the error it fails
with, are recorded) and is released before the next, so no backlog of compiles builds up. Then
each admitted spec is added again (warm: seen before, a cache hit). Prints p50/p90/p99/max, the
same without GC pauses, and the slowest cold adds; ``--json`` writes them with every request's
outcome. ``--compare A B`` prints the requests whose final verdict (admitted and served by an
engine, or refused, at admission or when added, with its message) differs between two such
reports: two trees, or two admission budgets (``--budget-ms inline``: every verdict at admission;
``0``: every check left to later).

Only public API is used, so the same file measures an older tree (a worktree of main) side by side:
run both one after the other under the bench lock.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VOCAB = 129_280


class GcClock:
    """Seconds spent in garbage collection (gc.callbacks), on any thread."""

    def __init__(self):
        self.total, self._began = 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._began


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)  # noqa: E731
    return {"n": len(ordered), "p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "max_ms": pick(1.0)}


def build(backend_name: str, budget_ms: str | None):
    from fd_guided import GuidedConfig, GuidedDecodingManager, load_tokenizer
    from fd_guided.registry import create_backend

    config = GuidedConfig(backend=backend_name)
    if budget_ms is not None:
        config = config.replace(admission_budget_s=None if budget_ms == "inline" else float(budget_ms) / 1e3)
    backend = create_backend(backend_name, load_tokenizer("deepseek"), vocab_size=VOCAB, config=config)
    manager = GuidedDecodingManager(backend, max_num_seqs=2)
    # The workers started and warm (the zygote builds the tokenizer tables once: seconds), and
    # admission's one-time costs paid, before anything is timed.
    for i in range(4):
        warm = manager.validate({"guided_json": {"type": "object", "properties": {f"warm{i}": {"type": "string"}}}})
        manager.add_request(0, warm)
        manager.wait_ready([0], 120)
        manager.release(0)
    return manager


def timed_add(manager, clock: GcClock, spec) -> tuple[float, float, float]:
    """(seconds add_request held this thread, of which in GC pauses, this thread's CPU seconds in
    it: what it computed, apart from waiting for a core or the GIL on a loaded host)."""
    in_gc = clock.total
    cpu = time.thread_time()
    started = time.perf_counter()
    manager.add_request(0, spec)
    return time.perf_counter() - started, clock.total - in_gc, time.thread_time() - cpu


def outcome(manager) -> str:
    ticket = manager.slots[0].ticket
    error = ticket.exception() if ticket.done() else None
    if not ticket.done():
        return "not ready"
    return f"error: {str(error)[:160]}" if error is not None else f"ok: {ticket.result().backend_name}"


def measure(manager, items: list[tuple[str, str]], ready_timeout_s: float) -> dict:
    from fd_guided import InvalidGrammarError

    clock = GcClock()
    cold, cold_no_gc, cold_cpu, ready, warm, warm_no_gc, slowest, outcomes, admitted = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        {},
        [],
    )
    for name, text in items:
        try:
            spec = manager.validate({"guided_json": text})
        except (InvalidGrammarError, ValueError, RecursionError) as error:
            outcomes[name] = f"refused at admission: {str(error)[:160]}"
            continue
        if spec is None:
            continue
        seconds, in_gc, cpu = timed_add(manager, clock, spec)
        started = time.perf_counter()
        manager.wait_ready([0], ready_timeout_s)
        ready.append(time.perf_counter() - started + seconds)
        cold.append(seconds)
        cold_no_gc.append(seconds - in_gc)
        cold_cpu.append(cpu)
        slowest.append((round(seconds * 1e3, 2), round(in_gc * 1e3, 2), round(cpu * 1e3, 2), name, len(text)))
        outcomes[name] = outcome(manager)
        manager.release(0)
        admitted.append(spec)
    for spec in admitted:
        seconds, in_gc, _ = timed_add(manager, clock, spec)
        warm.append(seconds)
        warm_no_gc.append(seconds - in_gc)
        manager.release(0)
    slowest.sort(reverse=True)
    kinds: dict[str, int] = {}
    for text in outcomes.values():
        kind = text.split(":")[0] + (":" + text.split(": ")[1] if text.startswith("ok") else "")
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "cold": percentiles(cold),
        "cold_without_gc": percentiles(cold_no_gc),
        "cold_thread_cpu": percentiles(cold_cpu),
        "warm": percentiles(warm),
        "warm_without_gc": percentiles(warm_no_gc),
        "ready_including_add": percentiles(ready),
        "slowest_cold": [{"ms": s, "gc_ms": g, "cpu_ms": c, "name": n, "bytes": b} for s, g, c, n, b in slowest[:10]],
        "outcomes_by_kind": kinds,
        "outcomes": outcomes,
    }


def verdict(outcome: str | None) -> str | None:
    """An outcome without where it was decided: refused at admission or failed when added alike."""
    if outcome is None:
        return None
    for where in ("refused at admission: ", "error: "):
        if outcome.startswith(where):
            return "refused: " + outcome[len(where) :]
    return outcome


def compare(before_path: str, after_path: str) -> int:
    """Print the requests whose verdict (`verdict`) differs between two --json reports (0: none)."""
    before = {
        name: verdict(text) for name, text in json.loads(Path(before_path).read_text())["schemas"]["outcomes"].items()
    }
    after = {
        name: verdict(text) for name, text in json.loads(Path(after_path).read_text())["schemas"]["outcomes"].items()
    }
    differ = {name: (before.get(name), after.get(name)) for name in sorted(set(before) | set(after))}
    differ = {name: pair for name, pair in differ.items() if pair[0] != pair[1]}
    print(json.dumps({"compared": len(set(before) | set(after)), "differ": differ}, indent=1))
    return 1 if differ else 0


def subset(items: list[tuple[str, str]], sample: int | None, seed: int, heaviest: int) -> list[tuple[str, str]]:
    """The `heaviest` largest schemas (bytes) and `sample` others drawn with `seed`, in name order:
    a corpus too long to run whole, its tail kept."""
    by_size = sorted(items, key=lambda item: (-len(item[1]), item[0]))
    heavy, rest = by_size[:heaviest], sorted(by_size[heaviest:])
    drawn = random.Random(seed).sample(rest, min(sample, len(rest))) if sample is not None else rest
    return sorted(heavy + drawn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--limit", type=int, help="the first N schemas only")
    parser.add_argument("--ready-timeout", type=float, default=30.0, help="seconds to wait for each request")
    parser.add_argument("--sample", type=int, help="N schemas drawn at random (with --seed), beside --heaviest")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--heaviest", type=int, default=0, help="the K largest schemas (bytes), always run")
    parser.add_argument("--budget-ms", help="admission budget in ms, or 'inline' (default: the config's)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    items = [
        (str(path.relative_to(folder)), path.read_text(encoding="utf-8", errors="replace"))
        for folder in args.folders
        for path in sorted(Path(folder).rglob("*.json"))
    ][: args.limit]
    if args.sample is not None or args.heaviest:
        items = subset(items, args.sample, args.seed, args.heaviest)
    manager = build(args.backend, args.budget_ms)
    started = time.time()
    load_before = os.getloadavg()
    try:
        report = {"schemas": measure(manager, items, args.ready_timeout)}
    finally:
        manager.close()
    report["run"] = {
        "backend": args.backend,
        "budget_ms": args.budget_ms or "default",
        "subset": {"sample": args.sample, "seed": args.seed, "heaviest": args.heaviest, "schemas": len(items)},
        "tree": str(REPO),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    summary = {key: value for key, value in report["schemas"].items() if key != "outcomes"}
    print(json.dumps({**summary, "run": report["run"]}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
