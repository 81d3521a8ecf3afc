"""The compile service: per-request tickets over per-engine jobs, bounded caches, killable workers.

`CompileService.submit(spec)` never blocks, and does only bounded work on the caller's thread:
lookups, cache probes, ticket bookkeeping. It returns a *ticket*, a `Future` that resolves with
the `CompiledGrammar` the request will run, or fails with the `InvalidGrammarError` that explains
why no engine could compile it. Behind a ticket are *jobs*, one per engine that may compile the spec
(`fd_guided.backends.composite.compile_engines`: xgrammar then llguidance for ``auto``, one engine
otherwise). Which engines those are is decided by the engines' checks (the schema normaliser: up
to hundreds of ms of Python on a large schema), so for a spec this service has not decided before
that decision is a job too (`composite.CHECKS`), run in a compile worker beside the compiles: killable,
off this process's GIL, cached like a grammar, its refusal failing the ticket, counted
(``deferred_admission_refusals_total``) and remembered for admission (`_chosen`). Meanwhile the job of
the engine every choice starts at once (llguidance for ``auto``) starts too; its worker checks that
engine before compiling, so nothing is compiled unchecked and a cold request does not wait for the
choice before its compile starts.

  - a job is looked up in the in-process LRU (keys ``(engine, spec)``, bounded by the bytes held,
    keys included), then in the optional shared L2 cache, then compiled by the runner;
  - identical jobs in flight are shared, identical tickets too; failed jobs are remembered;
  - with ``GuidedConfig.auto_first_ready`` every engine's job starts at once (but a less preferred
    engine that compiles slower than a preferred one is a hedge: it starts once that one failed or
    ran past `compile_demote_after_s`, `_hedged`) and the ticket takes
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

The jobs (one engine, one spec: caches, runner, loading, the cache-only backlog) are
`fd_guided.compile.jobs.CompileJobs`, which `CompileService` extends with the tickets.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from concurrent.futures import Future

from ..admission.cache import CHECKED
from ..admission.deferred import remember_refusal
from ..backends import composite
from ..backends.composite import CHECKS, EngineChoice
from ..errors import CompileBudgetError, GuidedDecodingError, InvalidGrammarError
from ..interface import CompiledGrammar, GuidedBackend
from ..metrics import GuidedMetrics
from ..spec import GrammarSpec
from .futures import failed, failed_with, join, resolved
from .jobs import CompileJobs, SharedGrammarCache
from .pool import CompileProcessPool
from .threads import ThreadCompileRunner
from .tickets import Ticket
from .zygote import zygote_key

logger = logging.getLogger(__name__)

# close() waits this long for a loader inside a native call (a rebuild takes milliseconds).
_LOADER_CLOSE_WAIT_S = 2.0


class CompileService(CompileJobs):
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
        super().__init__(backend, metrics=metrics, shared_cache=shared_cache)
        self._tickets: dict[GrammarSpec, Ticket] = {}
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
                for name in (*composite.engine_names(self.backend), CHECKS)
            },
            on_event=lambda name: self.metrics.inc_labelled("compile_worker_events_total", "event", name),
        )
        return "process", pool

    # ----- tickets ------------------------------------------------------------------------------

    def submit(self, spec: GrammarSpec) -> Future:
        """The ticket (a Future of the CompiledGrammar) of `spec`. Never blocks, never checks or
        compiles here: a spec decided before is probed in the caches (a hit answered at once), an
        identical one in flight is joined, anything else gets a ticket whose engines are chosen
        off this thread (`_choose`)."""
        self.metrics.inc("compile_requests_total")
        choice = self._known_choice(spec)
        if isinstance(choice, BaseException):
            return failed_with(choice)
        hits = [self.cache.get((engine, spec)) for engine in choice.engines] if choice is not None else []
        if hits and hits[0] is not None:
            self.metrics.inc("cache_hits_total")
            return resolved(hits[0])
        with self._lock:
            ticket = self._tickets.get(spec)
            if ticket is not None:
                self.metrics.inc("inflight_joins_total")
                return ticket.future
            if not self._closed and not any(hits):
                ticket = self._tickets[spec] = Ticket(spec, choice)
        if ticket is None:
            if self._closed:
                return failed_with(GuidedDecodingError("the compile service is closed"))
            assert choice is not None  # hits come from a known choice
            # A later engine has it cached: serve that now, and compile the preferred one for next time.
            self.metrics.inc("cache_hits_total")
            self._job(choice.engines[0], spec)
            self._to_background([(choice.engines[0], spec)])
            return resolved(next(hit for hit in hits if hit is not None))
        self.metrics.inc("cache_misses_total")
        if choice is None:
            self._choose(ticket)
        else:
            self._advance(ticket)
        return ticket.future

    def _known_choice(self, spec: GrammarSpec) -> EngineChoice | BaseException | None:
        """What is known of `spec`'s engines without checking it (lookups only): the refusal
        remembered for it (by admission's deferred checks or an earlier choice), its cached
        `EngineChoice`, the choice admission's checks reached in this process, or None: the checks
        have to run (`_choose`)."""
        if spec.pending is not None and spec.pending.refused:
            try:
                spec.pending.raise_if_refused()
            except InvalidGrammarError as refused:
                return refused
        known = self.cache.get((CHECKS, spec)) or self.errors.get((CHECKS, spec))
        if known is not None:
            return known
        if spec.pending is not None and not spec.pending.checked:
            return None  # admission's deferred checks have not run: nothing it decided counts yet
        known = composite.remembered_choice(self.backend, spec)
        if known is None and not composite.engine_names(self.backend)[1:]:
            known = self._admitted_alone(spec)
        return known

    def _admitted_alone(self, spec: GrammarSpec) -> EngineChoice | BaseException | None:
        """A one-engine backend's choice is its check's verdict: admission's, if remembered."""
        key = (type(self.backend), spec)
        if not CHECKED.known(key):
            return None
        try:
            CHECKED.verdict(key, len(spec.source), _not_remembered)
        except InvalidGrammarError as refused:
            return refused
        except LookupError:  # evicted since `known`
            return None
        return EngineChoice(spec, (self.backend.name,))

    def _choose(self, ticket: Ticket) -> None:
        """Start the `CHECKS` job that chooses `ticket`'s engines (`_chosen` takes its outcome),
        and the job of the engine that starts at once under every choice (`_eager_engine`)."""
        self._job(CHECKS, ticket.spec).add_done_callback(lambda done: self._chosen(ticket, done))
        eager = self._eager_engine()
        if eager is None:
            return
        with ticket.lock:
            if ticket.settled or ticket.chosen or eager in ticket.jobs:
                return  # chosen already (the choice was known by the time its job was asked for)
            job = ticket.jobs[eager] = self._job(eager, ticket.spec)
        job.add_done_callback(lambda _: self._advance(ticket))

    def _eager_engine(self) -> str | None:
        """The engine whose job `_advance` starts at once whatever the choice: the only engine, or
        with `auto_first_ready` the cheapest to compile (llguidance for auto: the preferred engine
        never defers it, `_deferred`, and it is never a hedge, `_hedged`). None otherwise."""
        names = composite.engine_names(self.backend)
        if len(names) == 1:
            return names[0]
        if not self.config.auto_first_ready:
            return None
        return min(names, key=lambda name: composite.engine(self.backend, name).compile_cost_weight)

    def _chosen(self, ticket: Ticket, done: Future) -> None:
        """`ticket`'s `CHECKS` job is done. Chosen: a job started early for an engine not chosen
        stops, and the policy starts the others (`_advance`). Refused (or the checks ran out of
        budget): the ticket fails with that error alone, its jobs stop; a refusal is counted and
        remembered for admission, so the next identical request is refused there."""
        error = done.exception()
        if error is None:
            choice = done.result()
            with ticket.lock:
                if ticket.settled:
                    return
                ticket.choose(choice)
                unchosen = [engine for engine in ticket.jobs if engine not in choice.engines]
                for engine in unchosen:
                    del ticket.jobs[engine]
            self._cancel([(engine, ticket.spec) for engine in unchosen])
            self._advance(ticket)
            return
        with ticket.lock:
            if ticket.settled:
                return
            ticket.settled = True
            ticket.stop_timers()
            started, ticket.jobs = list(ticket.jobs), {}
        with self._lock:
            if self._tickets.get(ticket.spec) is ticket:
                del self._tickets[ticket.spec]
        self._cancel([(engine, ticket.spec) for engine in started])
        if isinstance(error, InvalidGrammarError) and not isinstance(error, CompileBudgetError):
            # Admission's deferred schema checks were counted and remembered where the job ended
            # (`CompileJobs._finish_job`); the engines' refusal is counted and remembered here.
            pending = ticket.spec.pending
            if pending is None or not pending.refused:
                self.metrics.inc("deferred_admission_refusals_total")
                remember_refusal(type(self.backend), ticket.spec, error)
        if not ticket.future.done():
            ticket.future.set_exception(error)

    def _advance(self, ticket: Ticket) -> None:
        """Start the jobs the policy allows, and settle the ticket once its outcome is known."""
        started: list[Future] = []
        with ticket.lock:
            if ticket.settled or not ticket.chosen:
                return
            for index, engine in enumerate(ticket.engines):
                if engine in ticket.jobs:
                    continue
                if self._deferred(ticket, index):
                    ticket.deferred.add(engine)
                    continue
                ticket.deferred.discard(engine)
                earlier = [ticket.jobs.get(e) for e in ticket.engines[:index]]
                if (
                    index == 0
                    or all(j is not None and failed(j) for j in earlier)
                    or (self.config.auto_first_ready and not self._hedged(ticket, index))
                ):
                    ticket.jobs[engine] = self._job(engine, ticket.spec)
                    started.append(ticket.jobs[engine])
            outcome = ticket.decide(self.backend, self.config, self._advance)
            leftovers: list[tuple[str, GrammarSpec]] = []
            useless: list[tuple[str, GrammarSpec]] = []
            if outcome is not None:
                ticket.settled = True
                ticket.stop_timers()
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

    def _hedged(self, ticket: Ticket, index: int) -> bool:
        """Whether less preferred engine `index` holds back for now: a hedge, not a race. It could
        only serve if a preferred engine still compiling fails, and it compiles slower than that
        one (a higher `compile_cost_weight`: xgrammar behind llguidance), so started at once it
        would take a core from the compile the request waits for, and be killed (its worker
        re-forked, ~10 ms) as soon as that one succeeds: what a cold llguidance-first request
        paid on every compile. It starts once the preferred engines failed (`_advance` runs
        again then) or after `compile_demote_after_s`, when the pool too calls a compile slow."""
        engine = ticket.engines[index]
        weight = composite.engine(self.backend, engine).compile_cost_weight
        slower = any(composite.engine(self.backend, e).compile_cost_weight < weight for e in ticket.engines[:index])
        if not slower:
            return False
        remaining = ticket.started + self.config.compile_demote_after_s - time.monotonic()
        if remaining <= 0:
            return False
        ticket.hedge(remaining, self._advance)
        return True

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


def _not_remembered() -> None:
    raise LookupError("no remembered verdict")


_live_services: weakref.WeakSet[CompileService] = weakref.WeakSet()


@atexit.register
def _close_services() -> None:
    # Before the interpreter tears down: no loader thread may still be inside native code then.
    for service in list(_live_services):
        service.close()
