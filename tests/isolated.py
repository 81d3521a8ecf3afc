"""Run a test case in a fresh Python process, so a crash fails that test instead of the suite.

`run_isolated(code)` executes `code` (a script that prints one JSON line as its last output) with
the repository on the path and returns the parsed line; a nonzero exit, a signal or a timeout is
an AssertionError naming it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_isolated(code: str, *, timeout_s: float = 180, env: dict | None = None):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    environment.update(env or {})
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                               timeout=timeout_s, env=environment, cwd=str(REPO))
    if completed.returncode != 0:
        raise AssertionError(f"the isolated case exited with {completed.returncode} "
                             f"({'signal ' + str(-completed.returncode) if completed.returncode < 0 else 'error'}):\n"
                             f"{completed.stderr[-3000:]}")
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{") or line.startswith("[")]
    if not lines:
        raise AssertionError(f"the isolated case printed no JSON result:\n{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}")
    return json.loads(lines[-1])
