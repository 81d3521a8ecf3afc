"""The compile pool's watch over its workers: the job and worker records, the replies workers send,
their time and memory budgets, demotion to a lowered CPU priority, and kills.

`WorkerSupervisor` is the half of `fd_guided.compile.pool.CompileProcessPool` that owns the
workers and acts on one busy worker at a time; the pool queues, forks and dispatches. The pool's
one loop thread runs both halves.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from ..backends.composite import CHECKS
from ..errors import GrammarCompileCrash, GrammarCompileMemoryError, GrammarCompileTimeout, error_class
from .threads import lower_priority

_MAX_JOBS_PER_WORKER = 256
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss(pid: int) -> int:
    """The resident memory of process `pid` in bytes; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def reset_peak_rss() -> int:
    """This process's resident bytes now (`rss`), with its peak (VmHWM) reset to them where the
    kernel lets us (``clear_refs`` 5): `peak_rss` then reads the peak since; else the peak of the
    process's life, never less."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass
    return rss(os.getpid())


def peak_rss() -> int:
    """This process's peak resident bytes (VmHWM, never below the current size); 0 where unknown."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kill(pid: int) -> None:
    """SIGKILL `pid`; one already gone (or not ours) is ignored."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Job:
    """One compile ``(engine, spec)``, queued or running, and the Future its outcome settles."""

    __slots__ = ("id", "engine", "spec", "future", "started", "background")

    def __init__(self, job_id: int, engine: str, spec, future: Future):
        self.id, self.engine, self.spec, self.future = job_id, engine, spec, future
        self.started = 0.0
        self.background = False  # no request waits for it: it only fills the cache


class Worker:
    """One forked worker process, its pipe and the job it runs (the pool's loop thread owns it)."""

    __slots__ = ("pid", "conn", "job", "baseline_rss", "demoted", "lowered", "idle_class", "jobs_done")

    def __init__(self, pid: int, conn: Connection):
        self.pid, self.conn = pid, conn
        self.job: Job | None = None
        self.baseline_rss = 0
        self.demoted = False  # does not count against max_workers
        self.lowered = False  # runs at a lowered CPU priority: it exits after its job
        self.idle_class = False  # in the idle CPU class
        self.jobs_done = 0


class WorkerSupervisor:
    """Per-worker supervision for `CompileProcessPool` (see the module docstring): it owns the
    workers (`_workers`, by pid) and their budgets; its methods run on the pool's loop thread only.

    Args:
        config: the `GuidedConfig` (`background_idle_class`); also handed to forked workers.
        max_workers: foreground workers; at most twice as many run demoted.
        timeout_s: a job running longer is killed (`GrammarCompileTimeout`).
        memory_limit_bytes: a job growing its worker by more is killed (`GrammarCompileMemoryError`).
        demote_after_s: a job running longer gets a lowered CPU priority (not a `composite.CHECKS`
            job: short, and the request it gates waits for its verdict).
        on_event: called with "killed_timeout", "killed_memory", "crashed", "demoted" (and the
            pool's "forked").
    """

    def __init__(
        self,
        config: Any,
        *,
        max_workers: int,
        timeout_s: float,
        memory_limit_bytes: int,
        demote_after_s: float,
        on_event=None,
    ):
        self._config = config
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self.demote_after_s = demote_after_s
        self._on_event = on_event or (lambda name: None)
        self._workers: dict[int, Worker] = {}

    def _receive(self, worker: Worker) -> None:
        job = worker.job
        assert job is not None  # the loop receives from busy workers only
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._drop(worker)
            self._on_event("crashed")
            job.future.set_exception(
                GrammarCompileCrash(
                    f"the {job.engine} compiler crashed on this constraint; its worker process was replaced"
                )
            )
            return
        worker.job = None
        worker.jobs_done += 1
        if message[1] == "ok":
            job.future.set_result((message[2], message[3]))
        else:
            _, _, class_name, text, part, feature = message
            job.future.set_exception(error_class(class_name)(text, part=part, feature=feature))
        if worker.lowered or worker.jobs_done >= _MAX_JOBS_PER_WORKER or self._leaked(worker):
            self._drop(worker)

    def _leaked(self, worker: Worker) -> bool:
        # Native allocators keep freed memory; a worker that kept a quarter of the budget is retired.
        return rss(worker.pid) - worker.baseline_rss > self.memory_limit_bytes // 4

    def _demote_worker(self, worker: Worker) -> None:
        """Lower the worker's CPU priority (`lower_priority`: the idle class for a job no request
        waits for, else niceness 19: idle class could starve a job a request waits for under a
        saturated CPU until its time budget kills it) and stop counting it against `max_workers`:
        always for a background job (the lane bounds those), for a slow one while fewer than twice
        `max_workers` are demoted. A lowered worker cannot be raised back without privileges: it
        exits after its job."""
        idle_class = (
            worker.job is not None and worker.job.background and getattr(self._config, "background_idle_class", True)
        )
        if idle_class and not worker.idle_class:
            worker.idle_class = lower_priority(worker.pid, idle_class=True)
            worker.lowered = worker.lowered or worker.idle_class
        elif not worker.lowered:
            worker.lowered = lower_priority(worker.pid, idle_class=False)
        background = worker.job is not None and worker.job.background
        if worker.demoted or not (worker.lowered or background):
            return
        if background or sum(w.demoted for w in self._workers.values()) < 2 * self.max_workers:
            worker.demoted = True
            worker.lowered = True  # exits after its job: a background worker never serves a request's job
            self._on_event("demoted")

    def _police(self) -> None:
        now = time.monotonic()
        for worker in [w for w in self._workers.values() if w.job is not None]:
            job = worker.job
            assert job is not None  # the list holds busy workers only
            elapsed = now - job.started
            if elapsed > self.timeout_s:
                self._kill_job(
                    worker,
                    GrammarCompileTimeout(
                        f"the {job.engine} compile ran past its {self.timeout_s:g} s budget and was stopped"
                    ),
                    "killed_timeout",
                )
            elif rss(worker.pid) - worker.baseline_rss > self.memory_limit_bytes:
                self._kill_job(
                    worker,
                    GrammarCompileMemoryError(
                        f"the {job.engine} compile grew past its {self.memory_limit_bytes >> 20} MiB memory budget"
                        " and was stopped"
                    ),
                    "killed_memory",
                )
            elif not worker.lowered and elapsed > self.demote_after_s and job.engine != CHECKS:
                # A checks job is short and gates its request (its refusal names the feature):
                # demoted among nice-19 jobs under load it ran past the budget instead.
                self._demote_worker(worker)

    def _kill_job(self, worker: Worker, error: BaseException, event: str) -> None:
        job = worker.job
        kill(worker.pid)
        self._drop(worker)
        self._on_event(event)
        assert job is not None  # callers pass busy workers only
        job.future.set_exception(error)

    def _drop(self, worker: Worker) -> None:
        self._workers.pop(worker.pid, None)
        kill(worker.pid)
        worker.conn.close()
