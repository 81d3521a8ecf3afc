"""The start plans of a manager's grammars: searched once per spec and engine, then copied.

A request's first look needs the plan from its grammar's start state. `StartPlans` remembers the
last `START_PLANS` of them (a plan, or None where the search found nothing), and runs a search in
the background when the caller can go on without it (a request far from its budget): one thread,
each search on a matcher of its own (`BudgetSteering._own_search`), so a cold schema's first step
does not pay for it on the host's thread. A request's first look finds its plan by its compiled
grammar's identity (`of_grammar`: the compile cache hands every request of a spec the same object)
without hashing the spec or taking the lock.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor

from .plan import Plan

logger = logging.getLogger(__name__)

START_PLANS = 256  # start-state plans remembered per manager
_UNKNOWN = object()


class StartPlans:
    """Spec+engine key -> the start plan (or None: no completion found); thread-safe."""

    def __init__(self, limit: int = START_PLANS):
        self.limit = limit
        self._plans: OrderedDict[Hashable, Plan | None] = OrderedDict()
        self._needs: OrderedDict[Hashable, int] = OrderedDict()  # spec -> its start plan's need
        self._searches: dict[Hashable, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # id(compiled grammar) -> (a weak reference to it, its start plan, the plan's need and
        # growth): written and read on the step's thread only (`tie`, `of_grammar`; read directly
        # by a first look, `far.FarRows._far_at_start`: no call); the reference tells a reused id
        # from its grammar.
        self.by_grammar: dict[int, tuple[weakref.ref, Plan, int, int]] = {}

    def known(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._plans

    def get(self, key: Hashable) -> Plan | None:
        """The remembered plan (None if unknown or none was found); marks it recently used. One
        lookup of the key (a request's first look hashes its spec once here)."""
        with self._lock:
            plan = self._plans.get(key, _UNKNOWN)
            if plan is _UNKNOWN:
                return None
            self._plans.move_to_end(key)
            return plan  # type: ignore[return-value]

    def of_grammar(self, compiled: object) -> Plan | None:
        """The start plan tied to the compiled grammar `compiled` (`tie`), or None: one dict
        lookup by identity (no spec hashed, no lock), for a request's first look."""
        tied = self.by_grammar.get(id(compiled))
        return tied[1] if tied is not None and tied[0]() is compiled else None

    def tie(self, compiled: object, plan: Plan) -> None:
        """Remember `plan` (the start plan of `compiled`'s spec and engine) for `of_grammar`; at
        most `limit` grammars, forgotten all at once past it (each is tied again at its next look)."""
        try:
            reference = weakref.ref(compiled)
        except TypeError:  # a grammar without weak references: looked up by its spec, as before
            return
        if len(self.by_grammar) >= self.limit:
            self.by_grammar.clear()
        self.by_grammar[id(compiled)] = (reference, plan, plan.need, plan.growth)

    def remember(self, key: Hashable, plan: Plan | None) -> None:
        with self._lock:
            self._remember(key, plan)

    def searching(self, key: Hashable) -> bool:
        """Whether a background search for `key` is still running."""
        with self._lock:
            running = self._searches.get(key)
            return running is not None and not running.done()

    def search_later(self, key: Hashable, search: Callable[[], Plan | None]) -> bool:
        """Run `search` for `key` on the background thread (once); True when it was started."""
        with self._lock:
            if key in self._plans or key in self._searches:
                return key in self._searches
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-budget")
            self._searches[key] = self._pool.submit(self._run, key, search)
            return True

    def need_of(self, spec: Hashable) -> int | None:
        """The need of the last start plan found for `spec` (keys are (spec, engine)), or None."""
        with self._lock:
            return self._needs.get(spec)

    def wait(self, key: Hashable) -> None:
        """Wait for a background search of `key` in flight, if any (it is bounded)."""
        with self._lock:
            running = self._searches.get(key)
        if running is not None:
            running.exception()

    def when_known(self, key: Hashable, search: Callable[[], Plan | None], then: Callable[[Plan | None], None]) -> None:
        """Call `then(plan)` once `key`'s plan is known: now if it is, else after its background
        search (started here if none is in flight), on the background thread."""
        with self._lock:
            known, plan = key in self._plans, self._plans.get(key)
            running = None if known else self._searches.get(key)
            if not known and running is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-guided-budget")
                running = self._searches[key] = self._pool.submit(self._run, key, search)
        if running is None:
            then(plan)
        else:
            running.add_done_callback(lambda _: then(self.get(key)))

    def close(self) -> None:
        """Wait for a search in flight (it holds a matcher of its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _run(self, key: Hashable, search: Callable[[], Plan | None]) -> None:
        try:
            plan = search()
        except Exception:  # noqa: BLE001 - the request searches on its own matcher instead
            logger.exception("background start-plan search failed")
            with self._lock:
                self._searches.pop(key, None)
            return
        with self._lock:
            self._remember(key, plan)
            self._searches.pop(key, None)

    def _remember(self, key: Hashable, plan: Plan | None) -> None:
        self._plans[key] = plan
        self._plans.move_to_end(key)
        if plan is not None and isinstance(key, tuple) and key:
            self._needs[key[0]] = plan.need
            self._needs.move_to_end(key[0])
            if len(self._needs) > self.limit:
                self._needs.popitem(last=False)
        if len(self._plans) > self.limit:
            self._plans.popitem(last=False)
