"""Asynchronous grammar compilation: a pool, a bounded cache, shared in-flight compiles, timeouts.

`CompileService.submit(spec)` returns a Future at prefill time; the manager joins it just before
the request's first decode sample with `join(future, deadline)`. A compile error travels inside
the future and fails only the requests that asked for that spec.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Protocol

from .errors import GrammarCompileTimeout, InvalidGrammarError
from .interface import CompiledGrammar, GuidedBackend
from .metrics import GuidedMetrics
from .spec import GrammarSpec

# Invalid specs are remembered so a client retrying a bad schema costs no compile.
_MAX_REMEMBERED_ERRORS = 1024


class CompiledGrammarCache:
    """A thread-safe LRU of compiled grammars bounded by their total `memory_bytes`."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, spec: GrammarSpec) -> CompiledGrammar | None:
        with self._lock:
            compiled = self._entries.get(spec)
            if compiled is not None:
                self._entries.move_to_end(spec)
            return compiled

    def put(self, spec: GrammarSpec, compiled: CompiledGrammar) -> None:
        size = compiled.memory_bytes
        if size > self.limit_bytes:
            return
        with self._lock:
            previous = self._entries.pop(spec, None)
            if previous is not None:
                self._bytes -= previous.memory_bytes
            self._entries[spec] = compiled
            self._bytes += size
            while self._bytes > self.limit_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.memory_bytes

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class SharedGrammarCache(Protocol):
    """An L2 cache shared between processes (e.g. `fd_guided.redis_cache.RedisGrammarCache`).

    Keys are derived from the spec and the backend's tokenizer; values are the backend's
    `serialize` bytes. Implementations must never raise on a miss or an unreachable store.
    """

    def get(self, spec: GrammarSpec, backend: GuidedBackend) -> bytes | None: ...

    def put(self, spec: GrammarSpec, backend: GuidedBackend, data: bytes) -> None: ...


class CompileService:
    """Compiles specs on a thread pool for one backend; identical specs in flight share one compile.

    Lookup order: the in-process LRU (bounded bytes), then the optional shared L2 cache, then the
    backend compiler. A compiled grammar fetched from L2 is deserialized, never trusted blindly:
    the backend refuses data from another version or tokenizer and compiles instead.
    """

    def __init__(
        self,
        backend: GuidedBackend,
        *,
        metrics: GuidedMetrics | None = None,
        workers: int | None = None,
        shared_cache: SharedGrammarCache | None = None,
    ):
        self.backend = backend
        self.metrics = metrics or GuidedMetrics()
        self.shared_cache = shared_cache
        if backend.metrics is None:
            backend.metrics = self.metrics
        self.cache = CompiledGrammarCache(backend.config.cache_limit_bytes)
        self._pool = ThreadPoolExecutor(max_workers=workers or backend.config.compile_workers, thread_name_prefix="fd-guided-compile")
        self._in_flight: dict[GrammarSpec, Future] = {}
        self._errors: OrderedDict[GrammarSpec, InvalidGrammarError] = OrderedDict()
        self._lock = threading.Lock()

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar; never blocks on compiling."""
        self.metrics.inc("compile_requests_total")
        cached = self.cache.get(spec)
        if cached is not None:
            self.metrics.inc("cache_hits_total")
            return _resolved(cached)
        with self._lock:
            error = self._errors.get(spec)
            if error is not None:
                return _failed(error)
            future = self._in_flight.get(spec)
            if future is not None:
                self.metrics.inc("inflight_joins_total")
                return future
            self.metrics.inc("cache_misses_total")
            self.metrics.add_gauge("compiles_in_flight", 1)
            future = self._pool.submit(self._compile, spec)
            self._in_flight[spec] = future
        return future

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        started = time.perf_counter()
        try:
            compiled = self._from_shared_cache(spec)
            if compiled is None:
                compiled = self.backend.compile(spec)
                self.metrics.observe("compile_seconds", time.perf_counter() - started)
                self._to_shared_cache(spec, compiled)
            # Cached before leaving the in-flight table, so no submit in between misses both.
            self.cache.put(spec, compiled)
            self.metrics.set_gauge("cache_bytes", self.cache.size_bytes)
            return compiled
        except InvalidGrammarError as error:
            self.metrics.inc("compile_errors_total")
            self._remember_error(spec, error)
            raise
        finally:
            with self._lock:
                self._in_flight.pop(spec, None)
            self.metrics.add_gauge("compiles_in_flight", -1)

    def _from_shared_cache(self, spec: GrammarSpec) -> CompiledGrammar | None:
        if self.shared_cache is None:
            return None
        data = self.shared_cache.get(spec, self.backend)
        compiled = self.backend.deserialize(spec, data) if data else None
        self.metrics.inc("shared_cache_hits_total" if compiled is not None else "shared_cache_misses_total")
        return compiled

    def _to_shared_cache(self, spec: GrammarSpec, compiled: CompiledGrammar) -> None:
        if self.shared_cache is None:
            return
        data = self.backend.serialize(compiled)
        if data is not None:
            self.shared_cache.put(spec, self.backend, data)

    def _remember_error(self, spec: GrammarSpec, error: InvalidGrammarError) -> None:
        with self._lock:
            self._errors[spec] = error
            while len(self._errors) > _MAX_REMEMBERED_ERRORS:
                self._errors.popitem(last=False)

    def compile_now(self, spec: GrammarSpec, timeout_s: float | None = None) -> CompiledGrammar:
        """Submit and wait (for tools and tests; the serving path never calls this)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.backend.config.compile_timeout_s)
        return join(self.submit(spec), deadline)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def join(future: Future, deadline: float) -> CompiledGrammar:
    """Wait for `future` until the monotonic `deadline`; raise GrammarCompileTimeout past it."""
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        raise GrammarCompileTimeout("the grammar did not compile before the request needed its first token") from None


def _resolved(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future
