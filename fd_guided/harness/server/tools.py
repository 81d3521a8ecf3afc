"""Tool calling: the allowed tool-call syntax as a structural tag, and the calls parsed back.

A `ToolCallFormat` says how one chat-template family writes a call (its begin text, which embeds
the function name, the arguments as a JSON object, its end text, the separator between parallel
calls, and the trigger that opens a call inside free text). `plan_tools` turns a request's
``tools``/``tool_choice``/``parallel_tool_calls`` into a `ToolPlan` whose structural tag (xgrammar's
format style, enforced by either engine) allows exactly:

  ``auto``      free text in which every trigger opens a complete call (``triggered_tags``)
  ``required``  one or more calls and nothing else (``tags_with_separator``, ``at_least_one``)
  named         exactly one call of that function
  ``none``      no constraint and no parsing

Each call's arguments are a ``json_schema`` element of the function's ``parameters``, so they
always match (`strict` or not: a function's schema is always enforced, with the request's
``guided_strict`` semantics). ``parallel_tool_calls: false`` (``stop_after_first``) allows one
call at most. `ToolPlan.parse` reads the calls back from the output text with the same begin and
end strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fd_guided.errors import InvalidGrammarError
from fd_guided.harness.server.protocol import FunctionCall, NamedToolChoice, Tool, ToolCall, new_tool_call_id

_DEFAULT_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCallFormat:
    """How one template family writes a call: ``prefix + json(name) + middle + arguments + end``."""

    name: str
    prefix: str
    middle: str
    end: str
    separator: str
    trigger: str

    def begin(self, function_name: str) -> str:
        return f"{self.prefix}{json.dumps(function_name)}{self.middle}"

    def render(self, function_name: str, arguments: str) -> str:
        """A call as the model would write it (chat templates use this for assistant history)."""
        return f"{self.begin(function_name)}{arguments}{self.end}"


HERMES = ToolCallFormat(
    "hermes",
    prefix='<tool_call>\n{"name": ',
    middle=', "arguments": ',
    end="}\n</tool_call>",
    separator="\n",
    trigger="<tool_call>",
)
LLAMA3_JSON = ToolCallFormat(
    "llama3_json", prefix='{"name": ', middle=', "parameters": ', end="}", separator="; ", trigger='{"name": '
)


@dataclass(frozen=True)
class ToolPlan:
    """What tool calling does for one request (see the module docstring)."""

    format: ToolCallFormat
    names: tuple[str, ...]
    mode: str  # "auto", "required" or "named"
    parallel: bool
    structural_tag: dict

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The content (text outside calls; None when empty) and the complete calls, in order.

        A call is read only whole: begin, a JSON object, end. Text after an incomplete call (cut by
        ``max_tokens`` or a stop string) stays content.
        """
        begins = {self.format.begin(name): name for name in self.names}
        pattern = re.compile("|".join(re.escape(begin) for begin in sorted(begins, key=len, reverse=True)))
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        content: list[str] = []
        position = 0
        while (match := pattern.search(text, position)) is not None:
            start = _skip_space(text, match.end())
            try:
                arguments, stop = decoder.raw_decode(text, start)
            except ValueError:
                break
            close = _skip_space(text, stop)
            if not isinstance(arguments, dict) or not text.startswith(self.format.end, close):
                break
            between = text[position : match.start()]
            if not (calls and between.strip() in ("", self.format.separator.strip())):
                content.append(between)
            calls.append(
                ToolCall(
                    id=new_tool_call_id(), function=FunctionCall(name=begins[match.group()], arguments=text[start:stop])
                )
            )
            position = close + len(self.format.end)
        tail = text[position:]
        if not (calls and tail.strip() in ("", self.format.separator.strip())):
            content.append(tail)
        joined = "".join(content).strip()
        return (joined or None), calls


def plan_tools(
    tools: Sequence[Tool] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    call_format: ToolCallFormat,
    guided_fields: dict,
) -> ToolPlan | None:
    """The request's `ToolPlan`, or None when tools play no part (none given, or ``tool_choice:
    "none"``). Raises InvalidGrammarError (HTTP 400) naming the field for inconsistent requests."""
    tools = list(tools or [])
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidGrammarError("requires a non-empty 'tools' list", part="tool_choice")
        return None
    names = [tool.function.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InvalidGrammarError(f"function names must be unique; repeated: {', '.join(duplicates)}", part="tools")
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if guided_fields:
        given = ", ".join(sorted(guided_fields))
        raise InvalidGrammarError(
            f"cannot be combined with tool calling (tool_choice {_choice_text(choice)!r}); "
            f"use tool_choice 'none' or drop {given}",
            part=sorted(guided_fields)[0],
        )
    parallel = parallel_tool_calls is not False
    tags = {tool.function.name: _tag(call_format, tool) for tool in tools}
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in tags:
            raise InvalidGrammarError(
                f"names function {choice.function.name!r}, which is not among the tools ({', '.join(names)})",
                part="tool_choice.function.name",
            )
        fmt = {
            "type": "tags_with_separator",
            "tags": [tags[choice.function.name]],
            "separator": call_format.separator,
            "at_least_one": True,
            "stop_after_first": True,
        }
        return ToolPlan(call_format, (choice.function.name,), "named", False, _structural_tag(fmt))
    if choice == "required":
        fmt = {
            "type": "tags_with_separator",
            "tags": list(tags.values()),
            "separator": call_format.separator,
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    else:
        fmt = {
            "type": "triggered_tags",
            "triggers": [call_format.trigger],
            "tags": list(tags.values()),
            "at_least_one": False,
            "stop_after_first": not parallel,
        }
    return ToolPlan(call_format, tuple(names), choice, parallel, _structural_tag(fmt))


def parameters_of(tool: Tool) -> dict:
    """The function's argument schema (a function without one takes an empty object)."""
    return tool.function.parameters if tool.function.parameters is not None else dict(_DEFAULT_PARAMETERS)


def check_parameters(tools: Sequence[Tool], validate) -> None:
    """Validate every function's parameter schema with `validate` (an engine's admission check),
    so an error names ``tools[i].function.parameters`` and the keyword rather than a position
    inside the generated structural tag."""
    for index, tool in enumerate(tools):
        try:
            validate({"guided_json": parameters_of(tool)})
        except InvalidGrammarError as error:
            raise _moved(error, "guided_json", f"tools[{index}].function.parameters") from None


def _tag(call_format: ToolCallFormat, tool: Tool) -> dict:
    return {
        "type": "tag",
        "begin": call_format.begin(tool.function.name),
        "content": {"type": "json_schema", "json_schema": parameters_of(tool)},
        "end": call_format.end,
    }


def _structural_tag(fmt: dict) -> dict:
    return {"type": "structural_tag", "format": fmt}


def _choice_text(choice: Any) -> str:
    return choice.function.name if isinstance(choice, NamedToolChoice) else str(choice)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _moved(error: InvalidGrammarError, old: str, new: str) -> InvalidGrammarError:
    """The same error with its part's prefix `old` replaced by `new`."""
    part = error.part or old
    message = str(error)
    if error.part and message.startswith(f"{error.part}: "):
        message = message[len(error.part) + 2 :]
    moved = type(error)(message, part=new + part[len(old) :] if part.startswith(old) else new)
    moved.feature = error.feature
    return moved
