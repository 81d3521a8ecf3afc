"""An OpenAI-compatible HTTP server on the reference engine (``fd-guided serve``), in two processes.

Modules, one concern each: `settings` (the flags), `state` (what the routes share), `app`
(`create_app`, `serve`), `routes` (the endpoints), `protocol` (request/response models),
`engine_process` (the engine, its guided manager and compile service in a process of their own),
`engine_client` (starting and watching that process; updates to their requests), `ipc` (the
messages between the two: ZeroMQ + msgpack), `bounds` (body-size and prompt-length bounds),
`generation` (one request's choices from admission to finish), `output`
(incremental text, stop strings), `streaming` (SSE), `chat` (chat templates), `tools` (tool calls
as structural tags, and parsed back), `errors` (OpenAI error bodies), `metrics` (Prometheus),
`health` (event-loop lag and step-time windows), `loop_priority` (the event-loop thread's CPU
class).
"""

from fd_guided.harness.server.app import create_app, serve
from fd_guided.harness.server.settings import ServerSettings
from fd_guided.harness.server.state import ServerState

__all__ = ["ServerSettings", "ServerState", "build_engine", "create_app", "serve"]


def __getattr__(name):
    # Lazily: `python -m ...engine_process` imports this package first, and must run that module fresh.
    if name == "build_engine":
        from fd_guided.harness.server.engine_process import build_engine

        return build_engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
