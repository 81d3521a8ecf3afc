"""The OpenAI wire format the server speaks: request models (validated by FastAPI) and the
responses it builds, plus the error body.

Requests refuse unknown fields by name (a typo must not silently turn guided decoding off): the
OpenAI fields we serve, the guided extensions of `fd_guided.spec` (``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``, ``structural_tag`` and their options) and
a few sampling extensions (``top_k``, ``ignore_eos``). Fields we cannot honour (``logprobs``,
penalties, ``logit_bias``) are accepted only at their neutral value, so a client that relies on
them gets a 400 instead of a quietly different answer.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Guided fields passed through to `fd_guided.spec.parse_guided_request` unchanged.
GUIDED_FIELDS = (
    "guided_json",
    "guided_json_object",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structural_tag",
    "any_whitespace",
    "disable_any_whitespace",
    "max_whitespace_cnt",
    "separators",
    "guided_strict",
    "guided_unknown_formats",
    "guided_any_order",
    "guided_fit_budget",
)
MAX_N = 16
MAX_STOP = 16
# OpenAI's own rule for function names; it also keeps names safe to embed in a grammar literal.
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"

FinishReason = Literal["stop", "length", "tool_calls", "error", "abort"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# ----- requests -----------------------------------------------------------------------------------


class FunctionDefinition(_Strict):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: FunctionName


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients echo fields back (refusal, annotations, audio)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text; only text parts are served (an image part is refused in `text_only`)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    @field_validator("content")
    @classmethod
    def text_only(cls, content):
        if isinstance(content, list):
            for part in content:
                if part.type != "text":
                    raise ValueError(f"content parts of type {part.type!r} are not supported (text only)")
        return content


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Strict):
    """Fields shared by both endpoints."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    # Neutral values only (see the module docstring).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    # Guided extensions (fd_guided.spec); response_format is validated there too.
    response_format: Any = None
    # Typed Any on purpose: fd_guided.spec checks them and names the offending part in its error.
    guided_json: Any = None
    guided_json_object: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    any_whitespace: Any = None
    disable_any_whitespace: Any = None
    max_whitespace_cnt: Any = None
    separators: Any = None
    guided_strict: Any = None
    guided_unknown_formats: Any = None
    guided_any_order: Any = None
    guided_fit_budget: Any = None  # false: no budget steering (fd_guided.budget)

    @field_validator("stop")
    @classmethod
    def stop_list(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"at most {MAX_STOP} non-empty stop strings")
        return stops

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def neutral_penalty(cls, value):
        if value not in (None, 0, 0.0):
            raise ValueError("penalties are not supported (only 0)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def neutral_bias(cls, value):
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @field_validator("logprobs")
    @classmethod
    def no_logprobs(cls, value):
        if value not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return value

    def guided_fields(self) -> dict[str, Any]:
        """The fields `fd_guided.spec` reads, as given (None left out)."""
        fields = {name: getattr(self, name) for name in GUIDED_FIELDS if getattr(self, name) is not None}
        # {"type": "text"} asks for no constraint (clients send it explicitly): it is not a guided field.
        if self.response_format is not None and self.response_format != {"type": "text"}:
            fields["response_format"] = self.response_format
        return fields

    def sampling(self) -> dict[str, Any]:
        """Per-request engine fields (`ReferenceEngine.submit` reads them from the request dict)."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        fields = {name: value for name, value in fields.items() if value is not None}
        if self.ignore_eos:
            fields["ignore_eos"] = True
        return fields


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    top_logprobs: int | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def prompts(cls, prompt):
        if isinstance(prompt, list) and not prompt:
            raise ValueError("at least one prompt")
        return prompt

    @field_validator("echo")
    @classmethod
    def no_echo(cls, echo):
        if echo:
            raise ValueError("echo is not supported")
        return echo

    def token_limit(self) -> int | None:
        return self.max_tokens


# ----- responses ----------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChoiceError(BaseModel):
    """Why a choice ended with ``finish_reason: "error"`` (an extension; OpenAI has no such reason)."""

    message: str


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None
    error: ChoiceError | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason
    logprobs: None = None
    error: ChoiceError | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "fd_guided"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
