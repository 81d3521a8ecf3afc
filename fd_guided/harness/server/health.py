"""Loop health: how late the event loop runs a periodic timer, and how long engine steps take.

`LoopLagMonitor` is an asyncio task that sleeps `interval_s` (10 ms) over and over and records by
how much each wake-up overshoots: any CPU work on the loop thread, and any wait for the GIL that
another thread holds, shows up here as lag. `WindowStats` keeps recent samples of such a series for
percentiles (``GET /stats``; ``POST /stats/reset`` starts a new window, which the load tool does
before each phase); the Prometheus histograms in `fd_guided.harness.server.metrics` keep the totals.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable


class WindowStats:
    """The last `maxlen` samples of one series with their wall-clock times (thread-safe):
    count/mean/p50/p90/p99/max, and the raw series for plots."""

    def __init__(self, maxlen: int = 200_000):
        self._samples: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._since = time.time()

    def add(self, value: float) -> None:
        with self._lock:
            self._samples.append((time.time(), value))

    def snapshot(self, reset: bool = False, series: bool = False) -> dict:
        """The summary of the window; with `series` also ``samples``: [[unix time, value], ...]."""
        with self._lock:
            samples = list(self._samples)
            since = self._since
            if reset:
                self._samples.clear()
                self._since = time.time()
        summary = summarise(sorted(value for _, value in samples)) | {"window_seconds": round(time.time() - since, 3)}
        if series:
            summary["samples"] = [[round(t, 4), value] for t, value in samples]
        return summary


def summarise(sorted_samples: list[float]) -> dict[str, float | int | None]:
    """count, mean and nearest-rank percentiles of already sorted samples (None when empty)."""
    count = len(sorted_samples)
    if not count:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}

    def rank(q: float) -> float:
        return sorted_samples[min(count - 1, max(0, math.ceil(q * count) - 1))]

    return {
        "count": count,
        "mean": sum(sorted_samples) / count,
        "p50": rank(0.5),
        "p90": rank(0.9),
        "p99": rank(0.99),
        "max": sorted_samples[-1],
    }


class LoopLagMonitor:
    """Measures the event loop's scheduling delay with a periodic timer (see the module docstring).

    Args:
        interval_s: the timer's period.
        observe: called with every lag in seconds (e.g. a Prometheus histogram's observe).
    """

    def __init__(self, interval_s: float = 0.01, observe: Callable[[float], None] | None = None):
        self.interval_s = interval_s
        self.window = WindowStats()
        self._observe = observe
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fd-guided-loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - started - self.interval_s)
            self.window.add(lag)
            if self._observe is not None:
                self._observe(lag)
