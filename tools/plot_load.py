"""Draw the load plot of docs/benchmarks.md from `tools/load.py --out` JSON.

    pip install matplotlib   # not a dependency of the package
    python tools/plot_load.py docs/load.json docs/img/load.png

Top row, one panel per phase (unguided, guided): the event loop's lag (a 10 ms timer's overshoot)
and the longest inter-token gap per engine step, over time, with compiles in flight on the right
axis. Bottom: TTFT and TPOT percentiles per phase and request kind.
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def timeline_panel(ax, name: str, phase: dict) -> None:
    start = phase["started_unix"]
    for key, label, style in (("loop_lag", "event-loop lag", "."), ("token_gap", "inter-token gap per step", "x")):
        samples = phase[key].get("samples", [])
        ax.plot([t - start for t, _ in samples], [v * 1000 for _, v in samples], style, markersize=2, label=label)
    ax.axhline(10, color="red", linewidth=0.8, linestyle="--", label="10 ms")
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the phase")
    ax.set_ylabel("ms")
    lag = phase["loop_lag"]
    ax.set_title(f"{name}: loop lag p99 {lag['p99'] * 1000:.1f} ms, max {lag['max'] * 1000:.1f} ms", fontsize=9)
    twin = ax.twinx()
    twin.plot([p["t"] for p in phase["timeline"]], [p["compiles_in_flight"] for p in phase["timeline"]],
              color="gray", linewidth=1, label="compiles in flight")
    twin.set_ylabel("compiles in flight")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper right")


def latency_panel(ax, phases: dict, metric: str) -> None:
    labels, p50, p99 = [], [], []
    for name, phase in phases.items():
        for kind, stats in phase[metric].items():
            if stats.get("count"):
                labels.append(f"{name}\n{kind}")
                p50.append(stats["p50"] * 1000)
                p99.append(stats["p99"] * 1000)
    positions = range(len(labels))
    ax.bar([p - 0.2 for p in positions], p50, 0.4, label="p50")
    ax.bar([p + 0.2 for p in positions], p99, 0.4, label="p99")
    ax.set_xticks(list(positions), labels, fontsize=8)
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title("time to first token" if metric == "ttft" else "time per output token", fontsize=9)
    ax.legend(fontsize=7)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        report = json.load(handle)
    phases = report["phases"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for ax, (name, phase) in zip(axes[0], phases.items()):
        timeline_panel(ax, name, phase)
    latency_panel(axes[1][0], phases, "ttft")
    latency_panel(axes[1][1], phases, "tpot")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
