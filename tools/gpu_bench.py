"""The GPU path, measured: mask apply time, how the fill, the bitmask copy and the kernel sit
against a forward pass, and host reads (syncs) per step of the FastDeploy hooks.

    python tools/gpu_bench.py --out gpu_bench.json            # needs a CUDA GPU, torch, xgrammar
    python tools/gpu_bench.py --only apply,syncs --rows 8,32

NOT RUN YET: written and checked on a CPU-only machine (it refuses to start without CUDA);
docs/benchmarks.md says what to record when it first runs.

apply    `apply_token_bitmask_inplace` on CUDA logits (129,280 columns by default), torch and
         Paddle producers, fp32/bf16, every row masked and a half of them (`indices`), each
         xgrammar backend asked for (triton, cuda when nvcc can build it): GPU time from CUDA
         events around the call's kernels, and host time of the call (it must not wait).
overlap  one guided step of a `GuidedDecodingManager` (a JSON schema per row, real xgrammar
         fills): begin_step (fills start on the fill thread), a "forward" of --forward-ms on the
         stream (a sleep kernel), apply, then a marker. Reports host time of fill end and of
         apply's return against the forward's GPU end, and the GPU time from the forward's end
         to the marker: the copy + kernel left exposed after the forward (with the copy issued
         at apply time, it queues behind the forward). Run twice: as by default, and with
         FD_GUIDED_BITMASK_PREFETCH=1 (the copy on a side stream when the fill ends).
syncs    the FastDeploy adapter's hooks (tests/integrations/fastdeploy/test_adapter_host_reads.py's
         calls) on Paddle GPU tensors, nothing guided and then a guided slot: device reads per
         step counted by `HostReads` (fd_guided's own reads of device tensors), and torch's
         sync-debug warnings raised inside `apply`.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings

ROWS = (1, 8, 32, 128)
VOCAB = 129_280


def require_cuda():
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_bench: no CUDA device (torch.cuda.is_available() is False)")
    return torch


def random_bitmask(rows: int, vocab: int, seed: int = 0):
    import numpy as np
    import torch

    from fd_guided.kernels import allocate_pinned_bitmask, bitmask_width

    packed = np.random.default_rng(seed).integers(-(2**31), 2**31, size=(rows, bitmask_width(vocab)), dtype=np.int64)
    bitmask = allocate_pinned_bitmask(rows, vocab)
    bitmask.copy_(torch.from_numpy(packed.astype(np.int32)))
    return bitmask


def bench_apply(rows_list, vocab: int, repeats: int) -> list[dict]:
    torch = require_cuda()
    from fd_guided.kernels import cuda as cuda_kernel

    results = []
    producers = ["torch"]
    try:
        import paddle

        if paddle.is_compiled_with_cuda():
            producers.append("paddle")
    except ImportError:
        pass
    for producer in producers:
        for dtype in ("float32", "bfloat16"):
            for rows in rows_list:
                bitmask = random_bitmask(rows, vocab)
                base = torch.randn(rows, vocab, device="cuda").to(getattr(torch, dtype))
                logits = base if producer == "torch" else paddle.from_dlpack(base)
                for backend in ("triton", "cuda"):
                    for indices in (None, tuple(range(0, rows, 2))):
                        try:
                            cuda_kernel.apply_token_bitmask_inplace_cuda(logits, bitmask, indices, vocab, backend=backend)
                        except Exception as error:  # noqa: BLE001 - e.g. no nvcc for the native kernel
                            results.append({"producer": producer, "backend": backend, "error": f"{type(error).__name__}: {error}"})
                            break
                        torch.cuda.synchronize()
                        gpu, host = [], []
                        for _ in range(repeats):
                            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            start.record()
                            began = time.perf_counter()
                            cuda_kernel.apply_token_bitmask_inplace_cuda(logits, bitmask, indices, vocab, backend=backend)
                            host.append(time.perf_counter() - began)
                            end.record()
                            end.synchronize()
                            gpu.append(start.elapsed_time(end) / 1e3)
                        results.append({"producer": producer, "dtype": dtype, "rows": rows, "backend": backend,
                                        "indices": indices is not None, "gpu_ms_median": 1e3 * sorted(gpu)[len(gpu) // 2],
                                        "host_ms_median": 1e3 * sorted(host)[len(host) // 2]})
    return results


def bench_overlap(rows_list, vocab: int, forward_ms: float, repeats: int) -> list[dict]:
    torch = require_cuda()
    from fd_guided import GuidedConfig, parse_guided_request
    from fd_guided.manager import GuidedDecodingManager
    from fd_guided.registry import create_backend
    from fd_guided.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("deepseek")
    backend = create_backend("xgrammar", tokenizer, vocab_size=vocab, config=GuidedConfig(backend="xgrammar"))
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id", "name"]}
    spec = parse_guided_request({"guided_json": schema})
    import os

    results = []
    for prefetch, rows in [(p, r) for p in ("0", "1") for r in rows_list]:
        os.environ["FD_GUIDED_BITMASK_PREFETCH"] = prefetch  # read when the manager is built
        manager = GuidedDecodingManager(backend, max_num_seqs=rows)
        for slot in range(rows):
            manager.add_request(slot, spec, prefill_done=True)
        manager.wait_ready(list(range(rows)), timeout_s=120)
        logits = torch.zeros(rows, vocab, device="cuda")
        stay = tokenizer.encode("z")[0]  # a JSON object cannot start with it
        samples = []
        for step in range(repeats + 2):
            torch.cuda.synchronize()
            forward_start, forward_end, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            began = time.perf_counter()
            manager.begin_step(list(range(rows)))
            forward_start.record()
            torch.cuda._sleep(int(forward_ms * 2_000_000))  # ~cycles at ~2 GHz: the forward
            forward_end.record()
            queued = time.perf_counter()
            manager.apply(logits)
            applied = time.perf_counter()
            done.record()
            done.synchronize()
            # a token outside the mask, named as host-forced: not fed, so every step fills the same state
            manager.accept([stay] * rows, masked_out="host", host_forced={stay: "bench"})
            if step >= 2:
                samples.append({"forward_gpu_ms": forward_start.elapsed_time(forward_end),
                                "exposed_after_forward_ms": forward_end.elapsed_time(done),
                                "host_begin_to_apply_return_ms": 1e3 * (applied - began),
                                "host_apply_ms": 1e3 * (applied - queued),
                                "fill_ms": 1e3 * manager.timings.fill / max(1, manager.timings.steps)})
        manager.close()
        results.append({"rows": rows, "prefetch": prefetch == "1", **{k: sorted(s[k] for s in samples)[len(samples) // 2] for k in samples[0]}})
    backend.close()
    return results


def bench_syncs(vocab: int) -> dict:
    torch = require_cuda()
    import numpy as np
    import paddle

    from fd_guided.harness.bench.syncs import HostReads
    from fd_guided.integrations.fastdeploy import GuidedDecoding, get_guided_backend
    from fd_guided.tokenizer import load_tokenizer

    if not paddle.is_compiled_with_cuda():
        return {"error": "paddle is a CPU-only build"}
    slots = 8
    config = _fd_config(slots, vocab)
    tokenizer = load_tokenizer("deepseek")
    fd_backend = get_guided_backend(config, tokenizer=tokenizer)
    guided = GuidedDecoding(config, fd_backend)
    place = paddle.CUDAPlace(0)

    def step(token: int) -> None:
        guided.pre_process([])
        guided.apply_token_mask(paddle.to_tensor(np.zeros((slots, vocab), np.float32), place=place))
        guided.update_output_tokens(paddle.to_tensor(np.full((slots, 1), token, np.int64), place=place))

    out = {}
    with HostReads(count_host_tensors=False) as reads:
        for _ in range(5):
            step(7)
    out["unguided_reads_per_step"] = reads.total / 5
    guided.add_logits_processor(0, fd_backend.get_logits_processor(("regex", "[a-c]{64}"), enable_thinking=False))
    guided.pre_process([0])
    guided.manager.wait_ready([0], timeout_s=60)
    letter = tokenizer.encode("a")[0]
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught, HostReads(count_host_tensors=False) as reads:
            warnings.simplefilter("always")
            for _ in range(5):
                step(letter)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out["guided_reads_per_step"] = reads.total / 5
    out["guided_reads_by_caller"] = dict(reads.by_caller)
    out["torch_sync_warnings"] = [str(w.message)[:200] for w in caught if "synchroniz" in str(w.message)]
    guided.close()
    fd_backend.close()
    return out


def _fd_config(slots: int, vocab: int):
    from types import SimpleNamespace

    return SimpleNamespace(
        structured_outputs_config=SimpleNamespace(guided_decoding_backend="xgrammar", disable_any_whitespace=None,
                                                  reasoning_parser=None),
        model_config=SimpleNamespace(model="deepseek", vocab_size=vocab), scheduler_config=SimpleNamespace(max_num_seqs=slots))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="apply,overlap,syncs")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--forward-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch = require_cuda()
    rows = [int(r) for r in args.rows.split(",")]
    only = set(args.only.split(","))
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version()}
    if "apply" in only:
        report["apply"] = bench_apply(rows, args.vocab, args.repeats)
    if "overlap" in only:
        report["overlap"] = bench_overlap(rows, args.vocab, args.forward_ms, args.repeats)
    if "syncs" in only:
        report["syncs"] = bench_syncs(args.vocab)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
