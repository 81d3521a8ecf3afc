"""The HTTP endpoints: OpenAI's ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, plus
``/health`` (with what is in flight), ``/metrics`` (Prometheus) and ``/stats`` (event-loop lag,
engine step times and inter-token gaps as JSON percentiles; ``?samples=true`` adds the raw series;
``POST /stats/reset`` starts a new window).

A generation request is admitted (and its grammar compiled) before any response header is sent, so
every constraint error, including one only a compiler finds, is an HTTP 400 (`errors.py`). While
the engine process is down, generation requests get 503 and ``/health`` says so (503); a client
that goes away aborts its engine requests, streaming or not.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fd_guided.harness.server.errors import RequestError
from fd_guided.harness.server.generation import Generation
from fd_guided.harness.server.metrics import CONTENT_TYPE
from fd_guided.harness.server.protocol import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceError,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    ResponseMessage,
    new_id,
)
from fd_guided.harness.server.streaming import chat_events, completion_events
from fd_guided.harness.server.tools import plan_tools

if TYPE_CHECKING:
    from fd_guided.harness.server.state import ServerState

router = APIRouter()
_SEED_MODULUS = 1 << 63


def _state(request: Request) -> ServerState:
    return request.app.state.fd


@router.get("/health")
async def health(request: Request):
    state = _state(request)
    up = state.engine.up
    return JSONResponse(
        {"status": "ok" if up else "engine process down (starting again)", **state.load()},
        status_code=200 if up else 503,
    )


@router.get("/v1/models")
async def models(request: Request) -> ModelList:
    return ModelList(data=[ModelCard(id=_state(request).settings.model_name)])


@router.get("/metrics")
async def metrics(request: Request):
    return Response(await _state(request).exposition(), media_type=CONTENT_TYPE)


@router.get("/stats")
async def stats(request: Request, samples: bool = False):
    return await _state(request).stats(series=samples)


@router.post("/stats/reset")
async def stats_reset(request: Request):
    return await _state(request).stats(reset=True)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = _state(request)
    _check_model(state, body.model)
    guided = body.guided_fields()
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, state.template.tool_format, guided)
    fields: dict[str, Any] = {**guided, **body.sampling()}
    if plan is not None:
        fields["structural_tag"] = plan.structural_tag
    if body.chat_template_kwargs:
        fields["chat_template_kwargs"] = body.chat_template_kwargs
    prompt = state.template.render(body.messages, body.tools or [])
    max_tokens = body.token_limit() or state.settings.default_max_tokens

    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if plan is not None else None
    gen = Generation(
        state,
        "chat",
        [prompt] * body.n,
        fields,
        seed=_seed(body.seed),
        max_tokens=max_tokens,
        stop=body.stop,
        tool_plan=plan,
        tools=tools,
    )
    streamed = await _admit(gen, body, chat_events, state.settings.model_name, request)
    if streamed is not None:
        return streamed
    choices = [
        ChatChoice(
            index=c.index,
            finish_reason=c.finish_reason,
            error=_choice_error(c.error),
            message=ResponseMessage(content=c.content, tool_calls=c.tool_calls or None),
        )
        for c in gen.choices
    ]
    return ChatCompletion(id=new_id("chatcmpl"), model=state.settings.model_name, choices=choices, usage=gen.usage())


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = _state(request)
    _check_model(state, body.model)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    max_tokens = body.token_limit() or state.settings.default_max_tokens

    choice_prompts = [prompt for prompt in prompts for _ in range(body.n)]
    gen = Generation(
        state,
        "completions",
        choice_prompts,
        {**body.guided_fields(), **body.sampling()},
        seed=_seed(body.seed),
        max_tokens=max_tokens,
        stop=body.stop,
        choices_per_prompt=body.n,
    )
    streamed = await _admit(gen, body, completion_events, state.settings.model_name, request)
    if streamed is not None:
        return streamed
    choices = [
        CompletionChoice(
            index=c.index, text=c.content or "", finish_reason=c.finish_reason, error=_choice_error(c.error)
        )
        for c in gen.choices
    ]
    return Completion(id=new_id("cmpl"), model=state.settings.model_name, choices=choices, usage=gen.usage())


async def _admit(gen: Generation, body, stream_events, model_name: str, request: Request) -> Response | None:
    """Admit (a constraint error raises here, before any header), then either hand back the SSE
    response (a closed stream aborts the generation) or run the choices to their end for a plain
    response (returns None), aborting them if the client disconnects meanwhile."""
    await gen.admit()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream_events(gen, model_name, include_usage), media_type="text/event-stream")

    async def run() -> None:
        async for _ in gen.events():
            pass

    finishing = asyncio.ensure_future(run())
    watching = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((finishing, watching), return_when=asyncio.FIRST_COMPLETED)
        if not finishing.done():
            finishing.cancel()
            return Response(status_code=499)  # nobody reads it: the client is gone (nginx's code for that)
        finishing.result()
    finally:
        watching.cancel()
        gen.close()
    return None


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (the body was read already: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.settings.model_name:
        raise RequestError(
            f"The model {model!r} does not exist; this server serves {state.settings.model_name!r}",
            param="model",
            status=404,
            code="model_not_found",
        )


def _seed(seed: int | None) -> int:
    """The request's seed as numpy takes it (non-negative); a fresh random one when not given."""
    return secrets.randbits(63) if seed is None else seed % _SEED_MODULUS


def _choice_error(error: str | None) -> ChoiceError | None:
    return ChoiceError(message=error) if error is not None else None
