"""Killable compile workers: a pool of forked processes with per-job time and memory budgets.

One *zygote* process per tokenizer (shared by every pool of this process that uses it) imports
the engines and builds the tokenizer tables once; workers are forked from it on demand, ready in
milliseconds (~10 ms of zygote round trip on a 129k vocabulary, done on the pool's forker thread,
so the loop never waits for a fork: a job goes to an idle worker first, and replies are read
while a fork is under way). The pool's one loop thread owns every worker: it dispatches jobs (shortest expected
first: constraint size times the engine's `compile_cost_weight`, so a quick compile is not queued
behind a bomb, nor an llguidance job that serves a cold `auto` request behind xgrammar jobs that
only fill the cache), polls each busy worker's memory,
lowers the CPU priority of a job that runs past `demote_after_s` (it then stops counting against
`max_workers`, so fresh compiles get a worker and most of the CPU; at most twice `max_workers`
jobs run demoted), runs a job no request waits for any more (`to_background`: a cache-only
compile) after all others, in the idle CPU class and at most `background_workers` at once, on
workers outside the foreground count (so a backlog of them never holds a slot a request's job
needs), and kills a job that runs past
`timeout_s` or grows its worker by more than `memory_limit_bytes`. A killed or crashed worker is
simply gone: its job fails with a typed error and a fresh worker is forked when one is needed.
`close()` kills everything and returns at once; so does interpreter exit, and the workers and
zygotes exit by themselves when this process dies.

The per-worker half (replies, budgets, demotion, kills) is `fd_guided.compile.supervisor`.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from multiprocessing import connection
from typing import Any

from ..errors import GuidedDecodingError, InvalidGrammarError
from .supervisor import Job, Worker, WorkerSupervisor, kill, rss
from .zygote import _zygotes, shutdown_zygotes, zygote_for  # noqa: F401 - _zygotes: tests look at it

logger = logging.getLogger(__name__)

_POLL_S = 0.02


def background_lane(cpus: int | None = None) -> int:
    """How many cache-only compiles run at once: half the cores (at least one). They run in the
    idle CPU class, so they only take CPU nothing else wants; the bound keeps them from piling up
    as processes (memory) and leaves cores for the compiles requests wait for."""
    return max(1, (cpus or os.cpu_count() or 2) // 2)


# ----- the pool ---------------------------------------------------------------------------------------


class CompileProcessPool(WorkerSupervisor):
    """Compile jobs ``(engine, spec)`` in killable worker processes; see the module docstring.

    `submit` returns a Future of ``(serialized grammar bytes or a `transfer.CompileHere`, compile
    seconds)`` or fails it with `GrammarCompileTimeout`, `GrammarCompileMemoryError`,
    `GrammarCompileCrash` or the `InvalidGrammarError` the compiler raised. `on_event(name)` is
    called for "killed_timeout", "killed_memory", "crashed", "demoted" and "forked" (metrics).
    """

    def __init__(
        self,
        zygote_key: str,
        recipe: tuple[str, dict],
        config: Any,
        *,
        max_workers: int,
        timeout_s: float,
        memory_limit_bytes: int,
        demote_after_s: float,
        spare_workers: int = 1,
        on_event=None,
        cost_weights: dict[str, int] | None = None,
        background_workers: int | None = None,
    ):
        super().__init__(
            config,
            max_workers=max_workers,
            timeout_s=timeout_s,
            memory_limit_bytes=memory_limit_bytes,
            demote_after_s=demote_after_s,
            on_event=on_event,
        )
        self._zygote_key, self._recipe = zygote_key, recipe
        self.spare_workers = spare_workers
        self.background_workers = background_workers or background_lane()
        self.cost_weights = dict(cost_weights or {})
        self._pending: list[tuple[bool, int, int, Job]] = []
        self._incoming: list[Job] = []
        self._incoming_lock = threading.Lock()
        self._cancelled: list[tuple[Future, BaseException, bool]] = []
        self._backgrounded: list[Future] = []
        # Forks run on their own thread (a zygote round trip is ~10 ms): the loop never waits for
        # one, so a job is sent to an idle worker and a reply received while a fork is under way.
        self._forked: list[Any] = []  # (pid, conn), or why the fork failed (str), from the forker
        self._forking = 0  # forks asked of the forker and not yet taken in (loop thread only)
        self._fork_failed = False  # no fork until a new job comes (the zygote is not respawned in a loop)
        self._fork_requests: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._closed = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._thread = threading.Thread(target=self._loop, name="fd-guided-compile-pool", daemon=True)
        self._thread.start()
        self._forker = threading.Thread(target=self._fork_loop, name="fd-guided-compile-fork", daemon=True)
        self._forker.start()
        _live_pools.add(self)

    # ----- caller side -----

    def submit(self, engine: str, spec) -> Future:
        future: Future = Future()
        if self._closed:
            future.set_exception(GuidedDecodingError("the compile service is closed"))
            return future
        with self._incoming_lock:
            self._incoming.append(Job(next(self._ids), engine, spec, future))
        self._wake()
        return future

    def cancel_pending(self, run: Future, error: BaseException) -> None:
        """Drop the job of `run` if no worker has taken it yet (it fails with `error`); a job
        already running finishes. Asynchronous: the loop thread owns the queue."""
        with self._incoming_lock:
            self._cancelled.append((run, error, False))
        self._wake()

    def cancel(self, run: Future, error: BaseException) -> None:
        """Drop the job of `run`, queued or running (its worker is killed: a fresh one forks in
        milliseconds); it fails with `error`. For work nobody can use any more. Asynchronous."""
        with self._incoming_lock:
            self._cancelled.append((run, error, True))
        self._wake()

    def to_background(self, run: Future) -> None:
        """No request waits for `run` any more (it only fills the cache): it queues after every job
        a request waits for, and runs (or goes on running) in the idle CPU class. Asynchronous."""
        with self._incoming_lock:
            self._backgrounded.append(run)
        self._wake()

    def worker_pids(self) -> list[int]:
        return list(self._workers)

    def stats(self) -> dict[str, int]:
        workers = list(self._workers.values())
        return {
            "workers": len(workers),
            "busy": sum(w.job is not None for w in workers),
            "demoted": sum(w.demoted for w in workers),
            "background": self._background_running(),
            "queued": len(self._pending) + len(self._incoming),
        }

    def close(self, timeout_s: float = 2.0) -> None:
        """Kill every worker, fail every job still pending or running; returns within `timeout_s`."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._fork_requests.put(False)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        for worker in list(self._workers.values()):  # in case the loop is stuck
            kill(worker.pid)

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except (BlockingIOError, OSError):
            pass

    # ----- the loop (one thread owns all worker state) -----

    def _loop(self) -> None:
        try:
            while not self._closed:
                self._take_incoming()
                self._dispatch()  # idle workers first: a job never waits for a fork another one needs
                self._fork_workers()
                busy = [w for w in self._workers.values() if w.job is not None]
                ready = connection.wait([self._wake_read] + [w.conn for w in busy], _POLL_S if busy else None)
                for item in ready:
                    if item == self._wake_read:
                        os.read(self._wake_read, 4096)
                    else:
                        self._receive(next(w for w in busy if w.conn is item))
                self._police()
        except Exception:  # noqa: BLE001 - a bug here must fail the jobs, not leave them hanging
            logger.exception("the compile pool loop failed")
        finally:
            self._closed = True
            self._shutdown()

    def _take_incoming(self) -> None:
        with self._incoming_lock:
            jobs, self._incoming = self._incoming, []
            cancelled, self._cancelled = self._cancelled, []
            backgrounded, self._backgrounded = self._backgrounded, []
            forked, self._forked = self._forked, []
        self._take_forked(forked)
        self._fork_failed = self._fork_failed and not jobs
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                heapq.heappush(self._pending, self._queue_entry(job))
        if cancelled:
            self._drop_pending({run: error for run, error, _ in cancelled})
            running = {run: error for run, error, kill in cancelled if kill}
            for worker in [w for w in self._workers.values() if w.job is not None and w.job.future in running]:
                assert worker.job is not None  # the list holds busy workers only
                self._kill_job(worker, running[worker.job.future], "cancelled")
        if backgrounded:
            self._move_to_background(set(backgrounded))

    def _move_to_background(self, runs: set[Future]) -> None:
        for entry in self._pending:
            entry[-1].background = entry[-1].background or entry[-1].future in runs
        self._pending = [self._queue_entry(entry[-1]) for entry in self._pending]
        heapq.heapify(self._pending)
        for worker in self._workers.values():
            if worker.job is not None and worker.job.future in runs:
                worker.job.background = True
                self._demote_worker(worker)

    def _drop_pending(self, errors: dict[Future, BaseException]) -> None:
        kept = []
        for entry in self._pending:
            error = errors.get(entry[-1].future)
            if error is None:
                kept.append(entry)
            else:
                entry[-1].future.set_exception(error)
        if len(kept) != len(self._pending):
            heapq.heapify(kept)
            self._pending = kept

    def _queue_entry(self, job: Job) -> tuple[bool, int, int, Job]:
        """Shortest expected job first, by order of magnitude (FIFO within one): a short regex is
        not queued behind four 100k-entry choice lists, and a cheap engine's job (the one that
        serves a cold `auto` request) not behind an expensive engine's job for the cache."""
        cost = len(job.spec.source) * self.cost_weights.get(job.engine, 1)
        return (job.background, cost.bit_length(), job.id, job)

    def _foreground(self) -> list[Worker]:
        return [w for w in self._workers.values() if not w.demoted]

    def _background_running(self) -> int:
        return sum(w.job is not None and w.job.background for w in self._workers.values())

    def _startable(self) -> int:
        """Pending jobs that could start now: every foreground one, background ones up to the lane."""
        background = sum(entry[-1].background for entry in self._pending)
        lane = max(0, self.background_workers - self._background_running())
        return len(self._pending) - background + min(background, lane)

    def _fork_workers(self) -> None:
        """Ask the forker for the workers the queue needs beyond those idle or on their way."""
        if self._fork_failed:
            return
        foreground = self._foreground()
        idle = sum(w.job is None for w in foreground)
        wanted = min(self.max_workers, len(foreground) - idle + self._startable() + self.spare_workers)
        for _ in range(wanted - len(foreground) - self._forking):
            self._forking += 1
            self._fork_requests.put(True)

    def _fork_loop(self) -> None:
        """The forker thread: one zygote round trip per request, the result handed to the loop."""
        while self._fork_requests.get() and not self._closed:
            forked: tuple | str
            try:
                zygote = zygote_for(self._zygote_key, self._recipe)
                forked = zygote.fork(self._config) or str(zygote.error or "the zygote could not fork")
            except Exception as error:  # noqa: BLE001 - reported as a zygote that could not fork
                logger.exception("forking a compile worker failed")
                forked = repr(error)
            if not isinstance(forked, str) and self._closed:
                kill(forked[0])
                forked[1].close()
                return
            with self._incoming_lock:
                self._forked.append(forked)  # (pid, connection), or why it failed
            self._wake()

    def _take_forked(self, forked: list[Any]) -> None:
        for result in forked:
            self._forking -= 1
            if isinstance(result, str):
                self._fork_failed = True
                self._fail_pending(InvalidGrammarError(f"the compile workers could not start: {result}"))
                continue
            worker = Worker(*result)
            self._workers[worker.pid] = worker
            self._on_event("forked")

    def _dispatch(self) -> None:
        """Start pending jobs on idle foreground workers, best first. Cache-only (background) jobs
        queue after every other, and at most `background_workers` of them run at once: their
        workers leave the foreground (idle CPU class, not counted against `max_workers`), so a
        backlog of them never holds the worker or the core a waiting request needs."""
        for worker in self._foreground():
            if not self._pending:
                return
            if worker.job is not None:
                continue
            if self._pending[0][-1].background and self._background_running() >= self.background_workers:
                return  # the head is background, so is everything behind it
            *_, job = heapq.heappop(self._pending)
            try:
                worker.conn.send((job.id, job.engine, job.spec))
            except OSError:
                self._drop(worker)
                heapq.heappush(self._pending, self._queue_entry(job))
                continue
            worker.job, job.started = job, time.monotonic()
            worker.baseline_rss = rss(worker.pid)
            if job.background:
                self._demote_worker(worker)

    def _fail_pending(self, error: BaseException) -> None:
        while self._pending:
            *_, job = heapq.heappop(self._pending)
            job.future.set_exception(error)

    def _shutdown(self) -> None:
        closed = GuidedDecodingError("the compile service was closed before this compile finished")
        self._take_incoming()
        self._fail_pending(closed)
        self._fork_requests.put(False)
        for worker in list(self._workers.values()):
            if worker.job is not None and not worker.job.future.done():
                worker.job.future.set_exception(closed)
            self._drop(worker)
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass


_live_pools: weakref.WeakSet[CompileProcessPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_live_pools):
        pool.close(timeout_s=0.5)
    shutdown_zygotes()
