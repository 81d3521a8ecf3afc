"""Tickets: one request-level compile over per-engine jobs, and which engine's outcome settles it.

A ticket holds its engines in preference order and their job futures (`CompileService` starts the
jobs). The engines are the backend's `EngineChoice` for the spec: known at once when the service
decided the spec before, else chosen later off the caller's thread (`Ticket.choose`; until then
only the job of an engine every choice starts at once may run). `Ticket.decide` says when the
request has its grammar: the first success in preference order, where a less preferred engine
that is ready waits for a preferred one still compiling only as long as that engine is expected
to gain on it over the request, or its errors once every engine failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..backends import composite
from ..backends.composite import EngineChoice
from ..config import GuidedConfig
from ..errors import combine_engine_errors
from ..interface import GuidedBackend
from ..spec import GrammarSpec
from .futures import failed


class Ticket:
    """One request-level compile: its engines in preference order and their jobs."""

    __slots__ = (
        "spec",
        "engines",
        "refusals",
        "chosen",
        "jobs",
        "deferred",
        "future",
        "lock",
        "settled",
        "started",
        "ready_at",
        "timer",
        "hedge_timer",
    )

    def __init__(self, spec: GrammarSpec, choice: EngineChoice | None):
        self.spec = spec
        self.engines: tuple[str, ...] = ()
        self.refusals: tuple[tuple[str, Any], ...] = ()
        self.chosen = False  # the engines are known (`choose`); nothing settles before
        if choice is not None:
            self.choose(choice)
        self.jobs: dict[str, Future] = {}
        self.deferred: set[str] = set()  # engines whose job starts once the later ones are done
        self.future: Future = Future()
        self.lock = threading.RLock()
        self.settled = False
        self.started = time.monotonic()
        self.ready_at: float | None = None  # when a less preferred engine's job succeeded
        self.timer: threading.Timer | None = None
        self.hedge_timer: threading.Timer | None = None  # starts a held-back engine (`hedge`)

    def choose(self, choice: EngineChoice) -> None:
        """The spec's engines are known: `choice.engines`, preferred first, and the other engines'
        check refusals (named in the error if every candidate fails). Under `lock` once shared."""
        self.engines, self.refusals, self.chosen = choice.engines, choice.refusals, True

    def hedge(self, delay_s: float, recheck: Callable[[Ticket], Any]) -> None:
        """Run `recheck(self)` in `delay_s` (once): a held-back engine's job may start then."""
        if self.hedge_timer is None:
            self.hedge_timer = threading.Timer(delay_s, recheck, (self,))
            self.hedge_timer.daemon = True
            self.hedge_timer.start()

    def stop_timers(self) -> None:
        """The ticket settled: its timers have nothing left to do (their threads end now)."""
        for timer in (self.timer, self.hedge_timer):
            if timer is not None:
                timer.cancel()

    def decide(self, backend: GuidedBackend, config: GuidedConfig, recheck: Callable[[Ticket], Any]):
        """("ok", compiled) or ("error", why) once the outcome is known, else None.

        - the first success in preference order among finished jobs wins; a later engine's success
          waits for a pending earlier one, with `auto_first_ready` only as long as that engine is
          expected to gain on it over the request (`_waited_enough`; `recheck(self)` runs then);
        - every engine failed: the errors combined, after the other engines' check refusals;
        - the engines not chosen yet: None (a job started early may be done already).
        """
        if not self.chosen:
            return None
        errors: list[tuple[str, Any]] = []
        pending_earlier = []
        for engine in self.engines:
            job = self.jobs.get(engine)
            if job is None and engine not in self.deferred:
                return None
            if job is None or not job.done():
                if not config.auto_first_ready:
                    return None
                pending_earlier.append(engine)
                continue
            if failed(job):
                errors.append((engine, job.exception()))
                continue
            if pending_earlier and not self._waited_enough(backend, config, pending_earlier, engine, recheck):
                return None
            return "ok", job.result()
        if len(errors) < len(self.engines):
            return None
        return "error", combine_engine_errors(list(self.refusals) + errors)

    def _waited_enough(
        self,
        backend: GuidedBackend,
        config: GuidedConfig,
        pending: list[str],
        ready: str,
        recheck: Callable[[Ticket], Any],
    ) -> bool:
        """Whether the ticket, its `ready` engine compiled, may stop waiting for the `pending`
        (preferred) ones: once it has waited what they are expected to gain on `ready` over the
        request (`CompositeBackend.expected_gain_s`, measured from their masks; 0 while unknown),
        at most `auto_fallback_grace_s`. A longer wait would cost the request more time to its
        first token than the preferred engine could give back."""
        now = time.monotonic()
        if self.ready_at is None:
            self.ready_at = now
        gain = max(composite.expected_gain_s(backend, engine, ready) for engine in pending)
        remaining = self.ready_at + min(config.auto_fallback_grace_s, gain) - now
        if remaining <= 0:
            return True
        if self.timer is None:
            self.timer = threading.Timer(remaining, recheck, (self,))
            self.timer.daemon = True
            self.timer.start()
        return False
