"""`fd-guided serve` through the real `openai` client at tight budgets (issue #24, fd_guided.budget):
a max_tokens / max_completion_tokens below the shortest valid output is an HTTP 400 naming the
minimum (before any header: the engine process checks it once the grammar is compiled), and at
1.2x that minimum every choice ends ``stop`` (or ``tool_calls``) with a complete, valid output,
streamed or not, strict tool calls included. The model has random weights: without steering most
choices would be cut (``length``) at these budgets."""

import math
import re

import openai
import pytest
from server_process import ServerProcess, check_json, openai_client


pytestmark = pytest.mark.cpu

MODEL = "fd-guided-tiny"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "tags", "role"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
MESSAGES = [{"role": "user", "content": "Answer please."}]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--preset", "tiny", "--max-num-seqs", "16")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def refused_minimum(create, **kwargs) -> int:
    """Ask with a budget of 1 token: the 400 names the minimum (and its param and code)."""
    with pytest.raises(openai.BadRequestError) as caught:
        response = create(**kwargs)
        list(response) if kwargs.get("stream") else None
    body = caught.value.body
    assert caught.value.status_code == 400 and body["param"] == "max_tokens" and body["code"] == "budget_too_small"
    found = re.search(r"max_tokens=1 cannot hold a complete output: .* needs (\d+) tokens", body["message"])
    assert found, body["message"]
    return int(found.group(1))


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_json_schema_streamed_at_a_tight_budget_ends_valid(client, field):
    create = client.chat.completions.create
    minimum = refused_minimum(create, model=MODEL, messages=MESSAGES, response_format=RESPONSE_FORMAT, **{field: 1})
    budget = math.ceil(minimum * 1.2)
    stream = create(
        model=MODEL,
        messages=MESSAGES,
        response_format=RESPONSE_FORMAT,
        stream=True,
        n=4,
        seed=3,
        stream_options={"include_usage": True},
        **{field: budget},
    )
    texts, reasons, usage = {i: "" for i in range(4)}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    assert reasons == {i: "stop" for i in range(4)}, (budget, reasons, texts)
    assert usage is not None and usage.completion_tokens <= 4 * budget
    for text in texts.values():
        check_json(PERSON, text)
    # Turned off, the same budget cuts (almost) every choice: the steering did the work above.
    off = create(
        model=MODEL,
        messages=MESSAGES,
        response_format=RESPONSE_FORMAT,
        n=4,
        seed=3,
        extra_body={"guided_fit_budget": False},
        **{field: budget},
    )
    assert [choice.finish_reason for choice in off.choices].count("length") >= 2


def test_strict_tool_calls_at_a_tight_budget_end_valid(client):
    create = client.chat.completions.create
    common = dict(model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    minimum = refused_minimum(create, max_completion_tokens=1, **common)
    budget = math.ceil(minimum * 1.2)
    plain = create(n=4, seed=5, max_completion_tokens=budget, **common)
    streamed = create(stream=True, seed=6, max_tokens=budget, **common)
    calls, reason = [], None
    for chunk in streamed:
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            reason = choice.finish_reason or reason
    assert reason == "tool_calls" and len(calls) == 1, (budget, reason, calls)
    check_json(WEATHER["function"]["parameters"], calls[0].function.arguments)
    for choice in plain.choices:
        assert choice.finish_reason == "tool_calls", (budget, choice)
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather"
        check_json(WEATHER["function"]["parameters"], call.function.arguments)


def test_a_budget_that_fits_is_not_refused_and_turning_it_off_is_never_refused(client):
    create = client.chat.completions.create
    minimum = refused_minimum(create, model=MODEL, messages=MESSAGES, response_format=RESPONSE_FORMAT, max_tokens=1)
    exact = create(model=MODEL, messages=MESSAGES, response_format=RESPONSE_FORMAT, max_tokens=minimum, seed=1)
    assert exact.choices[0].finish_reason == "stop"
    check_json(PERSON, exact.choices[0].message.content)
    off = create(
        model=MODEL,
        messages=MESSAGES,
        response_format=RESPONSE_FORMAT,
        max_tokens=1,
        extra_body={"guided_fit_budget": False},
    )
    assert off.choices[0].finish_reason == "length"
