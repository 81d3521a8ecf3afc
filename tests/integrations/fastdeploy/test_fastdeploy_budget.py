"""Budget steering inside real FastDeploy: its max_tokens (max_dec_len) reaches the manager through
the sampler, and guided outputs end complete and valid within it (fd_guided.budget)."""
import pytest

import fastdeploy_engine as fe
from corpus import SCHEMAS
from fd_guided import parse_guided_request
from fd_guided.harness.validate import validate_output
from fd_guided.tokenizer import load_tokenizer
from fd_runner import tiny_model

pytestmark = pytest.mark.fastdeploy

SHORTEST_PERSON = 9  # {"name":"","age":0} + EOS, in DeepSeek tokens (tests/budget measure the plan)


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    return fe.enabled_host(tmp_path_factory)


def test_fastdeploy_max_tokens_are_kept_complete(fd):
    tokenizer = load_tokenizer("deepseek")
    cfg = fe.engine_config(fd, guided_decoding_backend="auto")
    runner = fe.build_runner(fe.start_worker(cfg, think_end_id=tokenizer.think_end_id,
                                             line_break_id=tokenizer.encode("\n")[0]))
    engine = fe.Engine(runner, tiny_model(), tokenizer.eos_token_ids, chunk_budget=8, seed=3)  # prefill chunks while the grammar compiles
    from fastdeploy.engine import common_engine

    checker = common_engine.schema_checker("auto", disable_any_whitespace=False)

    def admitted(request):
        request, error = checker.schema_format(request)
        assert error is None, error
        return request

    fields = {"guided_json": SCHEMAS["unbounded_strings"]}
    spec = parse_guided_request(fields)
    for warm in (spec, parse_guided_request({"guided_json": SCHEMAS["person"]})):  # a loaded CI box compiles slowly
        runner.guided_backend.compile_service.compile_now(warm)
    tight = [admitted(engine.request(f"tight-{i}", tokenizer.encode(f"Request {i}: answer with the JSON object asked for. " * 3), max_tokens=12, **fields)) for i in range(4)]
    small = admitted(engine.request("small", tokenizer.encode("Request: answer with the JSON object asked for. " * 3), max_tokens=5, guided_json=SCHEMAS["person"]))
    done = engine.run([*tight, small])
    for request in tight:
        state = done[request.request_id]
        assert state.error is None and state.finished == "stop", (state.finished, state.error)
        assert len(request.output_token_ids) <= 12
        text = tokenizer.decode([t for t in request.output_token_ids if t not in tokenizer.eos_token_ids])
        assert validate_output(spec, text).valid, text
    assert "needs 9 tokens" in (done["small"].error or ""), done["small"]
    assert runner.guided_backend.metrics.value("budget_refused_requests_total") == 1
