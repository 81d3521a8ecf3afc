"""Per-decode-step cost of guided decoding on the reference engine, side by side in one process.

For each batch size the same model runs the same prompts several ways, interleaved round by round
so machine noise hits all of them alike:
  - ``unguided``: no manager at all;
  - ``guided``: our manager with the default backend (auto; xgrammar for these schemas): async compile, overlapped fill,
    in-place C kernel;
  - ``guided_llguidance``: the same manager with the llguidance backend (when installed);
  - ``fastdeploy``: `FastDeployStyleManager` (blocking join, serial fill, numpy round trip).
The constraints force long structured outputs (arrays of objects with a minimum length), so every
request decodes for the whole measured window and the batch stays full.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from fd_guided.config import GuidedConfig
from fd_guided.harness.baseline import FASTDEPLOY_CACHE_BYTES, FastDeployStyleManager
from fd_guided.manager import GuidedDecodingManager

ITEM_SCHEMAS = [
    {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}},
        "required": ["id", "name"],
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"}, "tag": {"enum": ["a", "b", "c"]}},
        "required": ["ok", "score", "tag"],
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            },
            "label": {"type": "string", "pattern": "^[a-z]{2,6}$"},
        },
        "required": ["point", "label"],
    },
    {
        "type": "object",
        "properties": {
            "date": {"type": "string", "format": "date"},
            "count": {"type": "integer", "minimum": 0, "maximum": 999},
        },
        "required": ["date", "count"],
    },
]
MODES = ("unguided", "guided", "guided_llguidance", "fastdeploy")


def available_modes() -> tuple[str, ...]:
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return tuple(m for m in MODES if m != "guided_llguidance")
    return MODES


def long_running_requests(batch: int, guided: bool) -> list[dict]:
    """`batch` requests with equal-length prompts; guided ones need hundreds of tokens to finish."""
    requests = []
    for index in range(batch):
        request = {"prompt": f"Produce record batch number {index % 10}:", "ignore_eos": True}
        if guided:
            request["guided_json"] = {"type": "array", "items": ITEM_SCHEMAS[index % len(ITEM_SCHEMAS)], "minItems": 64}
        requests.append(request)
    return requests


@dataclass
class StepResult:
    batch: int
    mode: str
    step_ms: float
    phases_ms: dict[str, float]


def _engine_for(mode: str, model, tokenizer, batch: int):
    from fd_guided.harness.engine.engine import ReferenceEngine
    from fd_guided.registry import create_backend

    engine = ReferenceEngine(
        model, tokenizer, guided=False, max_num_seqs=batch, max_num_batched_tokens=max(512, batch * 16)
    )
    if mode == "unguided":
        return engine
    config = {
        "guided": GuidedConfig(),
        "guided_llguidance": GuidedConfig(backend="llguidance"),
        "fastdeploy": GuidedConfig(cache_limit_bytes=FASTDEPLOY_CACHE_BYTES),
    }[mode]
    backend = create_backend(config.backend, tokenizer, vocab_size=model.cfg.vocab_size, config=config)
    manager_cls = FastDeployStyleManager if mode == "fastdeploy" else GuidedDecodingManager
    engine.manager = manager_cls(backend, batch, think_end_id=tokenizer.think_end_id)
    engine.runner.attach_guided(engine.manager)
    return engine


def _one_run(engine, batch: int, guided: bool, decode_steps: int) -> tuple[float, dict[str, float]]:
    results = engine.generate(long_running_requests(batch, guided), max_tokens=decode_steps + 1, seed=0)
    if any(r.finish_reason != "length" for r in results):
        raise RuntimeError(f"a benchmark request ended early: {[r.finish_reason for r in results]}")
    # Skip the first decode steps: they include the (cold) compile joins, measured by the TTFT bench.
    steps = engine.stats.decode_step_seconds()[2:]
    phases = {}
    if guided:
        count = max(1, engine.stats.steps)
        phases = {k: 1e3 * v / count for k, v in engine.stats.guided.items() if k != "steps"}
    return statistics.median(steps) * 1e3, phases


def bench_steps(
    model, tokenizer, batches=(1, 8, 32, 128), decode_steps: int = 24, rounds: int = 3, progress=print
) -> list[StepResult]:
    results = []
    modes = available_modes()
    for batch in batches:
        engines = {mode: _engine_for(mode, model, tokenizer, batch) for mode in modes}
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        phases: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for round_index in range(rounds + 1):  # round 0 warms caches and allocators up
            for mode, engine in engines.items():
                step_ms, step_phases = _one_run(engine, batch, mode != "unguided", decode_steps)
                if round_index:
                    samples[mode].append(step_ms)
                    phases[mode].append(step_phases)
            progress(
                f"  steps batch={batch} round {round_index}/{rounds}: "
                + ", ".join(f"{m} {samples[m][-1]:.2f}ms" for m in modes if samples[m])
            )
        for mode in modes:
            merged = {
                k: statistics.median(p[k] for p in phases[mode]) for k in (phases[mode][0] if phases[mode] else {})
            }
            results.append(StepResult(batch, mode, statistics.median(samples[mode]), merged))
        for engine in engines.values():
            engine.close()
    return results


def step_ratios(results: list[StepResult]) -> list[dict]:
    """Per batch: guided/unguided, baseline/unguided, and our overhead as a fraction of the baseline's."""
    by_key = {(r.batch, r.mode): r for r in results}
    rows = []
    for batch in sorted({r.batch for r in results}):
        unguided = by_key[(batch, "unguided")].step_ms
        guided = by_key[(batch, "guided")]
        baseline = by_key[(batch, "fastdeploy")]
        ours, theirs = guided.step_ms - unguided, baseline.step_ms - unguided
        rows.append(
            {
                "batch": batch,
                "unguided_ms": unguided,
                "guided_ms": guided.step_ms,
                "fastdeploy_ms": baseline.step_ms,
                "guided_over_unguided": guided.step_ms / unguided,
                "fastdeploy_over_unguided": baseline.step_ms / unguided,
                "our_overhead_over_fastdeploy_overhead": ours / theirs if theirs > 0 else float("nan"),
                "guided_phases_ms": guided.phases_ms,
                "fastdeploy_phases_ms": baseline.phases_ms,
            }
        )
        llguidance = by_key.get((batch, "guided_llguidance"))
        if llguidance is not None:
            rows[-1].update(
                {
                    "guided_llguidance_ms": llguidance.step_ms,
                    "guided_llguidance_over_unguided": llguidance.step_ms / unguided,
                    "llguidance_overhead_over_fastdeploy_overhead": (llguidance.step_ms - unguided) / theirs
                    if theirs > 0
                    else float("nan"),
                    "guided_llguidance_phases_ms": llguidance.phases_ms,
                }
            )
    return rows
