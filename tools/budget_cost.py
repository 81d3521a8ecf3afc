"""Budget steering's step cost on the same tokens (issue #24 item 4): closing vs far vs no budget.

    python tools/budget_cost.py OUT.json [--backends xgrammar llguidance auto] [--steps 300]

"Guided step time at batch 32 with every row in its closing phase stays within 1.10x of guided rows
that are not; rows far from their budget pay nothing measurable." Measured so that only the
budget differs: five `GuidedDecodingManager`s (one compile service and backend shared) hold 32
requests each and walk the same token sequences in lockstep, one step of each in turn (in a seeded
random order every step), the same requests ending and being replaced at the same steps; in five
rounds, each manager runs each mode once (`measure`):

  closing  ``max_tokens`` = the schema's shortest document + the headroom: every row is in its
           closing phase at every step (steering keeps it so: left - need never grows)
  filled   the same, its closing rows filled over the vocabulary and then restricted (the path
           before closing rows were written from their candidates: ``closing_rows = False``)
  far      ``max_tokens`` = 2**20: budgeted, far from it
  none     no ``max_tokens``: no budget at all
  control  the same as none, on another manager: control / none is what two identical walks
           differ by in the same run (the noise floor of every other ratio)

Each sequence is recorded first: the schema (the 33 of tests/corpus.py, DeepSeek's vocabulary)
decoded once by the adversary of tests/budget under the closing budget (so every token is one the
closing row allows; the grammar's own row allows it too, so the far and unbudgeted rows do). Every
timed step checks that each row allows its token and that each request ends at its last one.
Timed: begin_step + apply + accept (the fill thread's work shows in apply's join: no forward to
overlap), the CPU kernel masking real 129,280-wide float32 logits (restored outside the timed part).
Reported per backend and mode: median and mean step; closing / far, filled / far, far / none and
control / none as the ratio of the medians, of the means and the median of the per-step ratios;
the steering's own time per step: `BudgetSteering.hook_ns`, the nanoseconds its two hooks spent
(one clock pair around each call: `prepare`, once a step for the step's budgeted rows, and
`steer`; no wrapper per call), read before and after each timed step; as ms per step (mean and
median) and as a share of the mode's median step, next to the noise floor (control / none's
distance from 1); split into a step's time without first looks and each first look's. A
checkout without `hook_ns` (before fd_guided.budget.far) is timed by wrappers as before (~1 us a
call, included); `hook_timer` in the output says which.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This checkout's fd_guided first (the venv's editable install points at the main checkout).
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "budget")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from adversary import pick  # noqa: E402
from corpus import SCHEMAS  # noqa: E402

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request  # noqa: E402
from fd_guided.budget.steer import HEADROOM  # noqa: E402
from fd_guided.compile import CompileService  # noqa: E402
from fd_guided.metrics import GuidedMetrics  # noqa: E402
from fd_guided.registry import create_backend  # noqa: E402
from fd_guided.tokenizer import load_tokenizer  # noqa: E402

FAR = 1 << 20
MODES = ("closing", "filled", "far", "none", "control")
BUDGETS = {
    "closing": lambda b: b,
    "filled": lambda b: b,
    "far": lambda b: FAR,
    "none": lambda b: None,
    "control": lambda b: None,
}


def allowed(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


def start_need(manager, spec, vocab: int) -> int | None:
    """The spec's shortest document in tokens (its stop included): the manager's start plan."""
    manager.add_request(0, spec, prefill_done=True, max_tokens=manager.budget.defer_start_above)
    manager.wait_ready([0], 120)
    manager.begin_step([0])
    manager.apply(torch.zeros((1, vocab)))
    need = manager.budget.need(0)
    words = manager.bitmask.numpy()[0]
    manager.accept([int(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))[0])])
    manager.release(0)
    return need


def record(manager, tokenizer, vocab: int, spec, budget: int) -> list[int] | None:
    """The adversary's tokens for `spec` under `budget` (steered), its stop token last; None if
    it did not end ``stop``."""
    manager.add_request(0, spec, prefill_done=True, max_tokens=budget)
    manager.wait_ready([0], 120)
    tokens: list[int] = []
    try:
        for _ in range(budget):
            manager.begin_step([0])
            manager.apply(torch.zeros((1, vocab)))
            token = pick(tokenizer, manager.bitmask.numpy()[0], vocab)
            tokens.append(token)
            done = manager.accept([token])
            if done:
                return tokens if done[0].reason == "stop" else None
        return None
    finally:
        manager.release(0)


class Walker:
    """One manager replaying the walks at full batch: slot s replays walk s, then walk s + n, ...
    (modulo the walks), a finished request replaced at once by the next."""

    def __init__(self, manager, walks, batch: int, vocab: int):
        self.manager, self.walks, self.batch = manager, walks, batch
        self.logits = torch.randn((batch, vocab), generator=torch.Generator().manual_seed(0))
        self.pristine = self.logits.clone()
        self.budget_of = BUDGETS["none"]
        self.walk: list[int] = []
        self.position: list[int] = []
        self.first_looks = 0  # rows in the last step that were their request's first step

    def start(self, mode: str) -> None:
        """Release every request and start the walks again from the first, with `mode`'s budgets."""
        for slot in range(len(self.walk)):
            self.manager.release(slot)
        self.budget_of = BUDGETS[mode]
        self.manager.budget.closing_rows = mode != "filled"
        self.walk, self.position = list(range(self.batch)), [0] * self.batch
        for slot in range(self.batch):
            self._add(slot)
        self.manager.wait_ready(list(range(self.batch)), 120)

    def _add(self, slot: int) -> None:
        spec, tokens, budget = self.walks[self.walk[slot] % len(self.walks)]
        self.manager.add_request(slot, spec, prefill_done=True, max_tokens=self.budget_of(budget))

    def step(self) -> float:
        """One timed step; checks every row allows its token and requests end where their walk does."""
        manager, rows = self.manager, list(range(self.batch))
        self.first_looks = self.position.count(0)
        self.logits.copy_(self.pristine)
        started = time.perf_counter()
        manager.begin_step(rows)
        manager.apply(self.logits)
        masked = time.perf_counter()
        words = manager.bitmask.numpy()
        tokens = [self.walks[self.walk[s] % len(self.walks)][1][self.position[s]] for s in rows]
        for slot, token in enumerate(tokens):
            if not allowed(words[slot], token):
                raise AssertionError(f"slot {slot}: walk {self.walk[slot]} token {self.position[slot]} not allowed")
        picked = time.perf_counter()
        finished = {f.slot: f.reason for f in manager.accept(tokens)}
        elapsed = masked - started + time.perf_counter() - picked
        renew = []
        for slot in rows:
            self.position[slot] += 1
            last = self.position[slot] == len(self.walks[self.walk[slot] % len(self.walks)][1])
            if last != (finished.get(slot) == "stop"):
                raise AssertionError(
                    f"slot {slot}: walk {self.walk[slot]} ended {finished.get(slot)} at {self.position[slot]}"
                )
            if last:
                manager.release(slot)
                self.walk[slot] += self.batch
                self.position[slot] = 0
                self._add(slot)
                renew.append(slot)
        if renew:
            manager.wait_ready(renew, 120)
        return elapsed


def summary(times: list[float]) -> dict:
    return {"median_ms": 1e3 * statistics.median(times), "mean_ms": 1e3 * statistics.fmean(times)}


def hook_summary(hooks: list[int], times: list[float], firsts: list[int]) -> dict:
    """The steering's own time per step (`steer_ms`: the mean) and its share of the median step;
    split by a least-squares line over the steps' first looks (a row at its request's first step:
    ~1 in 7 here, far fewer in serving) into a step's time without any (`steer_fixed_us`, the
    rows' comparisons) and each first look's (`steer_per_first_look_us`)."""
    mean = statistics.fmean(hooks) / 1e6
    split = {}
    if len(set(firsts)) > 1:
        fit = statistics.linear_regression(firsts, [h / 1e3 for h in hooks])
        split = {"steer_fixed_us": fit.intercept, "steer_per_first_look_us": fit.slope}
    return {
        "steer_ms": mean,
        "steer_median_ms": statistics.median(hooks) / 1e6,
        "steer_share_of_median_step": mean / (1e3 * statistics.median(times)),
        "first_looks_per_step": statistics.fmean(firsts),
    } | split


def wrap_hooks(budget) -> None:
    """A checkout before `hook_ns`: `prepare` and `steer` timed by a wrapper per call into it."""
    budget.hook_ns = 0
    for hook in ("prepare", "steer"):
        inner = getattr(budget, hook)

        def timed(*args, _inner=inner, **kwargs):
            started = time.perf_counter_ns()
            try:
                return _inner(*args, **kwargs)
            finally:
                budget.hook_ns += time.perf_counter_ns() - started

        setattr(budget, hook, timed)


def clock_pair_ns(pairs: int = 100_000) -> float:
    """What one `perf_counter_ns` pair costs here (each hook call pays one), in ns."""
    clock, total = time.perf_counter_ns, 0
    for _ in range(pairs):
        started = clock()
        total += clock() - started
    return total / pairs


def ratios(over: list[float], under: list[float]) -> dict:
    return {
        "of_medians": statistics.median(over) / statistics.median(under),
        "of_means": statistics.fmean(over) / statistics.fmean(under),
        "median_per_step": statistics.median(a / b for a, b in zip(over, under)),
    }


def record_walks(manager, tokenizer, vocab: int, config) -> tuple[list, dict]:
    """(spec, tokens, closing budget) per corpus schema, and the schemas left out with why."""
    walks, skipped = [], {}
    for name, schema in SCHEMAS.items():
        spec = parse_guided_request({"guided_json": schema}, config)
        need = start_need(manager, spec, vocab)
        if need is None:  # not steered, nothing to measure
            skipped[name] = "no start plan (the search gave up, or the compile failed)"
            continue
        tokens = record(manager, tokenizer, vocab, spec, need + HEADROOM)
        if tokens is None:
            skipped[name] = "the adversary's walk did not end stop"
            continue
        walks.append((spec, tokens, need + HEADROOM))
    return walks, skipped


def measure(backend_name: str, steps: int, batch: int = 32, warm: int = 10) -> dict:
    """`steps` timed steps per mode, in one round per mode: in round r the managers take the
    modes shifted by r (each manager runs each mode once: four unbudgeted managers differed by
    up to 13% in one run at load 8), every walk started afresh."""
    tokenizer = load_tokenizer("deepseek")
    vocab = tokenizer.padded_vocab_size or tokenizer.vocab_size
    # auto: xgrammar whenever it compiles (not the first engine ready), so every mode and the
    # recording run each schema on the same engine
    config = GuidedConfig(backend=backend_name, auto_first_ready=False)
    backend = create_backend(backend_name, tokenizer, vocab_size=vocab, config=config)
    compiler = CompileService(backend)
    managers = [
        GuidedDecodingManager(backend, max_num_seqs=batch, compile_service=compiler, metrics=GuidedMetrics())
        for _ in MODES
    ]
    for manager in managers:  # one cache of start plans: no walk's first looks search
        manager.budget.start_plans = managers[0].budget.start_plans
    walks, skipped = record_walks(managers[0], tokenizer, vocab, config)
    walkers = [Walker(manager, walks, batch, vocab) for manager in managers]
    mode_of = list(MODES)  # the mode each manager runs in the current round
    hook_timer = "hook_ns" if hasattr(managers[0].budget, "hook_ns") else "wrappers"
    if hook_timer == "wrappers":
        for manager in managers:
            wrap_hooks(manager.budget)
    hooks: dict[str, list[int]] = {mode: [] for mode in MODES}  # the steering's own ns, per timed step
    firsts: dict[str, list[int]] = {mode: [] for mode in MODES}  # first looks in each timed step
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    rng = random.Random(0)
    per_round, forced = steps // len(MODES), 0
    for shift in range(len(MODES)):
        mode_of[:] = MODES[shift:] + MODES[:shift]
        for walker, mode in zip(walkers, mode_of):
            walker.start(mode)
        closing = managers[mode_of.index("closing")]
        for step in range(warm + per_round):
            if step == warm:
                forced_before = closing.metrics.value("budget_forced_tokens_total")
            for index in rng.sample(range(len(MODES)), len(MODES)):  # no mode always after the same one
                hook_before = managers[index].budget.hook_ns
                elapsed = walkers[index].step()
                if step >= warm:
                    times[mode_of[index]].append(elapsed)
                    hooks[mode_of[index]].append(managers[index].budget.hook_ns - hook_before)
                    firsts[mode_of[index]].append(walkers[index].first_looks)
        forced += closing.metrics.value("budget_forced_tokens_total") - forced_before
    for manager in managers:
        manager.close()
    compiler.close()
    backend.close()
    lengths = [len(tokens) for _, tokens, _ in walks]
    timed = per_round * len(MODES)
    return {
        "backend": backend_name,
        "batch": batch,
        "steps": timed,
        "walks": len(walks),
        "skipped": skipped,
        "walk_tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "closing_rows_steered_share": forced / (timed * batch),
        "hook_timer": hook_timer,
        "clock_pair_ns": clock_pair_ns(),
        "modes": {mode: summary(times[mode]) | hook_summary(hooks[mode], times[mode], firsts[mode]) for mode in MODES},
        "noise_floor": abs(statistics.median(times["control"]) / statistics.median(times["none"]) - 1),
        "far_hooks_over_none_share": (statistics.fmean(hooks["far"]) - statistics.fmean(hooks["none"]))
        / 1e9
        / statistics.median(times["none"]),
        "closing_over_far": ratios(times["closing"], times["far"]),
        "filled_over_far": ratios(times["filled"], times["far"]),
        "far_over_none": ratios(times["far"], times["none"]),
        "control_over_none": ratios(times["control"], times["none"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--backends", nargs="+", default=["xgrammar", "llguidance", "auto"])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    report = {"load_before": Path("/proc/loadavg").read_text().split()[:3], "runs": []}
    for name in args.backends:
        report["runs"].append(measure(name, args.steps))
        print(json.dumps(report["runs"][-1]), flush=True)
    report["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
