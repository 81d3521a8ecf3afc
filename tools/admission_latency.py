"""How long admission holds the caller's thread: cold (first sight) and warm (seen before), per request.

    python tools/admission_latency.py SCHEMA_DIR [SCHEMA_DIR ...] [--backend auto] [--hostile]
        [--budget-ms 2 | --budget-ms inline] [--json out.json]

Every ``*.json`` under the directories is admitted as ``{"guided_json": text}`` through
`parse_guided_request` with the backend's checker (what `manager.validate` and FastDeploy's engine
checker run on their request thread), once cold (the admission caches cleared) and then again
warm. ``--hostile`` adds the hostile-input sets of tests/admission/test_hostile_inputs.py and
tests/schema/test_hostile_schemas.py. Prints p50/p90/p99/max per set, and the slowest cold ones.
``--budget-ms`` sets `GuidedConfig.admission_budget_s` (default: the config's default; ``inline``:
every verdict at admission, as before issue #22); a verdict left to the compile worker shows as
``deferred`` (admitted here; the worker decides).
Times are wall clock on whatever machine runs it: wrap it in ``flock /tmp/fd_bench.lock`` on a shared one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "schema"), str(REPO / "tests" / "admission")]

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request  # noqa: E402
from fd_guided.admission import cache, deferred  # noqa: E402


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


def _admit(fields, config) -> tuple[float, str]:
    before = deferred.STATS["deferred"]
    started = time.perf_counter()
    try:
        parse_guided_request(fields, config)
        verdict = "deferred" if deferred.STATS["deferred"] > before else "admitted"
    except InvalidGrammarError as error:
        verdict = f"refused: {str(error)[:80]}"
    return time.perf_counter() - started, verdict


def _fresh(fields: dict) -> dict:
    return {
        name: value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
        if isinstance(value, str)
        else value
        for name, value in fields.items()
    }


def measure(items: list[tuple[str, dict]], config) -> dict:
    cold, warm, slowest, verdicts = [], [], [], {"admitted": 0, "deferred": 0, "refused": 0}
    for name, fields in items:
        cache.PARSED.clear()
        cache.CHECKED.clear()
        seconds, verdict = _admit(fields, config)
        cold.append(seconds)
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
    }


def schema_items(folders: list[str]) -> list[tuple[str, dict]]:
    items = []
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.json")):
            items.append((path.name, {"guided_json": path.read_text(encoding="utf-8", errors="replace")}))
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
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    config = GuidedConfig(backend=args.backend)
    if args.budget_ms is not None:
        budget = None if args.budget_ms == "inline" else float(args.budget_ms) / 1e3
        config = config.replace(admission_budget_s=budget)
    parse_guided_request({"guided_json": {"type": "object"}}, config)  # imports and first-use costs
    report = {}
    if args.folders:
        report["schemas"] = measure(schema_items(args.folders), config)
    if args.hostile:
        report["hostile"] = measure(hostile_items(), config)
    for name, result in report.items():
        print(f"{name}: cold {json.dumps({k: round(v, 2) for k, v in result['cold'].items()})}")
        print(f"{name}: warm {json.dumps({k: round(v, 3) for k, v in result['warm'].items()})}")
        print(f"{name}: cold verdicts {json.dumps(result['cold_verdicts'])}")
        for row in result["slowest_cold"]:
            print("   ", row)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
