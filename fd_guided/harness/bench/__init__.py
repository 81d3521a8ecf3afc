"""`fd-guided bench`: what guided decoding costs, measured side by side in one process.

Three parts, each reported as ratios of things measured in the same run:
  - ``steps``: decode-step time on the reference engine, unguided vs guided vs a FastDeploy-style
    baseline manager, with our overhead split into compile wait, fill, apply and accept;
  - ``kernels``: the mask kernel per path vs xgrammar's CPU kernel vs a plain copy of the logits;
  - ``ttft``: time to first token for a cold complex schema, async compile vs compiling inline.
  - ``spec`` (only when asked for): speculative decoding under a grammar, acceptance length
    with and without masked drafts, guided over unguided speculative step;
  - ``jump_forward`` (only when asked for): forward passes per token and tokens/s, on vs off.
Speed targets live here, never in timed tests.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

PARTS = ("steps", "kernels", "ttft")
EXTRA_PARTS = ("spec", "jump_forward")  # run with --only: each takes minutes at the default sizes


def machine_info() -> dict:
    from importlib.metadata import version

    import paddle
    import torch
    import xgrammar  # noqa: F401

    return {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "torch": torch.__version__,
        "xgrammar": version("xgrammar"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "date": time.strftime("%Y-%m-%d"),
    }


def run_bench(
    parts=PARTS,
    *,
    preset: str = "small",
    batches=(1, 8, 32, 128),
    rounds: int = 3,
    decode_steps: int = 24,
    spec_ks=(1, 3, 5, 7),
    progress: Callable[[str], None] = print,
) -> dict:
    """Run the chosen parts on `preset` (trained or random: `models.py`); returns a JSON-ready dict."""
    from fd_guided.harness.bench.models import is_trained, load_model

    report: dict = {"machine": machine_info(), "preset": preset}
    model, tokenizer = load_model(preset)
    report["model"] = {**model.cfg.__dict__, "tokenizer": tokenizer.name}
    if "steps" in parts:
        from fd_guided.harness.bench.steps import bench_steps, step_ratios

        progress("decode steps: unguided vs guided vs FastDeploy-style, interleaved rounds")
        report["steps"] = step_ratios(bench_steps(model, tokenizer, batches, decode_steps, rounds, progress))
    if "kernels" in parts:
        from fd_guided.harness.bench.kernels import bench_kernels

        progress("mask kernels: ours vs xgrammar vs a copy of the logits")
        report["kernels"] = bench_kernels(batches=tuple(b for b in batches if b >= 8) or (8,), progress=progress)
    if "ttft" in parts:
        from fd_guided.harness.bench.models import guided_config
        from fd_guided.harness.bench.prompts import ttft_prompts
        from fd_guided.harness.bench.ttft import bench_ttft

        progress("time to first token: cold complex schema, async vs inline compile")
        # TTFT varies more from run to run than step times: more rounds for the same confidence. A
        # trained model's prefill (seconds) dwarfs that noise and its rounds cost seconds each.
        report["ttft"] = bench_ttft(
            model,
            tokenizer,
            ttft_prompts(preset, tokenizer),
            rounds=rounds if is_trained(preset) else max(rounds, 7),
            config=guided_config(preset),
            progress=progress,
        )
    if "spec" in parts:
        from fd_guided.harness.bench.spec import bench_spec

        progress("speculative decoding: acceptance length unmasked vs masked drafts, guided vs unguided step")
        from fd_guided.harness.bench.models import drafters
        from fd_guided.harness.bench.spec import DRAFTERS

        report["spec"] = bench_spec(
            model,
            tokenizer,
            ks=spec_ks,
            drafters=drafters(preset, DRAFTERS),
            batch=max(batches),
            rounds=rounds,
            progress=progress,
        )
    if "jump_forward" in parts:
        from fd_guided.harness.bench.jump_forward import bench_jump_forward

        progress("jump-forward: forward passes per token and tokens/s, off vs on")
        report["jump_forward"] = bench_jump_forward(model, tokenizer, rounds=rounds, progress=progress)
    return report


def format_report(report: dict) -> str:
    """A plain-text summary of `run_bench`'s dict."""
    lines = [
        f"machine: {report['machine']}",
        f"model: preset {report['preset']}, hidden {report['model']['hidden_size']}, "
        f"layers {report['model']['num_layers']}, vocab {report['model']['vocab_size']} "
        f"({report['model']['tokenizer']})",
    ]
    if "steps" in report:
        lines.append(
            "\ndecode step (median ms)  batch  unguided  guided  fastdeploy  guided/unguided  fd/unguided  "
            "our overhead / fd overhead"
        )
        for row in report["steps"]:
            lines.append(
                f"{'':25}{row['batch']:>5}  {row['unguided_ms']:8.2f}  {row['guided_ms']:6.2f}  "
                f"{row['fastdeploy_ms']:10.2f}  "
                f"{row['guided_over_unguided']:15.3f}  {row['fastdeploy_over_unguided']:11.3f}  "
                f"{row['our_overhead_over_fastdeploy_overhead']:10.3f}"
            )
        for row in report["steps"]:
            if "guided_llguidance_ms" in row:
                lines.append(
                    f"{'':25}{row['batch']:>5}  llguidance backend: {row['guided_llguidance_ms']:.2f} ms, "
                    f"x{row['guided_llguidance_over_unguided']:.3f} of unguided, "
                    f"overhead {row['llguidance_overhead_over_fastdeploy_overhead']:.3f} of fd's"
                )
        lines.append(
            "guided phases per step (ms): "
            + "; ".join(
                f"b{row['batch']}: " + ", ".join(f"{k} {v:.3f}" for k, v in row["guided_phases_ms"].items())
                for row in report["steps"]
            )
        )
    if "kernels" in report:
        lines.append("\nkernels (median ms)  batch  density  ours  xgrammar_cpu  copy  xgrammar/ours  ours/copy")
        for row in report["kernels"]:
            m = row["median_ms"]
            lines.append(
                f"{'':21}{row['batch']:>5}  {row['density']:<12} {m['ours_cpu']:.3f}  {m['xgrammar_cpu']:.3f}  "
                f"{m['copy_torch']:.3f}  "
                f"{row['speedup_vs_xgrammar_cpu']:.1f}x  {row['ours_over_copy_torch']:.2f}"
            )
    if "ttft" in report:
        lines.append(
            "\nttft from admission (ms)  prompt tokens  unguided  async  inline  compile (in run)  async-unguided  "
            "async beyond max(prefill, compile)  admission  prefill tokens/s  prompt"
        )
        for row in report["ttft"]:
            lines.append(
                f"{'':25}{row['prompt_tokens']:>13}  {row['ttft_unguided_ms']:8.1f}  {row['ttft_async_ms']:5.1f}  "
                f"{row['ttft_inline_ms']:6.1f}  "
                f"{row['compile_in_run_ms']:16.1f}  {row['async_excess_ms']:14.1f}  "
                f"{row['async_excess_over_bound_ms']:+34.1f}  {row['admission_ms']:9.1f}  "
                f"{row.get('prefill_tokens_per_s', float('nan')):16.0f}  {row.get('prompt', '')}"
            )
        lines.append(
            "paired per round, over unguided (ms): "
            + "; ".join(
                f"{row.get('prompt', row['prompt_tokens'])}: async {row['async_minus_unguided_paired_ms']:+.1f}, "
                f"inline {row['inline_minus_unguided_paired_ms']:+.1f}"
                for row in report["ttft"]
                if "async_minus_unguided_paired_ms" in row
            )
        )
    if "spec" in report:
        lines.append(
            "\nspeculative  drafter      k  acceptance unmasked  masked  guided/unguided step  guided ms  "
            "unguided ms  invalid"
        )
        for row in report["spec"]:
            lines.append(
                f"{'':13}{row['drafter']:<11} {row['k']:>2}  {row['acceptance_len_unmasked_drafts']:19.2f}  "
                f"{row['acceptance_len_masked_drafts']:6.2f}  {row['guided_over_unguided_step']:20.3f}  "
                f"{row['guided_step_ms']:9.1f}  {row['unguided_step_ms']:11.1f}  {row['invalid_outputs']:7}"
            )
    if "jump_forward" in report:
        lines.append(
            "\njump-forward  schema                          passes/token off  on      fewer  tokens/s on/off  invalid"
        )
        for row in report["jump_forward"]:
            off, on = row["forward_passes_per_token_off"], row["forward_passes_per_token_on"]
            lines.append(
                f"{'':14}{row['schema']:<32}{off:16.3f}  {on:6.3f}  {100 * (1 - on / off):4.0f}%  "
                f"{row['tokens_per_s_ratio']:15.2f}  {row['invalid_outputs']:7}"
            )
    return "\n".join(lines)
