"""The built-in requests `fd-guided generate` runs with no constraint given: each reads as a person
would write it (a JSON object with sensible fields, a date, a choice, a tool call, a grammar), so the
embedded model's guided output can be judged by eye."""

from __future__ import annotations

import json

_PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "occupation", "city"],
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "occupation": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 24},
    },
}
_WEATHER_ARGS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
}
_WEATHER_TOOL = {"name": "get_weather", "description": "Get the current weather in a city", "parameters": _WEATHER_ARGS}
_TOOL_SYSTEM = (
    "You are a helpful assistant with access to the following functions. Use them if required:\n<tools>\n"
    + json.dumps({"type": "function", "function": _WEATHER_TOOL})
    + "\n</tools>\nFor each function call, return "
    "a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
# What a person would ask (the chat template of the model wraps each `prompt`; a `system` turn where given).
DEMO_REQUESTS = [
    {
        "prompt": "Extract the person as JSON: John Smith is 42 years old and works as a nurse in Leeds.",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": _PERSON, "strict": True},
        },
    },
    {
        "prompt": "Make a JSON user profile for Maria Garcia, 34, email maria.garcia@example.com. She edits articles.",
        "guided_json": {
            "type": "object",
            "required": ["name", "age", "email", "roles"],
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "email": {"type": "string", "format": "email"},
                "roles": {
                    "type": "array",
                    "items": {"enum": ["admin", "editor", "viewer"]},
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
        },
    },
    {
        "prompt": "Alice ordered two of item ABC-1234 and one of item XYZ-0042, and she has paid. "
        "Write the order as JSON.",
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "order",
                "schema": {
                    "type": "object",
                    "$defs": {
                        "item": {
                            "type": "object",
                            "properties": {
                                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                            },
                            "required": ["sku", "qty"],
                        }
                    },
                    "properties": {
                        "customer": {"type": "string", "maxLength": 30},
                        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
                        "status": {"enum": ["new", "paid", "shipped"]},
                    },
                    "required": ["customer", "items", "status"],
                },
            },
        },
    },
    {
        "prompt": "On what date did Apollo 11 land on the Moon? Answer as YYYY-MM-DD.",
        "guided_regex": r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    },
    {
        "prompt": "Is this review positive, negative or neutral? "
        '"The battery lasts all day and the screen is gorgeous."',
        "guided_choice": ["positive", "negative", "neutral"],
    },
    {
        "system": _TOOL_SYSTEM,
        "prompt": "What's the weather like in Paris right now, in celsius?",
        "response_format": {
            "type": "structural_tag",
            "format": {
                "type": "tags_with_separator",
                "separator": "\n",
                "at_least_one": True,
                "stop_after_first": True,
                "tags": [
                    {
                        "type": "tag",
                        "begin": '<tool_call>\n{"name": "get_weather", "arguments": ',
                        "content": {"type": "json_schema", "json_schema": _WEATHER_ARGS},
                        "end": "}\n</tool_call>",
                    }
                ],
            },
        },
    },
    {"prompt": "Give me three facts about Paris as a short JSON object.", "response_format": {"type": "json_object"}},
    {
        "prompt": "Write a sum, like 2+3, whose value is 12.",
        "guided_grammar": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"',
    },
    {
        "prompt": "Greet Bob in lowercase, like 'hello bob'.",
        "guided_grammar": 'start: GREETING " " NAME\nGREETING: "hello" | "hi"\nNAME: /[a-z]{2,8}/',
    },
    {"prompt": "In one sentence, what is structured output in language models?"},
]
