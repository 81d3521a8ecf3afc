"""Chat templates: a conversation (and its tools) -> one prompt string, per model family.

The embedded model has random weights, so a template decides the *format* only: how turns and tool
definitions are laid out, and, through its `ToolCallFormat`, how a tool call is written (what the
structural tag enforces and `ToolPlan.parse` reads back). Families:

``hermes``  ChatML turns (``<|im_start|>role ... <|im_end|>``) with Hermes/Qwen2.5 tool calls,
            ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; tool results go back
            as ``<tool_response>`` blocks in a user turn (Qwen2.5's template).
``llama3``  Llama 3.1 headers (``<|start_header_id|>role<|end_header_id|>``) with JSON tool calls,
            ``{"name": ..., "parameters": {...}}``, parallel calls separated by ``; ``; tool results
            in ``ipython`` turns; the tools are listed in the first user turn (Llama 3.1's
            JSON-based tool calling).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fd_guided.harness.server.protocol import ChatMessage, Tool
from fd_guided.harness.server.tools import HERMES, LLAMA3_JSON, ToolCallFormat


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    tool_format: ToolCallFormat
    render_fn: Callable[[ChatTemplate, Sequence[ChatMessage], Sequence[Tool]], str]

    def render(self, messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> str:
        """The prompt for `messages`, ending with the opening of the assistant's turn."""
        return self.render_fn(self, messages, tools)


def _tool_json(tool: Tool) -> str:
    return json.dumps(tool.model_dump(exclude_none=True), ensure_ascii=False)


def _assistant_text(template: ChatTemplate, message: ChatMessage) -> str:
    calls = [
        template.tool_format.render(call.function.name, call.function.arguments) for call in message.tool_calls or []
    ]
    return template.tool_format.separator.join(([message.text()] if message.text() else []) + calls)


def _render_hermes(template: ChatTemplate, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> str:
    parts = []
    first = messages[0]
    system = first.text() if first.role in ("system", "developer") else ""
    rest = messages[1:] if first.role in ("system", "developer") else messages
    if tools:
        signatures = "\n".join(_tool_json(tool) for tool in tools)
        system = (f"{system}\n\n" if system else "") + (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{signatures}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>"
        )
    if system:
        parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for message in rest:
        if message.role == "tool":
            parts.append(f"<|im_start|>user\n<tool_response>\n{message.text()}\n</tool_response><|im_end|>\n")
        elif message.role == "assistant":
            parts.append(f"<|im_start|>assistant\n{_assistant_text(template, message)}<|im_end|>\n")
        else:
            role = "system" if message.role == "developer" else message.role
            parts.append(f"<|im_start|>{role}\n{message.text()}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _render_llama3(template: ChatTemplate, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> str:
    parts = ["<|begin_of_text|>"]

    def turn(role: str, text: str) -> None:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>")

    first = messages[0]
    rest = list(messages[1:] if first.role in ("system", "developer") else messages)
    system = first.text() if first.role in ("system", "developer") else ""
    if tools:
        system = "Environment: ipython\n" + system
    if system:
        turn("system", system)
    tools_pending = bool(tools)
    for message in rest:
        if message.role == "user" and tools_pending:
            tools_pending = False
            signatures = "\n\n".join(_tool_json(tool) for tool in tools)
            turn(
                "user",
                "Given the following functions, please respond with a JSON for a function call with its "
                'proper arguments that best answers the given prompt.\n\nRespond in the format {"name": '
                'function name, "parameters": dictionary of argument name and its value}. Do not use '
                f"variables.\n\n{signatures}\n\n{message.text()}",
            )
        elif message.role == "tool":
            turn("ipython", message.text())
        elif message.role == "assistant":
            turn("assistant", _assistant_text(template, message))
        else:
            turn("system" if message.role == "developer" else message.role, message.text())
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


TEMPLATES = {
    "hermes": ChatTemplate("hermes", HERMES, _render_hermes),
    "llama3": ChatTemplate("llama3", LLAMA3_JSON, _render_llama3),
}


def get_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; choose one of {sorted(TEMPLATES)}")
    return TEMPLATES[name]
