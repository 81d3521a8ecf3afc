"""The app: settings, the state every route shares, `create_app` and `serve` (``fd-guided serve``).

    engine = build_engine(ServerSettings(preset="tiny"))
    app = create_app(engine, settings)     # FastAPI; its lifespan starts the engine thread
    serve(settings, host="127.0.0.1", port=8000)   # builds both and runs uvicorn (blocks)

The event loop runs only I/O and small bookkeeping; see `engine_loop` for where the CPU work goes.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI

from fd_guided.config import GuidedConfig
from fd_guided.harness.engine.engine import ReferenceEngine
from fd_guided.harness.server.chat import ChatTemplate, get_template
from fd_guided.harness.server.engine_loop import EngineLoop
from fd_guided.harness.server.errors import RequestError, install_handlers
from fd_guided.harness.server.health import LoopLagMonitor, WindowStats
from fd_guided.harness.server.loop_priority import LoopScheduling, set_loop_priority
from fd_guided.harness.server.metrics import ServerMetrics
from fd_guided.harness.server.routes import router

logger = logging.getLogger("fd_guided.harness.server")
KNOWN_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health", "/stats",
                         "/stats/reset"})


@dataclass(frozen=True)
class ServerSettings:
    """What `fd-guided serve` is started with (its flags, one to one)."""

    preset: str = "small"
    tokenizer: str = "deepseek"
    backend: str = "auto"
    seed: int = 0
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    chat_template: str = "hermes"
    served_model_name: str | None = None
    default_max_tokens: int = 256
    admission_threads: int = 1
    lag_interval_s: float = 0.01
    # sys.setswitchinterval for the serving process (`serve` sets it). Python's default, 5 ms, is how
    # long a thread that wants the GIL waits before the holder is asked to drop it; with the engine,
    # fill, admission and loader threads busy the loop waits several such turns. Measured here (2
    # cores, 3 threads spinning in Python beside an asyncio 10 ms timer): 5 ms -> lag p50 14 ms, p99
    # 106 ms; 1 ms -> p50 2.5 ms, p99 24 ms; 0.5 ms -> p50 4.1 ms, p99 22 ms.
    switch_interval_s: float = 0.001
    # The event-loop thread's CPU class (`loop_priority.MODES`): auto tries SCHED_RR priority 1 for
    # that thread alone and falls back to the normal class; see loop_priority for why and the risks.
    # `fd-guided serve` defaults to auto; an app embedded in another program leaves its loop alone.
    loop_priority: str = "normal"

    @property
    def model_name(self) -> str:
        return self.served_model_name or f"fd-guided-{self.preset}"


@dataclass
class ServerState:
    """Shared by every route (``app.state.fd``)."""

    settings: ServerSettings
    engine: ReferenceEngine
    engine_loop: EngineLoop
    metrics: ServerMetrics
    template: ChatTemplate
    lag: LoopLagMonitor
    steps: WindowStats = field(default_factory=WindowStats)
    token_gaps: WindowStats = field(default_factory=WindowStats)
    loop_scheduling: LoopScheduling | None = None  # set when the app starts

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def check_length(self, prompt: str, max_tokens: int) -> None:
        """Refuse a prompt plus ``max_tokens`` past the model's context (admission thread: encodes)."""
        limit = self.engine.model.cfg.max_seq_len
        prompt_tokens = len(self.tokenizer.encode(prompt))
        if prompt_tokens + max_tokens > limit:
            raise RequestError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
                               f"context of {limit} tokens", param="max_tokens", code="context_length_exceeded")

    def stats(self, reset: bool = False, series: bool = False) -> dict:
        """Over the current window, in seconds: the event loop's lag, engine step times (with a
        forward), and per step the longest inter-token gap of the requests decoding in it; with
        `series` the raw samples too (for plots)."""
        return {"loop_lag": self.lag.window.snapshot(reset, series), "engine_step": self.steps.snapshot(reset, series),
                "token_gap": self.token_gaps.snapshot(reset, series), **self.load()}

    def load(self) -> dict:
        """What is in flight now (cheap: `/health` reports it)."""
        manager = self.engine.manager
        return {"requests_in_flight": self.engine_loop.in_flight,
                "compiles_in_flight": int(manager.metrics.value("compiles_in_flight")) if manager else 0,
                "loop_scheduling": self.loop_scheduling.describe() if self.loop_scheduling else None}


def build_engine(settings: ServerSettings) -> ReferenceEngine:
    """The embedded default model (random weights, `settings.preset`) over a bundled tokenizer."""
    return ReferenceEngine.default(preset=settings.preset, tokenizer=settings.tokenizer, seed=settings.seed,
                                   guided_config=GuidedConfig(backend=settings.backend), max_num_seqs=settings.max_num_seqs,
                                   max_num_batched_tokens=settings.max_num_batched_tokens)


def create_app(engine: ReferenceEngine, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving `engine`. The engine thread and the loop-lag timer run during the
    app's lifespan; closing the engine is the caller's (it may outlive the app)."""
    metrics = ServerMetrics(engine.manager.metrics if engine.manager is not None else None)
    steps, gaps = WindowStats(), WindowStats()

    def on_step(seconds: float, prompt_tokens: int, gap: float | None) -> None:
        metrics.step_seconds.observe(seconds)
        steps.add(seconds)
        if gap is not None:
            metrics.token_gap_seconds.observe(gap)
            gaps.add(gap)

    engine_loop = EngineLoop(engine, admission_threads=settings.admission_threads, on_step=on_step)
    lag = LoopLagMonitor(settings.lag_interval_s, metrics.loop_lag_seconds.observe)
    state = ServerState(settings, engine, engine_loop, metrics, get_template(settings.chat_template), lag, steps, gaps)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start(asyncio.get_running_loop())
        lag.start()
        state.loop_scheduling = set_loop_priority(settings.loop_priority)  # on the loop's own thread
        logger.info("event loop thread: %s", state.loop_scheduling.describe())
        yield
        await lag.stop()
        engine_loop.stop()

    app = FastAPI(title="fd_guided", summary="OpenAI-compatible guided decoding on the fd_guided reference engine",
                  lifespan=lifespan)
    app.state.fd = state
    install_handlers(app)
    app.include_router(router)
    app.add_middleware(RequestCounter, metrics=metrics)
    return app


def _freeze_startup_heap() -> int:
    """Move every object alive now (model, tokenizer tables, compiled-grammar templates: ~340,000
    for the small preset) to the collector's permanent generation and return how many. A full
    collection over them took ~180 ms here, a stall of the event loop and the engine alike at an
    unpredictable moment (seen once per load run as a 150-190 ms loop lag); they live as long as
    the server, so no collection can free them anyway."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


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
    """Build the engine and run the server until interrupted (``fd-guided serve``)."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(settings.switch_interval_s)
    started = time.perf_counter()
    logger.info("loading model: preset %s (random weights, seed %d), tokenizer %s", settings.preset, settings.seed, settings.tokenizer)
    engine = build_engine(settings)
    cfg = engine.model.cfg
    logger.info("model %s ready in %.1f s: %d layers, hidden %d, vocab %d, context %d tokens", settings.model_name,
                time.perf_counter() - started, cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.max_seq_len)
    logger.info("tokenizer %s: %d ids, eos %s; guided backend %s; chat template %s (tool calls: %s); "
                "max_num_seqs %d; GIL switch interval %.1f ms", engine.tokenizer.name, engine.tokenizer.vocab_size,
                list(engine.tokenizer.eos_token_ids), settings.backend, settings.chat_template,
                get_template(settings.chat_template).tool_format.name, settings.max_num_seqs, settings.switch_interval_s * 1000)
    app = create_app(engine, settings)
    frozen = _freeze_startup_heap()
    logger.info("garbage collector: %d startup objects frozen out of full collections", frozen)
    logger.info("serving %s on http://%s:%d/v1 (OpenAI API), /metrics, /health, /stats", settings.model_name, host, port)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
    finally:
        engine.close()
