"""An OpenAI-compatible HTTP server on the reference engine (``fd-guided serve``).

Modules, one concern each: `app` (settings, shared state, `create_app`, `serve`), `routes` (the
endpoints), `protocol` (request/response models), `engine_loop` (the engine thread and its
hand-off to asyncio), `generation` (one request's choices from admission to finish), `output`
(incremental text, stop strings), `streaming` (SSE), `chat` (chat templates), `tools` (tool calls
as structural tags, and parsed back), `errors` (OpenAI error bodies), `metrics` (Prometheus),
`health` (event-loop lag and step-time windows), `loop_priority` (the event-loop thread's CPU
class).
"""
from fd_guided.harness.server.app import ServerSettings, ServerState, build_engine, create_app, serve

__all__ = ["ServerSettings", "ServerState", "build_engine", "create_app", "serve"]
