"""A cooperative deadline for admission's checks on the caller's thread.

Admission (`fd_guided.admission.parse`) runs the checks whose cost it cannot bound by construction
(meta-schema, references, bounds, the normaliser) under `within(seconds)`; the long loops of those
checks call `checkpoint()`, which raises `Overrun` once the deadline of the current thread has
passed. Admission then leaves the rest to the compile worker (`fd_guided.admission.deferred`).
Outside `within` (compile workers, tools) `checkpoint()` never raises.

`Overrun` is not an `InvalidGrammarError`: it is no verdict and is never cached. A computation it
interrupts must not leave state behind that a later run reuses (`fd_guided.schema._cached` drops
the normaliser it stopped).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class Overrun(Exception):  # noqa: N818 - not an error: the check goes on elsewhere
    """The admission budget of this thread is spent: the check in progress is left to the worker."""


@contextmanager
def within(seconds: float | None) -> Iterator[None]:
    """Run the block under a deadline `seconds` from now (None: no deadline). Nested: the earlier
    deadline wins."""
    outer = getattr(_local, "deadline", None)
    if seconds is None:
        yield
        return
    deadline = time.perf_counter() + max(0.0, seconds)
    _local.deadline = deadline if outer is None else min(outer, deadline)
    try:
        yield
    finally:
        _local.deadline = outer


@contextmanager
def unbounded() -> Iterator[None]:
    """Run the block without the current thread's deadline (work whose result is needed whole)."""
    outer = getattr(_local, "deadline", None)
    _local.deadline = None
    try:
        yield
    finally:
        _local.deadline = outer


@contextmanager
def until(deadline: float | None) -> Iterator[None]:
    """Run the block under the absolute deadline `deadline` (a `time.perf_counter()` value, as
    `current()` gives; None: no deadline). Nested: the earlier deadline wins."""
    outer = getattr(_local, "deadline", None)
    if deadline is not None:
        _local.deadline = deadline if outer is None else min(outer, deadline)
    try:
        yield
    finally:
        _local.deadline = outer


def current() -> float | None:
    """The current thread's deadline (a `time.perf_counter()` value), or None."""
    return getattr(_local, "deadline", None)


def afford(seconds: float) -> None:
    """Raise `Overrun` if a step expected to take `seconds` (and that cannot stop itself: native
    code, a library's recursion) would end past the current thread's deadline."""
    deadline = getattr(_local, "deadline", None)
    if deadline is not None and time.perf_counter() + seconds >= deadline:
        raise Overrun


def checkpoint() -> None:
    """Raise `Overrun` if the current thread's deadline has passed (cheap: one thread-local read
    and one clock read)."""
    deadline = getattr(_local, "deadline", None)
    if deadline is not None and time.perf_counter() >= deadline:
        raise Overrun
