"""`--loop-priority`: the event-loop thread alone runs SCHED_RR priority 1 where the system allows
it; threads and processes it starts stay in the normal class; without permission ``auto`` falls
back and ``realtime`` refuses. Each case runs in a child process so the test runner's own thread
never changes class."""
import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap

import pytest

from server_process import REPO

pytestmark = pytest.mark.cpu

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="real-time scheduling is Linux's")

_PROBE = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    from fd_guided.harness.server.loop_priority import LoopPriorityError, set_loop_priority
    try:
        result = set_loop_priority(sys.argv[1])
    except LoopPriorityError as error:
        print(json.dumps({"refused": str(error)})); sys.exit(0)
    seen = {}
    worker = threading.Thread(target=lambda: seen.update(thread=os.sched_getscheduler(0)))
    worker.start(); worker.join()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                           capture_output=True, text=True, check=True)
    print(json.dumps({"policy": result.policy, "priority": result.priority, "note": result.note,
                      "kernel": os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK,
                      "thread": seen["thread"], "child": int(child.stdout)}))
""")


def _no_realtime_limit() -> None:
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))


def _unprivileged_prefix() -> list[str]:
    """A command prefix that takes CAP_SYS_NICE away from root (which ignores RLIMIT_RTPRIO)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without util-linux's setpriv: cannot take CAP_SYS_NICE away")
    return [setpriv, "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"]


def probe(mode: str, unprivileged: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    prefix = _unprivileged_prefix() if unprivileged else []
    done = subprocess.run([*prefix, sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120,
                          env=env, preexec_fn=_no_realtime_limit if unprivileged else None)
    if prefix and done.returncode != 0 and "setpriv" in done.stderr:
        pytest.skip(f"setpriv may not drop CAP_SYS_NICE here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@linux_only
def test_auto_puts_the_calling_thread_alone_in_round_robin():
    seen = probe("auto")
    if "SCHED_RR refused" in seen["note"]:  # e.g. a container without CAP_SYS_NICE, even as root
        assert seen["kernel"] == os.SCHED_OTHER
        pytest.skip(f"this process may not take SCHED_RR here: {seen['note']}")
    assert (seen["policy"], seen["priority"], seen["kernel"]) == ("SCHED_RR", 1, os.SCHED_RR)
    # SCHED_RESET_ON_FORK: a thread or process started afterwards is back in the normal class
    assert seen["thread"] == os.SCHED_OTHER and seen["child"] == os.SCHED_OTHER


@linux_only
def test_without_permission_auto_falls_back_and_realtime_refuses():
    fallback = probe("auto", unprivileged=True)
    assert (fallback["policy"], fallback["kernel"]) == ("SCHED_OTHER", os.SCHED_OTHER)
    assert "SCHED_RR refused" in fallback["note"] and "CAP_SYS_NICE" in fallback["note"]
    refused = probe("realtime", unprivileged=True)
    assert "--loop-priority realtime: SCHED_RR refused" in refused["refused"]


def test_normal_leaves_the_thread_alone_and_unknown_modes_are_errors():
    from fd_guided.harness.server.loop_priority import set_loop_priority

    assert probe("normal")["kernel"] == os.SCHED_OTHER
    with pytest.raises(ValueError, match="auto, realtime, normal"):
        set_loop_priority("fastest")
