"""The API process: `create_app` and `serve` (``fd-guided serve``); the shared state is `state.ServerState`.

    app = create_app(ServerSettings(preset="tiny"))   # FastAPI; its lifespan starts the engine process
    serve(settings, host="127.0.0.1", port=8000)     # runs uvicorn (blocks)

This process runs HTTP, cheap bounded checks (body size, chat templates), and streaming
(incremental detokenization with the engine's token table, SSE); it loads no tokenizer and no
model. The engine (model, guided manager, compile service) runs in its own process
(`engine_process`, driven by `engine_client`), so nothing it does can hold this event loop or its GIL.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import sys
from contextlib import asynccontextmanager

from fastapi import FastAPI

from fd_guided.harness.server.bounds import BodyLimit
from fd_guided.harness.server.chat import get_template
from fd_guided.harness.server.engine_client import EngineClient
from fd_guided.harness.server.errors import install_handlers
from fd_guided.harness.server.health import LoopLagMonitor, WindowStats
from fd_guided.harness.server.loop_priority import set_loop_priority
from fd_guided.harness.server.metrics import ServerMetrics
from fd_guided.harness.server.routes import router
from fd_guided.harness.server.settings import ServerSettings
from fd_guided.harness.server.state import ServerState

logger = logging.getLogger("fd_guided.harness.server")
KNOWN_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health", "/stats", "/stats/reset"}
)

__all__ = ["ServerSettings", "ServerState", "create_app", "serve"]


def create_app(settings: ServerSettings) -> FastAPI:
    """The FastAPI app. Its lifespan starts the engine process (and waits until it has loaded its
    model) and the loop-lag timer, and stops both."""
    metrics = ServerMetrics()
    transit = WindowStats()

    def on_transit(seconds: float) -> None:
        metrics.ipc_seconds.observe(seconds)
        transit.add(seconds)

    heartbeats = WindowStats()
    engine = EngineClient(
        settings, on_transit=on_transit, on_restart=metrics.engine_restarts.inc, on_heartbeat=heartbeats.add
    )
    lag = LoopLagMonitor(settings.lag_interval_s, metrics.loop_lag_seconds.observe)
    state = ServerState(settings, engine, metrics, get_template(settings.chat_template), lag, transit, heartbeats)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        hello = await engine.start()
        metrics.engine_up.set(1)
        logger.info(
            "engine process %d: %d layers, hidden %d, vocab %d, context %d tokens, tokenizer %s",
            hello.pid,
            hello.num_layers,
            hello.hidden_size,
            hello.vocab_size,
            hello.max_seq_len,
            hello.tokenizer,
        )
        lag.start()
        state.loop_scheduling = set_loop_priority(settings.loop_priority)  # on the loop's own thread
        logger.info("event loop thread: %s", state.loop_scheduling.describe())
        try:
            yield
        finally:
            await lag.stop()
            await engine.stop()

    app = FastAPI(
        title="fd_guided",
        summary="OpenAI-compatible guided decoding on the fd_guided reference engine",
        lifespan=lifespan,
    )
    app.state.fd = state
    install_handlers(app)
    app.include_router(router)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, on_refuse=lambda: metrics.refused.labels("body_too_large").inc()
    )
    app.add_middleware(RequestCounter, metrics=metrics)
    return app


def _freeze_startup_heap() -> int:
    """Move every object alive now (tokenizer tables, imported modules; the engine process freezes
    its own model and tables) to the collector's permanent generation and return how many. A full
    collection over the single process's ~340,000 took ~180 ms, a stall of the event loop at an
    unpredictable moment (seen once per load run as a 150-190 ms loop lag); they live as long as
    the server, so no collection can free them anyway."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _http_stack() -> str:
    """What uvicorn runs on: uvloop and httptools where importable (its ``auto``), else asyncio's
    loop and h11. With both, the loop's lag under 128 cold-schema streams was p50 0.1 / p99 1.0 ms
    against 0.5 / 1.9 ms (docs/benchmarks.md, issue #26)."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    hint = "" if (loop, http) == ("uvloop", "httptools") else " (pip install uvloop httptools: less loop lag)"
    return f"event loop {loop}, HTTP parser {http}{hint}"


class RequestCounter:
    """ASGI middleware: counts responses by endpoint and status (pure ASGI, so streaming is untouched)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            path = scope.get("path", "")
            # Known endpoints only: a label per arbitrary path would let clients grow the registry.
            self.metrics.requests.labels(path if path in KNOWN_PATHS else "other", str(status["code"])).inc()


def serve(settings: ServerSettings, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the server until interrupted (``fd-guided serve``); the engine process starts with the app."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(settings.switch_interval_s)
    logger.info(
        "guided backend %s; chat template %s (tool calls: %s); max_num_seqs %d; GIL switch interval %.1f ms; "
        "bodies up to %d bytes",
        settings.backend,
        settings.chat_template,
        get_template(settings.chat_template).tool_format.name,
        settings.max_num_seqs,
        settings.switch_interval_s * 1000,
        settings.max_body_bytes,
    )
    app = create_app(settings)
    frozen = _freeze_startup_heap()
    logger.info("garbage collector: %d startup objects frozen out of full collections", frozen)
    logger.info(
        "serving %s on http://%s:%d/v1 (OpenAI API), /metrics, /health, /stats once the engine process is up; %s",
        settings.model_name,
        host,
        port,
        _http_stack(),
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
