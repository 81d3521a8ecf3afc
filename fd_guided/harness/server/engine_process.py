"""The engine process: the reference engine, its guided manager and compile service, behind ZeroMQ.

    python -m fd_guided.harness.server.engine_process SETTINGS_JSON TO_ENGINE_ADDR FROM_ENGINE_ADDR

Started (and restarted) by the API process (`engine_client.EngineClient`) in a session of its own,
so the engine and every compile process it starts share one process group the API process can
kill whole. Nothing the engine does (forward passes, admission's schema normalisation, loading
compiled grammars, a native crash) can hold the API process's event loop or its GIL.

Threads: the main one receives messages (`ipc.ToEngine`), answers queries and sends a `Load`
heartbeat every `_HEARTBEAT_S`; the admission thread(s) tokenise each prompt once, refusing one too long for the context
without tokenising it whole (`bounds.PromptBound`), validate through
the library's public admission (`ReferenceEngine.validate` -> `GuidedDecodingManager.validate`), submit each choice
and report `Admitted` when the grammar's compile ticket settles; the engine thread steps while
anything is unfinished and sends each step's updates as one `Outputs` message. Sends from the
three go through one lock (a ZeroMQ socket is not thread-safe; a lock is the full barrier its
documentation asks for). The process exits when the API process goes away (a parent-death
signal, and a check of the parent's pid on every heartbeat).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import zmq

from fd_guided.budget import fit_budget_requested
from fd_guided.errors import InvalidGrammarError
from fd_guided.harness.server import ipc
from fd_guided.harness.server.bounds import PromptBound, longest_token_bytes
from fd_guided.harness.server.errors import RequestError, grammar_error_fields
from fd_guided.harness.server.health import WindowStats
from fd_guided.harness.server.metrics import EngineMetrics
from fd_guided.harness.server.settings import ServerSettings

logger = logging.getLogger("fd_guided.harness.server.engine")

_HEARTBEAT_S = 0.1
# How long the idle engine thread sleeps between checks when nothing woke it (a wake-up is immediate).
_IDLE_POLL_S = 0.05
# step_log entries kept before the engine's run statistics are trimmed (a server never ends a run).
_STEP_LOG_KEEP = 4096
_PR_SET_PDEATHSIG = 1


def build_engine(settings: ServerSettings):
    """The embedded default model (random weights, `settings.preset`) over a bundled tokenizer."""
    from fd_guided.config import GuidedConfig
    from fd_guided.harness.engine.engine import ReferenceEngine

    return ReferenceEngine.default(
        preset=settings.preset,
        tokenizer=settings.tokenizer,
        seed=settings.seed,
        guided_config=GuidedConfig(backend=settings.backend),
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )


class EngineServer:
    """Serves one engine over the two sockets (see the module docstring)."""

    def __init__(self, engine, settings: ServerSettings, out: zmq.Socket):
        self.engine = engine
        self.settings = settings
        self.metrics = EngineMetrics(engine.manager.metrics if engine.manager is not None else None)
        self.prompts = PromptBound(
            engine.tokenizer.encode, longest_token_bytes(engine.tokenizer.token_bytes), engine.model.cfg.max_seq_len
        )
        self.steps, self.token_gaps = WindowStats(), WindowStats()
        self._out = out
        self._send_lock = threading.Lock()
        self._admission = ThreadPoolExecutor(settings.admission_threads, thread_name_prefix="fd-guided-admission")
        self._live: set[int] = set()  # engine requests submitted and not finished (engine thread + admission)
        self._busy_since = 0.0  # when the engine thread began its current step (0: between steps)
        self._cancelled: set[int] = set()  # aborted by the API, perhaps before their admission ran
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_engine, name="fd-guided-engine", daemon=True)

    def send(self, message) -> None:
        data = ipc.encode(message)
        with self._send_lock:
            self._out.send(data, copy=False)

    # ----- the main thread: messages from the API process ---------------------------------------------------

    def serve(self, inbox: zmq.Socket, parent_pid: int) -> None:
        cfg = self.engine.model.cfg
        self._thread.start()
        tokenizer = self.engine.tokenizer
        self.send(
            ipc.Hello(
                os.getpid(),
                cfg.max_seq_len,
                cfg.vocab_size,
                cfg.num_layers,
                cfg.hidden_size,
                tokenizer.name,
                list(tokenizer.token_bytes),
            )
        )
        next_beat = 0.0
        while not self._stopping.is_set():
            if inbox.poll(int(_HEARTBEAT_S * 1000)):
                message = ipc.to_engine.decode(inbox.recv(copy=False).buffer)
                self._handle(message)
            now = time.monotonic()
            if now >= next_beat:
                if os.getppid() != parent_pid:
                    logger.warning("the API process is gone; exiting")
                    break
                self.send(ipc.Load(self._compiles_in_flight(), len(self._live), self._busy_since))
                next_beat = now + _HEARTBEAT_S
        self.close()

    def _handle(self, message) -> None:
        if isinstance(message, ipc.Submit):
            self._admission.submit(self._admit, message)
        elif isinstance(message, ipc.Abort):
            with self._lock:
                self._cancelled.update(message.indices)
            for index in message.indices:
                self.engine.abort(index)
            self._wake.set()
        elif isinstance(message, ipc.Query):
            self.send(ipc.Reply(message.id, self._answer(message)))
        elif isinstance(message, ipc.Shutdown):
            self._stopping.set()

    def _answer(self, query: ipc.Query):
        if query.what == "metrics":
            return self.metrics.exposition().decode()
        if query.what == "stats":
            return {
                "engine_step": self.steps.snapshot(query.reset, query.series),
                "token_gap": self.token_gaps.snapshot(query.reset, query.series),
            }
        return {"error": f"unknown query {query.what!r}"}

    def _compiles_in_flight(self) -> int:
        manager = self.engine.manager
        return int(manager.metrics.value("compiles_in_flight")) if manager is not None else 0

    # ----- admission ------------------------------------------------------------------------------

    def _admit(self, message: ipc.Submit) -> None:
        """Validate once for the ticket, submit each choice, and report when the grammar is compiled."""
        submitted: list[int] = []
        try:
            ids = self._tokenize(message.requests)
            if message.tools:
                from fd_guided.harness.server.protocol import Tool
                from fd_guided.harness.server.tools import check_parameters

                check_parameters([Tool.model_validate(tool) for tool in message.tools], self.engine.validate)
            spec = self.engine.validate(message.requests[0])
            # The same ticket the engine's own prefetch joins (identical specs share one compile).
            ticket = self.engine.manager.compiler.submit(spec) if spec is not None else None
            for position, (request, index) in enumerate(zip(message.requests, message.indices)):
                prompt_ids = ids.get((request.get("prompt"), request.get("max_tokens")))
                self.engine.submit(request, seed=message.seed, index=index, position=position, prompt_ids=prompt_ids)
                submitted.append(index)
                with self._lock:
                    self._live.add(index)
        except Exception as error:  # noqa: BLE001 - a refusal fails its request, never the engine
            self._drop(submitted)
            self.send(ipc.Admitted(message.id, _error_info(error)))
            return
        with self._lock:
            if self._cancelled.intersection(message.indices):  # the client left while this ran
                for index in message.indices:
                    self.engine.abort(index)
        self._wake.set()
        if ticket is None:
            self.send(ipc.Admitted(message.id))
        else:
            # Compiled, then the budget: a max_tokens below the shortest output is a 400 (fd_guided.budget).
            budget = self.engine.manager.budget.refusal_when_compiled(
                spec,
                ticket,
                min(int(request.get("max_tokens") or 0) for request in message.requests) or None,
                fit_budget_requested(message.requests[0]),
            )
            budget.add_done_callback(lambda done: self._settled(message, ticket, done.result()))

    def _tokenize(self, requests: list[dict]) -> dict[tuple, list[int]]:
        """Each distinct (prompt, max_tokens) tokenised once, bounded by the context (`PromptBound`):
        the engine requests get these ids and never encode their prompt again (n choices share one)."""
        ids: dict[tuple, list[int]] = {}
        for request in requests:
            prompt, max_tokens = request.get("prompt"), request.get("max_tokens")
            if isinstance(prompt, str) and (prompt, max_tokens) not in ids:
                ids[prompt, max_tokens] = self.prompts.tokenize(prompt, int(max_tokens or 0))
        return ids

    def _settled(self, message: ipc.Submit, ticket: Future, refusal: BaseException | None = None) -> None:
        error = ticket.exception() or refusal
        if error is not None:
            self._drop(message.indices)
        self.send(ipc.Admitted(message.id, None if error is None else _error_info(error)))

    def _drop(self, indices) -> None:
        for index in indices:
            self.engine.abort(index)
        self._wake.set()

    # ----- the engine thread ----------------------------------------------------------------------

    def _run_engine(self) -> None:
        last_token_at: dict[int, float] = {}
        stats = self.engine.stats
        while not self._stopping.is_set():
            if not self.engine.has_unfinished():
                last_token_at.clear()
                self._wake.wait(_IDLE_POLL_S)
                self._wake.clear()
                continue
            logged = len(stats.step_log)
            self._busy_since = time.monotonic()  # the heartbeat carries it (a stuck step is killed)
            try:
                updates = self.engine.step()
            except Exception as error:  # noqa: BLE001 - a broken step fails its requests, not the process
                logger.exception("engine step failed; failing the requests in flight")
                self._fail_in_flight(error)
                time.sleep(_IDLE_POLL_S)
                continue
            finally:
                self._busy_since = 0.0
            now = time.perf_counter()
            gap = _longest_gap(updates, last_token_at, now)
            for seconds, _ in stats.step_log[logged:][-1:]:
                self.metrics.step_seconds.observe(seconds)
                self.steps.add(seconds)
                if gap is not None:
                    self.metrics.token_gap_seconds.observe(gap)
                    self.token_gaps.add(gap)
            if len(stats.step_log) > _STEP_LOG_KEEP:
                del stats.step_log[:-1]
            if updates:
                self.send(ipc.Outputs(time.monotonic(), [self._update(update) for update in updates]))

    def _update(self, update) -> ipc.Update:
        finished = update.finished
        if finished is None:
            return ipc.Update(update.index, list(update.new_token_ids))
        self.metrics.finished.labels(finished.finish_reason).inc()
        with self._lock:
            self._live.discard(update.index)
            self._cancelled.discard(update.index)
        return ipc.Update(
            update.index,
            list(update.new_token_ids),
            ipc.Finished(finished.finish_reason, finished.error, finished.prompt_tokens),
        )

    def _fail_in_flight(self, error: BaseException) -> None:
        with self._lock:
            indices, self._live = sorted(self._live), set()
        for index in indices:
            self.engine.abort(index)
        message = f"the engine step failed: {type(error).__name__}: {error}"
        self.send(
            ipc.Outputs(time.monotonic(), [ipc.Update(index, [], ipc.Finished("error", message)) for index in indices])
        )

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=10)
        self._admission.shutdown(wait=False, cancel_futures=True)
        self.engine.close()


def _error_info(error: BaseException) -> ipc.ErrorInfo:
    if isinstance(error, InvalidGrammarError):
        return ipc.ErrorInfo(400, **grammar_error_fields(error))
    if isinstance(error, RequestError):
        return ipc.ErrorInfo(error.status, error.message, error.param, error.code, error.type)
    logger.error("admission failed", exc_info=error)
    return ipc.ErrorInfo(500, f"internal error: {type(error).__name__}: {error}", type="server_error")


def _longest_gap(updates, last_token_at: dict[int, float], now: float) -> float | None:
    """The longest time since a request's previous token among those that got one now (None when
    none had one before); keeps `last_token_at` up to date."""
    gap = None
    for update in updates:
        if update.new_token_ids:
            previous = last_token_at.get(update.index)
            if previous is not None:
                gap = max(gap or 0.0, now - previous)
            last_token_at[update.index] = now
        if update.finished is not None:
            last_token_at.pop(update.index, None)
    return gap


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it (the API's loop thread) ends."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    settings_json, inbox_addr, outbox_addr = argv
    parent_pid = os.getppid()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API process decides when the engine stops
    logging.basicConfig(
        level=os.environ.get("FD_GUIDED_ENGINE_LOG", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    settings = ServerSettings.from_json(settings_json)
    sys.setswitchinterval(settings.switch_interval_s)
    context = zmq.Context()
    outbox = context.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 1000)
    outbox.connect(outbox_addr)
    inbox = context.socket(zmq.PULL)
    inbox.connect(inbox_addr)
    started = time.perf_counter()
    engine = build_engine(settings)
    cfg = engine.model.cfg
    logger.info(
        "engine ready in %.1f s: preset %s (%d layers, hidden %d, vocab %d, context %d), backend %s",
        time.perf_counter() - started,
        settings.preset,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        cfg.max_seq_len,
        settings.backend,
    )
    server = EngineServer(engine, settings, outbox)
    gc.collect()
    gc.freeze()  # the model and tables live as long as the process: no full collection walks them
    try:
        server.serve(inbox, parent_pid)
    finally:
        inbox.close(0)
        outbox.close()
        context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
