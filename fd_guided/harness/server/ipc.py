"""The messages between the API process and the engine process, and how they travel.

Transport: two ZeroMQ PUSH/PULL pipes over ``ipc://`` sockets in a private (0700) directory, one per
direction, bound by the API process and connected by each engine process it starts (a restarted
engine gets fresh sockets, so nothing of a dead one's queue reaches its successor). Encoding:
MessagePack through msgspec, one tagged struct per message. Both are maintained libraries (pyzmq,
msgspec); nothing here frames or parses bytes itself.

    API -> engine   Submit (one HTTP request's choices), Abort, Query (metrics/stats), Shutdown
    engine -> API   Hello (loaded), Admitted (grammar compiled, or the error), Outputs (one step's
                    updates), Load (a heartbeat: compiles and requests in flight, the step's start;
                    `liveness` kills an engine whose heartbeat stops), Reply (to a Query)

Times (`Outputs.sent_at`) are `time.monotonic()`, the same clock in both processes on Linux, so the
API process measures how long a step's updates spent in transit.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Union

import msgspec


class Submit(msgspec.Struct, tag="submit"):
    """Admit `requests` (one per choice, same guided fields, each with its ``max_tokens``) as engine
    requests `indices`; each prompt's length is checked against the context first."""

    id: int
    indices: list[int]
    requests: list[dict[str, Any]]
    seed: int
    tools: list[dict[str, Any]] | None = None  # tool definitions whose parameter schemas are validated first


class Abort(msgspec.Struct, tag="abort"):
    indices: list[int]


class Query(msgspec.Struct, tag="query"):
    """``metrics`` (Prometheus text) or ``stats`` (step and token-gap windows)."""

    id: int
    what: str
    reset: bool = False
    series: bool = False


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


class Hello(msgspec.Struct, tag="hello"):
    """The engine is loaded. `token_bytes` (each id's bytes; None for special ids) is all the API
    process needs of the tokenizer: it detokenizes streamed ids and never encodes."""

    pid: int
    max_seq_len: int
    vocab_size: int
    num_layers: int
    hidden_size: int
    tokenizer: str
    token_bytes: list[bytes | None]


class ErrorInfo(msgspec.Struct):
    """A refusal as the API answers it: HTTP status and OpenAI error fields."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"


class Admitted(msgspec.Struct, tag="admitted"):
    """Sent once the request's grammar is compiled (at once when it has none), or with the error
    that refused it (then nothing of it stays queued in the engine)."""

    id: int
    error: ErrorInfo | None = None


class Finished(msgspec.Struct, array_like=True):
    finish_reason: str
    error: str | None = None
    prompt_tokens: int = 0


class Update(msgspec.Struct, array_like=True):
    """What one step did for one engine request (`StepUpdate` without the full result)."""

    index: int
    new_token_ids: list[int]
    finished: Finished | None = None


class Outputs(msgspec.Struct, tag="outputs"):
    sent_at: float
    updates: list[Update]


class Load(msgspec.Struct, tag="load"):
    """The heartbeat (every 100 ms from the engine's main thread): what is in flight, and when the
    engine thread began the step it is in (`time.monotonic()`; 0 when it is not in one)."""

    compiles_in_flight: int
    requests: int
    busy_since: float = 0.0


class Reply(msgspec.Struct, tag="reply"):
    id: int
    payload: Any


ToEngine = Union[Submit, Abort, Query, Shutdown]  # noqa: UP007 (msgspec reads the tagged union)
FromEngine = Union[Hello, Admitted, Outputs, Load, Reply]  # noqa: UP007

encode = msgspec.msgpack.Encoder().encode
to_engine = msgspec.msgpack.Decoder(ToEngine)
from_engine = msgspec.msgpack.Decoder(FromEngine)


def socket_paths(generation: int, directory: str | None = None) -> tuple[str, str]:
    """Fresh ``ipc://`` addresses (to the engine, from the engine) for engine incarnation `generation`."""
    directory = directory or tempfile.mkdtemp(prefix="fd-guided-ipc-")
    os.chmod(directory, 0o700)
    return (f"ipc://{directory}/to-engine-{generation}", f"ipc://{directory}/from-engine-{generation}")
