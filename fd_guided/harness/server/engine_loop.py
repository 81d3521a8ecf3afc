"""The bridge between the asyncio server and the reference engine's step loop.

One background thread owns `ReferenceEngine.step`: it steps while requests are unfinished and
hands each step's `StepUpdate`s to the event loop in one `call_soon_threadsafe` call, where they
are put on the queue of the HTTP request they belong to. Every concurrent HTTP request is a set of
engine requests (one per choice, ``n``) batched together by the engine: continuous batching.

The event loop never runs CPU work of the engine, and never runs one long burst of its own: a
step's updates wake every streaming response at once (each decodes its new text and writes an SSE
chunk), so they are handed out `dispatch_chunk` at a time, one chunk per loop iteration, and
timers, new connections and other callbacks run between chunks (as vLLM splits its output
processing). Updates keep their order: one FIFO holds them across steps. Beyond that, admission
(`ReferenceEngine.submit` validates the guided fields in pure Python, and may normalise a large
JSON schema) runs on a small dedicated executor, steps run on the engine thread, compiles in the
compile service's worker processes.

Readiness: `Submission.ready()` resolves when the request's grammar is compiled, or raises the
compile error (an `InvalidGrammarError`: HTTP 400). The engine samples no guided token before
that, so a server that awaits it before sending headers can still refuse the request.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fd_guided.spec import GrammarSpec
from fd_guided.harness.engine.engine import GenerationResult, ReferenceEngine, StepUpdate

logger = logging.getLogger(__name__)

# How long the idle engine thread sleeps between checks when nothing woke it (a wake-up is immediate).
_IDLE_POLL_S = 0.05
# step_log entries kept before the engine's run statistics are trimmed (a server never ends a run).
_STEP_LOG_KEEP = 4096
# Updates handed to their requests per event-loop iteration (see the module docstring). Each wakes
# one response (~0.1-0.3 ms of work here), so a step of 72 updates no longer holds the loop for
# the whole step's streaming at once.
DISPATCH_CHUNK = 8


@dataclass
class Submission:
    """One HTTP request's engine requests (one id per choice) and its grammar's compile ticket."""

    indices: list[int]
    spec: GrammarSpec | None
    queue: asyncio.Queue
    ticket: Future | None = None
    results: dict[int, GenerationResult] = field(default_factory=dict)

    async def ready(self) -> None:
        """Wait until the grammar is compiled; raises its compile error (never cancels the ticket,
        which identical requests share)."""
        if self.ticket is None:
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def settle(ticket: Future) -> None:
            def deliver():
                if waiter.done():
                    return
                error = ticket.exception()
                waiter.set_exception(error) if error is not None else waiter.set_result(None)

            loop.call_soon_threadsafe(deliver)

        self.ticket.add_done_callback(settle)
        await waiter

    async def next_update(self) -> StepUpdate:
        update = await self.queue.get()
        if update.finished is not None:
            self.results[update.index] = update.finished
        return update

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.indices)


class EngineLoop:
    """Runs `engine.step()` on a background thread and dispatches updates to asyncio queues.

    Args:
        engine: the reference engine (its `submit`, `step`, `abort` and `has_unfinished` are used).
        admission_threads: threads that run admission (Python validation). One keeps the Python
            CPU work that competes with the event loop for the GIL to one thread at a time.
        dispatch_chunk: updates handed out per event-loop iteration.
        on_step: called on the engine thread after every step that ran a forward, with the step's
            seconds, its prompt tokens and the longest inter-token gap of the requests that got a
            token in it (None when none had one before: what a decoding request waited between
            two tokens, stalls included); must be thread-safe and quick.
    """

    def __init__(self, engine: ReferenceEngine, *, admission_threads: int = 1,
                 on_step: Callable[[float, int, float | None], None] | None = None, dispatch_chunk: int = DISPATCH_CHUNK):
        self.engine = engine
        self.on_step = on_step
        self.dispatch_chunk = max(1, dispatch_chunk)
        self._undelivered: deque[StepUpdate] = deque()  # event-loop side only
        self._admission = ThreadPoolExecutor(admission_threads, thread_name_prefix="fd-guided-admission")
        self._queues: dict[int, asyncio.Queue] = {}
        self._ids = itertools.count()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="fd-guided-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._admission.shutdown(wait=False, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        return len(self._queues)

    # ----- requests (event-loop side) -----------------------------------------------------------

    async def submit(self, requests: Sequence[dict], *, seed: int, precheck: Callable[[], Any] | None = None) -> Submission:
        """Admit `requests` (the choices of one HTTP request; identical guided fields) on the
        admission executor and queue them in the engine. `precheck` runs first on that thread.

        Raises InvalidGrammarError (nothing stays queued then).
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        indices = [next(self._ids) for _ in requests]
        for index in indices:
            self._queues[index] = queue
        admitted = loop.run_in_executor(self._admission, self._admit, list(requests), indices, seed, precheck)
        try:
            spec, ticket = await asyncio.shield(admitted)
        except asyncio.CancelledError:
            # The client went away while admission ran: drop whatever it queues.
            admitted.add_done_callback(lambda _: self.abort(indices))
            raise
        except BaseException:
            self._forget(indices)
            raise
        self._wake.set()
        return Submission(indices, spec, queue, ticket)

    def abort(self, indices: Sequence[int], *, forget: bool = True) -> None:
        """Stop these engine requests at the next step (thread-safe). With `forget` their updates
        are dropped; without, the final update (reason ``abort``) still arrives on the queue."""
        for index in indices:
            self.engine.abort(index)
        if forget:
            self._forget(indices)
        self._wake.set()

    def _forget(self, indices: Sequence[int]) -> None:
        for index in indices:
            self._queues.pop(index, None)

    def _admit(self, requests: list[dict], indices: list[int], seed: int, precheck) -> tuple[GrammarSpec | None, Future | None]:
        """Admission thread: validate once for the ticket, then submit each choice."""
        if precheck is not None:
            precheck()
        spec = self.engine.validate(requests[0])
        # The same ticket the engine's own prefetch joins (identical specs share one compile).
        ticket = self.engine.manager.compiler.submit(spec) if spec is not None else None
        submitted: list[int] = []
        try:
            for position, (request, index) in enumerate(zip(requests, indices)):
                self.engine.submit(request, seed=seed, index=index, position=position)
                submitted.append(index)
        except BaseException:
            for index in submitted:
                self.engine.abort(index)
            raise
        return spec, ticket

    def _dispatch(self, updates: list[StepUpdate]) -> None:
        """Event-loop side of a step: queue its updates for delivery, a chunk per loop iteration."""
        draining = bool(self._undelivered)
        self._undelivered.extend(updates)
        if not draining:
            self._deliver()

    def _deliver(self) -> None:
        """Each of the next `dispatch_chunk` updates onto its request's queue; the rest next iteration."""
        for _ in range(min(self.dispatch_chunk, len(self._undelivered))):
            update = self._undelivered.popleft()
            queue = self._queues.get(update.index)
            if queue is None:
                continue  # aborted or abandoned
            queue.put_nowait(update)
            if update.finished is not None:
                self._queues.pop(update.index, None)
        if self._undelivered:
            asyncio.get_running_loop().call_soon(self._deliver)

    # ----- the engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        last_token_at: dict[int, float] = {}
        while not self._stopping.is_set():
            if not self.engine.has_unfinished():
                last_token_at.clear()
                self._wake.wait(_IDLE_POLL_S)
                self._wake.clear()
                continue
            stats = self.engine.stats
            logged = len(stats.step_log)
            try:
                updates = self.engine.step()
            except Exception as error:  # noqa: BLE001 - a broken step fails its requests, not the server
                logger.exception("engine step failed; failing the requests in flight")
                self._fail_in_flight(error)
                time.sleep(_IDLE_POLL_S)
                continue
            now = time.perf_counter()
            gap = _longest_gap(updates, last_token_at, now)
            new_steps = stats.step_log[logged:]
            if new_steps and self.on_step is not None:
                seconds, prompt_tokens = new_steps[-1]
                self.on_step(seconds, prompt_tokens, gap)
            if len(stats.step_log) > _STEP_LOG_KEEP:
                del stats.step_log[:-1]
            if updates and self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._dispatch, updates)

    def _fail_in_flight(self, error: BaseException) -> None:
        indices = list(self._queues.copy())  # copy() is atomic; the loop thread mutates the dict
        for index in indices:
            self.engine.abort(index)
        message = f"the engine step failed: {type(error).__name__}: {error}"
        updates = [StepUpdate(index, (), GenerationResult(index, "", [], "error", message)) for index in indices]
        if updates and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch, updates)


def _longest_gap(updates: list[StepUpdate], last_token_at: dict[int, float], now: float) -> float | None:
    """The longest time since a request's previous token among those that got one now (None when
    none had one before); keeps `last_token_at` up to date."""
    gap = None
    for update in updates:
        if update.new_token_ids:
            previous = last_token_at.get(update.index)
            if previous is not None:
                gap = max(gap or 0.0, now - previous)
            last_token_at[update.index] = now
        if update.finished is not None:
            last_token_at.pop(update.index, None)
    return gap
