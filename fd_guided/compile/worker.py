"""The processes that compile untrusted constraints: one zygote per pool, and its forked workers.

Runs as ``python -m fd_guided.compile.worker FD`` (started by `fd_guided.compile.pool`), never
imported by the serving process for its own use. The zygote reads a backend recipe, builds the
backend once (imports xgrammar and llguidance, loads the tokenizer tables: seconds), then forks a
worker whenever the pool asks: a worker is ready in milliseconds and shares the zygote's memory
copy-on-write. A worker compiles one job at a time on a thread of `WORKER_STACK_BYTES` and sends
back the serialized grammar (or `CompileHere`, see `fd_guided.compile.transfer`) or the error.
Both exit on their own when the serving process dies.

Protocol (pickles over a socket pair; see `CompileProcessPool`):
  pool -> zygote:  (recipe, serving_pid); then ("fork", config) + a socket handle; ("exit",)
  zygote -> pool:  ("ready", pid) or ("failed", traceback); ("forked", pid) per fork
  pool -> worker:  (job_id, engine, spec)
  worker -> pool:  (job_id, "ok", data, seconds) or (job_id, "error", class_name, message, part, feature);
                   data is the serialized grammar, or a `transfer.CompileHere` where sending it
                   would cost more than compiling again in the serving process

Before compiling, a worker runs the admission checks a bounded admission left to it
(`_admission_checks`); the message of a refusal there starts with `admission.deferred.DEFERRED_TAG`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from multiprocessing import reduction
from multiprocessing.connection import Connection

from ..backends import composite
from .supervisor import peak_rss, reset_peak_rss
from .threads import WORKER_STACK_BYTES, start_thread
from .transfer import CompileHere, compile_here

_POLL_S = 1.0


def build_backend(recipe: tuple[str, dict]):
    """Instantiate a backend from its `worker_recipe()`: ("module:factory", kwargs)."""
    return composite.from_recipe(recipe)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _next_message(conn: Connection, serving_pid: int):
    """The next message on `conn`, or None once the pool hung up or the serving process died."""
    while not conn.poll(_POLL_S):
        if not _alive(serving_pid):
            return None
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _warm_up(backend) -> None:
    """Pay every lazy first-use cost (imports, token tries) once here; forked workers inherit it."""
    from ..admission.parse import warm_up
    from ..spec import GrammarSpec, parse_guided_request

    backend.warm_up()
    warm_up(backend.config)  # the checks a worker runs before compiling: their one-time costs
    json_object = parse_guided_request({"guided_json_object": True}, check_backend=False)
    assert json_object is not None  # None only for a request with no guided field
    specs = [GrammarSpec("regex", "[a-z]{1,3}"), json_object]
    for name in composite.engine_names(backend):
        engine = composite.engine(backend, name)
        for spec in specs:
            engine.serialize(engine.compile_checked(spec))


def zygote(conn: Connection) -> None:
    recipe, serving_pid = conn.recv()
    try:
        backend = build_backend(recipe)
        _warm_up(backend)
    except BaseException:  # noqa: BLE001 - reported to the pool, which fails its compiles
        conn.send(("failed", traceback.format_exc()))
        return
    # Forked workers are reaped by the kernel; the pool watches their pipes, not their exit codes.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    conn.send(("ready", os.getpid()))
    while True:
        message = _next_message(conn, serving_pid)
        if message is None or message[0] != "fork":
            return
        fd = reduction.recv_handle(conn)
        priority_set_read, priority_set_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(priority_set_read)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # Compiles are background work next to a serving process (`GuidedConfig.compile_nice`).
            os.setpriority(os.PRIO_PROCESS, 0, int(getattr(message[1], "compile_nice", 0)))
            os.close(priority_set_write)
            code = 0
            try:
                serve(composite.with_config(backend, message[1]), Connection(fd), serving_pid)
            except BaseException:  # noqa: BLE001 - a worker must never return into the zygote's loop
                code = 1
            finally:
                os._exit(code)
        os.close(fd)
        # The pool may lower the worker's priority as soon as it knows the pid; the worker setting
        # its own afterwards would undo that where setting is privileged (root): report it only
        # once the worker has set it (its end of the pipe closed, or it died).
        os.close(priority_set_write)
        os.read(priority_set_read, 1)
        os.close(priority_set_read)
        conn.send(("forked", pid))


def serve(backend, conn: Connection, serving_pid: int) -> None:
    """A worker's loop: compile jobs one at a time until the pool hangs up or the server dies."""
    while True:
        message = _next_message(conn, serving_pid)
        if message is None:
            return
        job_id, engine, spec = message
        outcome: list = []
        thread = start_thread(
            # The thread is joined below, before the loop moves on: it sees this job's variables.
            lambda: outcome.append(_compile(backend, engine, spec)),  # noqa: B023
            name="fd-guided-compile",
            stack_bytes=WORKER_STACK_BYTES,
        )
        while thread.is_alive():
            thread.join(_POLL_S)
            if not _alive(serving_pid):
                os._exit(0)
        conn.send((job_id, *outcome[0]))


def _compile(backend, engine: str, spec) -> tuple:
    from ..errors import InvalidGrammarError

    started = time.perf_counter()
    try:
        engine_backend = composite.engine(backend, engine)
        refused = _admission_checks(engine_backend, spec)
        if refused is not None:
            return refused
        compile_started, rss_before = time.perf_counter(), reset_peak_rss()
        compiled = engine_backend.compile_checked(spec)
        compile_s, growth = time.perf_counter() - compile_started, peak_rss() - rss_before
        estimate = engine_backend.serialized_size_estimate(compiled)
        if compile_here(estimate, compile_s, growth, engine_backend.config.compile_transfer_max_bytes):
            assert estimate is not None  # compile_here is False without one
            return ("ok", CompileHere(estimate), time.perf_counter() - started)
        data = engine_backend.serialize(compiled)
        if data is None:
            raise RuntimeError(f"the {engine} backend cannot serialize its grammars")
        return ("ok", data, time.perf_counter() - started)
    except InvalidGrammarError as error:
        return ("error", type(error).__name__, _message(error), error.part, error.feature)
    except BaseException as error:  # noqa: BLE001 - any failure is this job's failure
        return (
            "error",
            "InvalidGrammarError",
            f"the {engine} compiler failed: {type(error).__name__}: {error}",
            None,
            None,
        )


def _admission_checks(engine_backend, spec) -> tuple | None:
    """What admission may have left to this worker (`fd_guided.admission.deferred`), before the
    compile: a pending spec's checks (a schema's bounds, meta-schema and references; a grammar's
    syntax and bounds), whose refusal goes back tagged so the serving process remembers it for
    admission; then the engine's own check
    (`GuidedBackend.check`: what it cannot enforce faithfully), always: admission's budget may
    have run out before it, and it costs little here (the normaliser's result is cached for the
    compile that follows). An engine's refusal is that engine's compile error."""
    from ..admission.deferred import DEFERRED_TAG, finish_deferred_checks
    from ..errors import InvalidGrammarError

    try:
        finish_deferred_checks(spec)
    except InvalidGrammarError as error:
        return ("error", type(error).__name__, DEFERRED_TAG + _message(error), error.part, error.feature)
    type(engine_backend).check(spec)
    return None


def _message(error) -> str:
    text = str(error)
    prefix = f"{error.part}: " if error.part else ""
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text


def main(argv: list[str]) -> int:
    zygote(Connection(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
