"""`fd-guided serve --chat-template llama3 --backend xgrammar`: Llama-3 JSON tool calls over HTTP.

The second template family (calls written ``{"name": ..., "parameters": {...}}``, parallel calls
separated by ``; ``), on the xgrammar engine pinned, through the real `openai` client.
"""
import openai
import pytest

from server_process import ServerProcess
from test_server_openai import CLOCK, MESSAGES, WEATHER, check_tool_calls

pytestmark = pytest.mark.cpu

MODEL = "llama-test"


@pytest.fixture(scope="module")
def client():
    process = ServerProcess("--preset", "tiny", "--chat-template", "llama3", "--backend", "xgrammar",
                            "--served-model-name", MODEL)
    yield openai.OpenAI(base_url=process.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    process.stop()


def test_llama3_required_named_and_auto(client):
    required = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice="required",
                                              n=4, seed=1, max_tokens=96)
    finished = [choice for choice in required.choices if choice.finish_reason == "tool_calls"]
    assert finished, [choice.finish_reason for choice in required.choices]
    for choice in finished:
        check_tool_calls(choice.message.tool_calls)
    named = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER, CLOCK], seed=2, max_tokens=96,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    check_tool_calls(choice.message.tool_calls)
    auto = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], n=2, seed=3, max_tokens=48)
    for choice in auto.choices:
        assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
        check_tool_calls(choice.message.tool_calls or [])
