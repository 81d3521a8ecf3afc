"""fd_guided decoding inside real FastDeploy: its runner's insert/p-done code, its Sampler, its post_process.

Each test starts a worker the way FastDeploy does (the command line its engine builds ->
``parse_args`` -> ``initialize_fd_config``, where ``FD_PLUGINS`` loads fd_guided), builds the real
``GPUModelRunner`` and steps it with logits from the reference LM (tests/fastdeploy_engine.py).
Outputs are checked with jsonschema (formats included), ``re.fullmatch`` and grammar re-parsing.
"""
import json
import os

import pytest

import fastdeploy_engine as fe
from corpus import GRAMMARS, REGEXES, SCHEMAS, STRUCTURAL_TAGS
from fd_guided import parse_guided_request
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output
from fd_runner import VOCAB, tiny_model

pytestmark = pytest.mark.fastdeploy


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    return fe.enabled_host(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def worker(model_dir, tokenizer, chunk_budget=512, seed=0, **engine_args):
    """An engine config, a worker started from it, its runner, and our engine loop around it."""
    cfg = fe.engine_config(model_dir, **{"guided_decoding_backend": "auto", **engine_args})
    fd_config = fe.start_worker(cfg, think_end_id=tokenizer.think_end_id, line_break_id=tokenizer.encode("\n")[0])
    runner = fe.build_runner(fd_config)
    return cfg, runner, fe.Engine(runner, tiny_model(), tokenizer.eos_token_ids, chunk_budget=chunk_budget, seed=seed)


def admitted(cfg, request):
    """The engine's checker, as EngineService.__init__ builds it from the bound name."""
    from fastdeploy.engine import common_engine

    checker = common_engine.schema_checker(cfg.structured_outputs_config.guided_decoding_backend,
                                           disable_any_whitespace=cfg.structured_outputs_config.disable_any_whitespace)
    request, error = checker.schema_format(request)
    assert error is None, error
    return request


def content(tokenizer, request, skip=()) -> str:
    ids = list(request.output_token_ids)
    if tokenizer.think_end_id in ids:
        ids = ids[ids.index(tokenizer.think_end_id) + 1:]
    return tokenizer.decode([t for t in ids if t not in skip])


MULTIPLE_OF = {"guided_json": {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}, "required": ["n"]}}
KINDS = [
    {"guided_json": SCHEMAS["person"]},
    {"guided_json": SCHEMAS["format_date"]},
    MULTIPLE_OF,
    {"guided_json_object": True},
    {"guided_regex": REGEXES["hex_color"]},
    {"guided_choice": ["alpha", "beta", "gamma"]},
    {"guided_grammar": GRAMMARS["key_value_ebnf"]},
    {"guided_grammar": GRAMMARS["greeting_lark"]},
    {"structural_tag": json.dumps(STRUCTURAL_TAGS["weather_tool"])},
]


def test_every_kind_is_valid_through_fastdeploys_runner_and_sampler(fd, tokenizer):
    cfg, runner, engine = worker(fd, tokenizer, chunk_budget=12)
    specs, requests = [], []
    for index, fields in enumerate(KINDS):
        specs.append(parse_guided_request(fields))
        prompt = tokenizer.encode(f"Request {index}: answer in the required format. " * 2)
        requests.append(admitted(cfg, engine.request(f"kind-{index}", prompt, max_tokens=96, **fields)))
    done = engine.run(requests)
    assert type(runner.sampler.guided_decoding).__module__ == "fd_guided.integrations.fastdeploy.sampler"
    finished = 0
    for fields, spec, request in zip(KINDS, specs, requests):
        state = done[request.request_id]
        assert state.error is None, (fields, state.error)
        text = content(tokenizer, request)
        if state.finished == "stop":
            finished += 1
            verdict = validate_output(spec, text)
            assert verdict.valid, f"{fields} -> {text!r}: {verdict.reason}"
    assert finished >= 0.7 * len(KINDS)
    # per-request auto: a number's multipleOf is not xgrammar's, so that request ran on llguidance;
    # the others ran on xgrammar or, while xgrammar was still compiling, on llguidance (auto's race)
    used = runner.guided_backend.metrics.labelled("requests_by_backend_total")
    assert used.get("llguidance", 0) >= 1 and sum(used.values()) == len(KINDS), used
    served = runner.guided_backend.compile_service.compile_now(specs[KINDS.index(MULTIPLE_OF)])
    assert served.backend_name == "llguidance"
    # the first chunks of every request are unmasked; its first sample is masked
    first = [row for row in engine.masked if "kind-0" in row]
    assert first[0]["kind-0"] == VOCAB and min(row["kind-0"] for row in first) < 100


def test_a_preempted_request_is_masked_again_from_its_replayed_tokens(fd, tokenizer):
    cfg, runner, engine = worker(fd, tokenizer, chunk_budget=4, seed=3)
    schema = SCHEMAS["tool_call"]
    victim = admitted(cfg, engine.request("victim", tokenizer.encode("Call a tool as JSON."), max_tokens=96,
                                          guided_json=schema))
    other = admitted(cfg, engine.request("other", tokenizer.encode("Pick one."), guided_choice=["left", "right"]))
    engine.add(victim, slot=0)
    while len(victim.output_token_ids) < 4:
        engine.step()
    before = list(victim.output_token_ids)
    engine.preempt("victim")  # FastDeploy's PREEMPTED task: the runner leaves the guided slot alone
    engine.add(other, slot=0)  # the slot is reused at once by another guided request
    for _ in range(3):
        engine.step()
    engine.add(victim, slot=2)  # resumed: prompt + its 4 tokens re-prefilled in chunks of 4
    steps_before_resume = len(engine.masked)
    done = engine.run([])
    assert victim.output_token_ids[:4] == before
    after = [row["victim"] for row in engine.masked[steps_before_resume:] if "victim" in row]
    decoding = after[-(len(victim.output_token_ids) - 4):]  # the steps that sampled victim's new tokens
    assert decoding and max(decoding) < VOCAB, decoding  # masked again (FastDeploy alone: all 129,280)
    assert done["victim"].finished == "stop"
    verdict = validate_output(parse_guided_request({"guided_json": schema}), content(tokenizer, victim))
    assert verdict.valid, (content(tokenizer, victim), verdict.reason)
    assert content(tokenizer, other) in ("left", "right")
    assert runner.guided_backend.metrics.value("rejected_tokens_total") == 0


def test_a_reasoning_request_thinks_unmasked_then_is_constrained(fd, tokenizer):
    cfg, runner, engine = worker(fd, tokenizer, reasoning_parser="qwen3", seed=5)
    assert runner.fd_config.structured_outputs_config.reasoning_parser == "qwen3"
    choices = ["alpha", "beta"]
    thinking = admitted(cfg, engine.request("think", tokenizer.encode("Choose:"), guided_choice=choices,
                                            enable_thinking=True, reasoning_max_tokens=6))
    direct = admitted(cfg, engine.request("direct", tokenizer.encode("Choose:"), guided_choice=choices,
                                          enable_thinking=False))
    done = engine.run([thinking, direct])
    rows = [row["think"] for row in engine.masked if "think" in row]
    # 6 free reasoning tokens, FastDeploy's thinking limit forces </think>, then the constraint
    assert rows[:6] == [VOCAB] * 6 and max(rows[7:]) < 100, rows
    assert tokenizer.think_end_id in thinking.output_token_ids
    assert done["think"].finished == "stop" and content(tokenizer, thinking) in choices
    assert max(row["direct"] for row in engine.masked if "direct" in row) < 100
    assert content(tokenizer, direct) in choices
    assert runner.guided_backend.metrics.value("rejected_tokens_total") == 0


def test_tokens_fastdeploy_forces_are_not_grammar_rejections(fd, tokenizer, monkeypatch):
    # ERNIE-X1's thinking limit forces "\n</think>\n\n": the two line breaks land in the constrained part.
    monkeypatch.setenv("FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR", "\n</think>\n\n")
    cfg, runner, engine = worker(fd, tokenizer, reasoning_parser="qwen3", seed=7)
    newline = tokenizer.encode("\n")[0]
    thinking = admitted(cfg, engine.request("think", tokenizer.encode("Choose:"), guided_choice=["alpha", "beta"],
                                            enable_thinking=True, reasoning_max_tokens=1))
    # max length: FastDeploy replaces the last sampled token with EOS mid-JSON
    cut = admitted(cfg, engine.request("cut", tokenizer.encode("JSON:"), max_tokens=5, guided_json=SCHEMAS["person"]))
    cut.guided_fit_budget = False  # FastDeploy's own cut, not fd_guided.budget's refusal of a 5-token budget
    done = engine.run([thinking, cut])
    metrics = runner.guided_backend.metrics
    assert metrics.value("rejected_tokens_total") == 0
    # named: FastDeploy's model_config.line_break_id under this strategy (fd_guided.integrations.fastdeploy.sampler)
    assert metrics.labelled("host_forced_tokens_total") == {"line_break": 2, "stop": 1}
    assert metrics.value("out_of_mask_tokens_total") == 0
    assert done["think"].finished == "stop" and done["think"].error is None
    assert content(tokenizer, thinking, skip={newline}) in ("alpha", "beta")
    assert done["cut"].finished == "length" and done["cut"].error is None and len(cut.output_token_ids) == 5


def test_a_failed_request_ends_with_its_error_not_a_plain_stop(fd, tokenizer):
    cfg, runner, engine = worker(fd, tokenizer)
    # Not admitted (as on FastDeploy's offline path): the worker refuses the key itself.
    bad = engine.request("bad", tokenizer.encode("Regex:"), guided_regex="(unclosed")
    good = admitted(cfg, engine.request("good", tokenizer.encode("Pick:"), guided_choice=["x", "y"]))
    done = engine.run([bad, good])
    assert done["bad"].finished == "error" and "guided_regex" in done["bad"].error, done["bad"].error
    assert bad.output_token_ids[-1] in tokenizer.eos_token_ids and len(bad.output_token_ids) <= 2
    assert done["good"].finished == "stop" and content(tokenizer, good) in ("x", "y")


@pytest.mark.parametrize("flag, whitespace", [("false", True), ("true", False)])
def test_the_whitespace_flag_reaches_every_worker(fd, tokenizer, flag, whitespace):
    cfg, runner, engine = worker(fd, tokenizer, guided_decoding_disable_any_whitespace=flag)
    assert cfg.structured_outputs_config.disable_any_whitespace is (not whitespace)
    assert runner.guided_backend.config.any_whitespace is whitespace
    request = admitted(cfg, engine.request("ws", tokenizer.encode("JSON:"), guided_json=SCHEMAS["person"]))
    key = runner._init_logits_processor(request)[1]
    processor = runner.guided_backend.get_logits_processor(key).result(timeout=30)
    assert processor.accept_token(tokenizer.encode("{")[0])
    bitmask = processor.allocate_token_bitmask()
    processor.fill_token_bitmask(bitmask, 0)
    space = tokenizer.encode(" ")[0]
    assert bool((int(bitmask[0, space // 32]) >> (space % 32)) & 1) is whitespace


def test_an_ernie_sentencepiece_checkpoint_gets_its_own_tokenizer(fd, tmp_path):
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["yes no maybe", "the quick brown fox jumps", '{"a": 1, "b": [true, false]}'] * 50))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "tokenizer"), vocab_size=300, hard_vocab_limit=False,
                                   byte_fallback=True, user_defined_symbols=["<think>", "</think>"])
    model_dir = fe.make_model_dir(str(tmp_path / "ernie"), architecture="Ernie4_5_ForCausalLM", vocab_size=1024)
    os.remove(os.path.join(model_dir, "tokenizer.json"))
    os.remove(os.path.join(model_dir, "tokenizer_config.json"))
    os.replace(tmp_path / "tokenizer.model", os.path.join(model_dir, "tokenizer.model"))
    cfg = fe.engine_config(model_dir, guided_decoding_backend="auto")
    from fastdeploy.model_executor.guided_decoding import get_guided_backend

    backend = get_guided_backend(fd_config=cfg)
    bundle = backend.tokenizer
    text = 'yes {"a": 7}\n'
    assert bundle.decode(bundle.encode(text)).strip() == text.strip()
    assert bundle.think_end_id is not None and bundle.token_bytes[bundle.think_end_id] is None
    processor = backend.get_logits_processor(("regex", "(yes|no)")).result(timeout=30)
    bitmask = processor.allocate_token_bitmask()
    processor.fill_token_bitmask(bitmask, 0)
    allowed = [t for t in range(bundle.vocab_size) if (int(bitmask[0, t // 32]) >> (t % 32)) & 1]
    assert allowed and all((bundle.token_bytes[t] or b"").strip() and ("yes".startswith(bundle.token_bytes[t].decode().strip())
                                                                      or "no".startswith(bundle.token_bytes[t].decode().strip()))
                           for t in allowed), [bundle.token_bytes[t] for t in allowed]
    backend.close()
