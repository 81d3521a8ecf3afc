"""Draw the PNG plots of docs/benchmarks.md from `fd-guided bench --json` output.

    pip install matplotlib   # not a dependency of the package
    python tools/plot_bench.py docs/bench.json docs/img
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_steps(report: dict, out: Path) -> None:
    rows = report["steps"]
    batches = [str(r["batch"]) for r in rows]
    width = 0.27
    fig, ax = plt.subplots(figsize=(7, 4))
    for offset, (key, label) in enumerate([("unguided_ms", "unguided"), ("guided_ms", "fd_guided"), ("fastdeploy_ms", "FastDeploy-style")]):
        ax.bar([i + (offset - 1) * width for i in range(len(rows))], [r[key] for r in rows], width, label=label)
    for i, r in enumerate(rows):
        ax.annotate(f"x{r['guided_over_unguided']:.2f}", (i, r["guided_ms"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), batches)
    ax.set_xlabel("batch")
    ax.set_ylabel("decode step, median ms")
    ax.set_title("Decode step time (labels: guided / unguided)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "steps.png", dpi=110)


def plot_kernels(report: dict, out: Path) -> None:
    rows = report["kernels"]
    labels = [f"{r['batch']}\n{r['density']}" for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.27
    for offset, (key, label) in enumerate([("ours_cpu", "fd_guided cpu"), ("xgrammar_cpu", "xgrammar cpu"), ("copy_torch", "copy of the logits")]):
        ax.bar([i + (offset - 1) * width for i in range(len(rows))], [r["median_ms"][key] for r in rows], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("median ms (log)")
    ax.set_title("Applying the mask in place, vocab 129,280, fp32")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "kernels.png", dpi=110)


def plot_ttft(report: dict, out: Path) -> None:
    rows = report["ttft"]
    width = 0.27
    fig, ax = plt.subplots(figsize=(7, 4))
    for offset, (key, label) in enumerate([("ttft_unguided_ms", "unguided"), ("ttft_async_ms", "async compile (ours)"), ("ttft_inline_ms", "inline compile")]):
        ax.bar([i + (offset - 1) * width for i in range(len(rows))], [r[key] for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [str(r["prompt_tokens"]) for r in rows])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token, median ms")
    ax.set_title("Cold complex schema: time to first token")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=110)


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for part, plot in (("steps", plot_steps), ("kernels", plot_kernels), ("ttft", plot_ttft)):
        if part in report:
            plot(report, out)
            print(f"wrote {out / (part + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
