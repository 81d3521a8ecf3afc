"""The uniqueItems guard's batched fill and accept cost, before and after, side by side (issue #25 item 1).

    OMP_WAIT_POLICY=PASSIVE python tools/unique_guard_bench.py [--before-tree ../wt-before] [--batch 32]
        [--repeats 3] [--scenarios strings,objects,enum] [--json out.json]

Also run by `tools/guard_kernel_bench.py --part guard` (`guard_rows`). `--batch` requests walk one
output in lockstep (deepseek's tokenizer, 129,280 tokens); each step times one batched
`fill_bitmasks` (the engine's native batch fill, then the guard over the rows), and each accepted
token `accept_token` per row. Scenarios:
  strings  {"tags": [12 strings "tag number i of the list"]}: issue #11's (an open string language)
  objects  [12 {"id": i, "name": "tag number i of the list"}], additionalProperties false: object
           items whose last property is open (each member's end asks whether closing would repeat)
  enum     {"tags": [12 of an enum of 500 such strings]}: a finite domain past enumeration
Variants, interleaved walk by walk: unguarded (the schema without uniqueItems), after (this tree's
guard), python (this tree with `native.ENABLED = False`: the Python reference alone; strings only
unless --python-all: elsewhere it is what before ran), and before (the tree at --before-tree,
built, in a worker process with that tree first on its path: its own default path, and its own
unguarded walk, so each ratio is of times taken in one process). Absolute times depend on what
else the machine runs: read the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the harness sets it, before torch loads

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ITEMS = 12
VALUES = [f"tag number {i} of the list" for i in range(500)]
OBJECT = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
          "required": ["id", "name"], "additionalProperties": False}


def scenario(name: str, unique: bool) -> tuple[dict, str]:
    """(schema, output) of a scenario, with or without ``uniqueItems``."""
    flag = {"uniqueItems": True} if unique else {}
    if name == "objects":
        return ({"type": "array", "items": OBJECT, **flag},
                json.dumps([{"id": i, "name": VALUES[i]} for i in range(ITEMS)]))
    items = {"type": "string", "enum": VALUES} if name == "enum" else {"type": "string"}
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": items, **flag}}, "required": ["tags"]}
    return schema, json.dumps({"tags": VALUES[:ITEMS]})


class Walker:
    """Backends and compiled grammars of one process, and one timed walk."""

    def __init__(self):
        from fd_guided import GuidedConfig
        from fd_guided.registry import get_backend_class
        from fd_guided.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer("deepseek")
        self.backends = {name: get_backend_class(name)(self.tokenizer, vocab_size=self.tokenizer.padded_vocab_size,
                                                        config=GuidedConfig(backend=name))
                         for name in ("xgrammar", "llguidance")}
        self.compiled: dict = {}

    def walk(self, engine: str, name: str, unique: bool, batch: int, native: bool = True) -> dict:
        from fd_guided import parse_guided_request
        from fd_guided.unique import native as native_module

        backend = self.backends[engine]
        schema, text = scenario(name, unique)
        key = (engine, name, unique)
        if key not in self.compiled:
            self.compiled[key] = backend.compile(parse_guided_request({"guided_json": schema}))
        ids = self.tokenizer.encode(text)
        grammars = [backend.new_grammar(self.compiled[key]) for _ in range(batch)]
        bitmask = torch.zeros((batch, (backend.vocab_size + 31) // 32), dtype=torch.int32)
        rows = list(range(batch))
        fills, accepts = [], []
        native_module.ENABLED = native and native_module.AVAILABLE
        try:
            for token in ids:
                started = time.perf_counter()
                backend.fill_bitmasks(grammars, bitmask, rows)
                fills.append(time.perf_counter() - started)
                for grammar in grammars:
                    started = time.perf_counter()
                    ok = grammar.accept_token(token)
                    accepts.append(time.perf_counter() - started)
                    assert ok, (name, engine, self.tokenizer.decode([token]))
        finally:
            native_module.ENABLED = native_module.AVAILABLE
        return {"fills": fills, "accepts": accepts}


def serve() -> None:
    """The before tree's worker: one walk per JSON line on stdin, its times as one line out."""
    import fd_guided

    walker = Walker()
    print(json.dumps({"fd_guided": fd_guided.__file__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(walker.walk(job["engine"], job["scenario"], job["unique"], job["batch"])), flush=True)


class Before:
    """The worker on the before tree (its fd_guided first on the path)."""

    def __init__(self, tree: Path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env, cwd=str(tree))
        self.module = json.loads(self.process.stdout.readline())["fd_guided"]
        if not self.module.startswith(str(tree)):
            raise SystemExit(f"the before worker imported {self.module}, not {tree}'s fd_guided")

    def walk(self, engine: str, name: str, unique: bool, batch: int) -> dict:
        job = {"engine": engine, "scenario": name, "unique": unique, "batch": batch}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def guard_rows(batch: int = 32, repeats: int = 3, scenarios=("strings", "objects", "enum"),
               before_tree: Path | None = None, python_all: bool = False) -> list[dict]:
    """One report row per engine and scenario (the module docstring), for this tree's fd_guided."""
    if str(REPO) not in sys.path[:1]:
        sys.path.insert(0, str(REPO))  # (a script's path starts at tools/: an installed fd_guided would win)
    import fd_guided

    if not fd_guided.__file__.startswith(str(REPO)):
        raise SystemExit(f"imported {fd_guided.__file__}, not this tree's fd_guided: import it first from {REPO}")
    walker = Walker()
    before = Before(before_tree) if before_tree else None
    out = []
    try:
        for engine in ("xgrammar", "llguidance"):
            for name in scenarios:
                variants = {"unguarded": partial(walker.walk, engine, name, False, batch),
                            "after": partial(walker.walk, engine, name, True, batch)}
                if name == "strings" or python_all:
                    variants["python"] = partial(walker.walk, engine, name, True, batch, native=False)
                if before is not None:
                    variants["before_unguarded"] = partial(before.walk, engine, name, False, batch)
                    variants["before"] = partial(before.walk, engine, name, True, batch)
                for run in variants.values():  # warm-up: first compiles, token tables
                    run()
                times: dict[str, dict[str, list[float]]] = {label: {"fills": [], "accepts": []} for label in variants}
                for _ in range(repeats):  # interleaved, so drifting load hits each alike
                    for label, run in variants.items():
                        walked = run()
                        times[label]["fills"] += walked["fills"]
                        times[label]["accepts"] += walked["accepts"]
                out.append(report_row(engine, name, batch, repeats, times))
                out[-1]["trees"] = {"after": str(REPO), "before": str(before_tree) if before_tree else None}
                print(json.dumps(out[-1]), flush=True)
    finally:
        if before is not None:
            before.close()
    return out


def report_row(engine: str, name: str, batch: int, repeats: int, times: dict) -> dict:
    median = {label: statistics.median(t["fills"]) * 1e3 for label, t in times.items()}
    mean = {label: statistics.fmean(t["fills"]) * 1e3 for label, t in times.items()}
    row = {"engine": engine, "scenario": name, "batch": batch,
           "steps": len(times["unguarded"]["fills"]) // repeats,
           "fill_ms_median": median, "fill_ms_mean": mean,
           "accept_us_per_token_median": {label: statistics.median(t["accepts"]) * 1e6 for label, t in times.items()}}
    ratios = {"after_median": median["after"] / median["unguarded"], "after_mean": mean["after"] / mean["unguarded"]}
    if "python" in median:
        ratios["python_median"] = median["python"] / median["unguarded"]
    if "before" in median:
        ratios["before_median"] = median["before"] / median["before_unguarded"]
        ratios["before_mean"] = mean["before"] / mean["before_unguarded"]
    row["guarded_over_unguarded"] = ratios
    return row


def plot_panel(ax, rows: list[dict]) -> None:
    """The guard's panel of tools/guard_kernel_bench.py's plot: median batched fill per variant."""
    series = [("unguarded", "unguarded"), ("before", "guarded, before"), ("python", "guarded, Python reference"),
              ("after", "guarded, after")]
    labels = [f"{r['engine']}\n{r.get('scenario', 'strings')}" for r in rows]
    width = 0.8 / len(series)
    for offset, (name, label) in enumerate(series):
        positions = [i + (offset - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(positions, [r["fill_ms_median"].get(name, 0) for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("batched fill per step, median ms (log)")
    ax.legend(fontsize=7)
    ax.set_title(f"uniqueItems guard ({rows[0]['batch'] if rows else 32} rows in lockstep)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before-tree", type=Path, help="a built worktree whose guard is 'before'")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default="strings,objects,enum")
    parser.add_argument("--python-all", action="store_true", help="the Python reference in every scenario")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    rows = guard_rows(args.batch, args.repeats, tuple(args.scenarios.split(",")), args.before_tree, args.python_all)
    if args.json:
        args.json.write_text(json.dumps({"guard": rows}, indent=1))


if __name__ == "__main__":
    main()
