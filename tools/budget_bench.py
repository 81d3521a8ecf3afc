"""Budget steering (fd_guided.budget): complete, valid outputs at tight max_tokens, and its cost.

    python tools/budget_bench.py docs/budget_bench.json [--seeds 4] [--backend xgrammar]
    python tools/budget_bench.py docs/budget_bench_smollm2.json --model smollm2 --schemas person invoice
    python tools/budget_bench.py --plot docs/budget_bench.json docs/img   # needs matplotlib

Quality: every JSON schema of tests/corpus.py (or those `--schemas` names), each at max_tokens =
ceil(1.2 x) and ceil(2 x) its shortest document (in the model's tokens, its stop token included:
the manager's own plan at the start), with and without the feature (``guided_fit_budget``),
decoded two ways: the reference engine on `--model` (`fd_guided.harness.bench.models`: the random
preset ``small`` by default, prompted "Write NAME as JSON:"; or ``smollm2``, SmolLM2-135M-Instruct,
asked for an example NAME record under its chat template; sampled at temperature 1, `--seeds`
requests per schema), and the adversarial decoder of tests/budget (never ends a string). An output
counts when it ends ``stop`` and validates (jsonschema with format checking,
`fd_guided.harness.validate`).

Cost: manager steps (begin_step + apply + accept timed; no model, the adversary chooses) at batch 32,
every row in its closing phase (max_tokens = its shortest document + the headroom; a slot whose
request ends takes a new one at once, so the batch stays full) against the same rows with the
feature off; both interleaved in one process after a warm-up (start plans cached per schema). The
model's tokenizer and vocabulary width are used; its weights are not.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This checkout's fd_guided first (the venv's editable install points at the main checkout).
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "budget")]

import torch  # noqa: E402
from adversary import pick  # noqa: E402
from corpus import SCHEMAS  # noqa: E402

from fd_guided import GuidedDecodingManager, parse_guided_request  # noqa: E402
from fd_guided.budget.steer import HEADROOM  # noqa: E402
from fd_guided.harness.bench import models  # noqa: E402
from fd_guided.harness.bench.prompts import schema_prompt  # noqa: E402
from fd_guided.harness.validate import validate_output  # noqa: E402
from fd_guided.registry import create_backend  # noqa: E402

FACTORS = (1.2, 2.0)


def shortest(manager, spec, vocab: int) -> int:
    """The spec's shortest document in tokens (its stop included), as the manager's start plan has it.
    The budget is the largest one searched at once (a larger one defers its search to a thread)."""
    manager.add_request(0, spec, prefill_done=True, max_tokens=manager.budget.defer_start_above)
    manager.wait_ready([0], 120)
    manager.begin_step([0])
    manager.apply(torch.zeros((1, vocab)))
    need = manager.budget.need(0)
    manager.accept([0])
    manager.release(0)
    return need


def adversary_run(manager, tokenizer, vocab: int, specs, budgets, fit: bool, timings: list | None = None):
    """Decode every spec with the adversary; (finish, text) each."""
    n = len(specs)
    for slot, (spec, budget) in enumerate(zip(specs, budgets)):
        manager.add_request(slot, spec, prefill_done=True, max_tokens=budget, fit_budget=fit)
    manager.wait_ready(list(range(n)), 120)
    outputs: dict[int, list[int]] = {s: [] for s in range(n)}
    finish: dict[int, str] = {}
    logits = torch.zeros((n, vocab))
    while len(finish) < n:
        rows = [s if s not in finish else None for s in range(n)]
        started = time.perf_counter()
        manager.begin_step(rows)
        manager.apply(logits)
        words = manager.bitmask.numpy()
        tokens = [pick(tokenizer, words[r], vocab) if rows[r] is not None else 0 for r in range(n)]
        done = {f.slot: f for f in manager.accept(tokens)}
        if timings is not None and None not in rows:
            timings.append(time.perf_counter() - started - 0)
        for slot, token in enumerate(tokens):
            if rows[slot] is None:
                continue
            if slot in done:
                finish[slot] = done[slot].reason
                continue
            outputs[slot].append(token)
            if len(outputs[slot]) >= budgets[slot]:
                finish[slot] = "length"
    for slot in range(n):
        manager.release(slot)
    return [(finish[s], tokenizer.decode(outputs[s])) for s in range(n)]


def quality(preset: str, backend_name: str, seeds: int, every: list[str]) -> dict:
    from fd_guided.harness.engine.engine import ReferenceEngine

    model, tokenizer = models.load_model(preset)
    vocab = model.cfg.vocab_size
    config = models.guided_config(preset, backend=backend_name)
    backend = create_backend(backend_name, tokenizer, vocab_size=vocab, config=config)
    manager = GuidedDecodingManager(backend, max_num_seqs=len(every))
    planned = {
        name: shortest(manager, parse_guided_request({"guided_json": SCHEMAS[name]}, config), vocab) for name in every
    }
    names = [name for name in every if planned[name] is not None]  # None: its compile failed here (timed out)
    specs = [parse_guided_request({"guided_json": SCHEMAS[name]}, config) for name in names]
    needs = [planned[name] for name in names]
    report = {"schemas": planned, "runs": [], "prompt_example": schema_prompt(preset, tokenizer, names[0])}
    engine = ReferenceEngine(model, tokenizer, guided_config=config, max_num_seqs=min(32, len(names) * seeds))
    for factor in FACTORS:
        budgets = [math.ceil(need * factor) for need in needs]
        for fit in (False, True):
            results = adversary_run(manager, tokenizer, vocab, specs, budgets, fit)
            good = sum(
                reason == "stop" and validate_output(spec, text).valid for (reason, text), spec in zip(results, specs)
            )
            report["runs"].append(
                {"decoder": "adversary", "factor": factor, "fit_budget": fit, "valid": good, "total": len(specs)}
            )
            requests = [
                {
                    "prompt": schema_prompt(preset, tokenizer, name),
                    "guided_json": SCHEMAS[name],
                    "max_tokens": budget,
                    "seed": seed,
                    "guided_fit_budget": fit,
                }
                for name, budget in zip(names, budgets)
                for seed in range(seeds)
            ]
            outs = engine.generate(requests)
            good = sum(out.finish_reason == "stop" and validate_output(out.spec, out.text).valid for out in outs)
            tokens = sum(len(out.token_ids) for out in outs)
            report["runs"].append(
                {
                    "decoder": "model",
                    "factor": factor,
                    "fit_budget": fit,
                    "valid": good,
                    "total": len(outs),
                    "output_tokens": tokens,
                    "wall_s": engine.stats.wall_seconds,
                    # Batched, prompts' prefill included: what a client of this engine sees.
                    "tokens_per_s": tokens / engine.stats.wall_seconds,
                }
            )
            print(report["runs"][-2], report["runs"][-1], flush=True)
    engine.close()
    manager.close()
    backend.close()
    return report


def full_batch_steps(manager, tokenizer, vocab: int, specs, budgets, fit: bool, steps: int) -> list[float]:
    """Seconds per manager step (begin_step + apply + accept) with every slot busy: a slot whose
    request ends takes a new one of the same schema and budget at once (continuous batching)."""
    n = len(specs)

    def start(slot: int) -> None:
        manager.add_request(slot, specs[slot], prefill_done=True, max_tokens=budgets[slot], fit_budget=fit)

    for slot in range(n):
        start(slot)
    manager.wait_ready(list(range(n)), 120)
    generated = [0] * n
    logits = torch.zeros((n, vocab))
    times = []
    for _ in range(steps):
        rows = list(range(n))
        started = time.perf_counter()
        manager.begin_step(rows)
        manager.apply(logits)
        masked = time.perf_counter()
        words = manager.bitmask.numpy()
        tokens = [pick(tokenizer, words[r], vocab) for r in rows]  # the "model": not timed
        picked = time.perf_counter()
        done = {f.slot for f in manager.accept(tokens)}
        times.append(masked - started + time.perf_counter() - picked)
        for slot in rows:
            generated[slot] += 1
            if slot in done or generated[slot] >= budgets[slot]:
                manager.release(slot)
                start(slot)
                generated[slot] = 0
    for slot in range(n):
        manager.release(slot)
    return times


def cost(preset: str, backend_name: str, batch: int = 32, steps: int = 40, repeats: int = 3) -> dict:
    tokenizer, vocab = models.load_tokenizer_of(preset)
    config = models.guided_config(preset, backend=backend_name)
    backend = create_backend(backend_name, tokenizer, vocab_size=vocab, config=config)
    manager = GuidedDecodingManager(backend, max_num_seqs=batch)
    every = [parse_guided_request({"guided_json": SCHEMAS[name]}, config) for name in SCHEMAS]
    needs = {spec: shortest(manager, spec, vocab) for spec in every}
    planned = [spec for spec in every if needs[spec] is not None]  # None: its compile failed (timed out)
    specs = [planned[i % len(planned)] for i in range(batch)]
    closing = [needs[spec] + HEADROOM for spec in specs]  # in the closing phase from the first step
    # Off: the same rows unsteered (far from any budget as far as the manager knows).
    full_batch_steps(manager, tokenizer, vocab, specs, closing, True, 4)  # warm: plans cached, tables built
    off: list[float] = []
    on: list[float] = []
    # The steering's own time (BudgetSteering.steer, inside apply): steered requests also end
    # sooner than unsteered ones (at their plan's end, not at the budget), so the on run replaces
    # more requests per step; the steer time alone is the closing phase's cost per step.
    steer_times: list[float] = []
    collecting = [False]
    inner = manager.budget.steer

    def timed_steer(*args, **kwargs):
        started = time.perf_counter()
        inner(*args, **kwargs)
        if collecting[0]:
            steer_times.append(time.perf_counter() - started)

    manager.budget.steer = timed_steer
    for _ in range(repeats):  # interleaved, so both see the same machine
        off.extend(full_batch_steps(manager, tokenizer, vocab, specs, closing, False, steps)[2:])
        collecting[0] = True
        on.extend(full_batch_steps(manager, tokenizer, vocab, specs, closing, True, steps)[2:])
        collecting[0] = False
    steered = manager.metrics.value("budget_forced_tokens_total")
    manager.close()
    backend.close()
    return {
        "batch": batch,
        "steps_each": len(off),
        "off_ms": 1e3 * statistics.median(off),
        "on_ms": 1e3 * statistics.median(on),
        "ratio": statistics.median(on) / statistics.median(off),
        "steer_ms": 1e3 * statistics.median(steer_times),
        "steer_ratio": (statistics.median(off) + statistics.median(steer_times)) / statistics.median(off),
        "steered_rows": steered,
    }


def plot(report_path: str, out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(report_path).read_text())
    preset = report.get("model", "small")
    trained = models.is_trained(preset)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, decoder in zip(axes, ("model", "adversary")):
        runs = [r for r in report["quality"]["runs"] if r["decoder"] == decoder]
        for offset, fit in ((-0.2, False), (0.2, True)):
            xs = [i + offset for i, _ in enumerate(FACTORS)]
            ys = [
                next(r["valid"] / r["total"] for r in runs if r["factor"] == f and r["fit_budget"] == fit)
                for f in FACTORS
            ]
            ax.bar(xs, ys, 0.4, label="budget steering" if fit else "off (as every engine today)")
        ax.set_xticks(range(len(FACTORS)), [f"max_tokens {f:g}x shortest" for f in FACTORS])
        engine = f"reference engine ({preset}, trained)" if trained else "reference engine (random-weight model)"
        ax.set_title({"model": engine, "adversary": "adversarial decoder"}[decoder], fontsize=9)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("complete and valid outputs")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    suffix = "" if preset == "small" else f"_{preset}"  # the random preset's figure keeps its name
    fig.savefig(Path(out_dir) / f"budget_valid_share{suffix}.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("img", nargs="?")
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--only", choices=("quality", "cost"))
    parser.add_argument("--repeats", type=int, default=3, help="cost: interleaved off/on runs of 40 steps each")
    parser.add_argument("--model", default="small", choices=models.CHOICES, help="fd_guided/harness/bench/models.py")
    parser.add_argument("--schemas", nargs="+", choices=sorted(SCHEMAS), help="a subset of tests/corpus.py (quality)")
    args = parser.parse_args()
    if args.plot:
        plot(args.out, args.img or "docs/img")
        return
    report = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if report.get("model", "small") != args.model:
        report = {}  # another model's figures are not this model's
    report["backend"] = args.backend
    report["model"] = args.model
    if args.only in (None, "cost"):
        report["cost"] = cost(args.model, args.backend, repeats=args.repeats)
        print(report["cost"], flush=True)
    if args.only in (None, "quality"):
        report["quality"] = quality(args.model, args.backend, args.seeds, args.schemas or list(SCHEMAS))
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
