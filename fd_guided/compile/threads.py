"""Threads whose stacks are deep enough for native grammar compilers.

Native compilers recurse over reference and rule chains; on a thread with a small stack a long
chain is a segfault of the whole process. Compiles run in worker processes on threads of
`WORKER_STACK_BYTES`; anything the parent then rebuilds from a compiled grammar (llguidance
re-validates its grammar text, xgrammar deserializes) runs on threads of `PARENT_STACK_BYTES`,
eight times deeper: what compiled in a worker cannot overflow here. `fd_guided.limits` keeps
admitted constraints far inside both.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..admission.deferred import finish_deferred_checks
from ..backends import composite
from ..errors import GrammarCompileTimeout
from .futures import copy_outcome, settle

if TYPE_CHECKING:
    from ..interface import GuidedBackend
    from ..spec import GrammarSpec

WORKER_STACK_BYTES = 8 << 20
PARENT_STACK_BYTES = 64 << 20
# At interpreter exit, how long to wait for a job still inside native code (see `_join_at_exit`).
EXIT_WAIT_S = 60.0

logger = logging.getLogger(__name__)

_stack_size_lock = threading.Lock()


def start_thread(target: Callable[[], None], *, name: str, stack_bytes: int, daemon: bool = True) -> threading.Thread:
    """Start a thread with a stack of `stack_bytes` (the process-wide default is restored)."""
    with _stack_size_lock:
        previous = threading.stack_size(stack_bytes)
        try:
            thread = threading.Thread(target=target, name=name, daemon=daemon)
            thread.start()
        finally:
            threading.stack_size(previous)
    return thread


class DeepStackExecutor:
    """A small fixed pool of daemon threads with deep stacks; `submit` returns a Future.

    Daemon threads: a native call that never returns cannot hold the interpreter's exit for more
    than `EXIT_WAIT_S`; one that returns within it is waited for (`_join_at_exit`).
    """

    def __init__(self, threads: int, *, name: str, stack_bytes: int = PARENT_STACK_BYTES, idle_class: bool = False):
        self._idle_class = idle_class  # the threads run only on CPU nothing else wants (`lower_this_thread`)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._busy = 0  # jobs running now
        self._idle = threading.Condition()
        self._threads = [start_thread(self._run, name=f"{name}-{i}", stack_bytes=stack_bytes) for i in range(threads)]
        _executors.add(self)

    def submit(self, function: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        if self._closed:
            future.set_exception(RuntimeError("executor is shut down"))
            return future
        self._queue.put((future, function, args))
        return future

    def _run(self) -> None:
        if self._idle_class:
            lower_this_thread()
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, function, args = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._idle:
                self._busy += 1
            try:
                future.set_result(function(*args))
            except BaseException as error:  # noqa: BLE001 - delivered to the waiter
                future.set_exception(error)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no job runs; False if one still does after `timeout_s`."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout=timeout_s)

    def shutdown(self, wait_s: float = 0.0) -> None:
        """Stop taking work; queued work is dropped with a cancelled Future. Waits up to `wait_s`
        for a job already running (a native call, milliseconds): a daemon thread still inside
        native code when the interpreter exits can abort the process in C++ destructors."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


LOWEST_NICE = 19


def lower_priority(task_id: int, *, idle_class: bool) -> bool:
    """Lower the CPU priority of process or thread `task_id` (Linux schedules threads; a process id
    is its main thread): niceness 19, or with `idle_class` the SCHED_IDLE class where the platform
    has it (the CPU only when nothing else wants it; niceness 19 where it has not). False when
    neither could be set. Idle class is for work no request waits for: measured on 2 cores with 64
    cold `auto` compiles, with workers at niceness 10 or 19 a waking event loop waited ~4 ms (p90)
    for a core; idle-class tasks are preempted at once by any normal one."""
    if idle_class:
        try:
            os.sched_setscheduler(task_id, os.SCHED_IDLE, os.sched_param(0))
            return True
        except (AttributeError, OSError):
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, task_id, LOWEST_NICE)
        return True
    except (AttributeError, OSError):
        return False


def lower_this_thread() -> bool:
    """The calling thread in the idle CPU class (`lower_priority`)."""
    return lower_priority(threading.get_native_id(), idle_class=True)


_executors: weakref.WeakSet[DeepStackExecutor] = weakref.WeakSet()


@atexit.register
def _join_at_exit() -> None:
    """Wait for jobs still running on executor threads before the interpreter finalizes.

    A daemon thread inside a native call when finalization starts is killed with pthread_exit as
    the call returns and retakes the GIL; the unwind through xgrammar's C++ frames (tvm_ffi's call
    context) ends in std::terminate: the process aborts at exit (seen with a compile that ran past
    its budget in thread isolation). Registered at import, before the compile service's own exit
    hook, so it runs after that hook has shut every executor down: only running jobs remain.
    """
    deadline = time.monotonic() + EXIT_WAIT_S
    busy = [executor for executor in list(_executors) if executor._busy]
    if busy:
        logger.info("fd_guided: waiting up to %.0f s for in-process native jobs to return before exit", EXIT_WAIT_S)
    if not all(executor.wait_idle(max(0.0, deadline - time.monotonic())) for executor in busy):
        logger.warning("fd_guided: an in-process native job still runs at exit; the interpreter may abort")


class ThreadCompileRunner:
    """Compiles in this process on deep-stack threads. A job past its budget fails (its thread runs on)."""

    def __init__(self, backend: GuidedBackend, workers: int, timeout_s: float):
        self.backend, self.timeout_s = backend, timeout_s
        self._executor = DeepStackExecutor(workers, name="fd-guided-compile")
        self._queued: dict[Future, Future] = {}  # outer -> inner, until the inner one is done

    def submit(self, engine: str, spec: GrammarSpec) -> Future:
        outer: Future = Future()

        def work():
            started = time.perf_counter()
            finish_deferred_checks(spec)  # what admission left to the compile (a grammar's syntax, bounds)
            engine_backend = composite.engine(self.backend, engine)
            # As a compile worker does: the engine's own check first (the caller's thread never runs it).
            type(engine_backend).check(spec)
            return engine_backend.compile_checked(spec), time.perf_counter() - started

        timer = threading.Timer(
            self.timeout_s,
            settle,
            (
                outer,
                None,
                GrammarCompileTimeout(
                    f"the {engine} compile ran past its {self.timeout_s:g} s budget"
                    " (it cannot be stopped in thread isolation)"
                ),
            ),
        )
        timer.daemon = True
        inner = self._executor.submit(work)
        self._queued[outer] = inner

        def finish(done: Future) -> None:
            timer.cancel()
            self._queued.pop(outer, None)
            copy_outcome(done, outer)

        inner.add_done_callback(finish)
        timer.start()
        return outer

    def cancel_pending(self, run: Future, error: BaseException) -> bool:
        """Drop `run` if it has not started; it fails with `error`. False when it runs already."""
        inner = self._queued.get(run)
        if inner is None or not inner.cancel():
            return False
        settle(run, None, error)
        return True

    def close(self) -> None:
        self._executor.shutdown()  # no wait: a compile in this process cannot be stopped
