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


def grouped_bars(ax, rows: list[dict], series: list[tuple], tick_labels: list[str]) -> None:
    """One group of bars per row; `series` holds (value getter, legend label) pairs."""
    width = 0.8 / len(series)
    for offset, (value_of, label) in enumerate(series):
        positions = [i + (offset - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(positions, [value_of(r) for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), tick_labels, fontsize=7 if len(rows) > 6 else 9)
    ax.legend()


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_steps(report: dict, out: Path) -> None:
    rows = report["steps"]
    fig, ax = plt.subplots(figsize=(7, 4))
    series = [(lambda r: r["unguided_ms"], "unguided"), (lambda r: r["guided_ms"], "fd_guided (default: auto)")]
    if all("guided_llguidance_ms" in r for r in rows):
        series.append((lambda r: r["guided_llguidance_ms"], "fd_guided (llguidance pinned)"))
    series.append((lambda r: r["fastdeploy_ms"], "FastDeploy-style"))
    grouped_bars(ax, rows, series, [str(r["batch"]) for r in rows])
    for i, r in enumerate(rows):
        ax.annotate(f"x{r['guided_over_unguided']:.2f}", (i, r["guided_ms"]), ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("batch")
    ax.set_ylabel("decode step, median ms")
    ax.set_title("Decode step time (labels: guided / unguided)")
    save(fig, out / "steps.png")


def plot_kernels(report: dict, out: Path) -> None:
    rows = report["kernels"]
    fig, ax = plt.subplots(figsize=(13, 4.5))
    grouped_bars(ax, rows, [(lambda r: r["median_ms"]["ours_cpu"], "fd_guided cpu"), (lambda r: r["median_ms"]["xgrammar_cpu"], "xgrammar cpu"),
                            (lambda r: r["median_ms"]["copy_torch"], "copy of the logits")], [f"{r['batch']}\n{r['density']}" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("median ms (log)")
    ax.set_title("Applying the mask in place, vocab 129,280, fp32")
    save(fig, out / "kernels.png")


def plot_ttft(report: dict, out: Path) -> None:
    rows = report["ttft"]
    fig, ax = plt.subplots(figsize=(7, 4))
    grouped_bars(ax, rows, [(lambda r: r["ttft_unguided_ms"], "unguided"), (lambda r: r["ttft_async_ms"], "async compile (ours)"),
                            (lambda r: r["ttft_inline_ms"], "inline compile")], [str(r["prompt_tokens"]) for r in rows])
    if all("compile_in_run_ms" in r for r in rows):  # the promise: max(prefill, compile), drawn over the async bar
        bounds = [max(r["ttft_unguided_ms"], r["compile_in_run_ms"]) for r in rows]
        ax.hlines(bounds, [i - 0.13 for i in range(len(rows))], [i + 0.13 for i in range(len(rows))], colors="black",
                  linestyles="dashed", label="max(unguided TTFT, compile)")
        ax.legend()
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token, median ms")
    ax.set_title("Cold complex schema: time to first token")
    save(fig, out / "ttft.png")


def plot_spec(report: dict, out: Path) -> None:
    rows = report["spec"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    labels = [f"{r['drafter']}\nK={r['k']}" for r in rows]
    grouped_bars(left, rows, [(lambda r: r["acceptance_len_unmasked_drafts"], "unmasked drafts"),
                              (lambda r: r["acceptance_len_masked_drafts"], "masked drafts")], labels)
    left.set_ylabel("tokens per target forward per request")
    left.set_title("Acceptance length under a JSON schema")
    grouped_bars(right, rows, [(lambda r: r["guided_over_unguided_step"], "guided / unguided step")], labels)
    right.axhline(1.15, color="black", linestyle="dashed", linewidth=1)
    right.set_ylabel("speculative step time ratio")
    right.set_title(f"Guided speculative step at batch {rows[0].get('batch', '?')} (goal <= 1.15)")
    save(fig, out / "spec.png")


def plot_jump_forward(report: dict, out: Path) -> None:
    rows = report["jump_forward"]
    fig, ax = plt.subplots(figsize=(11, 4))
    grouped_bars(ax, rows, [(lambda r: r["forward_passes_per_token_off"], "jump-forward off"),
                            (lambda r: r["forward_passes_per_token_on"], "jump-forward on")],
                 [r["schema"].replace("_any_whitespace", "\n(any ws)") for r in rows])
    for i, r in enumerate(rows):
        ax.annotate(f"tok/s x{r['tokens_per_s_ratio']:.2f}", (i, r["forward_passes_per_token_off"]), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("forward passes per output token")
    ax.set_title("Jump-forward (labels: tokens/s on / off)")
    save(fig, out / "jump_forward.png")


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for part, plot in (("steps", plot_steps), ("kernels", plot_kernels), ("ttft", plot_ttft), ("spec", plot_spec),
                       ("jump_forward", plot_jump_forward)):
        if part in report:
            plot(report, out)
            print(f"wrote {out / (part + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
