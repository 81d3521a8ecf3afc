"""Small helpers over `concurrent.futures.Future`: settled futures, first-outcome-wins, bounded joins."""

from __future__ import annotations

import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from ..errors import GrammarCompileTimeout, GuidedDecodingError


def failed(job: Future) -> bool:
    """Done, and cancelled or raised."""
    return job.done() and (job.cancelled() or job.exception() is not None)


def settle(future: Future, result, error: BaseException | None) -> None:
    """Set `future`'s outcome unless it already has one (the first outcome stands)."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # noqa: BLE001 - already settled (InvalidStateError): the first outcome stands
        pass


def copy_outcome(source: Future, target: Future) -> None:
    if source.cancelled():
        settle(target, None, GuidedDecodingError("the compile was cancelled"))
    elif source.exception() is not None:
        settle(target, None, source.exception())
    else:
        settle(target, source.result(), None)


def join(future: Future, deadline: float):
    """Wait for `future` until the monotonic `deadline`; raise GrammarCompileTimeout past it."""
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        raise GrammarCompileTimeout("the grammar did not compile before the request needed its first token") from None


def resolved(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def failed_with(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future
