"""Time to ready under a stream of distinct cold JSON schemas, through the manager as serving runs it.

    flock /tmp/fd_bench.lock python tools/time_to_ready.py --json docs/time_to_ready.json \\
        --plot docs/img/time_to_ready.png            # ~2 minutes on 2 cores

Each schema goes through `GuidedDecodingManager` as a host drives it: ``validate`` (admission,
timed apart), ``add_request`` (the compile starts: worker processes, ``auto`` by default), then
``is_ready`` polled every `--poll-ms`; "ready" is the time from ``add_request`` to the first poll
that sees it ready (admission excluded). Nothing waits between requests, so the cache-only
compiles an earlier request left running (xgrammar's, for ``auto``) overlap the later ones, as
they would in a server fed by a stream of per-request schemas. Two phases, each on its own
schemas: ``sequential`` (one request at a time) and ``burst`` (`--burst` requests admitted at
once, the next burst once all are ready).

Then every schema is compiled alone by each engine (`--calibrate`, a fresh service per engine,
one at a time, nothing else running): the schemas *some engine compiles quickly* (alone within
`--quick-ms`) are the ones the targets speak of; the rest is listed with its engine times.

Corpora (`--corpus`): ``generated`` (default: `tools/schema_stream.py`'s seeded real-looking
schemas), ``suite`` (JSON-Schema-Test-Suite), ``project`` (tests/corpus.py and tools/load.py), or
a directory of ``*.json`` (e.g. JSONSchemaBench's data/ folders). Figures depend on the host's
load: run it under the bench lock, on a quiet machine for figures to publish.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import schema_stream  # noqa: E402

VOCAB = 129_280


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": round(ordered[-1], 2)}


def build(args, backend_name: str, **overrides):
    from fd_guided import GuidedConfig, GuidedDecodingManager, load_tokenizer
    from fd_guided.registry import create_backend

    if args.compile_workers:
        overrides.setdefault("compile_workers", args.compile_workers)
    config = GuidedConfig(backend=backend_name, compile_timeout_s=args.timeout, **overrides)
    backend = create_backend(backend_name, load_tokenizer(args.tokenizer), vocab_size=VOCAB, config=config)
    manager = GuidedDecodingManager(backend, max_num_seqs=max(args.burst, 1))
    # Start the workers (the zygote builds the tokenizer tables once: seconds) before timing anything.
    for i in range(4):
        warm = manager.validate({"guided_json": {"type": "object", "properties": {f"warm{i}": {"type": "integer"}}}})
        manager.compiler.compile_now(warm)
    return manager


def admit(manager, schema: dict):
    """(spec or None, admission ms, refusal text)."""
    from fd_guided import InvalidGrammarError

    started = time.perf_counter()
    try:
        spec = manager.validate({"guided_json": json.dumps(schema)})
        return spec, (time.perf_counter() - started) * 1e3, None
    except (InvalidGrammarError, ValueError, RecursionError) as error:
        return None, (time.perf_counter() - started) * 1e3, str(error)[:200]


class Trace:
    """`--trace`: monotonic stamps along one request's path to ready, for the engine that served it.

    add_request called -> returned (ticket made, job handed to the pool) / the pool's loop took
    it -> sent to a worker -> the worker compiled (its own clock) -> reply read -> rebuild started
    on a loader thread -> rebuilt (the matcher built here from the worker's grammar) -> ticket
    done -> first `is_ready` poll that saw it; ``checks_done``: when the job that ran the engines'
    checks and chose them was done (trees where `add_request` leaves them to a worker). Wraps the
    pool's and the jobs' private methods in this process (a measurement, not part of the library);
    costs ~10 us a request."""

    STAGES = ("submitted", "pool_took", "sent", "replied", "rebuild_start", "rebuilt", "ticket_done", "is_ready")

    def __init__(self):
        from fd_guided.compile import jobs, pool, supervisor

        self.stamps: dict = {}  # (engine, spec) -> {stage: monotonic}
        self.compile_s: dict = {}  # (engine, spec) -> the worker's own compile seconds
        stamp = self.stamp

        def wrap(cls, name, before):
            original = getattr(cls, name)

            def wrapped(this, *args):
                before(this, *args)
                return original(this, *args)

            setattr(cls, name, wrapped)

        def took(this):
            with this._incoming_lock:
                incoming = list(this._incoming)
            for job in incoming:
                stamp(job.engine, job.spec, "pool_took")

        def replied(this, worker):
            job = worker.job
            stamp(job.engine, job.spec, "sent", job.started)
            stamp(job.engine, job.spec, "replied")
            job.future.add_done_callback(
                lambda f: f.exception() is None and self.compile_s.setdefault((job.engine, job.spec), f.result()[1])
            )

        wrap(pool.CompileProcessPool, "_take_incoming", took)
        wrap(supervisor.WorkerSupervisor, "_receive", replied)
        wrap(jobs.CompileJobs, "_after_run", lambda this, engine, spec, *_: stamp(engine, spec, "rebuild_start"))
        wrap(jobs.CompileJobs, "_finish_job", lambda this, engine, spec, *_: stamp(engine, spec, "rebuilt"))

    def stamp(self, engine, spec, stage, at=None):
        self.stamps.setdefault((engine, spec), {}).setdefault(stage, time.monotonic() if at is None else at)

    def record(self, record: dict, spec, engine: str, added: float, submitted: float, done: float, ready: float):
        """When each stage was reached, ms after ``add_request`` was called, into `record["trace"]`
        (offsets, not durations: the pool may take the job before ``add_request`` returns)."""
        stamps = dict(self.stamps.pop((engine, spec), {}), submitted=submitted, ticket_done=done, is_ready=ready)
        trace = {stage: round((stamps[stage] - added) * 1e3, 3) for stage in self.STAGES if stage in stamps}
        if (engine, spec) in self.compile_s:
            trace["worker_compile"] = round(self.compile_s.pop((engine, spec)) * 1e3, 3)
        # The job that runs the engines' checks and chooses them (issue #22), in trees that have one.
        checks = self.stamps.pop(("engine-checks", spec), {})
        self.compile_s.pop(("engine-checks", spec), None)
        if "rebuilt" in checks:
            trace["checks_done"] = round((checks["rebuilt"] - added) * 1e3, 3)
        record["trace"] = trace


def run_group(manager, group: list, poll_s: float, trace: Trace | None = None) -> list[dict]:
    """Admit every schema of `group`, add them all, poll until each is ready; one record each."""
    records, slots = [], {}
    for name, schema in group:
        spec, admit_ms, refused = admit(manager, schema)
        record = {"name": name, "bytes": len(json.dumps(schema)), "admit_ms": round(admit_ms, 2)}
        records.append(record)
        if spec is None:
            record["refused"] = refused
            continue
        slot = len(slots)
        record["_slot"], record["_t0"], record["_spec"] = slot, time.perf_counter(), spec
        record["_added"] = time.monotonic()
        manager.add_request(slot, spec)
        record["_submitted"] = time.monotonic()
        ticket = manager.slots[slot].ticket
        ticket.add_done_callback(lambda _, record=record: record.setdefault("_done", time.monotonic()))
        slots[slot] = record
    waiting = dict(slots)
    while waiting:
        now = time.perf_counter()
        for slot in [s for s in waiting if manager.is_ready(s)]:
            record = waiting.pop(slot)
            record["ready_ms"] = round((now - record.pop("_t0")) * 1e3, 2)
            ticket = manager.slots[slot].ticket
            record["engine"] = ticket.result().backend_name if ticket.exception() is None else "error"
            if ticket.exception() is not None:
                record["error"] = str(ticket.exception())[:200]
            elif trace is not None:
                trace.record(
                    record,
                    record["_spec"],
                    record["engine"],
                    record["_added"],
                    record["_submitted"],
                    record.get("_done", now),
                    time.monotonic(),
                )
        if waiting:
            time.sleep(poll_s)
    for slot in slots:
        manager.release(slot)
    for record in records:
        for key in ("_slot", "_spec", "_added", "_submitted", "_done"):
            record.pop(key, None)
    return records


def calibrate(args, items: list, engines: list[str]) -> dict[str, dict[str, float | None]]:
    """Each schema compiled alone by each engine in turn (ms; None: refused or failed), skipping
    the schemas an earlier engine already compiled within `--quick-ms`."""
    times: dict[str, dict[str, float | None]] = {name: {} for name, _ in items}
    for engine in engines:
        manager = build(args, engine)
        for name, schema in items:
            if any(t is not None and t <= args.quick_ms for t in times[name].values()):
                continue
            spec, _, _ = admit(manager, schema)
            if spec is None:
                times[name][engine] = None
                continue
            started = time.perf_counter()
            try:
                manager.compiler.compile_now(spec, timeout_s=args.timeout + 5)
                times[name][engine] = round((time.perf_counter() - started) * 1e3, 2)
            except Exception:  # noqa: BLE001 - a failed compile is "not quick" for this engine
                times[name][engine] = None
        manager.compiler.close()
    return times


def summarise(records: list[dict], quick: set[str]) -> dict:
    served = [r for r in records if "ready_ms" in r]
    traced = [r["trace"] for r in served if "trace" in r]
    stages = [stage for stage in (*Trace.STAGES, "worker_compile", "checks_done") if any(stage in t for t in traced)]
    stage_ms = {stage: percentiles([t[stage] for t in traced if stage in t]) for stage in stages}
    return {
        **({"trace_ms": stage_ms} if traced else {}),
        "all": percentiles([r["ready_ms"] for r in served]),
        "quick": percentiles([r["ready_ms"] for r in served if r["name"] in quick]),
        "admission": percentiles([r["admit_ms"] for r in records]),
        "refused": sum("refused" in r for r in records),
        "errors": sum(r.get("engine") == "error" for r in served),
        "engines": {e: sum(r.get("engine") == e for r in served) for e in sorted({r.get("engine") for r in served})},
    }


def plot(report: dict, path: Path, before: dict | None = None) -> None:
    """The CDF of time to ready per phase; with `before` (an earlier report), its curves dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    runs = [(report, "-", "")] + ([(before, "--", "before, ")] if before else [])
    for run, style, prefix in runs:
        for color, phase in zip(("C0", "C1"), ("sequential", "burst")):
            values = sorted(r["ready_ms"] for r in run["phases"].get(phase, []) if "ready_ms" in r)
            if values:
                cdf = [(i + 1) / len(values) for i in range(len(values))]
                ax.plot(values, cdf, style, color=color, label=f"{prefix}{phase} (n={len(values)})")
    for target, style in ((10, ":"), (150, "--")):
        ax.axvline(target, color="grey", linestyle=style, linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("add_request -> is_ready (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"time to ready, {report['corpus']} schemas, backend {report['backend']}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="generated", help="generated, suite, project, or a directory of *.json")
    parser.add_argument("-n", "--schemas", type=int, default=100, help="schemas per phase")
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--tokenizer", default="deepseek")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="compile budget (s), GuidedConfig.compile_timeout_s"
    )
    parser.add_argument("--poll-ms", type=float, default=0.5)
    parser.add_argument("--quick-ms", type=float, default=50.0, help="'compiles quickly': alone within this")
    parser.add_argument(
        "--calibrate", default="llguidance,xgrammar", help="engines to time each schema alone with ('' skips)"
    )
    parser.add_argument(
        "--alone-from", type=Path, help="take the engines' alone times from an earlier --json of the same schemas"
    )
    parser.add_argument("--phases", default="sequential,burst")
    parser.add_argument("--compile-workers", type=int, help="GuidedConfig.compile_workers (default: the config's)")
    parser.add_argument("--trace", action="store_true", help="time each stage of the path to ready (`Trace`)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot-before", type=Path, help="an earlier --json to draw beside (dashed)")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)

    import logging

    logging.disable(logging.WARNING)
    phases = [p for p in args.phases.split(",") if p]
    items = schema_stream.corpus(args.corpus, args.schemas * len(phases), args.seed)
    groups = {phase: items[i * args.schemas : (i + 1) * args.schemas] for i, phase in enumerate(phases)}
    trace = Trace() if args.trace else None
    manager = build(args, args.backend)
    report: dict = {
        "corpus": args.corpus,
        "backend": args.backend,
        "schemas_per_phase": args.schemas,
        "burst": args.burst,
        "host": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "phases": {},
    }
    poll_s = args.poll_ms / 1e3
    for phase, group in groups.items():
        size = 1 if phase == "sequential" else args.burst
        records = []
        for start in range(0, len(group), size):
            records += run_group(manager, group[start : start + size], poll_s, trace)
        report["phases"][phase] = records
    report["service"] = manager.compiler.stats()
    report["metrics"] = (
        {
            k: v
            for k, v in manager.metrics.snapshot().items()
            if "background" in k or "served_by" in k or "worker_events" in k
        }
        if hasattr(manager.metrics, "snapshot")
        else {}
    )
    manager.compiler.close()
    engines = [e for e in args.calibrate.split(",") if e]
    if args.alone_from:
        earlier = json.loads(args.alone_from.read_text())["phases"].values()
        alone = {r["name"]: r.get("alone_ms", {}) for records in earlier for r in records}
        engines = engines or ["from file"]
    else:
        alone = calibrate(args, [item for group in groups.values() for item in group], engines) if engines else {}
    quick = {name for name, times in alone.items() if any(t is not None and t <= args.quick_ms for t in times.values())}
    for records in report["phases"].values():
        for record in records:
            record["alone_ms"] = alone.get(record["name"], {})
    report["quick_ms"] = args.quick_ms
    report["summary"] = {
        phase: summarise(records, quick if engines else {r["name"] for r in records})
        for phase, records in report["phases"].items()
    }
    for phase, summary in report["summary"].items():
        print(f"{phase:10s} ready ms all {summary['all']}")
        print(f"{'':10s} quick (some engine <= {args.quick_ms:g} ms alone) {summary['quick']}")
        print(
            f"{'':10s} admission {summary['admission']}; refused {summary['refused']}, errors {summary['errors']}, "
            f"served by {summary['engines']}"
        )
        for stage, figures in summary.get("trace_ms", {}).items():
            print(f"{'':10s} stage {stage:15s} ms {figures}")
    slow = [r for records in report["phases"].values() for r in records if "ready_ms" in r and r["name"] not in quick]
    for record in sorted(slow, key=lambda r: -r["ready_ms"])[:15]:
        print(
            f"  not quick: {record['name']} ready {record['ready_ms']} ms, "
            f"alone {record['alone_ms']}, {record['bytes']} B"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(report, args.plot, json.loads(args.plot_before.read_text()) if args.plot_before else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
