"""The engine's process group as the API process handles it: kill it whole, reap what is left.

The engine process starts in a session of its own, so it and every compile process it forks share
one process group (its pid). The API process makes itself its descendants' subreaper (Linux), so
compile processes orphaned by a dead engine become its children and are reaped here rather than
left as zombies of the host's init.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphaned descendants of this process become its children (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group `pgid` (a stopped one too); nothing when it is gone already."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap_group(pgid: int) -> bool:
    """Reap the dead of process group `pgid` that are our children; True when none is left."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


async def reap_group_soon(pgid: int, timeout_s: float = 2.0) -> None:
    """`reap_group` until none is left (SIGKILLed compile processes exit within milliseconds)."""
    deadline = time.monotonic() + timeout_s
    while not reap_group(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
