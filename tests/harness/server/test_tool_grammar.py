"""Tool-call structural tags, judged by real matchers (xgrammar and llguidance) on exact text.

For both template families, what each `tool_choice` admits and refuses, byte by byte, and
`ToolPlan.parse` reading the calls back. No model: the text is written here, so the parallel,
single and named cases are decided exactly, not by what a random model happens to sample.
"""
import functools
import json

import pytest

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.harness.conformance import STOP, byte_tokenizer
from fd_guided.errors import InvalidGrammarError
from fd_guided.registry import get_backend_class
from fd_guided.harness.server.chat import TEMPLATES
from fd_guided.harness.server.protocol import NamedToolChoice, Tool
from fd_guided.harness.server.tools import HERMES, LLAMA3_JSON, plan_tools

pytestmark = pytest.mark.cpu

ENGINES = ("xgrammar", "llguidance")
FORMATS = (HERMES, LLAMA3_JSON)
TOOLS = [Tool.model_validate(t) for t in (
    {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"]}}},
)]
WEATHER = '{"city":"Paris","unit":"c"}'
TIME = '{"zone":"UTC"}'


@functools.lru_cache(maxsize=None)
def backend(name: str):
    return get_backend_class(name)(byte_tokenizer(), vocab_size=STOP + 1, config=GuidedConfig(backend=name), stop_token_ids=[STOP])


def accepts(engine: str, plan, text: str) -> bool:
    spec = parse_guided_request({"structural_tag": plan.structural_tag, "disable_any_whitespace": True}, GuidedConfig(backend=engine))
    grammar = backend(engine).new_grammar(backend(engine).compile(spec))
    return all(grammar.accept_token(b) for b in text.encode("utf-8")) and grammar.accept_token(STOP) and grammar.is_terminated()


def plan(fmt, choice, parallel=None):
    return plan_tools(TOOLS, choice, parallel, fmt, {})


def calls(fmt, *pairs) -> str:
    return fmt.separator.join(fmt.render(name, arguments) for name, arguments in pairs)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_required_admits_calls_only_and_parallel_only_when_allowed(engine, fmt):
    two = calls(fmt, ("get_weather", WEATHER), ("get_time", TIME))
    parallel, single = plan(fmt, "required"), plan(fmt, "required", parallel=False)
    assert accepts(engine, parallel, calls(fmt, ("get_weather", WEATHER)))
    assert accepts(engine, parallel, two)
    assert accepts(engine, single, calls(fmt, ("get_time", TIME)))
    assert not accepts(engine, single, two)
    assert not accepts(engine, parallel, "no call at all")
    assert not accepts(engine, parallel, "")
    # arguments must match the function's schema: enum, pattern, closed object
    assert not accepts(engine, parallel, calls(fmt, ("get_weather", '{"city":"Paris","unit":"k"}')))
    assert not accepts(engine, parallel, calls(fmt, ("get_time", '{"zone":"utc"}')))
    assert not accepts(engine, parallel, calls(fmt, ("get_weather", '{"city":"Paris","unit":"c","x":1}')))
    assert not accepts(engine, parallel, calls(fmt, ("send_mail", TIME)))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_named_admits_exactly_one_call_of_that_function(engine, fmt):
    named = plan(fmt, NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}}))
    assert accepts(engine, named, calls(fmt, ("get_time", TIME)))
    assert not accepts(engine, named, calls(fmt, ("get_weather", WEATHER)))
    assert not accepts(engine, named, calls(fmt, ("get_time", TIME), ("get_time", TIME)))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_auto_admits_text_and_text_with_valid_calls(engine, fmt):
    auto = plan(fmt, "auto")
    assert accepts(engine, auto, "Just an answer.")
    assert accepts(engine, auto, "Let me look. " + calls(fmt, ("get_weather", WEATHER)))
    assert not accepts(engine, auto, "Let me look. " + calls(fmt, ("get_weather", '{"city":"Paris"}')))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_parse_reads_calls_and_content_back(fmt):
    text = "Checking. " + calls(fmt, ("get_weather", WEATHER), ("get_time", TIME))
    content, parsed = plan(fmt, "auto").parse(text)
    assert content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed] == [
        ("get_weather", json.loads(WEATHER)), ("get_time", json.loads(TIME))]
    assert len({c.id for c in parsed}) == 2
    # an incomplete call (cut by max_tokens) is not a call; its text stays content
    content, parsed = plan(fmt, "required").parse(calls(fmt, ("get_time", TIME)) + fmt.separator + fmt.begin("get_weather") + '{"ci')
    assert len(parsed) == 1 and content.endswith('{"ci')


def test_plan_refusals_name_the_field():
    with pytest.raises(InvalidGrammarError) as caught:
        plan_tools([], "required", None, HERMES, {})
    assert caught.value.part == "tool_choice"
    with pytest.raises(InvalidGrammarError) as caught:
        plan_tools(TOOLS, "auto", None, HERMES, {"guided_regex": "a+"})
    assert caught.value.part == "guided_regex"
    with pytest.raises(InvalidGrammarError) as caught:
        plan_tools(TOOLS + TOOLS[:1], "auto", None, HERMES, {})
    assert caught.value.part == "tools"
    assert plan_tools(TOOLS, "none", None, HERMES, {}) is None
    # an explicit response_format "text" is no constraint, so it combines with tools
    from fd_guided.harness.server.protocol import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}})
    assert request.guided_fields() == {}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_templates_render_tools_history_and_the_assistant_turn(name):
    from fd_guided.harness.server.protocol import ChatMessage

    template = TEMPLATES[name]
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Weather?"),
                ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER}}]}),
                ChatMessage(role="tool", content="sunny", tool_call_id="call_1")]
    prompt = template.render(messages, TOOLS)
    assert "Be brief." in prompt and "Weather?" in prompt and "sunny" in prompt and '"get_time"' in prompt
    assert template.tool_format.render("get_weather", WEATHER) in prompt
    ending = {"hermes": "<|im_start|>assistant\n", "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n"}[name]
    assert prompt.endswith(ending)
