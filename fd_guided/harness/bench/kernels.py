"""Benchmark the CPU mask kernels side by side, in one process, with Paddle loaded and busy.

Run through `fd-guided bench --only kernels` (or as part of the whole `fd-guided bench`).

For every (batch, mask density) each implementation is warmed up, then timed `--repeats` times, each
timed call preceded by a small Paddle matmul: as in a serving process, Paddle's thread pool has just
worked and its threads still spin on the cores that torch and our kernel need. (Implementations are
timed one block after another, not interleaved, so no call inherits another implementation's
spinning threads.) Reported: median milliseconds, and the ratios xgrammar_cpu / ours (speed-up) and
ours / copy (cost relative to copying the logits once: torch's multi-threaded copy_, and numpy's
single-threaded copyto). Run with OMP_WAIT_POLICY=PASSIVE to see the numbers without the spinning.

Mask densities: `json_trace` rows are real masks, recorded while xgrammar constrains a JSON
document token by token (most rows allow a handful of tokens, those inside strings allow ~99%);
the others are synthetic extremes (see `make_bitmask`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import paddle
import torch
import xgrammar

from fd_guided.kernels import apply_token_bitmask_inplace, bitmask_width
from fd_guided.kernels import cpu as cpu_kernel

DENSITIES = ("json_trace", "json_sparse", "nearly_all", "all_but_few", "random_50")

# The `json_trace` rows: the masks xgrammar fills, token after token, while this document is
# generated under this schema with the DeepSeek tokenizer (structure, keys, enums, numbers, strings).
TRACE_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "email", "vip"],
        },
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "unit_price": {"type": "number"},
                },
                "required": ["sku", "quantity", "unit_price"],
            },
            "minItems": 1,
        },
        "notes": {"type": "string"},
    },
    "required": ["order_id", "customer", "status", "items", "notes"],
}
TRACE_DOCUMENT = {
    "order_id": "ORD-204817",
    "customer": {"name": "Margarethe Okonkwo-Lindqvist", "email": "m.okonkwo@example.org", "vip": True},
    "status": "shipped",
    "items": [
        {"sku": "KB-ERGO-2041", "quantity": 2, "unit_price": 89.5},
        {"sku": "USB-C-HUB-7P", "quantity": 1, "unit_price": 42.0},
        {"sku": "MON-27-4K", "quantity": 3, "unit_price": 329.99},
    ],
    "notes": "Leave the parcel with the concierge; the office is closed on Fridays after 3 pm.",
}


def make_bitmask(density: str, rows: int, vocab: int, rng: np.random.Generator) -> torch.Tensor:
    """Allowed-token pattern per row, packed like xgrammar (bit j of word w = token 32w + j)."""
    if density == "json_trace":
        trace = json_trace_bitmasks(vocab)
        return trace[torch.from_numpy(rng.integers(0, trace.shape[0], size=rows))].contiguous()
    allowed = np.zeros((rows, bitmask_width(vocab) * 32), dtype=bool)
    for row in range(rows):
        if density == "json_sparse":  # a JSON state: 1-200 allowed tokens anywhere in the vocab
            allowed[row, rng.choice(vocab, size=rng.integers(1, 201), replace=False)] = True
        elif density == "nearly_all":  # inside a JSON string: ~5% of tokens masked, scattered
            allowed[row, :vocab] = rng.random(vocab) >= 0.05
        elif density == "all_but_few":  # free text with a few forbidden (special) tokens
            allowed[row, :vocab] = True
            allowed[row, rng.choice(vocab, size=rng.integers(1, 201), replace=False)] = False
        elif density == "random_50":
            allowed[row, :vocab] = rng.random(vocab) < 0.5
        else:
            raise ValueError(f"unknown density {density!r}")
    packed = np.packbits(allowed, axis=1, bitorder="little").view(np.int32)
    return torch.from_numpy(packed.copy())


@functools.cache
def json_trace_bitmasks(vocab: int) -> torch.Tensor:
    """One bitmask row per token of TRACE_DOCUMENT (and one after it), as xgrammar fills them."""
    import json

    from fd_guided.config import GuidedConfig
    from fd_guided.registry import create_backend
    from fd_guided.spec import parse_guided_request
    from fd_guided.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("deepseek")
    backend = create_backend("xgrammar", tokenizer, vocab_size=vocab, config=GuidedConfig())
    grammar = backend.new_grammar(backend.compile(parse_guided_request({"guided_json": TRACE_SCHEMA})))
    token_ids = tokenizer.encode(json.dumps(TRACE_DOCUMENT))
    rows = torch.empty((len(token_ids) + 1, bitmask_width(vocab)), dtype=torch.int32)
    for row, token_id in enumerate(token_ids):
        grammar.fill_bitmask(rows, row)
        if not grammar.accept_token(token_id):
            raise RuntimeError(f"the trace document's token {row} was rejected by its own schema")
    grammar.fill_bitmask(rows, len(token_ids))
    backend.close()
    return rows


def allowed_fractions(bitmask: torch.Tensor, vocab: int) -> np.ndarray:
    """Fraction of the vocab each row allows."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    return bits.mean(axis=1)


def paddle_busy_work(matrix: paddle.Tensor) -> None:
    paddle.matmul(matrix, matrix).numpy()


def time_call(function: Callable[[], None], matrix: paddle.Tensor) -> float:
    paddle_busy_work(matrix)
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1e3


def candidates(logits: torch.Tensor, bitmask: torch.Tensor, copy_target: torch.Tensor) -> dict:
    """name -> zero-argument callable. Masking is idempotent, so no reset between calls is needed."""
    paddle_logits = paddle.from_dlpack(logits.clone())
    numpy_src, numpy_dst = logits.numpy(), copy_target.numpy()
    functions = {
        "ours_cpu": lambda: apply_token_bitmask_inplace(logits, bitmask, impl="cpu"),
        "ours_cpu_paddle_tensor": lambda: apply_token_bitmask_inplace(paddle_logits, bitmask, impl="cpu"),
        "ours_paddle": lambda: apply_token_bitmask_inplace(paddle_logits, bitmask, impl="paddle"),
        "ours_torch": lambda: apply_token_bitmask_inplace(logits, bitmask, impl="torch"),
        "xgrammar_cpu": lambda: xgrammar.apply_token_bitmask_inplace(logits, bitmask, backend="cpu"),
        "xgrammar_torch_compile": lambda: xgrammar.apply_token_bitmask_inplace(
            logits, bitmask, backend="torch_compile"
        ),
        "copy_torch": lambda: copy_target.copy_(logits),
        "copy_numpy_1thread": lambda: np.copyto(numpy_dst, numpy_src),
    }
    if cpu_kernel.FAST_PATH_AVAILABLE and len(cpu_kernel._cpu_mask.paths()) > 1:
        # What `ours_cpu` would cost on a CPU without AVX-512 (the C kernel's portable row loop).
        functions["ours_cpu_portable"] = lambda: cpu_kernel._cpu_mask.apply(
            logits.data_ptr(),
            logits.stride(0),
            "float32",
            bitmask.data_ptr(),
            bitmask.stride(0),
            logits.shape[1],
            logits.shape[0],
            path="portable",
        )
    return functions


def measure(batch: int, vocab: int, density: str, args, matrix, rng) -> dict:
    logits = torch.randn(batch, vocab, dtype=torch.float32)
    bitmask = make_bitmask(density, batch, vocab, rng)
    functions = candidates(logits, bitmask, torch.empty_like(logits))
    if args.skip_torch_compile:
        functions.pop("xgrammar_torch_compile")
    skipped: dict[str, str] = {}
    timings: dict[str, list[float]] = {}
    for name, function in functions.items():  # warm-up right before timing: no stale pool state
        try:
            for _ in range(args.warmup):
                function()
        except Exception as error:  # optional backends may not work on this machine
            skipped[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            continue
        timings[name] = [time_call(function, matrix) for _ in range(args.repeats)]
    medians = {name: statistics.median(values) for name, values in timings.items()}
    p90 = {name: float(np.percentile(values, 90)) for name, values in timings.items()}
    ours = medians["ours_cpu"]
    return {
        "batch": batch,
        "vocab": vocab,
        "density": density,
        # How much of the vocab the rows allow (10th, 50th, 90th percentile): what the mask looks like.
        "allowed_fraction_p10_p50_p90": [
            round(float(q), 4) for q in np.quantile(allowed_fractions(bitmask, vocab), [0.1, 0.5, 0.9])
        ],
        "median_ms": medians,
        "p90_ms": p90,
        "skipped": skipped,
        "cpu_row_loop": cpu_kernel._cpu_mask.paths()[0] if cpu_kernel.FAST_PATH_AVAILABLE else "torch fallback",
        "speedup_vs_xgrammar_cpu": medians["xgrammar_cpu"] / ours,
        "ours_over_copy_torch": ours / medians["copy_torch"],
        "ours_over_copy_numpy_1thread": ours / medians["copy_numpy_1thread"],
    }


def print_table(results: list[dict]) -> None:
    names = list(results[0]["median_ms"])
    short = {n: n.replace("xgrammar_", "xgr_").replace("_paddle_tensor", "_pd") for n in names}
    header = ["batch", "density"] + [short[n] for n in names] + ["xgr/ours", "ours/copy", "ours/copy1t"]
    lines = [header]
    for result in results:
        cells = [str(result["batch"]), result["density"]]
        cells += [f"{result['median_ms'][n]:.3f}" if n in result["median_ms"] else "-" for n in names]
        cells += [
            f"{result['speedup_vs_xgrammar_cpu']:.1f}x",
            f"{result['ours_over_copy_torch']:.2f}",
            f"{result['ours_over_copy_numpy_1thread']:.2f}",
        ]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))
    for result in results:
        for name, reason in result["skipped"].items():
            print(f"skipped {name} (batch {result['batch']}, {result['density']}): {reason}")


def bench_kernels(
    batches=(8, 32, 128),
    vocab: int = 129_280,
    densities=DENSITIES,
    repeats: int = 15,
    warmup: int = 3,
    skip_torch_compile: bool = False,
    progress=print,
) -> list[dict]:
    """Every (batch, density) pair, all implementations side by side; returns one dict per pair."""
    if not cpu_kernel.FAST_PATH_AVAILABLE:
        progress("WARNING: fd_guided.kernels._cpu_mask is not built; ours_cpu is the torch fallback")
    args = SimpleNamespace(repeats=repeats, warmup=warmup, skip_torch_compile=skip_torch_compile)
    matrix = paddle.randn([256, 256])
    paddle_busy_work(matrix)
    rng = np.random.default_rng(0)
    results = []
    for batch in batches:
        for density in densities:
            result = measure(batch, vocab, density, args, matrix, rng)
            progress(
                f"  kernels batch={batch} {density}: ours {result['median_ms']['ours_cpu']:.3f}ms, "
                f"xgrammar cpu {result['median_ms']['xgrammar_cpu']:.3f}ms, "
                f"copy {result['median_ms']['copy_torch']:.3f}ms"
            )
            results.append(result)
    return results
