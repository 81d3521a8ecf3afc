"""Event-loop lag in a serving process while guided requests with cold schemas decode, per policy.

    python tools/loop_lag.py --out docs/loop_lag.json

One process, as `fd-guided serve` runs it: an asyncio loop (a 10 ms timer; its overshoot is the
lag) beside a `ReferenceEngine` thread decoding `--requests` guided requests, each with a distinct
never-seen complex schema (`tools/load.py`'s), under ``auto``: llguidance serves them within
milliseconds and xgrammar compiles them for the cache (seconds each). Lag is measured from the
first submit until `--tail-s` after the last request finished (the cache-only compiles still
run then). Policies, run in turn in this process, each on fresh schemas:

  idle   `GuidedConfig.background_idle_class=True` (default): cache-only compiles queue last and
         run, with the loading of their results, in the idle CPU class
  inline as idle, and masks filled inline in the step (`overlap_fill=False`) instead of on a
         thread beside the forward
  nice   `background_idle_class=False`: niceness 19 instead (the behaviour before it existed)
  slice  as idle, and the loop thread asks Linux (6.12+, ``sched_setattr``) for a 0.2 ms
         scheduler slice (`shorten_slice`), so that when it wakes it preempts a running thread of
         the same priority instead of waiting out that thread's protected slice (an experiment:
         docs/benchmarks.md has what it gave)
  none   unguided requests (the same prompts): the floor of this host

No HTTP: the server's own handling adds the same to every policy (`tools/load.py` measures it).
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import platform
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import complex_schema  # noqa: E402

POLICIES = ("idle", "slice", "inline", "nice", "none")
# sched_setattr's syscall number per architecture (no libc wrapper exists).
_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
MIN_SLICE_S = 0.0001


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64)]


def shorten_slice(slice_s: float = 0.0002) -> bool:
    """Ask the scheduler for a `slice_s` slice for the calling thread (SCHED_OTHER, its niceness
    kept). False on other platforms or when refused (kernels before 6.12 accept and ignore it)."""
    number = _SYS_SCHED_SETATTR.get(platform.machine())
    if number is None or not sys.platform.startswith("linux"):
        return False
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), sched_policy=os.SCHED_OTHER, sched_flags=0, sched_nice=nice,
                          sched_runtime=int(max(slice_s, MIN_SLICE_S) * 1e9))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(number, 0, ctypes.byref(attr), 0) != 0:
            return False
    except (OSError, AttributeError, ValueError):
        return False
    return True


def percentiles(values: list[float]) -> dict:
    values = sorted(values)
    pick = lambda q: values[int(q * (len(values) - 1))] * 1000 if values else None  # noqa: E731
    return {"count": len(values), "p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "max_ms": pick(1.0)}


def run_policy(policy: str, args, offset: int) -> dict:
    from fd_guided import GuidedConfig
    from fd_guided.harness.engine.engine import ReferenceEngine

    config = GuidedConfig(backend="auto", background_idle_class=policy != "nice")
    engine = ReferenceEngine.default(preset=args.preset, max_num_seqs=args.requests + 1, guided_config=config,
                                     guided=policy != "none", overlap_fill=policy != "inline")
    prompt = "Fill in the record."
    engine.generate([{"prompt": prompt, "guided_json": complex_schema(offset - 1)} if policy != "none" else {"prompt": prompt}],
                    max_tokens=4)  # warm: workers forked, first compile done
    requests = [{"prompt": prompt, **({"guided_json": complex_schema(offset + i)} if policy != "none" else {})}
                for i in range(args.requests)]
    steps: list[float] = []
    done = threading.Event()

    def decode():
        for index, request in enumerate(requests):
            engine.submit(request, max_tokens=args.max_tokens, index=index)
        while engine.has_unfinished():
            started = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - started)
        done.set()

    async def measure() -> list[float]:
        if policy == "slice":
            shorten_slice()
        lags: list[float] = []
        worker = threading.Thread(target=decode, name="engine", daemon=True)
        worker.start()
        tail_end = None
        while tail_end is None or time.perf_counter() < tail_end:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - started - 0.01)
            if tail_end is None and done.is_set():
                tail_end = time.perf_counter() + args.tail_s
        return lags

    started = time.perf_counter()
    lags = asyncio.run(measure())
    wall = time.perf_counter() - started
    engine.close()
    return {"policy": policy, "loop_lag": percentiles(lags), "engine_step": percentiles(steps), "wall_s": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--tail-s", type=float, default=10.0, help="lag measured this long after decoding ends")
    parser.add_argument("--switch-interval-ms", type=float, default=1.0, help="as `fd-guided serve` sets it")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    base = int(time.time()) % 100_000 * 1000  # fresh schemas per run and per policy
    rows = []
    for index, policy in enumerate(args.policies):
        row = run_policy(policy, args, base + index * 1000)
        rows.append(row)
        lag, step = row["loop_lag"], row["engine_step"]
        print(f"{policy:5s} loop lag ms p50 {lag['p50_ms']:.2f} p90 {lag['p90_ms']:.2f} p99 {lag['p99_ms']:.2f} "
              f"max {lag['max_ms']:.2f} (n={lag['count']}) | engine step ms p50 {step['p50_ms']:.0f} "
              f"p99 {step['p99_ms']:.0f} | {row['wall_s']} s", flush=True)
    report = {"host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "config": vars(args), "rows": rows}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
