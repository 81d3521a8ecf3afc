"""Per-engine compile jobs: one ``(engine, spec)`` looked up in the L1 and L2 caches, else handed to
the runner; its result rebuilt on a loader thread (from the worker's bytes, or compiled again
where the worker said so: `transfer.CompileHere`), cached, and the job's future settled.

`CompileJobs` is the half of `fd_guided.compile.service.CompileService` below the tickets: it keeps
the in-flight job table (identical jobs shared), the cache-only backlog (`max_background_compiles`,
oldest dropped), cancellation of jobs no request will use, and the memory hand-back after loads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Protocol

from ..admission.deferred import learned
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
from .futures import failed_with, resolved
from .threads import DeepStackExecutor
from .transfer import CompileHere

# Loader threads rebuild compiled grammars from worker bytes and talk to the L2 cache.
_LOADER_THREADS = 2

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


class CompileJobs:
    """The job layer of `CompileService` (see the module docstring): it owns the job state below;
    the service adds the tickets and attaches the runner (`_runner`: a `CompileProcessPool` or a
    `ThreadCompileRunner`, built once the metrics set here exist).

    Args:
        backend: the engine-level backend; its `config` sets the cache bounds and the backlog.
        metrics: shared metrics sink; a private one otherwise (also given to `backend` if it has none).
        shared_cache: an optional L2 (`SharedGrammarCache`).
    """

    _runner: Any

    def __init__(
        self,
        backend: GuidedBackend,
        *,
        metrics: GuidedMetrics | None = None,
        shared_cache: SharedGrammarCache | None = None,
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

    # ----- the cache-only backlog and cancellation ---------------------------------------------------

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
        if self.shared_cache is None or engine == composite.CHECKS:
            # Nothing on the way to the runner can block (no L2 to ask): hand it over now. On a
            # loader thread, a burst's jobs queued behind the rebuilds of the ones before them.
            self._start_job(engine, spec, future)
        else:
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
            compiled: CompiledGrammar | None
            if isinstance(result, CompileHere):
                compiled, compile_seconds = self._compile_here(backend, spec, compile_seconds)
            else:
                compiled = backend.deserialize(spec, data) if data is not None else result
            if compiled is None:
                raise InvalidGrammarError(f"the {engine} grammar compiled in a worker could not be loaded here")
            if engine != composite.CHECKS:  # the engines' checks (a choice) are not a compile
                self.metrics.observe("compile_seconds", compile_seconds)
                self.metrics.inc_labelled("compiles_by_engine_total", "engine", engine)
            estimate = result.estimated_bytes if isinstance(result, CompileHere) else None
            self._to_shared_cache(engine, spec, compiled, data, estimate)
            self._finish_job(engine, spec, future, compiled, None)
        except BaseException as error:  # noqa: BLE001 - every failure travels in the future
            if not isinstance(error, GuidedDecodingError):
                error = InvalidGrammarError(f"the {engine} compile failed: {type(error).__name__}: {error}")
            self._finish_job(engine, spec, future, None, error)

    def _compile_here(
        self, backend: GuidedBackend, spec: GrammarSpec, worker_seconds: float
    ) -> tuple[CompiledGrammar, float]:
        """The worker's grammar compiled again in this process (`transfer.CompileHere`): the worker
        ran the checks and showed the compile ends within its budgets, so `compile` alone runs."""
        started = time.perf_counter()
        compiled = backend.compile(spec)
        self.metrics.inc("compiles_rebuilt_here_total")
        return compiled, worker_seconds + time.perf_counter() - started

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
            # Each job of the spec (its engines' and its `composite.CHECKS` job) runs the deferred
            # checks first: the refusal is counted once, when first remembered.
            known = spec.pending is not None and spec.pending.refused
            error, deferred = learned(spec, error)  # a deferred admission refusal: remembered for admission
            if deferred and not known:
                self.metrics.inc("deferred_admission_refusals_total")
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
        # The L2 holds compiled grammars; an engine choice is recomputed in a worker, not shared.
        if self.shared_cache is None or engine == composite.CHECKS:
            return None
        backend = composite.engine(self.backend, engine)
        data = self.shared_cache.get(spec, backend)
        compiled = backend.deserialize(spec, data) if data else None
        self.metrics.inc("shared_cache_hits_total" if compiled is not None else "shared_cache_misses_total")
        return compiled

    def _to_shared_cache(
        self, engine: str, spec: GrammarSpec, compiled: CompiledGrammar, data: bytes | None, estimate: int | None
    ) -> None:
        """Store `compiled` in the L2: `data` (the worker's bytes) or, for a grammar compiled here,
        its bytes written now unless `estimate` (the worker's, else the backend's now) passes the
        transfer bound."""
        if self.shared_cache is None or engine == composite.CHECKS:
            return
        backend = composite.engine(self.backend, engine)
        if data is None:
            if estimate is None:
                estimate = backend.serialized_size_estimate(compiled)
            bound = self.config.compile_transfer_max_bytes
            if estimate is not None and bound is not None and estimate > bound:
                return  # writing it here would cost the memory a worker was spared (`transfer`)
            data = backend.serialize(compiled)
        if data is not None:
            self.shared_cache.put(spec, backend, data)
