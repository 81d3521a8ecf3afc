"""One HTTP generation request from admission to its last choice, shared by both endpoints.

`Generation.admit` sends the choices to the engine process (one engine request each), which checks
each prompt's length (bounded: `bounds.PromptBound`) and waits until the grammar is compiled there,
so a constraint that only a compiler can refuse (syntax, budget, an empty language) is still an
`InvalidGrammarError` the route turns into HTTP 400 before any header is sent.
`Generation.events` then yields each choice's new text as steps produce it, and each choice once
when it ends. Finish reasons: the engine's ``stop`` (EOS or grammar complete) and ``length``;
``stop`` for a stop string (the engine request is aborted); ``tool_calls`` when the output holds
complete tool calls; ``error`` when guided decoding failed while decoding (rejected token, dead
end), with the message in the choice's ``error``: that choice ends, the others go on. When the
engine process dies, `admit` and `events` raise `EngineUnavailable` (HTTP 503 / an SSE error event).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fd_guided.harness.server.errors import RequestError
from fd_guided.harness.server.output import ChoiceText
from fd_guided.harness.server.protocol import ToolCall, Usage
from fd_guided.harness.server.tools import ToolPlan

if TYPE_CHECKING:
    from fd_guided.harness.server.state import ServerState


@dataclass
class Choice:
    index: int
    engine_index: int
    text: ChoiceText
    tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


class Generation:
    """Args:
    state: the server's shared state (engine loop, tokenizer, metrics).
    endpoint: ``chat`` or ``completions`` (metrics label).
    prompts: one prompt per choice.
    fields: guided and sampling fields for the engine (`ReferenceEngine.submit`), the same
        for every choice.
    seed: the request's seed; choice i samples with ``[seed, i]``.
    stop: stop strings.
    tool_plan: tool calling for this request (chat only), or None.
    choices_per_prompt: ``n`` (usage counts each distinct prompt once).
    tools: the request's tool definitions (their parameter schemas are validated in the engine).
    """

    def __init__(
        self,
        state: ServerState,
        endpoint: str,
        prompts: Sequence[str],
        fields: dict[str, Any],
        *,
        seed: int,
        max_tokens: int,
        stop: Sequence[str] = (),
        tool_plan: ToolPlan | None = None,
        choices_per_prompt: int = 1,
        tools: list[dict] | None = None,
    ):
        self.state = state
        self.endpoint = endpoint
        self.started = time.perf_counter()
        self.requests = [{"prompt": prompt, **fields, "max_tokens": max_tokens} for prompt in prompts]
        self.seed = seed
        self.stop = list(stop or ())
        self.tool_plan = tool_plan
        self.tools = tools
        self.choices_per_prompt = choices_per_prompt
        self._closed = False
        self.submission = None
        self.choices: list[Choice] = []
        self._first_token_at: float | None = None
        self._pending: set[int] = set()

    async def admit(self) -> None:
        """Queue the choices and wait for the grammar; raises RequestError (nothing left queued)."""
        try:
            self.submission = await self.state.engine.submit(self.requests, seed=self.seed, tools=self.tools)
        except RequestError as error:
            if error.code in ("context_length_exceeded", "engine_unavailable"):
                self.state.metrics.refused.labels(error.code).inc()
            raise
        self._pending = set(self.submission.indices)
        plan = self.tool_plan
        for index, engine_index in enumerate(self.submission.indices):
            text = ChoiceText(
                self.state.tokenizer,
                self.stop,
                hold_from=plan.format.trigger if plan and plan.mode == "auto" else None,
                hold_all=bool(plan and plan.mode != "auto"),
            )
            self.choices.append(Choice(index, engine_index, text))

    async def events(self) -> AsyncIterator[tuple[Choice, str]]:
        """(choice, new text) as tokens arrive; a choice's last event has `finish_reason` set."""
        by_engine = {choice.engine_index: choice for choice in self.choices}
        while self._pending:
            update = await self.submission.next_update()
            choice = by_engine[update.index]
            if update.finished is not None:
                self._pending.discard(update.index)
                choice.prompt_tokens = update.finished.prompt_tokens
            if choice.finish_reason is not None:
                continue  # ended by a stop string; this is its abort arriving
            if update.new_token_ids and self._first_token_at is None:
                self._first_token_at = time.perf_counter()
                self.state.metrics.ttft_seconds.labels(self.endpoint).observe(self._first_token_at - self.started)
            delta = choice.text.add(update.new_token_ids, final=update.finished is not None)
            choice.tokens += len(update.new_token_ids)
            if choice.text.stopped:
                self._finish(choice, "stop", None)
                if update.finished is None:
                    self.state.engine.abort([update.index], forget=False)
            elif update.finished is not None:
                self._finish(choice, update.finished.finish_reason, update.finished.error)
            if delta or choice.finish_reason is not None:
                yield choice, delta

    def _finish(self, choice: Choice, reason: str, error: str | None) -> None:
        if self.tool_plan is not None and reason != "error":
            choice.content, choice.tool_calls = self.tool_plan.parse(choice.text.text)
            if choice.tool_calls and reason == "stop":
                reason = "tool_calls"
        else:
            choice.content = choice.text.text
        choice.finish_reason, choice.error = reason, error
        metrics = self.state.metrics
        metrics.finished.labels(reason).inc()
        metrics.generated_tokens.inc(choice.tokens)

    @property
    def prompt_tokens(self) -> int:
        return sum(choice.prompt_tokens for choice in self.choices[:: self.choices_per_prompt])

    def usage(self) -> Usage:
        completion = sum(choice.tokens for choice in self.choices)
        return Usage(
            prompt_tokens=self.prompt_tokens, completion_tokens=completion, total_tokens=self.prompt_tokens + completion
        )

    def close(self) -> None:
        """Abort whatever is still running (a client that went away); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.submission is not None and self._pending:
            self.state.engine.abort(sorted(self._pending))
            self._pending.clear()
        self.state.metrics.prompt_tokens.inc(self.prompt_tokens)
        self.state.metrics.request_seconds.labels(self.endpoint).observe(time.perf_counter() - self.started)
