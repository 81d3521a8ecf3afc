"""Server-sent events for ``stream: true``: OpenAI's chunk shapes, ``data: {...}`` lines, ``data: [DONE]``.

Chat: a first chunk per choice with ``{"role": "assistant", "content": ""}``, content deltas as
tokens arrive, tool calls in one delta each once complete (text from the tool-call trigger on is
held back until the call parses), then a chunk with ``finish_reason`` (and ``error`` for
``finish_reason: "error"``); with ``stream_options.include_usage`` a last chunk with empty
``choices`` and ``usage``. Completions: ``text`` deltas, then the finish chunk. The generation is
aborted when the client goes away (the generator is closed). If the engine process dies mid-stream
the stream ends with an error event, ``data: {"error": {...}}`` (what the OpenAI clients raise as
an `APIError`), then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from fd_guided.harness.server.errors import EngineUnavailable
from fd_guided.harness.server.generation import Choice, Generation
from fd_guided.harness.server.protocol import new_id

DONE = b"data: [DONE]\n\n"


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _choice(index: int, body: dict, finish_reason: str | None, error: str | None) -> dict:
    """One streamed choice in OpenAI's shape; `body` is the delta (chat) or the text (completions)."""
    choice = {"index": index, **body, "logprobs": None, "finish_reason": finish_reason}
    if error is not None:
        choice["error"] = {"message": error}
    return choice


class _Chunks:
    """The chunks of one stream: one id and creation time for all of them. A choice chunk carries
    its `body_key` (``delta`` for chat, ``text`` for completions); the usage chunk no choice."""

    def __init__(self, id_prefix: str, object_name: str, body_key: str, model: str):
        self.head = {"id": new_id(id_prefix), "object": object_name, "created": int(time.time()), "model": model}
        self.body_key = body_key

    def __call__(self, choice_index: int, body, finish_reason: str | None = None, error: str | None = None) -> bytes:
        return _event({**self.head, "choices": [_choice(choice_index, {self.body_key: body}, finish_reason, error)]})

    def usage(self, gen: Generation) -> bytes:
        return _event({**self.head, "choices": [], "usage": gen.usage().model_dump()})


async def chat_events(gen: Generation, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    chunk = _Chunks("chatcmpl", "chat.completion.chunk", "delta", model)

    try:
        for choice in gen.choices:
            yield chunk(choice.index, {"role": "assistant", "content": ""})
        async for choice, delta in gen.events():
            if delta:
                yield chunk(choice.index, {"content": delta})
            if choice.finish_reason is not None:
                for event in _chat_finish(gen, choice, chunk):
                    yield event
        if include_usage:
            yield chunk.usage(gen)
        yield DONE
    except EngineUnavailable as error:
        yield _event(error.body())
        yield DONE
    finally:
        gen.close()


def _chat_finish(gen: Generation, choice: Choice, chunk) -> list[bytes]:
    events = []
    if gen.tool_plan is not None and choice.finish_reason != "error":
        # Text before the trigger was sent as it came; the rest holds the calls (and any text after them).
        rest, _ = gen.tool_plan.parse(choice.text.text[choice.text.sent :])
        if rest:
            events.append(chunk(choice.index, {"content": rest}))
        if choice.tool_calls:
            calls = [{"index": i, **call.model_dump()} for i, call in enumerate(choice.tool_calls)]
            events.append(chunk(choice.index, {"tool_calls": calls}))
    else:
        rest = choice.text.rest()
        if rest:
            events.append(chunk(choice.index, {"content": rest}))
    events.append(chunk(choice.index, {}, choice.finish_reason, choice.error))
    return events


async def completion_events(gen: Generation, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    chunk = _Chunks("cmpl", "text_completion", "text", model)

    try:
        async for choice, delta in gen.events():
            if delta:
                yield chunk(choice.index, delta)
            if choice.finish_reason is not None:
                yield chunk(choice.index, choice.text.rest(), choice.finish_reason, choice.error)
        if include_usage:
            yield chunk.usage(gen)
        yield DONE
    except EngineUnavailable as error:
        yield _event(error.body())
        yield DONE
    finally:
        gen.close()
