"""The event-loop thread's CPU scheduling: a real-time round-robin slot, or the normal class.

Why: on a host whose cores are busy (a CPU forward, compile workers, admission, another process),
a waking event loop waits for a core. Measured over HTTP with 64 cold compiles in flight on 2 cores
(docs/benchmarks.md): the loop's 10 ms timer ran up to ~15-20 ms late at p99 in the normal class,
whatever else we tried (its niceness at -10, every other server thread at +10, a 0.1 ms EEVDF
slice: none moved the p99 beyond noise); with ``SCHED_RR`` priority 1 the p99 was ~5 ms. The
normal class lets a running thread keep its core for its slice; a real-time thread preempts it.

What is changed, and only that: the calling thread (the event loop's) gets ``SCHED_RR`` at the
lowest real-time priority, with ``SCHED_RESET_ON_FORK``, so no thread or process it starts
afterwards inherits it (admission threads, executor threads, subprocesses stay in the normal
class). The loop runs I/O and small bookkeeping only (the engine runs in its own process:
`engine_process`); were it ever to spin, the kernel's real-time throttling (``sched_rt_runtime_us``,
95% by default) still leaves CPU to everyone else, and round-robin at priority 1 yields to any
real-time task of the host's.

Needs ``CAP_SYS_NICE`` or a non-zero ``RLIMIT_RTPRIO``: the ``auto`` mode falls back to the
normal class and says so; ``realtime`` refuses to start without it; ``normal`` never asks.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

MODES = ("auto", "realtime", "normal")
# The lowest real-time priority: above every normal-class thread, below any real-time task.
_RT_PRIORITY = 1


class LoopPriorityError(RuntimeError):
    """``realtime`` was asked for and the system refused it."""


@dataclass(frozen=True)
class LoopScheduling:
    """What the loop thread runs with: `policy` ``SCHED_RR`` or ``SCHED_OTHER``, and why."""

    policy: str
    priority: int
    note: str

    def describe(self) -> str:
        return f"{self.policy} priority {self.priority}" + (f" ({self.note})" if self.note else "")


def set_loop_priority(mode: str) -> LoopScheduling:
    """Apply `mode` (one of `MODES`) to the calling thread; returns what it now runs with.

    Raises LoopPriorityError for ``realtime`` when refused, ValueError for an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"loop priority must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "normal":
        return LoopScheduling("SCHED_OTHER", 0, "as asked")
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_RESET_ON_FORK"):
        return _refused(mode, "real-time scheduling is set only on Linux")
    try:
        os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(_RT_PRIORITY))
    except OSError as error:
        return _refused(mode, f"SCHED_RR refused: {error.strerror}; needs CAP_SYS_NICE or RLIMIT_RTPRIO >= 1")
    return current_scheduling("threads it starts stay SCHED_OTHER")


def current_scheduling(note: str = "") -> LoopScheduling:
    """The calling thread's policy and priority, as the kernel reports them."""
    if not hasattr(os, "sched_getscheduler"):
        return LoopScheduling("unknown", 0, note)
    policy = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    names = {
        getattr(os, name): name
        for name in ("SCHED_OTHER", "SCHED_RR", "SCHED_FIFO", "SCHED_BATCH", "SCHED_IDLE")
        if hasattr(os, name)
    }
    return LoopScheduling(names.get(policy, str(policy)), os.sched_getparam(0).sched_priority, note)


def _refused(mode: str, reason: str) -> LoopScheduling:
    if mode == "realtime":
        raise LoopPriorityError(f"--loop-priority realtime: {reason}")
    return LoopScheduling("SCHED_OTHER", 0, reason)
