"""`ServerState`: what every route of the API process shares (``app.state.fd``), and its `Detokenizer`.

Its own module so that routes and generation can name it without importing the app (no cycle).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fd_guided.harness.server.chat import ChatTemplate
from fd_guided.harness.server.engine_client import EngineClient
from fd_guided.harness.server.errors import EngineUnavailable
from fd_guided.harness.server.health import LoopLagMonitor, WindowStats
from fd_guided.harness.server.loop_priority import LoopScheduling
from fd_guided.harness.server.metrics import ServerMetrics
from fd_guided.harness.server.settings import ServerSettings
from fd_guided.tokenizer import join_token_bytes


@dataclass
class ServerState:
    """Shared by every route (``app.state.fd``)."""

    settings: ServerSettings
    engine: EngineClient
    metrics: ServerMetrics
    template: ChatTemplate
    lag: LoopLagMonitor
    transit: WindowStats = field(default_factory=WindowStats)
    heartbeats: WindowStats = field(default_factory=WindowStats)  # seconds between the engine's heartbeats
    loop_scheduling: LoopScheduling | None = None  # set when the app starts

    @property
    def tokenizer(self) -> Detokenizer:
        """The serving engine's token bytes (from its `Hello`): what streaming decodes with."""
        hello = self.engine.hello
        if hello is None:
            raise EngineUnavailable()
        if self._detokenizer is None or self._detokenizer.hello is not hello:
            self._detokenizer = Detokenizer(hello)
        return self._detokenizer

    _detokenizer: Detokenizer | None = None

    async def stats(self, reset: bool = False, series: bool = False) -> dict:
        """Over the current window, in seconds: the event loop's lag, the IPC transit of step
        updates and the intervals between the engine's heartbeats (this process), engine step times
        and per step the longest inter-token gap of the requests decoding in it (the engine process;
        None while it is down); with `series` the raw samples too (for plots)."""
        try:
            engine = await self.engine.query("stats", reset=reset, series=series)
        except (EngineUnavailable, asyncio.TimeoutError):
            engine = {"engine_step": None, "token_gap": None}
        return {
            "loop_lag": self.lag.window.snapshot(reset, series),
            "ipc_transit": self.transit.snapshot(reset, series),
            "heartbeat_interval": self.heartbeats.snapshot(reset, series),
            **engine,
            **self.load(),
        }

    def load(self) -> dict:
        """What is in flight now (cheap, no IPC: the engine's figures are its last heartbeat's)."""
        hello = self.engine.hello
        return {
            "requests_in_flight": self.engine.in_flight,
            "compiles_in_flight": self.engine.load.compiles_in_flight,
            "engine_pid": hello.pid if hello else None,
            "engine_generation": self.engine.generation,
            "loop_scheduling": self.loop_scheduling.describe() if self.loop_scheduling else None,
        }

    async def exposition(self) -> bytes:
        """Both processes' metrics in one Prometheus text (the engine's left out while it is down)."""
        self.metrics.engine_up.set(1 if self.engine.up else 0)
        own = self.metrics.exposition()
        try:
            return own + (await self.engine.query("metrics")).encode()
        except (EngineUnavailable, asyncio.TimeoutError):
            return own


class Detokenizer:
    """Ids -> bytes with the engine's table (`ChoiceText` needs only `decode_bytes`)."""

    def __init__(self, hello):
        self.hello = hello
        self.name = hello.tokenizer
        self.token_bytes = tuple(hello.token_bytes)

    def decode_bytes(self, token_ids) -> bytes:
        return join_token_bytes(self.token_bytes, token_ids)
