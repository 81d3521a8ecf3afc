"""Zygotes: one process per tokenizer that holds a backend's engines and forks compile workers.

A zygote imports the engines and builds the tokenizer tables once (seconds); a worker forked from
it is ready in milliseconds and shares its memory copy-on-write. Every pool of this process whose
recipe differs only in config shares one zygote (`zygote_for`). See `fd_guided.compile.worker`
for what runs inside.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import subprocess
import sys
import threading
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any


class Zygote:
    """One process holding a backend's engines and tokenizer tables, forking compile workers."""

    def __init__(self, recipe: tuple[str, dict]):
        parent, child = socket.socketpair()
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("FD_GUIDED_COMPILE_OMP_THREADS", "1"))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fd_guided.compile.worker", str(child.fileno())],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
        child.close()
        self.conn = Connection(parent.detach())
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self.error: str | None = None
        try:
            self.conn.send((recipe, os.getpid()))
        except OSError as error:  # it died at start-up (e.g. it could not import us): not alive, said why
            self._ready, self.error = False, f"the zygote exited while starting ({error!r})"

    def wait_ready(self) -> bool:
        """Block until the zygote has built its backend (seconds, once). False if it failed."""
        with self._lock:
            if self._ready is None:
                try:
                    status, detail = self.conn.recv()
                except (EOFError, OSError) as error:
                    status, detail = "failed", f"the zygote exited while starting ({error!r})"
                self._ready = status == "ready"
                self.error = None if self._ready else str(detail)
            return self._ready

    def fork(self, config: Any) -> tuple[int, Connection] | None:
        """A new worker (pid, connection) built with `config`, or None if the zygote is gone."""
        if not self.wait_ready():
            return None
        ours, theirs = socket.socketpair()
        with self._lock:
            try:
                self.conn.send(("fork", config))
                reduction.send_handle(self.conn, theirs.fileno(), self.process.pid)
                _, pid = self.conn.recv()
            except (EOFError, OSError):
                self._ready, self.error = False, "the zygote exited"
                return None
            finally:
                theirs.close()
        return pid, Connection(ours.detach())

    def alive(self) -> bool:
        return self.process.poll() is None and self._ready is not False

    def close(self) -> None:
        try:
            self.conn.send(("exit",))
        except OSError:
            pass
        self.process.kill()
        self.conn.close()


_zygotes: dict[str, Zygote] = {}
_zygotes_lock = threading.Lock()


def zygote_for(key: str, recipe: tuple[str, dict]) -> Zygote:
    """The shared zygote of `key` (a digest of the recipe without its config), started if needed."""
    with _zygotes_lock:
        zygote = _zygotes.get(key)
        if zygote is None or not zygote.alive():
            if zygote is not None:
                zygote.close()
            zygote = _zygotes[key] = Zygote(recipe)
        return zygote


def shutdown_zygotes() -> None:
    with _zygotes_lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()


def zygote_key(recipe: tuple[str, dict]) -> str:
    """Pools whose recipes differ only in config share one zygote (the config reaches each worker)."""
    path, kwargs = recipe
    material = pickle.dumps((path, {k: v for k, v in sorted(kwargs.items()) if k != "config"}), protocol=4)
    return hashlib.sha256(material).hexdigest()
