"""How long a decode step waits for its mask fills after the forward (issue #25 item 2, per step).

    OMP_WAIT_POLICY=PASSIVE python tools/fill_tails.py ... --save-sample /tmp/fill_sample.json
    OMP_WAIT_POLICY=PASSIVE python tools/step_tails.py --sample /tmp/fill_sample.json [--batch 32]
        [--forward sleep:10,paddle:10] [--modes plain] [--passes 2] [--json docs/bench_step_tails.json]

The outputs `tools/fill_tails.py` walked (public schemas' valid instances and decoded outputs) are
replayed through `GuidedDecodingManager` (backend ``auto``, compiles in worker processes, every
schema compiled before the run, as a warm server serves it) as a host drives it: `--batch` slots,
each holding one output; every step `begin_step` (the fill starts on the background thread), a
stand-in forward, `apply` (joins the fill and masks a ``[rows, 129_280]`` fp32 logits tensor),
`accept` of each output's next token; a slot whose output ended takes the next one. Reported per
forward and mode: how long `apply` waited for the fill after the forward (`StepTimings.fill_join`
per step: p50/p90/p99/max and the steps that waited over 0.1 / 1 ms), the fill's own time per
step, and the step's time.

Forwards (`kind:ms`): ``sleep`` (a GPU host: the host thread waits, the cores are free), ``paddle``
(a CPU host: fp32 Paddle matmuls calibrated to take `ms` alone, on the cores the fill needs),
``ops`` (a GPU host's thread launching kernels: small Paddle ops in a loop for `ms`, the GIL held
between them), ``python`` (a host thread busy in Python for `ms` that never lets the GIL go by
itself: the fill's Python parts wait for Python's switch interval, 5 ms).

Modes are the switches a design under test adds (see `MODES`); passes alternate between them
(ABAB...) so every mode sees the same load. Figures are one process's, on one machine: compare
modes within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import deque
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SWITCH_INTERVAL = sys.getswitchinterval()


# mode name -> (GuidedConfig overrides, GuidedDecodingManager keyword arguments, a set-up of the
# built manager): the switches of the designs under test. "plain" is the fill as it was before
# them; "first_masks" the default now (first states' rows copied: fd_guided.manager.first_masks).
def _without(*parts: str):
    def setup(manager) -> None:
        for part in parts:
            setattr(manager.step.fill, part, None)

    return setup


def _switch_interval(seconds: float):
    """The host sets Python's switch interval (how long a thread waiting for the GIL waits before
    it asks the holder to drop it; 5 ms by default), for this mode's passes only."""

    def setup(manager) -> None:
        sys.setswitchinterval(seconds)

    return setup


MODES: dict[str, tuple[dict, dict, object]] = {
    "plain": ({}, {}, _without("first_masks")),
    "first_masks": ({}, {}, None),
    # Every engine's rows in one native call, however few (one GIL hand-back per engine and step).
    "one_call": ({"parallel_fill_min_rows": 1}, {}, None),
    "switch_0.5ms": ({}, {}, _switch_interval(0.0005)),
    "inline": ({}, {"overlap_fill": False}, _without("first_masks")),
}


def percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 4)  # noqa: E731
    return {
        "n": len(ordered),
        "p50_ms": pick(0.5),
        "p90_ms": pick(0.9),
        "p99_ms": pick(0.99),
        "max_ms": round(ordered[-1] * 1e3, 4),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 4),
    }


class Forward:
    """A stand-in for the model's forward pass (see the module docstring)."""

    def __init__(self, text: str):
        self.kind, _, ms = text.partition(":")
        self.ms = float(ms or 10)
        self.label = f"{self.kind}:{ms or 10}"
        if self.kind == "paddle":
            import paddle

            paddle.set_device("cpu")
            self.paddle = paddle
            self.a = paddle.rand([512, 512], dtype="float32")
            self.b = paddle.rand([512, 512], dtype="float32")
            for _ in range(3):
                self._matmul(1)
            started = time.perf_counter()
            self._matmul(20)
            one = (time.perf_counter() - started) / 20
            self.repeat = max(1, round(self.ms / 1e3 / one))
        elif self.kind == "ops":
            import paddle

            paddle.set_device("cpu")
            self.paddle = paddle
            self.a = paddle.rand([64], dtype="float32")
        elif self.kind not in ("sleep", "python"):
            raise SystemExit(f"unknown forward {text!r}: sleep:MS, paddle:MS, ops:MS or python:MS")

    def _matmul(self, count: int) -> None:
        out = None
        for _ in range(count):
            out = self.paddle.matmul(self.a, self.b)
        float(out[0, 0])  # wait for it

    def __call__(self) -> None:
        if self.kind == "sleep":
            time.sleep(self.ms / 1e3)
        elif self.kind == "paddle":
            self._matmul(self.repeat)
        elif self.kind == "ops":
            deadline = time.perf_counter() + self.ms / 1e3
            x = self.a
            while time.perf_counter() < deadline:
                x = self.paddle.tanh(x * 0.5 + 0.1)
        else:
            deadline = time.perf_counter() + self.ms / 1e3
            total = 0
            while time.perf_counter() < deadline:
                total += sum(range(200))


def load_sample(path: Path, limit: int | None) -> list[tuple[str, dict, list[int]]]:
    sample = [(case, schema, tokens) for case, schema, tokens, *_ in json.loads(path.read_text())]
    return sample[:limit] if limit else sample


def compile_all(manager, sample) -> tuple[list[tuple[object, list[int], str]], dict]:
    """Admit and compile each distinct schema once; returns (spec, tokens, case) per admitted
    output and how many schemas each engine serves."""
    from fd_guided import InvalidGrammarError

    specs: dict[str, object] = {}
    engines: dict[str, int] = {}
    outputs = []
    for case, schema, tokens in sample:
        key = json.dumps(schema, sort_keys=True)
        if key not in specs:
            try:
                spec = manager.validate({"guided_json": schema})
                compiled = manager.compiler.compile_now(spec)
                engines[compiled.backend_name] = engines.get(compiled.backend_name, 0) + 1
                specs[key] = spec
            except (InvalidGrammarError, ValueError, RecursionError):
                specs[key] = None
        if specs[key] is not None and tokens:
            outputs.append((specs[key], tokens, case))
    return outputs, engines


def run_pass(manager, outputs, forward: Forward, batch: int, logits) -> dict:
    """Every output through `batch` slots; per step: the fill wait in apply, the fill, the step."""
    timings = manager.timings
    queue = deque(outputs)
    active: dict[int, list] = {}  # slot -> [tokens, position]

    recompiled = 0

    def start(slot: int) -> None:
        # A host samples a guided request's first token once it is ready: a schema whose grammar
        # left the compile cache since `compile_all` is compiled again first (counted).
        nonlocal recompiled
        if queue:
            spec, tokens, _ = queue.popleft()
            manager.add_request(slot, spec, prefill_done=True)
            if not manager.is_ready(slot):
                recompiled += 1
                manager.wait_ready([slot])
            active[slot] = [tokens, 0]

    for slot in range(batch):
        start(slot)
    waits, fills, steps, begins, accepts, rows_per_step, spans = [], [], [], [], [], [], []
    errors = 0
    while active:
        rows = sorted(active)
        step_started = time.perf_counter()
        fill_before, join_before = timings.fill, timings.fill_join
        manager.begin_step(rows)
        begun = time.perf_counter()
        forward()
        manager.apply(logits[: len(rows)])
        applied = time.perf_counter()
        finishes = manager.accept([active[slot][0][active[slot][1]] for slot in rows])
        ended_at = time.perf_counter()
        steps.append(ended_at - step_started)
        spans.append((step_started, ended_at))
        begins.append(begun - step_started)
        accepts.append(ended_at - applied)
        waits.append(timings.fill_join - join_before)
        fills.append(timings.fill - fill_before)
        rows_per_step.append(len(rows))
        ended = {finish.slot for finish in finishes}
        errors += sum(finish.reason == "error" for finish in finishes)
        for slot in rows:
            active[slot][1] += 1
            if slot in ended or active[slot][1] >= len(active[slot][0]):
                manager.release(slot)
                del active[slot]
                start(slot)
    return {
        "waits": waits,
        "fills": fills,
        "steps": steps,
        "begins": begins,
        "accepts": accepts,
        "rows": rows_per_step,
        "spans": spans,
        "errors": errors,
        "recompiled": recompiled,
    }


def summarise(runs: list[dict], gc_pauses: GcPauses) -> dict:
    waits = [w for run in runs for w in run["waits"]]
    spans = [span for run in runs for span in run["spans"]]
    # Steps during which the collector paused for over 1 ms (on either thread): not the fill's.
    collected = gc_pauses.overlapping(spans, 1e-3)
    return {
        "steps": len(waits),
        "rows_mean": round(statistics.fmean(r for run in runs for r in run["rows"]), 1),
        "wait": percentiles_ms(waits),
        "steps_waiting_over_0.1ms": sum(w > 1e-4 for w in waits),
        "steps_waiting_over_1ms": sum(w > 1e-3 for w in waits),
        "steps_with_a_gc_pause_over_1ms": len(collected),
        "wait_without_those": percentiles_ms([w for k, w in enumerate(waits) if k not in collected]),
        "fill": percentiles_ms([f for run in runs for f in run["fills"]]),
        "begin_step": percentiles_ms([s for run in runs for s in run["begins"]]),
        "accept": percentiles_ms([s for run in runs for s in run["accepts"]]),
        "step": percentiles_ms([s for run in runs for s in run["steps"]]),
        "rejected_outputs": sum(run["errors"] for run in runs),
        "recompiled_outputs": sum(run["recompiled"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=Path, required=True, help="tools/fill_tails.py --save-sample output")
    parser.add_argument("--limit", type=int, help="only the first N outputs of the sample")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--forward", default="sleep:10,paddle:10")
    parser.add_argument("--modes", default="plain")
    parser.add_argument("--passes", type=int, default=2, help="passes per mode and forward, alternating modes")
    parser.add_argument("--repo", type=Path, default=REPO, help="the tree whose fd_guided to import")
    parser.add_argument("--cache-mb", type=int, default=4096, help="the compile cache's bound: every schema's grammar")
    parser.add_argument("--lock", type=Path, help="hold this flock (e.g. /tmp/fd_bench.lock) for the timed passes only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo))
    import torch

    from fd_guided import GuidedConfig, GuidedDecodingManager, load_tokenizer
    from fd_guided.compile import CompileService
    from fd_guided.registry import create_backend

    tokenizer = load_tokenizer("deepseek")
    vocab = tokenizer.padded_vocab_size
    modes = args.modes.split(",")
    # Compiles before the timed passes, at the lowest priority; each request then finds its
    # schema compiled (a warm server), served by the engine auto prefers. Modes with the same
    # config share one backend and compile service.
    base = GuidedConfig(backend="auto", auto_first_ready=False, compile_nice=19, cache_limit_bytes=args.cache_mb << 20)
    sample = load_sample(args.sample, args.limit)
    started = time.time()
    backends, services, prepared = {}, {}, {}
    for mode in modes:
        overrides = json.dumps(MODES[mode][0], sort_keys=True)
        if overrides not in services:
            config = GuidedConfig(**{**vars_of(base), **MODES[mode][0]})
            backends[overrides] = create_backend("auto", tokenizer, vocab_size=vocab, config=config)
            services[overrides] = CompileService(backends[overrides])
            probe = GuidedDecodingManager(backends[overrides], max_num_seqs=1, compile_service=services[overrides])
            prepared[overrides] = compile_all(probe, sample)
            probe.close()
    compile_s = time.time() - started
    logits = torch.zeros((args.batch, vocab), dtype=torch.float32)
    lock = open(args.lock, "w") if args.lock else None  # noqa: SIM115 - held until the process exits
    if lock is not None:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
    load_before = os.getloadavg()
    gc_pauses = GcPauses()
    results: dict = {}
    for text in args.forward.split(","):
        forward = Forward(text)
        runs: dict[str, list] = {mode: [] for mode in modes}
        for _ in range(args.passes):
            for mode in modes:
                overrides, kwargs, setup = MODES[mode]
                key = json.dumps(overrides, sort_keys=True)
                manager = GuidedDecodingManager(
                    backends[key], max_num_seqs=args.batch, compile_service=services[key], **kwargs
                )
                if callable(setup):
                    setup(manager)
                runs[mode].append(run_pass(manager, prepared[key][0], forward, args.batch, logits))
                manager.close()
                sys.setswitchinterval(DEFAULT_SWITCH_INTERVAL)
        results[forward.label] = {mode: summarise(runs[mode], gc_pauses) for mode in modes}
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "compile_s": round(compile_s, 1),
        "gc_pauses_ms": gc_pauses.summary(),
        "outputs": len(next(iter(prepared.values()))[0]),
        "served_by": next(iter(prepared.values()))[1],
        "batch": args.batch,
        "passes": args.passes,
        "results": results,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    for service in services.values():
        service.close()
    for backend in backends.values():
        backend.close()


class GcPauses:
    """Python's collector runs on whichever thread allocates past its threshold, host or fill:
    each pause is timed so a step's maximum can be told apart from one."""

    def __init__(self):
        import gc

        self.pauses: list[tuple[int, float]] = []
        self.spans: list[tuple[float, float]] = []
        self._started = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            ended = time.perf_counter()
            self.pauses.append((info["generation"], ended - self._started))
            self.spans.append((self._started, ended))

    def overlapping(self, spans: list[tuple[float, float]], longer_than: float) -> set[int]:
        """Indices of `spans` that overlap a pause longer than `longer_than` seconds."""
        long = [(a, b) for a, b in self.spans if b - a > longer_than]
        return {k for k, (start, end) in enumerate(spans) if any(a < end and b > start for a, b in long)}

    def summary(self) -> dict:
        return {
            f"gen{generation}": percentiles_ms([p for g, p in self.pauses if g == generation])
            for generation in (0, 1, 2)
        }


def vars_of(config) -> dict:
    import dataclasses

    return {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}


if __name__ == "__main__":
    main()
