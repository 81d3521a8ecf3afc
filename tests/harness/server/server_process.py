"""Start `fd-guided serve` in a child process on a free loopback port, and stop it.

The real CLI entry point runs (`python -m fd_guided.harness.cli serve`), so tests exercise what a user
starts. Its log goes to a file that a failing test prints.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, *args: str, startup_timeout_s: float = 120.0):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="fd-guided-serve-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fd_guided.harness.cli", "serve", "--port", str(self.port), "--log-level", "warning", *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.read_log()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not answer /health within {startup_timeout_s} s:\n{self.read_log()}")
            time.sleep(0.2)

    def read_log(self) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-20000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


def openai_client(server: ServerProcess):
    """The real openai client for `server` (no retries: a failure shows as it happened)."""
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_json(schema: dict, text: str) -> None:
    """Assert `text` is a valid instance of `schema` (fd_guided's validator, formats checked)."""
    from fd_guided.harness.validate import validate_output
    from fd_guided.spec import parse_guided_request

    verdict = validate_output(parse_guided_request({"guided_json": schema}), text)
    assert verdict.valid, f"{text!r}: {verdict.reason}"
