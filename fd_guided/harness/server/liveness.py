"""Is the engine process answering? A deadline on its heartbeat, and one on a single step.

A process can be alive and useless: stopped (SIGSTOP, a debugger), deadlocked, or stuck in native
code that holds the GIL. Its pidfd never fires, so `engine_client` also judges it by what it says.
The engine process's main thread sends a `Load` heartbeat every 100 ms whatever its engine thread
does (`engine_process._HEARTBEAT_S`), and in it the monotonic time its engine thread started the
step it is in (``busy_since``; 0 when idle). `Liveness` turns that into a verdict:

- **silent**: nothing at all from the engine for `silence_s` (default 5 s): the whole process is
  stopped, or its interpreter is (a thread holding the GIL in native code stops the heartbeat too);
- **stuck step**: one step has run for `step_s` (default 60 s) while the heartbeat goes on: the engine
  thread is deadlocked or spinning without the GIL.

The API process then kills the engine's process group and handles it as a death: in-flight requests
get the error, new ones 503, a fresh engine starts (`EngineClient`). Both deadlines are far above
what a healthy engine shows on this 2-core host under the heaviest load measured (the longest
interval between heartbeats is in ``GET /stats`` as ``heartbeat_interval``; docs/benchmarks.md).

The watchdog judges nothing when it ran late itself (the API process was stopped or starved): the
engine's messages may be waiting unread in the socket, and silence seen from a stalled reader is
not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Liveness:
    """Args:
    silence_s: the longest the engine may say nothing (heartbeats come every 100 ms).
    step_s: the longest one engine step may run.
    check_s: how often the watchdog looks (it ignores a look more than two periods late).
    """

    silence_s: float = 5.0
    step_s: float = 60.0
    check_s: float = 0.25
    last_heard: float = 0.0
    busy_since: float = 0.0
    last_check: float = 0.0

    def reset(self, now: float) -> None:
        """A new engine process said hello at `now`."""
        self.last_heard = self.last_check = now
        self.busy_since = 0.0

    def heard(self, now: float, busy_since: float | None = None) -> None:
        """A message arrived at `now`; a heartbeat also says when the current step began (0: idle)."""
        self.last_heard = now
        if busy_since is not None:
            self.busy_since = busy_since

    def verdict(self, now: float) -> str | None:
        """Why the engine counts as hung at `now`, or None. A look that comes more than two
        periods after the previous one judges nothing (see the module docstring)."""
        late = now - self.last_check > 2 * self.check_s
        self.last_check = now
        if late:
            self.last_heard = max(self.last_heard, now - self.check_s)  # start counting afresh
            return None
        if now - self.last_heard > self.silence_s:
            return f"no message from it for {now - self.last_heard:.1f} s (deadline {self.silence_s:g} s)"
        if self.busy_since and now - self.busy_since > self.step_s:
            return f"one engine step has run for {now - self.busy_since:.1f} s (deadline {self.step_s:g} s)"
        return None
