"""A real redis-server for `redis`-marked tests: a free loopback port, no persistence, stopped after.

    from redis_server import running_redis

    @pytest.fixture(scope="module")
    def redis_client():
        with running_redis() as client:
            yield client

Skips the test when no ``redis-server`` binary or ``redis`` client package is installed.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_redis(startup_timeout_s: float = 10.0):
    """Start ``redis-server`` on 127.0.0.1:<free port>, yield a connected client, stop the server."""
    redis = pytest.importorskip("redis")
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=1)
    try:
        _wait_until_up(client, process, startup_timeout_s)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_until_up(client, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}: {process.stderr.read().decode(errors='replace')}")
        try:
            if client.ping():
                return
        except Exception:  # not accepting connections yet
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer PING within {timeout_s} s")
