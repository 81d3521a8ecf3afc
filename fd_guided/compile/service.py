"""The compile service: per-request tickets over per-engine jobs, bounded caches, killable workers.

`CompileService.submit(spec)` never blocks. It returns a *ticket*, a `Future` that resolves with
the `CompiledGrammar` the request will run, or fails with the `InvalidGrammarError` that explains
why no engine could compile it. Behind a ticket are *jobs*, one per engine that may compile the spec
(`fd_guided.backends.composite.compile_engines`: xgrammar then llguidance for ``auto``, one engine
otherwise):

  - a job is looked up in the in-process LRU (keys ``(engine, spec)``, bounded by the bytes held,
    keys included), then in the optional shared L2 cache, then compiled by the runner;
  - identical jobs in flight are shared, identical tickets too; failed jobs are remembered;
  - with ``GuidedConfig.auto_first_ready`` every engine's job starts at once and the ticket takes
    the first success in preference order among the jobs done (`tickets.Ticket.decide`): an
    uncached request starts on llguidance's millisecond compile as soon as it is ready, waiting
    for xgrammar only what xgrammar is measured to gain on it (`expected_gain_s`), and a request
    whose xgrammar compile fails or runs out of budget is served by llguidance (compile-time
    fallback). Without it, the next engine starts only when the previous one failed;
  - once a ticket settles, the jobs of engines it prefers over the winner only fill the cache:
    they queue after every job a request waits for and run in the pool's bounded cache-only lane
    (idle CPU class; the oldest queued ones dropped past `max_background_compiles`; a result too
    large to load without stalling this process is not loaded); jobs of engines it prefers less
    could never serve the constraint while the winner is cached, and are stopped.

Runners: ``process`` compiles in killable workers (`fd_guided.compile.pool`; the result crosses
as the engine's serialized grammar and is rebuilt here on a deep-stack loader thread), ``thread``
compiles in this process (no kill: a job past its budget fails its requests but keeps running).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Protocol

from ..backends import composite
from ..errors import (
    CompileBudgetError,
    CompileSkipped,
    GrammarCompileTimeout,
    GuidedDecodingError,
    InvalidGrammarError,
)
from ..interface import CompiledGrammar, GuidedBackend
from ..metrics import GuidedMetrics
from ..spec import GrammarSpec
from .cache import CompiledGrammarCache, RememberedErrors
from .futures import failed, failed_with, join, resolved
from .pool import CompileProcessPool
from .threads import DeepStackExecutor, ThreadCompileRunner
from .tickets import Ticket
from .zygote import zygote_key

logger = logging.getLogger(__name__)

# Loader threads rebuild compiled grammars from worker bytes and talk to the L2 cache.
_LOADER_THREADS = 2
# close() waits this long for a loader inside a native call (a rebuild takes milliseconds).
_LOADER_CLOSE_WAIT_S = 2.0
# A cache-only result larger than this is not loaded: loading holds the GIL for stretches that
# grow with its size (a 338 MB xgrammar grammar stalled every other thread of the process for up
# to 2.3 s; 1-7 MB ones for under 6 ms), so one would delay every request's compile hand-off.
_CACHE_ONLY_LOAD_MAX_BYTES = 32 << 20
# After this many bytes of grammars loaded, freed native memory is handed back to the OS (below).
_TRIM_EVERY_BYTES = 8 << 20


def _allocator_trim():
    """glibc's ``malloc_trim``, or None. Grammars are built on loader threads and freed on others;
    glibc keeps each thread's freed memory in that thread's arena, so a long run of distinct
    grammars grew RSS to ~3x the cache bound (tools/soak.py); trimming now and then keeps it near 1x."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _allocator_trim()


class SharedGrammarCache(Protocol):
    """An L2 cache shared between processes (e.g. `fd_guided.redis_cache.RedisGrammarCache`).

    Keys are derived from the spec and the engine backend's tokenizer; values are the backend's
    `serialize` bytes. Implementations must never raise on a miss or an unreachable store.
    """

    def get(self, spec: GrammarSpec, backend: GuidedBackend) -> bytes | None: ...

    def put(self, spec: GrammarSpec, backend: GuidedBackend, data: bytes) -> None: ...


def _skipped_error(engine: str) -> CompileSkipped:
    return CompileSkipped(f"a cache-only {engine} compile was dropped from a full backlog")


class CompileService:
    """Compiles specs for one backend; see the module docstring.

    Args:
        backend: the engine-level backend (its `config` sets budgets, workers and isolation).
        metrics: shared metrics sink; a private one otherwise.
        workers: most compile processes (or threads) at normal priority; `config.compile_workers`.
        shared_cache: an optional L2 (`SharedGrammarCache`).
        isolation: ``process`` or ``thread``; `config.compile_isolation` by default. A backend
            without a `worker_recipe` always compiles in threads.
    """

    def __init__(
        self,
        backend: GuidedBackend,
        *,
        metrics: GuidedMetrics | None = None,
        workers: int | None = None,
        shared_cache: SharedGrammarCache | None = None,
        isolation: str | None = None,
    ):
        self.backend = backend
        self.config = backend.config
        self.metrics = metrics or GuidedMetrics()
        if backend.metrics is None:
            backend.metrics = self.metrics
        self.shared_cache = shared_cache
        self.cache = CompiledGrammarCache(self.config.cache_limit_bytes)
        self.errors = RememberedErrors(max(1 << 20, self.config.cache_limit_bytes // 16))
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, GrammarSpec], Future] = {}
        self._tickets: dict[GrammarSpec, Ticket] = {}
        # Cache-only jobs (their ticket settled on another engine), oldest first, and the runner's
        # futures of started jobs, so the oldest can be dropped from a full backlog.
        self._background: OrderedDict[tuple[str, GrammarSpec], None] = OrderedDict()
        self._runs: dict[tuple[str, GrammarSpec], Future] = {}
        self._skipped: set[tuple[str, GrammarSpec]] = set()
        self._loaders = DeepStackExecutor(_LOADER_THREADS, name="fd-guided-load")
        # Loads of cache-only results (an xgrammar grammar for a 129k vocabulary is ~50 MB and a
        # second to load) run on a thread in the idle CPU class: nobody waits for them.
        self._cache_loaders = DeepStackExecutor(
            1, name="fd-guided-cache-load", idle_class=self.config.background_idle_class
        )
        self._loaders.submit(backend.warm_up)
        self._loaded_since_trim = 0
        self._closed = False
        _live_services.add(self)
        self.isolation, self._runner = self._make_runner(
            workers or self.config.compile_workers, isolation or self.config.compile_isolation
        )

    def _make_runner(self, workers: int, isolation: str):
        recipe = composite.worker_recipe(self.backend) if isolation == "process" else None
        if isolation == "process" and recipe is None:
            logger.warning(
                "backend %s cannot compile in worker processes: compiling in threads (no kill on budget)",
                self.backend.name,
            )
        if recipe is None:
            return "thread", ThreadCompileRunner(self.backend, workers, self.config.compile_timeout_s)
        pool = CompileProcessPool(
            zygote_key(recipe),
            recipe,
            self.config,
            max_workers=workers,
            timeout_s=self.config.compile_timeout_s,
            memory_limit_bytes=self.config.compile_memory_limit_bytes,
            demote_after_s=self.config.compile_demote_after_s,
            cost_weights={
                name: composite.engine(self.backend, name).compile_cost_weight
                for name in composite.engine_names(self.backend)
            },
            on_event=lambda name: self.metrics.inc_labelled("compile_worker_events_total", "event", name),
        )
        return "process", pool

    # ----- tickets ------------------------------------------------------------------------------

    def submit(self, spec: GrammarSpec) -> Future:
        """The ticket (a Future of the CompiledGrammar) of `spec`; never blocks on compiling."""
        self.metrics.inc("compile_requests_total")
        try:
            engines = composite.compile_engines(self.backend, spec)
        except InvalidGrammarError as error:
            return failed_with(error)
        hits = [self.cache.get((engine, spec)) for engine in engines]
        if hits[0] is not None:
            self.metrics.inc("cache_hits_total")
            return resolved(hits[0])
        with self._lock:
            ticket = self._tickets.get(spec)
            if ticket is not None:
                self.metrics.inc("inflight_joins_total")
                return ticket.future
            if not self._closed and not any(hits):
                ticket = self._tickets[spec] = Ticket(spec, engines)
        if ticket is None:
            if self._closed:
                return failed_with(GuidedDecodingError("the compile service is closed"))
            # A later engine has it cached: serve that now, and compile the preferred one for next time.
            self.metrics.inc("cache_hits_total")
            self._job(engines[0], spec)
            self._to_background([(engines[0], spec)])
            return resolved(next(hit for hit in hits if hit is not None))
        self.metrics.inc("cache_misses_total")
        self._advance(ticket)
        return ticket.future

    def _advance(self, ticket: Ticket) -> None:
        """Start the jobs the policy allows, and settle the ticket once its outcome is known."""
        started: list[Future] = []
        with ticket.lock:
            if ticket.settled:
                return
            for index, engine in enumerate(ticket.engines):
                if engine in ticket.jobs:
                    continue
                if self._deferred(ticket, index):
                    ticket.deferred.add(engine)
                    continue
                ticket.deferred.discard(engine)
                earlier = [ticket.jobs.get(e) for e in ticket.engines[:index]]
                if index == 0 or self.config.auto_first_ready or all(j is not None and failed(j) for j in earlier):
                    ticket.jobs[engine] = self._job(engine, ticket.spec)
                    started.append(ticket.jobs[engine])
            outcome = ticket.decide(self.backend, self.config, self._advance)
            leftovers: list[tuple[str, GrammarSpec]] = []
            useless: list[tuple[str, GrammarSpec]] = []
            if outcome is not None:
                ticket.settled = True
                # Engines preferred over the one that served it are worth compiling for the cache
                # (the next request prefers them); less preferred ones never serve this constraint
                # while the cache holds the winner, so their compiles stop.
                winner = outcome[1].backend_name if outcome[0] == "ok" else None
                later = ticket.engines[ticket.engines.index(winner) + 1 :] if winner in ticket.engines else ()
                for engine, job in ticket.jobs.items():
                    if not job.done():
                        (useless if engine in later else leftovers).append((engine, ticket.spec))
                # A deferred engine the winner did not outrank compiles for the cache only.
                for engine in ticket.deferred:
                    if engine not in later:
                        self._job(engine, ticket.spec)
                        leftovers.append((engine, ticket.spec))
                # Each job's done-callbacks hold this ticket: drop the ticket's hold on the jobs so
                # the pair is not a reference cycle (left to the cyclic GC, settled tickets kept
                # their compiled grammars alive and RSS swung by ~3x the cache bound).
                ticket.jobs = {}
        for job in started:
            job.add_done_callback(lambda _: self._advance(ticket))
        if outcome is None:
            return
        with self._lock:
            if self._tickets.get(ticket.spec) is ticket:
                del self._tickets[ticket.spec]
        self._to_background(leftovers)
        self._cancel(useless)
        kind, value = outcome
        if kind == "ok" and value.backend_name != ticket.engines[0]:
            self.metrics.inc_labelled("auto_served_by_total", "engine", value.backend_name)
        if not ticket.future.done():
            if kind == "ok":
                ticket.future.set_result(value)
            else:
                ticket.future.set_exception(value)

    def _to_background(self, keys: list[tuple[str, GrammarSpec]]) -> None:
        """These jobs only fill the cache now. Beyond `max_background_compiles` of them the oldest
        are dropped: a stream of distinct cold schemas (each served by llguidance) would otherwise
        queue xgrammar jobs without bound, since cheaper jobs always go first."""
        dropped = []
        with self._lock:
            for key in keys:
                if key in self._jobs:
                    self._background[key] = None
            while len(self._background) > self.config.max_background_compiles:
                key, _ = self._background.popitem(last=False)
                dropped.append((key, self._runs.get(key)))
                if dropped[-1][1] is None:
                    self._skipped.add(key)  # not handed to the runner yet: _start_job skips it
        for (engine, _), run in dropped:
            self.metrics.inc("background_compiles_dropped_total")
            if run is not None:
                self._runner.cancel_pending(run, _skipped_error(engine))
        self._lower(self._runs.get(key) for key in keys if key in self._background)

    def _deferred(self, ticket: Ticket, index: int) -> bool:
        """Whether engine `index` starts only once the less preferred ones are done: when no request
        would wait for it (its expected gain over each of them is 0), while one of them may still
        serve. Its compile then never takes a core from theirs; it fills the cache afterwards, or
        serves the request if they all fail."""
        engine, later = ticket.engines[index], ticket.engines[index + 1 :]
        if not self.config.auto_first_ready or not later:
            return False
        if any(composite.expected_gain_s(self.backend, engine, other) > 0 for other in later):
            return False
        return not all(other in ticket.jobs and failed(ticket.jobs[other]) for other in later)

    def _cancel(self, keys: list[tuple[str, GrammarSpec]]) -> None:
        """Stop jobs no request will use (queued: dropped; running in a worker: killed)."""
        for engine, spec in keys:
            with self._lock:
                if (engine, spec) not in self._jobs:
                    continue
                run = self._runs.get((engine, spec))
                if run is None:
                    self._skipped.add((engine, spec))  # not handed to the runner yet: _start_job skips it
            if run is not None:
                cancel = getattr(self._runner, "cancel", None) or self._runner.cancel_pending
                cancel(
                    run, CompileSkipped(f"the {engine} compile was stopped: a preferred engine serves this constraint")
                )

    def _lower(self, runs) -> None:
        """Runs no request waits for: the runner schedules them after the others (idle CPU class)."""
        to_background = getattr(self._runner, "to_background", None)
        for run in runs:
            if run is not None and to_background is not None:
                to_background(run)

    # ----- jobs (one engine, one spec) ---------------------------------------------------------------

    def _job(self, engine: str, spec: GrammarSpec) -> Future:
        key = (engine, spec)
        cached = self.cache.get(key)
        if cached is not None:
            return resolved(cached)
        error = self.errors.get(key)
        if error is not None:
            return failed_with(error)
        with self._lock:
            future = self._jobs.get(key)
            if future is not None:
                return future
            future = self._jobs[key] = Future()
        self.metrics.add_gauge("compiles_in_flight", 1)
        self._loaders.submit(self._start_job, engine, spec, future)
        return future

    def _start_job(self, engine: str, spec: GrammarSpec, future: Future) -> None:
        started = time.perf_counter()
        with self._lock:
            skipped = (engine, spec) in self._skipped
            self._skipped.discard((engine, spec))
        if skipped:
            self._finish_job(engine, spec, future, None, _skipped_error(engine))
            return
        try:
            compiled = self._from_shared_cache(engine, spec)
        except Exception:  # noqa: BLE001 - an L2 problem means compiling here
            compiled = None
        if compiled is not None:
            self._finish_job(engine, spec, future, compiled, None)
            return
        run = self._runner.submit(engine, spec)
        with self._lock:
            self._runs[(engine, spec)] = run
            background = (engine, spec) in self._background
        if background:
            self._lower([run])  # it became cache-only before it reached the runner
        run.add_done_callback(
            lambda done: self._loader_for(engine, spec).submit(self._after_run, engine, spec, done, future, started)
        )

    def _loader_for(self, engine: str, spec: GrammarSpec) -> DeepStackExecutor:
        with self._lock:
            background = (engine, spec) in self._background
        return self._cache_loaders if background else self._loaders

    def _after_run(self, engine: str, spec: GrammarSpec, run: Future, future: Future, started: float) -> None:
        try:
            result, compile_seconds = run.result()
            backend = composite.engine(self.backend, engine)
            data = result if isinstance(result, bytes) else None
            if (
                data is not None
                and len(data) > _CACHE_ONLY_LOAD_MAX_BYTES
                and self._loader_for(engine, spec) is self._cache_loaders
            ):
                raise CompileSkipped(f"a cache-only {engine} grammar of {len(data) >> 20} MB was not loaded")
            compiled = backend.deserialize(spec, data) if data is not None else result
            if compiled is None:
                raise InvalidGrammarError(f"the {engine} grammar compiled in a worker could not be loaded here")
            self.metrics.observe("compile_seconds", compile_seconds)
            self.metrics.inc_labelled("compiles_by_engine_total", "engine", engine)
            self._to_shared_cache(engine, spec, compiled, data)
            self._finish_job(engine, spec, future, compiled, None)
        except BaseException as error:  # noqa: BLE001 - every failure travels in the future
            if not isinstance(error, GuidedDecodingError):
                error = InvalidGrammarError(f"the {engine} compile failed: {type(error).__name__}: {error}")
            self._finish_job(engine, spec, future, None, error)

    def _finish_job(
        self,
        engine: str,
        spec: GrammarSpec,
        future: Future,
        compiled: CompiledGrammar | None,
        error: BaseException | None,
    ) -> None:
        key = (engine, spec)
        if compiled is not None:
            # Cached before leaving the in-flight table, so no submit in between misses both.
            self.cache.put(key, compiled)
            self.metrics.set_gauge("cache_bytes", self.cache.size_bytes)
            self._maybe_trim(compiled.memory_bytes)
        elif isinstance(error, InvalidGrammarError):
            self.metrics.inc("compile_errors_total")
            self.errors.put(key, error, transient=isinstance(error, CompileBudgetError))
            if isinstance(error, GrammarCompileTimeout):
                self.metrics.inc("compile_timeouts_total")
        with self._lock:
            self._jobs.pop(key, None)
            self._runs.pop(key, None)
            self._background.pop(key, None)
            self._skipped.discard(key)
        self.metrics.add_gauge("compiles_in_flight", -1)
        if future.done():
            return
        if error is None:
            future.set_result(compiled)
        else:
            future.set_exception(error)

    def _maybe_trim(self, loaded_bytes: int) -> None:
        with self._lock:
            self._loaded_since_trim += loaded_bytes
            due = self._loaded_since_trim >= _TRIM_EVERY_BYTES
            if due:
                self._loaded_since_trim = 0
        if due and _TRIM is not None:
            _TRIM(0)  # a few ms, on a loader thread, off every request's path

    def _from_shared_cache(self, engine: str, spec: GrammarSpec) -> CompiledGrammar | None:
        if self.shared_cache is None:
            return None
        backend = composite.engine(self.backend, engine)
        data = self.shared_cache.get(spec, backend)
        compiled = backend.deserialize(spec, data) if data else None
        self.metrics.inc("shared_cache_hits_total" if compiled is not None else "shared_cache_misses_total")
        return compiled

    def _to_shared_cache(self, engine: str, spec: GrammarSpec, compiled: CompiledGrammar, data: bytes | None) -> None:
        if self.shared_cache is None:
            return
        backend = composite.engine(self.backend, engine)
        data = data if data is not None else backend.serialize(compiled)
        if data is not None:
            self.shared_cache.put(spec, backend, data)

    # ----- tools and lifetime --------------------------------------------------------------------

    def compile_now(self, spec: GrammarSpec, timeout_s: float | None = None) -> CompiledGrammar:
        """Submit and wait (tools and tests; the serving path never calls this)."""
        if timeout_s is None:
            # Every engine's budget in turn, plus the workers' first start.
            timeout_s = self.config.compile_timeout_s * 2 + 60
        return join(self.submit(spec), time.monotonic() + timeout_s)

    def stats(self) -> dict:
        runner = self._runner.stats() if hasattr(self._runner, "stats") else {}
        return {
            "cache_entries": len(self.cache),
            "cache_bytes": self.cache.size_bytes,
            "remembered_errors": len(self.errors),
            "remembered_error_bytes": self.errors.size_bytes,
            **runner,
        }

    def close(self) -> None:
        """Stop every compile (workers are killed) and fail the tickets still pending. Returns within
        about two seconds whatever is in flight (a rebuild on a loader thread may finish first)."""
        with self._lock:
            if self._closed and not self._tickets:
                return
            self._closed = True
            tickets = list(self._tickets.values())
            self._tickets.clear()
        self._runner.close()
        self._loaders.shutdown(wait_s=_LOADER_CLOSE_WAIT_S)
        self._cache_loaders.shutdown(wait_s=_LOADER_CLOSE_WAIT_S)
        closed = GuidedDecodingError("the compile service was closed before this compile finished")
        for ticket in tickets:
            if not ticket.future.done():
                ticket.future.set_exception(closed)


_live_services: weakref.WeakSet[CompileService] = weakref.WeakSet()


@atexit.register
def _close_services() -> None:
    # Before the interpreter tears down: no loader thread may still be inside native code then.
    for service in list(_live_services):
        service.close()
