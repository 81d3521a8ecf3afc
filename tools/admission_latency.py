"""How long admission holds the caller's thread: cold (first sight) and warm (seen before), per request.

    python tools/admission_latency.py SCHEMA_DIR [SCHEMA_DIR ...] [--backend auto] [--hostile]
        [--budget-ms 2 | --budget-ms inline] [--as-objects] [--unread-chars N] [--json out.json]

Every ``*.json`` under the directories is admitted as ``{"guided_json": text}`` (with
``--as-objects``: the document ``json.loads`` reads, as FastDeploy and HTTP servers pass it) through
`parse_guided_request` with the backend's checker (what `manager.validate` and FastDeploy's engine
checker run on their request thread), once cold (the admission caches cleared) and then again
warm. ``--hostile`` adds the hostile-input sets of tests/admission/test_hostile_inputs.py and
tests/schema/test_hostile_schemas.py. Prints p50/p90/p99/max per set, and the slowest cold ones.
``--budget-ms`` sets `GuidedConfig.admission_budget_s` (default: the config's default; ``inline``:
every verdict at admission, as before issue #22); a verdict left to the compile worker shows as
``deferred`` (admitted here; the worker decides). Python's garbage collector pauses whatever
thread allocates when it runs (a full pass over this process's heap: ~0.1 s on a loaded 2-core
host); the time each admission spent in such pauses is reported too, the percentiles without it,
and how many passes of each generation fell in cold admissions (what allocating less shows as).
``--check-deferred``: no timing; for every request, the verdict it finally gets with no budget at all
(admission, then the checks left to the worker) against the inline verdict, message included.
Times are wall clock on whatever machine runs it (wrap it in ``flock /tmp/fd_bench.lock`` on a shared
one), and this thread's CPU time (``cold_cpu``): the wall time less what other processes took of the
core meanwhile, the part that does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "schema"), str(REPO / "tests" / "admission")]

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request  # noqa: E402
from fd_guided.admission import cache  # noqa: E402

try:  # a tree before issue #22's bounded admission has none: everything is inline there
    from fd_guided.admission.deferred import STATS as DEFERRALS  # noqa: E402
except ImportError:
    DEFERRALS = {"deferred": 0}


def _percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {}
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {
        "n": len(ordered),
        "p50_ms": pick(0.5) * 1e3,
        "p90_ms": pick(0.9) * 1e3,
        "p99_ms": pick(0.99) * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


class _GcClock:
    """Seconds spent in garbage collection (gc.callbacks): wall (`total`) and CPU (`cpu`)."""

    def __init__(self):
        self.total, self.cpu, self._began, self._began_cpu = 0.0, 0.0, 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began, self._began_cpu = time.perf_counter(), time.thread_time()
        else:
            self.total += time.perf_counter() - self._began
            self.cpu += time.thread_time() - self._began_cpu


GC = _GcClock()


def _admit(fields, config) -> tuple[float, str, float]:
    """(wall seconds, verdict, this thread's CPU seconds: the wall time less what the machine's
    other processes took from it, the part a quiet host would see)."""
    before = DEFERRALS["deferred"]
    started, cpu = time.perf_counter(), time.thread_time()
    try:
        parse_guided_request(fields, config)
        verdict = "deferred" if DEFERRALS["deferred"] > before else "admitted"
    except InvalidGrammarError as error:
        verdict = f"refused: {str(error)[:80]}"
    return time.perf_counter() - started, verdict, time.thread_time() - cpu


def _fresh(fields: dict) -> dict:
    """The same request as new objects (a host's next request): new text, or a copy of a document."""
    return {name: _copy(value) for name, value in fields.items()}


def _copy(value):
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
    if isinstance(value, dict):
        return {key: _copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_copy(child) for child in value]
    return value


def measure(items: list[tuple[str, dict]], config) -> dict:
    cold, warm, slowest, verdicts = [], [], [], {"admitted": 0, "deferred": 0, "refused": 0}
    cold_no_gc, cold_cpu, cold_cpu_no_gc, gc_pauses = [], [], [], []
    collections = [0, 0, 0]  # the collector's passes per generation that fell in cold admissions
    for name, fields in items:
        cache.PARSED.clear()
        cache.CHECKED.clear()
        in_gc, in_gc_cpu, passes = GC.total, GC.cpu, [stat["collections"] for stat in gc.get_stats()]
        seconds, verdict, cpu = _admit(fields, config)
        in_gc, in_gc_cpu = GC.total - in_gc, GC.cpu - in_gc_cpu
        for generation, stat in enumerate(gc.get_stats()):
            collections[generation] += stat["collections"] - passes[generation]
        cold.append(seconds)
        cold_no_gc.append(seconds - in_gc)
        cold_cpu.append(cpu)
        cold_cpu_no_gc.append(cpu - in_gc_cpu)
        if in_gc > 1e-3:
            gc_pauses.append(round(in_gc * 1e3, 1))
        slowest.append((seconds, name, verdict))
        verdicts[verdict.split(":")[0]] += 1
        # A new request brings new objects: text whose hash Python has not cached yet.
        warm.append(min(_admit(_fresh(fields), config)[0] for _ in range(3)))
    slowest.sort(reverse=True)
    return {
        "cold": _percentiles(cold),
        "warm": _percentiles(warm),
        "slowest_cold": [(round(s * 1e3, 1), n, v) for s, n, v in slowest[:8]],
        "cold_verdicts": verdicts,
        "cold_without_gc": _percentiles(cold_no_gc),
        "cold_cpu": _percentiles(cold_cpu),
        "cold_cpu_without_gc": _percentiles(cold_cpu_no_gc),
        "cold_gc_pauses_over_1ms": gc_pauses,
        "cold_gc_collections_per_generation": collections,
        "seconds": {
            "cold": cold,
            "cold_without_gc": cold_no_gc,
            "cold_cpu": cold_cpu,
            "cold_cpu_without_gc": cold_cpu_no_gc,
            "warm": warm,
        },
    }


def combined(results: list[dict]) -> dict:
    """Percentiles over the requests of several sets together (the targets' "over SchemaStore and
    the hostile set")."""
    return {
        kind: _percentiles([seconds for result in results for seconds in result["seconds"][kind]])
        for kind in ("cold", "cold_without_gc", "cold_cpu", "cold_cpu_without_gc", "warm")
    }


def check_deferred(items: list[tuple[str, dict]], backend: str) -> dict:
    """Inline verdict vs the eventual one with a budget of 0 (every check left to the worker)."""
    try:
        from fd_guided.admission.deferred import finish_deferred_checks
    except ImportError:  # a tree before grammar checks could be deferred
        from fd_guided.admission.deferred import finish_schema_checks as finish_deferred_checks
    from fd_guided.registry import get_backend_class
    from fd_guided.spec import check_with_backend

    def eventual(fields: dict, config) -> str:
        try:
            spec = parse_guided_request(fields, config)
            if spec is not None:
                finish_deferred_checks(spec)
                check_with_backend(get_backend_class(config.backend), spec)
        except InvalidGrammarError as error:
            return str(error)
        return "admitted"

    inline = GuidedConfig(backend=backend, admission_budget_s=None)
    differ = []
    for name, fields in items:
        verdicts = []
        for config in (inline, inline.replace(admission_budget_s=0.0)):
            cache.PARSED.clear()
            cache.CHECKED.clear()
            verdicts.append(eventual(fields, config))
        if verdicts[0] != verdicts[1]:
            differ.append((name, verdicts[0][:160], verdicts[1][:160]))
    return {"requests": len(items), "same": len(items) - len(differ), "differ": differ}


def schema_items(folders: list[str], as_objects: bool = False) -> list[tuple[str, dict]]:
    """``{"guided_json": text}`` per file; `as_objects`: its document instead (files that are not
    JSON json.loads reads stay text)."""
    items = []
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.json")):
            value = path.read_text(encoding="utf-8", errors="replace")
            if as_objects:
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            items.append((path.name, {"guided_json": value}))
    return items


def hostile_items() -> list[tuple[str, dict]]:
    import test_hostile_inputs
    import test_hostile_schemas

    items = [(name, fields) for name, (fields, _) in test_hostile_inputs.HOSTILE.items() if isinstance(fields, dict)]
    items += [
        (name, {"guided_json": schema, "guided_strict": False}) for name, schema in test_hostile_schemas.HOSTILE.items()
    ]
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--hostile", action="store_true")
    parser.add_argument("--budget-ms", help="admission budget in ms, or 'inline' (default: the config's)")
    parser.add_argument("--check-deferred", action="store_true", help="compare verdicts, no timing")
    parser.add_argument("--as-objects", action="store_true", help="schemas as documents, not text")
    parser.add_argument("--unread-chars", type=int, help="admission.unread.UNREAD_TEXT_CHARS (choosing it)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.unread_chars is not None:
        from fd_guided.admission import unread

        unread.UNREAD_TEXT_CHARS = args.unread_chars
    config = GuidedConfig(backend=args.backend)
    if args.budget_ms is not None:
        budget = None if args.budget_ms == "inline" else float(args.budget_ms) / 1e3
        config = config.replace(admission_budget_s=budget)
    parse_guided_request({"guided_json": {"type": "object"}}, config)  # imports and first-use costs
    try:  # what an engine pays at start-up (a tree before issue #22 has no warm_up)
        from fd_guided.admission.parse import warm_up

        warm_up(config)
    except ImportError:
        pass
    report = {}
    if args.check_deferred:
        items = (schema_items(args.folders, args.as_objects) if args.folders else []) + (
            hostile_items() if args.hostile else []
        )
        result = check_deferred(items, args.backend)
        print(json.dumps(result, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0 if not result["differ"] else 1
    if args.folders:
        report["schemas"] = measure(schema_items(args.folders, args.as_objects), config)
    if args.hostile:
        report["hostile"] = measure(hostile_items(), config)
    if len(report) > 1:
        report["all"] = combined(list(report.values()))
        print(f"all: {json.dumps({k: {q: round(v, 3) for q, v in p.items()} for k, p in report['all'].items()})}")
    for name, result in report.items():
        if name == "all":
            continue
        print(f"{name}: cold {json.dumps({k: round(v, 2) for k, v in result['cold'].items()})}")
        print(f"{name}: warm {json.dumps({k: round(v, 3) for k, v in result['warm'].items()})}")
        print(f"{name}: cold verdicts {json.dumps(result['cold_verdicts'])}")
        print(f"{name}: cold without GC {json.dumps({k: round(v, 2) for k, v in result['cold_without_gc'].items()})}")
        print(f"{name}: cold CPU {json.dumps({k: round(v, 2) for k, v in result['cold_cpu'].items()})}")
        print(f"{name}: GC pauses over 1 ms during cold admissions {result['cold_gc_pauses_over_1ms']}")
        print(f"{name}: GC passes (generations 0-2) in cold admissions {result['cold_gc_collections_per_generation']}")
        for row in result["slowest_cold"]:
            print("   ", row)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
