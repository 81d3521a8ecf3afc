"""The API-server process: a guided refusal that comes back from the engine or a worker answered 400.

`api_server.py` refuses what admission can judge before the request is sent. What only the engine
or a worker can judge (a compile that fails or times out in the worker; the schema normaliser when
``FD_GUIDED_DEFER_SCHEMA_CHECKS=1`` leaves it to the compile) comes back as a finished result with
``error_code=400`` and our message (`hooks.py`: the engine's checker refusal, a worker's report).
FastDeploy 8c3513a4's non-streaming generators break on such a result: chat hands it to the
response processor, which reads ``outputs["token_ids"]`` before the error check (``outputs`` is
None for the engine's refusal: a ``TypeError``, answered 500 with the message lost); completions
raise ``ValueError(error_msg)`` into their own ``except``, which logs it and returns None, and the
route streams that None (the client gets 200 and no body).

So, for a non-streaming request that carries a guided field, `hooks.py` wraps:

- ``OpenAIServingChat.chat_completion_full_generator`` / ``OpenAIServingCompletion.
  completion_full_generator``: the request is watched while the generator runs; if a result of ours
  arrived, the generator's own outcome is replaced by an ``ErrorResponse`` (type
  ``invalid_request_error``, ``param`` the client's guided field, ``code`` "400", the message as
  the engine or worker wrote it), which the routes' ``JSONResponse`` (`api_server.py`) answers 400;
- ``DealerConnectionManager.get_connection``: a watched request's response queue is read through a
  check that stops the generator (`EngineRefusal`) before it reads the refused result.

Only results with ``error_code == 400`` whose message is one of ours (`REFUSAL_PREFIXES`) count:
FastDeploy's own errors (a failed cache transfer is also 400) keep FastDeploy's handling. A stream
has answered 200 before any result: its refusal stays an error chunk (upstream: the first chunk
would have to be awaited before the response starts).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .api_server import client_field

CONNECTIONS_MODULE = "fastdeploy.entrypoints.openai.utils"
SERVING_CHAT_MODULE = "fastdeploy.entrypoints.openai.serving_chat"
SERVING_COMPLETION_MODULE = "fastdeploy.entrypoints.openai.serving_completion"
# The engine checker's `admission.AdmissionError` and a worker's report (`sampler.py`) begin so.
REFUSAL_PREFIXES = ("invalid guided decoding request", "guided decoding")
WATCHES_ATTRIBUTE = "_fd_guided_watched"


class EngineRefusal(Exception):
    """Raised from a watched response queue so FastDeploy's generator stops before the result."""


class Watch:
    """One non-streaming request's watch: the refused result, once one arrives."""

    def __init__(self) -> None:
        self.refusal: Mapping[str, Any] | None = None

    def reading(self, get: Callable[[], Any]) -> Callable[[], Any]:
        """`get` (the queue's) with the check: a refused result is kept and raised, never returned."""

        async def checked_get():
            response = await get()
            refused = next((result for result in response if is_our_refusal(result)), None)
            if refused is not None:
                self.refusal = refused
                raise EngineRefusal(str(refused.get("error_msg")))
            return response

        return checked_get


def is_our_refusal(result: Any) -> bool:
    """A result the engine's checker or a worker ended with our 400 (a result is a dict over ZMQ)."""
    if not isinstance(result, Mapping) or result.get("error_code") != 400:
        return False
    return str(result.get("error_msg") or "").startswith(REFUSAL_PREFIXES)


def _watches(manager: Any) -> dict[str, Watch]:
    return vars(manager).setdefault(WATCHES_ATTRIBUTE, {})


def install_connections(module: Any, mark: str) -> None:
    """Wrap ``DealerConnectionManager.get_connection``: a watched request's queue is read checked."""
    cls = getattr(module, "DealerConnectionManager", None)
    original = vars(cls).get("get_connection") if isinstance(cls, type) else None
    if original is None or getattr(original, mark, False):
        return

    @functools.wraps(original)
    async def get_connection(self, request_id, *args, **kwargs):
        dealer, queue = await original(self, request_id, *args, **kwargs)
        watch = _watches(self).get(request_id)
        if watch is not None:
            queue.get = watch.reading(queue.get)  # the one queue the dealer's listener fills
        return dealer, queue

    setattr(get_connection, mark, True)
    setattr(cls, "get_connection", get_connection)  # noqa: B010 - FastDeploy's class, untyped here


def install_serving_chat(module: Any, mark: str) -> None:
    _install_generator(getattr(module, "OpenAIServingChat", None), "chat_completion_full_generator", mark)


def install_serving_completion(module: Any, mark: str) -> None:
    _install_generator(getattr(module, "OpenAIServingCompletion", None), "completion_full_generator", mark)


def _install_generator(cls: Any, name: str, mark: str) -> None:
    original = vars(cls).get(name) if isinstance(cls, type) else None
    if original is None or getattr(original, mark, False):
        return
    signature = inspect.signature(original)  # chat passes request and request_id by position, completions by name

    @functools.wraps(original)
    async def full_generator(self, *args, **kwargs):
        try:
            arguments = signature.bind_partial(self, *args, **kwargs).arguments
        except TypeError:  # a call this FastDeploy's signature does not take: FastDeploy's to answer
            arguments = {}
        request_id, param = arguments.get("request_id"), client_field(arguments.get("request"))
        manager = getattr(getattr(self, "engine_client", None), "connection_manager", None)
        if request_id is None or param is None or manager is None:
            return await original(self, *args, **kwargs)
        watches, watch = _watches(manager), Watch()
        watches[request_id] = watch
        try:
            outcome = await original(self, *args, **kwargs)
        except EngineRefusal:
            outcome = None  # chat's generator lets it through; completions' swallows it
        finally:
            watches.pop(request_id, None)
        return outcome if watch.refusal is None else refusal_response(watch.refusal, param)

    setattr(full_generator, mark, True)
    setattr(cls, name, full_generator)


def refusal_response(result: Mapping[str, Any], param: str) -> Any:
    """FastDeploy's ``ErrorResponse`` for our refused result: the client's field, the message as written."""
    from fastdeploy.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

    message = str(result.get("error_msg"))
    return ErrorResponse(error=ErrorInfo(message=message, type="invalid_request_error", param=param, code="400"))
