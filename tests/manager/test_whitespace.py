"""Runaway safety: under default settings a random-weight model cannot pad JSON with whitespace until
max_tokens, on every backend; compact separators leave no whitespace outside strings at all."""
import statistics

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.harness.validate import validate_output
from fd_guided.harness.engine import ReferenceEngine

from corpus import SCHEMAS

pytestmark = pytest.mark.cpu

MAX_TOKENS = 128
DEFAULT_BOUND = GuidedConfig().max_whitespace_cnt
# Typical API schemas: bounded strings, enums, nested objects and arrays (unbounded free text excluded).
TYPICAL = ["person", "nested_address", "bounded_array", "enum_status", "const_version", "anyof_id", "defs_ref",
           "string_pattern", "numeric_bounds", "integer_multiple", "nullable", "string_lengths", "optional_props",
           "tool_call", "array_of_objects", "nested_arrays", "boolean_flags", "deep_nesting", "invoice", "format_date"]


def whitespace_runs_outside_strings(text: str) -> list[int]:
    """Lengths of the whitespace runs of `text` that lie outside JSON string literals."""
    runs, current, in_string, escaped = [], 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char in " \t\r\n":
            current += 1
            continue
        if current:
            runs.append(current)
            current = 0
        in_string = char == '"'
    if current:
        runs.append(current)
    return runs


def test_whitespace_scanner():
    assert whitespace_runs_outside_strings('{ "a b  c" :  [1,\n 2] }') == [1, 1, 2, 2, 1]
    assert whitespace_runs_outside_strings('"\\"  "') == []


@pytest.fixture(scope="module", params=["xgrammar", "llguidance", "auto"])
def engine(request):
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=32, guided_config=GuidedConfig(backend=request.param))
    engine.test_backend = request.param
    yield engine
    engine.close()


def _requests(extra: dict, engine=None) -> list[dict]:
    """The typical schemas this engine's backend admits (pinned xgrammar refuses bounded strings)."""
    config = GuidedConfig(backend=getattr(engine, "test_backend", "auto"))
    out = []
    for name in TYPICAL:
        request = {"prompt": f"Return {name} as JSON.", "guided_json": SCHEMAS[name], **extra}
        try:
            parse_guided_request(request, config)
        except InvalidGrammarError:
            continue
        out.append(request)
    assert len(out) >= 10
    return out


def test_default_outputs_end_well_before_max_tokens(engine):
    results = engine.generate(_requests({}, engine), max_tokens=MAX_TOKENS, seed=11)
    lengths = [len(result.token_ids) for result in results]
    assert statistics.median(lengths) < 0.4 * MAX_TOKENS, lengths
    assert sum(result.finish_reason == "length" for result in results) <= 2, lengths
    for result in results:
        assert result.error is None, result.error
        assert max(whitespace_runs_outside_strings(result.text), default=0) <= DEFAULT_BOUND, repr(result.text)
        if result.finish_reason == "stop":
            assert validate_output(result.spec, result.text).valid, result.text


def test_compact_separators_leave_no_whitespace_outside_strings(engine):
    results = engine.generate(_requests({"disable_any_whitespace": True}, engine), max_tokens=MAX_TOKENS, seed=12)
    for result in results:
        assert result.error is None, result.error
        assert whitespace_runs_outside_strings(result.text) == [], repr(result.text)
    assert statistics.median(len(result.token_ids) for result in results) < 0.4 * MAX_TOKENS


def test_the_bound_is_what_keeps_runs_short(engine):
    # Sensitivity check of the assertion above: without a bound the same model does emit longer runs.
    results = engine.generate(_requests({"max_whitespace_cnt": None}, engine), max_tokens=MAX_TOKENS, seed=11)
    assert max(max(whitespace_runs_outside_strings(r.text), default=0) for r in results) > DEFAULT_BOUND
