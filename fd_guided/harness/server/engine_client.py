"""The API process's side of the engine: start and watch the engine process, submit, stream updates.

`EngineClient` starts `engine_process` (a fresh interpreter, a session of its own) and waits for its
`Hello`. It watches the process through a pidfd on the event loop, so its death is seen in the
same loop iteration as the kernel reports it, whatever killed it. Then every request in flight
ends at once: one still waiting for admission raises `EngineUnavailable` (HTTP 503), one streaming
gets it from `Submission.next_update` (an SSE error event); the process group is killed (compile
workers included), new requests get 503, and a new engine process is started after
`restart_delay_s` (doubling while engines keep dying within a minute, up to 30 s). This process is
the engine's children's subreaper (Linux), so the compile processes an engine leaves behind become
its children when the engine dies and are reaped here, not left as zombies of the host's init.
An engine process alive but not answering (stopped, deadlocked, stuck in native code) is killed
when its heartbeat misses a deadline (`liveness.Liveness`), and then handled as one that died.

Updates arrive one `Outputs` message per engine step. The event loop never runs one long burst
for them: a step's updates wake every streaming response at once (each decodes its new text and
writes an SSE chunk), so they are handed out `dispatch_chunk` at a time, one chunk per loop
iteration, with timers, new connections and other callbacks between chunks (as vLLM splits its
output processing). Updates keep their order: one FIFO holds them across steps.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from fd_guided.harness.server import ipc
from fd_guided.harness.server.errors import EngineUnavailable, RequestError
from fd_guided.harness.server.liveness import Liveness
from fd_guided.harness.server.process_group import become_subreaper, kill_group, reap_group, reap_group_soon
from fd_guided.harness.server.settings import ServerSettings

logger = logging.getLogger("fd_guided.harness.server")

# Updates handed to their requests per event-loop iteration (see the module docstring).
DISPATCH_CHUNK = 8
_QUERY_TIMEOUT_S = 5.0
_MAX_RESTART_DELAY_S = 30.0


@dataclass
class Submission:
    """One HTTP request's engine requests (one index per choice) and the queue their updates arrive on."""

    indices: list[int]
    queue: asyncio.Queue
    results: dict[int, ipc.Finished] = field(default_factory=dict)

    async def next_update(self) -> ipc.Update:
        """The next update; raises `EngineUnavailable` when the engine process died meanwhile."""
        update = await self.queue.get()
        if isinstance(update, BaseException):
            raise update
        if update.finished is not None:
            self.results[update.index] = update.finished
        return update


class EngineClient:
    """Args:
    settings: the server's settings (sent to the engine process as they are).
    on_outputs: called with each `Outputs`' transit time in seconds (metrics).
    on_restart: called when an engine process is started again after one died.
    on_heartbeat: called with the seconds since the engine's previous heartbeat (its liveness).
    dispatch_chunk: updates handed out per event-loop iteration.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        on_transit: Callable[[float], None] | None = None,
        on_restart: Callable[[], None] | None = None,
        on_heartbeat: Callable[[float], None] | None = None,
        dispatch_chunk: int = DISPATCH_CHUNK,
    ):
        self.settings = settings
        self.on_transit = on_transit
        self.on_restart = on_restart
        self.on_heartbeat = on_heartbeat
        self.liveness = Liveness(settings.engine_silence_timeout_s, settings.engine_step_timeout_s)
        self._hung: str | None = None  # why the watchdog killed the engine process
        self._last_beat = 0.0
        self.dispatch_chunk = max(1, dispatch_chunk)
        self.hello: ipc.Hello | None = None  # the serving engine's; None while it is down
        self.load = ipc.Load(0, 0)
        self.process: subprocess.Popen | None = None
        self.generation = 0
        self._context = zmq.asyncio.Context()
        self._ipc_dir: str | None = None
        self._inbox: zmq.asyncio.Socket | None = None  # from the engine
        self._outbox: zmq.asyncio.Socket | None = None  # to the engine
        self._reader: asyncio.Task | None = None
        self._pidfd: int | None = None
        self._hello_waiter: asyncio.Future | None = None
        self._queues: dict[int, asyncio.Queue] = {}
        self._admissions: dict[int, tuple[asyncio.Future, list[int]]] = {}
        self._replies: dict[int, asyncio.Future] = {}
        self._undelivered: deque[ipc.Update] = deque()
        self._ids = itertools.count()
        self._request_ids = itertools.count()
        self._deaths: deque[float] = deque(maxlen=8)
        self._stopping = False
        self._restart: asyncio.TimerHandle | None = None

    # ----- lifecycle ----------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self.hello is not None

    @property
    def in_flight(self) -> int:
        """HTTP requests with engine requests not finished (or being admitted)."""
        return len(set(map(id, self._queues.values())))

    async def start(self, timeout_s: float = 600.0) -> ipc.Hello:
        """Start an engine process and wait until it has loaded its model."""
        loop = asyncio.get_running_loop()
        self.generation += 1
        to_engine, from_engine = ipc.socket_paths(self.generation, self._ipc_dir)
        self._ipc_dir = to_engine[len("ipc://") :].rsplit("/", 1)[0]
        self._close_sockets()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.bind(from_engine)
        self._outbox = self._context.socket(zmq.PUSH)
        self._outbox.setsockopt(zmq.LINGER, 0)
        self._outbox.bind(to_engine)
        self._hello_waiter = loop.create_future()
        env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fd_guided.harness.server.engine_process",
                self.settings.to_json(),
                to_engine,
                from_engine,
            ],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        become_subreaper()
        self._pidfd = os.pidfd_open(self.process.pid)
        loop.add_reader(self._pidfd, self._on_exit, self.process, self._pidfd)
        self._reader = loop.create_task(self._read(self._inbox), name="fd-guided-engine-reader")
        logger.info("engine process %d started (generation %d)", self.process.pid, self.generation)
        hello = await asyncio.wait_for(asyncio.shield(self._hello_waiter), timeout_s)
        self._hung, self._last_beat = None, 0.0
        self.liveness.reset(time.monotonic())
        loop.create_task(self._watch(self.process), name="fd-guided-engine-watchdog")
        self.hello = hello
        return hello

    async def _watch(self, process: subprocess.Popen) -> None:
        """Kill `process`'s group when it stops answering (`liveness`); its pidfd then reports the death."""
        while self.process is process and process.returncode is None and not self._stopping:
            await asyncio.sleep(self.liveness.check_s)
            reason = self.liveness.verdict(time.monotonic())
            if reason is not None and self.process is process and not self._stopping:
                self._hung = reason
                logger.error("engine process %d is not answering: %s; killing it", process.pid, reason)
                kill_group(process.pid)  # SIGKILL ends a stopped process too
                return

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the engine process to exit, wait for it, then kill whatever is left of its group."""
        self._stopping = True
        if self._restart is not None:
            self._restart.cancel()
        process = self.process
        if process is not None and process.poll() is None:
            self._send(ipc.Shutdown())
            deadline = time.monotonic() + timeout_s
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self._reap(process)
        if process is not None:
            await reap_group_soon(process.pid)
        self._fail_all(EngineUnavailable("the server is shutting down"))
        self._close_sockets()
        self._context.term()
        if self._ipc_dir:
            for name in os.listdir(self._ipc_dir):
                os.unlink(os.path.join(self._ipc_dir, name))
            os.rmdir(self._ipc_dir)

    def _reap(self, process: subprocess.Popen | None) -> None:
        """Kill the engine's process group (the engine and every compile process it started) and reap."""
        if process is None:
            return
        kill_group(process.pid)
        process.wait()
        reap_group(process.pid)
        if self._pidfd is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._pidfd)
            except RuntimeError:
                pass
            os.close(self._pidfd)
            self._pidfd = None

    def _on_exit(self, process: subprocess.Popen, pidfd: int) -> None:
        """The pidfd became readable: the engine process is gone."""
        if pidfd != self._pidfd:
            return
        self._reap(process)
        asyncio.get_running_loop().create_task(reap_group_soon(process.pid))
        was_up, self.hello = self.hello is not None, None
        if self._stopping:
            return
        logger.error(
            "engine process %d exited with %s; failing %d requests in flight",
            process.pid,
            process.returncode,
            self.in_flight,
        )
        if self._hello_waiter is not None and not self._hello_waiter.done():
            self._hello_waiter.set_exception(
                RuntimeError(f"the engine process exited with {process.returncode} while starting")
            )
        what = f"was killed, not answering: {self._hung}" if self._hung else f"died (exit status {process.returncode})"
        self._fail_all(EngineUnavailable(f"the engine process {what}; the request was lost, retry shortly"))
        now = time.monotonic()
        self._deaths.append(now)
        recent = sum(1 for t in self._deaths if now - t < 60)
        delay = min(_MAX_RESTART_DELAY_S, self.settings.restart_delay_s * 2 ** (recent - 1))
        logger.warning(
            "starting a new engine process in %.1f s%s", delay, "" if was_up else " (it died while starting)"
        )
        self._restart = asyncio.get_running_loop().call_later(delay, self._start_again)

    def _start_again(self) -> None:
        async def restart():
            try:
                await self.start()
            except Exception:  # noqa: BLE001 - _on_exit schedules the next try when the process died
                logger.exception("the engine process did not start")
                return
            if self.on_restart is not None:
                self.on_restart()
            logger.warning("engine process %d serving again", self.hello.pid)

        asyncio.get_running_loop().create_task(restart())

    def _fail_all(self, error: EngineUnavailable) -> None:
        for future, _ in self._admissions.values():
            if not future.done():
                future.set_exception(error)
        self._admissions.clear()
        for future in self._replies.values():
            if not future.done():
                future.set_exception(error)
        self._replies.clear()
        self._undelivered.clear()
        for queue in {id(q): q for q in self._queues.values()}.values():
            queue.put_nowait(error)
        self._queues.clear()

    def _close_sockets(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        for sock in (self._inbox, self._outbox):
            if sock is not None:
                sock.close(0)
        self._inbox = self._outbox = None

    # ----- requests -----------------------------------------------------------------------------------

    async def submit(self, requests: Sequence[dict], *, seed: int, tools: list[dict] | None = None) -> Submission:
        """Admit `requests` (the choices of one HTTP request; identical guided fields) in the engine and
        wait until their grammar is compiled. Raises RequestError (400 for a constraint, with nothing
        left queued) or EngineUnavailable (503)."""
        if not self.up:
            raise EngineUnavailable()
        loop = asyncio.get_running_loop()
        request_id = next(self._request_ids)
        indices = [next(self._ids) for _ in requests]
        queue: asyncio.Queue = asyncio.Queue()
        for index in indices:
            self._queues[index] = queue
        admitted = loop.create_future()
        self._admissions[request_id] = (admitted, indices)
        self._send(ipc.Submit(request_id, indices, list(requests), seed, tools))
        try:
            error = await admitted
        except asyncio.CancelledError:
            self._admissions.pop(request_id, None)
            self.abort(indices)  # the client went away while it was admitted
            raise
        except BaseException:
            self._forget(indices)
            raise
        if error is not None:
            self._forget(indices)
            raise RequestError(error.message, param=error.param, status=error.status, code=error.code, type=error.type)
        return Submission(indices, queue)

    def abort(self, indices: Sequence[int], *, forget: bool = True) -> None:
        """Stop these engine requests at the engine's next step. With `forget` their updates are
        dropped; without, the final update (reason ``abort``) still arrives on the queue."""
        if forget:
            self._forget(indices)
        if self.up:
            self._send(ipc.Abort(list(indices)))

    async def query(self, what: str, **options) -> object:
        """Ask the engine process (``metrics``, ``stats``); raises EngineUnavailable when it is down."""
        if not self.up:
            raise EngineUnavailable()
        query_id = next(self._request_ids)
        reply = asyncio.get_running_loop().create_future()
        self._replies[query_id] = reply
        self._send(ipc.Query(query_id, what, **options))
        try:
            return await asyncio.wait_for(reply, _QUERY_TIMEOUT_S)
        finally:
            self._replies.pop(query_id, None)

    def _forget(self, indices: Sequence[int]) -> None:
        for index in indices:
            self._queues.pop(index, None)

    def _send(self, message) -> None:
        try:
            self._outbox.send(ipc.encode(message), flags=zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError, AttributeError):
            logger.warning("could not send %s to the engine process", type(message).__name__)

    # ----- messages from the engine -------------------------------------------------------------------

    async def _read(self, inbox: zmq.asyncio.Socket) -> None:
        while True:
            frame = await inbox.recv(copy=False)
            self.liveness.heard(time.monotonic())
            try:
                self._handle(ipc.from_engine.decode(frame.buffer))
            except Exception:  # noqa: BLE001 - one bad message must not stop every request's updates
                logger.exception("a message from the engine process could not be handled")

    def _handle(self, message) -> None:
        if isinstance(message, ipc.Outputs):
            if self.on_transit is not None:
                self.on_transit(max(0.0, time.monotonic() - message.sent_at))
            self._dispatch(message.updates)
        elif isinstance(message, ipc.Admitted):
            pending = self._admissions.pop(message.id, None)
            if pending is not None and not pending[0].done():
                pending[0].set_result(message.error)
        elif isinstance(message, ipc.Load):
            self.load = message
            now = time.monotonic()
            self.liveness.heard(now, message.busy_since)
            if self._last_beat and self.on_heartbeat is not None:
                self.on_heartbeat(now - self._last_beat)
            self._last_beat = now
        elif isinstance(message, ipc.Reply):
            reply = self._replies.get(message.id)
            if reply is not None and not reply.done():
                reply.set_result(message.payload)
        elif isinstance(message, ipc.Hello):
            if self._hello_waiter is not None and not self._hello_waiter.done():
                self._hello_waiter.set_result(message)

    def _dispatch(self, updates: list[ipc.Update]) -> None:
        """Queue a step's updates for delivery, a chunk per loop iteration."""
        draining = bool(self._undelivered)
        self._undelivered.extend(updates)
        if not draining:
            self._deliver()

    def _deliver(self) -> None:
        """Each of the next `dispatch_chunk` updates onto its request's queue; the rest next iteration."""
        for _ in range(min(self.dispatch_chunk, len(self._undelivered))):
            update = self._undelivered.popleft()
            queue = self._queues.get(update.index)
            if queue is None:
                continue  # aborted or abandoned
            queue.put_nowait(update)
            if update.finished is not None:
                self._queues.pop(update.index, None)
        if self._undelivered:
            asyncio.get_running_loop().call_soon(self._deliver)
