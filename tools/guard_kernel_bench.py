"""The uniqueItems guard's cost and the CPU mask kernel, before and after, side by side in one run.

    OMP_WAIT_POLICY=PASSIVE python tools/guard_kernel_bench.py [--part guard|kernels|both]
        [--before REV] [--before-tree DIR] [--repeats 9] [--json docs/bench_guard_kernels.json]
        [--plot docs/img/guard_kernels.png]

guard: tools/unique_guard_bench.py (three outputs walked by `--batch` requests in lockstep, one
batched fill timed per step: unguarded, before (`--before-tree`, a built worktree of the revision
to compare with, in a worker process), the Python reference alone, after; and `accept_token`).

kernels: 129,280-token rows, batch 8/32/128, `half_sparse` (even rows allow 1-200 tokens, odd rows
~95%) and `json_trace` (real xgrammar masks of a JSON document); before each timed call a Paddle
matmul (Paddle loaded and busy); ours before (the kernel at `--before`, compiled here under another
module name), ours after with 1 and 2 threads, xgrammar's CPU and torch.compile kernels, a copy.
Absolute times depend on what else the machine runs: read the ratios, measured in the same run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the harness sets it, before Paddle and torch load

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
VOCAB = 129_280


# ----- guard -------------------------------------------------------------------------------------

def guard_part(batch: int, repeats: int, before_tree: Path | None) -> list[dict]:
    """The guard's scenarios, before and after (tools/unique_guard_bench.py)."""
    sys.path.insert(0, str(REPO / "tools"))
    from unique_guard_bench import guard_rows

    return guard_rows(batch, repeats, before_tree=before_tree)


# ----- kernels -----------------------------------------------------------------------------------

def build_before(rev: str):
    """The CPU kernel as it was at `rev`, compiled into a temporary module `_cpu_mask_before`."""
    source = subprocess.run(["git", "show", f"{rev}:fd_guided/kernels/_cpu_mask.c"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="cpu_mask_before_"))
    (folder / "before.c").write_text(source)
    target = folder / f"_cpu_mask_before{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["cc", "-O3", "-std=c11", "-shared", "-fPIC", "-DPyInit__cpu_mask=PyInit__cpu_mask_before",
                    f"-I{sysconfig.get_paths()['include']}", str(folder / "before.c"), "-o", str(target)], check=True)
    spec = importlib.util.spec_from_file_location("_cpu_mask_before", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernels_part(before_rev: str, repeats: int, batches=(8, 32, 128)) -> list[dict]:
    import paddle
    import xgrammar

    from fd_guided.harness.bench.kernels import make_bitmask
    from fd_guided.kernels import cpu as cpu_kernel

    before = build_before(before_rev)
    matrix = paddle.randn([256, 256])
    rng = np.random.default_rng(0)
    out = []
    for batch in batches:
        for density in ("half_sparse", "json_trace"):
            logits = torch.randn(batch, VOCAB)
            if density == "half_sparse":
                bitmask = make_bitmask("json_sparse", batch, VOCAB, rng)
                bitmask[1::2] = make_bitmask("nearly_all", batch, VOCAB, rng)[1::2]
            else:
                bitmask = make_bitmask("json_trace", batch, VOCAB, rng)
            bitmask = bitmask.contiguous()
            target = torch.empty_like(logits)
            args = (logits.data_ptr(), VOCAB, "float32", bitmask.data_ptr(), bitmask.shape[1], VOCAB, batch)
            functions = {
                "ours_before": lambda: before.apply(*args),
                "ours_1_thread": lambda: cpu_kernel._cpu_mask.apply(*args, threads=1),
                "ours_2_threads": lambda: cpu_kernel._cpu_mask.apply(*args, threads=2),
                # the same loop without the non-temporal stores of all-masked blocks
                "ours_no_stream": lambda: cpu_kernel._cpu_mask.apply(*args, threads=1, path=cpu_kernel._cpu_mask.paths()[-2:][0]),
                "xgrammar_cpu": lambda: xgrammar.apply_token_bitmask_inplace(logits, bitmask, backend="cpu"),
                "xgrammar_torch_compile": lambda: xgrammar.apply_token_bitmask_inplace(logits, bitmask, backend="torch_compile"),
                "copy": lambda: target.copy_(logits),
            }
            for function in functions.values():
                for _ in range(3):
                    function()
            times: dict[str, list[float]] = {name: [] for name in functions}
            for _ in range(repeats):  # round robin: each round times every path once, after a matmul
                for name, function in functions.items():
                    paddle.matmul(matrix, matrix).numpy()
                    started = time.perf_counter()
                    function()
                    times[name].append((time.perf_counter() - started) * 1e3)
            median = {name: statistics.median(values) for name, values in times.items()}
            best_peer = min(median["xgrammar_cpu"], median["xgrammar_torch_compile"])
            row = {"batch": batch, "density": density, "median_ms": median,
                   "ours_1_thread_over_best_peer": median["ours_1_thread"] / best_peer,
                   "ours_2_threads_over_best_peer": median["ours_2_threads"] / best_peer,
                   "ours_before_over_best_peer": median["ours_before"] / best_peer,
                   "ours_1_thread_over_copy": median["ours_1_thread"] / median["copy"]}
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [key for key in ("guard", "kernels") if report.get(key)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4), squeeze=False)
    for ax, key in zip(axes[0], panels):
        rows = report[key]
        if key == "guard":
            sys.path.insert(0, str(REPO / "tools"))
            from unique_guard_bench import plot_panel

            plot_panel(ax, rows)
            continue
        else:
            series = [("ours_before", "ours before"), ("ours_no_stream", "ours, no streaming"), ("ours_1_thread", "ours, 1 thread"),
                      ("ours_2_threads", "ours, 2 threads"),
                      ("xgrammar_cpu", "xgrammar cpu"), ("xgrammar_torch_compile", "xgrammar torch.compile"), ("copy", "copy")]
            labels = [f"{r['batch']}\n{r['density']}" for r in rows]
            values = lambda r, s: r["median_ms"][s]  # noqa: E731
            ax.set_ylabel("apply, ms (log)")
            ax.set_yscale("log")
        width = 0.8 / len(series)
        for offset, (name, label) in enumerate(series):
            positions = [i + (offset - (len(series) - 1) / 2) * width for i in range(len(rows))]
            ax.bar(positions, [values(r, name) for r in rows], width, label=label)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.legend(fontsize=7)
        ax.set_title("uniqueItems guard (32 rows in lockstep)" if key == "guard" else "CPU mask kernels, Paddle busy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def head_commit() -> str:
    """This tree's commit, with "+dirty" where files differ from it (what the figures are of)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "fd_guided", "tools", "setup.py")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def load_average() -> str:
    """/proc/loadavg's first three fields (the machine is shared: the figures' context)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("guard", "kernels", "both"), default="both")
    parser.add_argument("--merge", type=Path, help="keep the other part's results from this JSON report")
    parser.add_argument("--before", default="77baba3", help="git revision whose CPU kernel is 'before'")
    parser.add_argument("--before-tree", type=Path, help="a built worktree whose uniqueItems guard is 'before'")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    report: dict = {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cpu_count": os.cpu_count(),
                    "date": time.strftime("%Y-%m-%d %H:%M"), "commit": head_commit(),
                    "loadavg_before": load_average()}
    if args.part in ("guard", "both"):
        report["guard"] = guard_part(args.batch, max(1, args.repeats // 3), args.before_tree)
    if args.part in ("kernels", "both"):
        report["kernels"] = kernels_part(args.before, args.repeats)
    report["loadavg_after"] = load_average()
    if args.merge:
        kept = json.loads(args.merge.read_text())
        report = {**{key: kept[key] for key in ("guard", "kernels") if key in kept and key not in report}, **report}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
