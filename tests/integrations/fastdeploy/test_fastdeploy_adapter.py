"""The FastDeploy adapter, driven in FastDeploy's step order by a mini runner over real logits.

The runner (tests/fd_runner.py) calls the adapter where FastDeploy's GPUModelRunner calls its
own objects: prefill-done indices -> pre_process -> forward (the reference Paddle LM) ->
apply_token_mask -> sampling -> post_process, with slot-indexed logits rows. Each test that
names a FastDeploy fault fails if the fault comes back.
"""
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.errors import SlotStateError
from fd_guided.integrations import fastdeploy as adapter
from fd_guided.integrations.fastdeploy import (
    GuidedDecoding,
    get_guided_backend,
    guided_config_from_fd,
    schema_checker,
    schemata_key_of,
    spec_from_schemata_key,
)
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output

from corpus import CHOICES, GRAMMARS, REGEXES, SCHEMAS, STRUCTURAL_TAGS
from fd_runner import VOCAB, MiniFastDeployRunner, Request, fd_config

pytestmark = pytest.mark.cpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def make_request(tokenizer, request_id, prompt, **fields) -> Request:
    return Request(request_id=str(request_id), prompt_token_ids=tokenizer.encode(prompt), **fields)


def admit(checker, request) -> None:
    _, error = checker.schema_format(request)
    assert error is None, error


def token_of(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def whitespace_outside_strings(text: str) -> bool:
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped = char == "\\" and not escaped
            if char == '"' and not escaped:
                in_string = False
        elif char == '"':
            in_string = True
        elif char.isspace():
            return True
    return False


# ----- the whole path, in FastDeploy's order -------------------------------------------------

MIXED = [
    {"guided_json": SCHEMAS["person"]},
    {"guided_json": SCHEMAS["nested_address"]},
    {"guided_json": json.dumps(SCHEMAS["enum_status"])},
    {"guided_json": SCHEMAS["defs_ref"]},
    {"guided_json": SCHEMAS["format_date"]},
    {"guided_regex": REGEXES["hex_color"]},
    {"guided_regex": REGEXES["email"]},
    {"guided_choice": CHOICES["sentiment"]},
    {"guided_choice": CHOICES["quotes_and_escapes"]},
    {"guided_grammar": GRAMMARS["key_value_ebnf"]},
    {"guided_grammar": GRAMMARS["greeting_lark"]},
    {"structural_tag": json.dumps(STRUCTURAL_TAGS["weather_tool"])},
    {"guided_json_object": True},
    {},
]


def test_fastdeploy_step_order_gives_valid_outputs(tokenizer):
    checker = schema_checker("xgrammar")
    specs, requests = [], []
    for index, fields in enumerate(MIXED):
        specs.append(parse_guided_request(fields))
        prompt = f"Request {index}: answer in the required format. " * (1 + index % 3)
        request = make_request(tokenizer, index, prompt, max_tokens=96, seed=index, **fields)
        admit(checker, request)
        requests.append(request)
    runner = MiniFastDeployRunner(fd_config(max_num_seqs=6), chunk_budget=24)
    try:
        runner.run(requests)
    finally:
        runner.close()
    finished = 0
    for fields, spec, request in zip(MIXED, specs, requests):
        assert request.error is None, (fields, request.error)
        if spec is None or request.finish_reason != "stop":
            continue
        finished += 1
        verdict = validate_output(spec, runner.text(request))
        assert verdict.valid, f"{fields} -> {runner.text(request)!r}: {verdict.reason}"
    assert finished >= 0.7 * (len(MIXED) - 1), [r.finish_reason for r in requests]


def test_chunked_prefill_is_unmasked_until_the_final_chunk_and_compiled_once(tokenizer):
    schema = {**SCHEMAS["person"], "title": "chunked-prefill"}  # a spec no other test compiles
    request = make_request(tokenizer, "long", "Describe one person as JSON please. " * 8, guided_json=schema, seed=3)
    admit(schema_checker("xgrammar"), request)
    runner = MiniFastDeployRunner(fd_config(max_num_seqs=2), chunk_budget=8)
    try:
        runner.run([request])
        metrics = runner.guided_backend.metrics
        chunk_steps = [row[0] for row in runner.prefill_rows if 0 in row]
        assert len(chunk_steps) >= 5
        assert all(allowed == VOCAB for allowed in chunk_steps)  # no mask before the final chunk
        first_sample = next(row[0] for row in runner.masked_rows if 0 in row)
        assert first_sample < 1000  # the final chunk's row is masked: '{' and little else
        # FastDeploy re-sends the request per chunk; every re-send found the compile, none recompiled.
        assert metrics.value("compile_requests_total") == len(chunk_steps) + 1
        assert metrics.value("cache_misses_total") == 1 and metrics.value("compile_seconds") == 1
        assert request.finish_reason == "stop"
        assert validate_output(parse_guided_request({"guided_json": schema}), runner.text(request)).valid
    finally:
        runner.close()


def test_preempted_request_resumes_in_another_slot_with_its_tokens_replayed(tokenizer):
    checker = schema_checker("xgrammar")
    schema = SCHEMAS["tool_call"]
    victim = make_request(tokenizer, "victim", "Call a tool as JSON.", guided_json=schema, seed=11, max_tokens=96)
    other = make_request(tokenizer, "other", "Pick one.", guided_choice=CHOICES["shared_prefix"], seed=2)
    admit(checker, victim)
    admit(checker, other)
    runner = MiniFastDeployRunner(fd_config(max_num_seqs=4), chunk_budget=4)
    try:
        runner.insert(victim, 0)
        while len(victim.output_token_ids) < 4:
            runner.step()
        assert victim.finish_reason is None
        generated_before = list(victim.output_token_ids)
        runner.preempt(0)
        runner.insert(other, 0)  # the freed slot serves another guided request at once
        for _ in range(3):
            runner.step()
        slot = runner.insert(victim, 2, resumed=True)  # re-prefilled in chunks of 4 tokens
        assert slot == 2
        for _ in range(400):
            if victim.finish_reason and other.finish_reason:
                break
            runner.step()
        assert victim.output_token_ids[: len(generated_before)] == generated_before
        assert victim.finish_reason == "stop", victim
        verdict = validate_output(parse_guided_request({"guided_json": schema}), runner.text(victim))
        assert verdict.valid, (runner.text(victim), verdict.reason)
        assert other.finish_reason == "stop" and runner.text(other) in CHOICES["shared_prefix"]
        assert runner.guided_backend.metrics.value("compile_seconds") == 2  # one compile per spec
    finally:
        runner.close()


# ----- FastDeploy faults, each pinned ----------------------------------------------------------

@pytest.mark.parametrize("flag", [True, "true", "True", 1])
def test_disable_any_whitespace_reaches_the_compiler(tokenizer, flag):
    config = fd_config(max_num_seqs=4, disable_any_whitespace=flag)
    assert guided_config_from_fd(config).any_whitespace is False
    checker = schema_checker("xgrammar", disable_any_whitespace=flag)
    names = ["person", "tool_call", "invoice", "array_of_objects"]
    requests = [make_request(tokenizer, n, f"{n} as JSON:", guided_json=SCHEMAS[n], seed=i, max_tokens=96) for i, n in enumerate(names)]
    for request in requests:
        admit(checker, request)
    runner = MiniFastDeployRunner(config)
    try:
        runner.run(requests)
    finally:
        runner.close()
    outputs = [runner.text(r) for r in requests if r.finish_reason == "stop"]
    assert len(outputs) >= 3
    for text in outputs:
        assert not whitespace_outside_strings(text), text


@pytest.mark.parametrize("flag, whitespace_allowed", [(False, True), ("false", True), (True, False), ("1", False)])
def test_whitespace_flag_decides_the_mask(tokenizer, flag, whitespace_allowed):
    config = fd_config(max_num_seqs=2, disable_any_whitespace=flag)
    backend = get_guided_backend(config, tokenizer=tokenizer)
    request = types.SimpleNamespace(guided_json=SCHEMAS["person"])
    admit(schema_checker("xgrammar", fd_config=config), request)
    processor = backend.get_logits_processor(schemata_key_of(request)).result()
    assert processor.accept_token(token_of(tokenizer, "{"))
    bitmask = processor.allocate_token_bitmask()
    processor.fill_token_bitmask(bitmask, 0)
    space = token_of(tokenizer, " ")
    assert bool((int(bitmask[0, space // 32]) >> (space % 32)) & 1) is whitespace_allowed
    backend.close()


def test_cli_strings_of_the_whitespace_flag_are_parsed():
    # FastDeploy's CLI flag is type=str: "false" must not become bool("false") == True.
    assert guided_config_from_fd(fd_config(disable_any_whitespace="false")).any_whitespace is True
    assert guided_config_from_fd(fd_config(disable_any_whitespace="true")).any_whitespace is False
    with pytest.raises(ValueError):
        guided_config_from_fd(fd_config(disable_any_whitespace="maybe"))


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.5}}}, "multipleOf"),
    ({"type": "object", "patternProperties": {"^a": {"type": "integer"}}}, "patternProperties"),
    ({"type": "array", "contains": {"const": 1}}, "contains"),
    ({"type": "object", "properties": {"r": {"type": "string", "format": "uri-template"}}}, "format"),
])
@pytest.mark.parametrize("as_text", [False, True], ids=["dict", "str"])
def test_unsupported_schema_is_refused_as_dict_and_as_str(schema, keyword, as_text):
    request = types.SimpleNamespace(guided_json=json.dumps(schema) if as_text else schema)
    _, error = schema_checker("xgrammar").schema_format(request)
    assert error is not None and keyword in error


@pytest.mark.parametrize("fields, fragment", [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_regex": "[z-a]"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice[1]"),
    ({"structural_tag": {"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}]}}, "triggers"),
    ({"structural_tag": "{not json"}, "malformed JSON"),
    ({"guided_json": "{not json"}, "malformed JSON"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "only one kind"),
])
def test_admission_validates_every_kind_and_returns_errors(fields, fragment):
    request = types.SimpleNamespace(**fields)
    returned, error = schema_checker("auto").schema_format(request)  # never raises
    assert returned is request and error is not None and fragment in error, error


def test_valid_regex_passes_admission_unchanged():
    request = types.SimpleNamespace(guided_regex=REGEXES["semver"])
    assert schema_checker("xgrammar").schema_format(request) == (request, None)
    assert request.guided_regex == REGEXES["semver"]


def test_tokens_the_host_forced_are_not_grammar_rejections(tokenizer, monkeypatch):
    # A scripted token bypasses the mask, as a token FastDeploy overwrites after sampling does:
    # the "\n</think>\n\n" thinking limit writes model_config.line_break_id. Named, it is not
    # fed to the matcher and the constraint holds.
    monkeypatch.setenv("FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR", "\n</think>\n\n")
    letter_a, newline = token_of(tokenizer, "a"), tokenizer.encode("\n")[0]
    request = make_request(tokenizer, "forced", "Letters:", guided_regex="[a-c]{6}", scripted_tokens=[letter_a, newline])
    admit(schema_checker("xgrammar"), request)
    config = fd_config(max_num_seqs=2)
    config.model_config.line_break_id = newline
    runner = MiniFastDeployRunner(config)
    try:
        runner.run([request])
        assert request.finish_reason == "stop" and request.error is None
        assert request.output_token_ids[:2] == [letter_a, newline]
        text = tokenizer.decode(request.output_token_ids[:1] + request.output_token_ids[2:])
        assert validate_output(parse_guided_request({"guided_regex": "[a-c]{6}"}), text).valid, text
        metrics = runner.guided_backend.metrics
        assert metrics.value("rejected_tokens_total") == 0 and metrics.value("out_of_mask_tokens_total") == 0
        assert metrics.labelled("host_forced_tokens_total") == {"line_break": 1}
    finally:
        runner.close()


@pytest.mark.parametrize("strategy", ["</think>", "\n</think>\n\n"])
def test_a_token_outside_the_mask_fastdeploy_does_not_force_fails_the_request(tokenizer, monkeypatch, strategy):
    # "z" (or, with the "</think>" strategy, a line break FastDeploy never writes) is outside the
    # grammar: the request ends with a visible error instead of an output that breaks it.
    monkeypatch.setenv("FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR", strategy)
    letter_a, newline = token_of(tokenizer, "a"), tokenizer.encode("\n")[0]
    stray = newline if strategy == "</think>" else token_of(tokenizer, "z")
    request = make_request(tokenizer, "stray", "Letters:", guided_regex="[a-c]{6}", scripted_tokens=[letter_a, stray])
    admit(schema_checker("xgrammar"), request)
    config = fd_config(max_num_seqs=2)
    config.model_config.line_break_id = newline
    runner = MiniFastDeployRunner(config)
    try:
        runner.run([request])
        assert request.finish_reason == "error"
        assert request.error == f"guided decoding: token {stray} outside the grammar at position 1"
        assert request.output_token_ids == [letter_a, stray]  # nothing after it: only EOS was allowed
        metrics = runner.guided_backend.metrics
        assert metrics.value("out_of_mask_tokens_total") == 1
        assert metrics.labelled("host_forced_tokens_total") == {}
    finally:
        runner.close()


def test_eos_the_host_forces_at_max_length_ends_the_slot_without_an_error(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    request = make_request(tokenizer, "cut", "Letters:", guided_regex="[a-c]{6}", scripted_tokens=[token_of(tokenizer, "a"), eos])
    admit(schema_checker("xgrammar"), request)
    runner = MiniFastDeployRunner(fd_config(max_num_seqs=2))
    try:
        runner.run([request])
        assert request.finish_reason == "stop" and request.error is None
        assert runner.guided_backend.metrics.value("rejected_tokens_total") == 0
        assert runner.guided_backend.metrics.labelled("host_forced_tokens_total") == {"stop": 1}
        assert runner.guided_decoding.manager.finish_of(0).reason == "forced"  # ended by the host, not failed
    finally:
        runner.close()


def test_a_compile_failure_fails_the_request_instead_of_a_none_processor(tokenizer):
    config = fd_config(max_num_seqs=2)
    backend = get_guided_backend(config, tokenizer=tokenizer)
    # Grammar syntax is judged by the engines' parsers, in the compile workers: it fails the future.
    for key in [("json", '{"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": true}'), ("xml", "<a/>"), ("regex", "("), ("grammar", "root ::= ")]:
        future = backend.get_logits_processor(key)
        with pytest.raises(InvalidGrammarError):
            future.result(timeout=10)
    backend.close()
    # Not admitted (FastDeploy's offline path skipped its checker): the worker refuses it.
    request = make_request(tokenizer, "bad", "Number:", guided_json='{"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": true}')
    runner = MiniFastDeployRunner(config)
    try:
        runner.run([request])
        assert request.finish_reason == "error" and request.output_token_ids == []
    finally:
        runner.close()


def test_logits_processor_has_fastdeploy_names_and_is_terminated_attribute(tokenizer):
    backend = get_guided_backend(fd_config(max_num_seqs=2), tokenizer=tokenizer)
    try:
        processor = backend._init_logits_processor(("regex", "(yes|no)"), enable_thinking=True)
        assert processor.is_terminated is False and processor.enable_reasoning is True
        bitmask = processor.allocate_token_bitmask()
        processor.fill_token_bitmask(bitmask, 1)
        allowed = {t for t in range(tokenizer.vocab_size) if (int(bitmask[1, t // 32]) >> (t % 32)) & 1}
        assert token_of(tokenizer, "yes") in allowed and token_of(tokenizer, "maybe") not in allowed
        assert processor.accept_token(token_of(tokenizer, "maybe")) is False
        assert processor.accept_token(token_of(tokenizer, "yes")) is True  # the rejection did not reset it
        assert processor.is_terminated is False
        assert processor.accept_token(tokenizer.eos_token_ids[0]) is True
        assert processor.is_terminated is True
        assert processor.accept_token(token_of(tokenizer, "no")) is False
        twin = processor.copy()
        assert twin.is_terminated is False and twin.enable_reasoning is True and twin.spec == processor.spec
        processor.reset()
        assert processor.is_terminated is False and processor.accept_token(token_of(tokenizer, "no"))
        assert backend.metrics.value("rejected_tokens_total") == 1
    finally:
        backend.close()


def test_engine_stop_ids_reach_the_backend(tokenizer):
    engine_stop = token_of(tokenizer, "END")
    backend = get_guided_backend(fd_config(max_num_seqs=2), tokenizer=tokenizer, stop_token_ids=[1, engine_stop])
    try:
        assert backend.stop_token_ids == [1, engine_stop]
        processor = backend._init_logits_processor(("regex", "ok"))
        assert processor.accept_token(token_of(tokenizer, "ok"))
        assert processor.accept_token(engine_stop) and processor.is_terminated is True
    finally:
        backend.close()


def test_reasoning_requests_are_constrained_after_think_end(tokenizer):
    think_end = tokenizer.think_end_id
    thinking = make_request(tokenizer, "think", "Choose:", guided_choice=["alpha", "beta"], enable_thinking=True,
                            scripted_tokens=tokenizer.encode("Let me think") + [think_end])
    direct = make_request(tokenizer, "direct", "Choose:", guided_choice=["alpha", "beta"], enable_thinking=False)
    checker = schema_checker("xgrammar")
    admit(checker, thinking)
    admit(checker, direct)
    runner = MiniFastDeployRunner(fd_config(max_num_seqs=2, reasoning_parser="deepseek_r1"))
    try:
        runner.run([thinking, direct])
        reasoning_steps = len(tokenizer.encode("Let me think")) + 1
        thinking_rows = [row[0] for row in runner.masked_rows if 0 in row]
        assert all(n == VOCAB for n in thinking_rows[:reasoning_steps])
        assert all(n < 100 for n in thinking_rows[reasoning_steps:])
        assert max(row[1] for row in runner.masked_rows if 1 in row) < 100
        assert runner.text(thinking) in ("alpha", "beta") and runner.text(direct) in ("alpha", "beta")
    finally:
        runner.close()


# ----- request normalisation --------------------------------------------------------------------

ROUND_TRIP = [
    {"guided_json": SCHEMAS["person"]},
    {"guided_json": SCHEMAS["person"], "disable_any_whitespace": True},
    {"guided_json": SCHEMAS["person"], "any_whitespace": True, "max_whitespace_cnt": 1, "separators": [", ", ": "]},
    {"guided_json": SCHEMAS["optional_props"], "guided_strict": False},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["tool_call"], "strict": False}}},
    {"guided_json_object": True},
    {"response_format": {"type": "json_object"}, "disable_any_whitespace": True},
    {"guided_regex": REGEXES["ipv4"]},
    {"guided_grammar": GRAMMARS["arithmetic_ebnf"]},
    {"guided_grammar": GRAMMARS["list_lark"]},
    {"structural_tag": STRUCTURAL_TAGS["weather_tool"], "disable_any_whitespace": True},
    {"guided_choice": CHOICES["unicode"]},
]


@pytest.mark.parametrize("fields", ROUND_TRIP, ids=lambda f: ",".join(sorted(f)))
def test_normalised_request_keeps_every_option_through_the_runner_key(fields):
    admission = GuidedConfig()
    expected = parse_guided_request(fields, admission)
    request = types.SimpleNamespace(**fields)
    admit(schema_checker("xgrammar", config=admission), request)
    key = schemata_key_of(request)
    assert key is not None and key[0] in ("json", "regex", "grammar", "structural_tag")
    admit(schema_checker("xgrammar", config=admission), request)  # checking twice is harmless
    assert schemata_key_of(request) == key
    # The worker's defaults differ on purpose: the request's own options must win.
    worker = GuidedConfig(any_whitespace=False, strict_mode=False)
    rebuilt = spec_from_schemata_key(key, worker)
    if expected.kind == "choice":
        assert rebuilt.kind == "ebnf"
        for choice in expected.choices:
            assert validate_output(rebuilt, choice).valid
    else:
        assert rebuilt == expected


def test_fastdeploy_style_json_object_key_means_any_object():
    spec = spec_from_schemata_key(("json", '{"type": "object"}'), GuidedConfig())
    assert spec.kind == "json_object"


# ----- registration -----------------------------------------------------------------------------

def test_register_is_idempotent_in_one_process():
    adapter.register()
    assert adapter.register() is False and adapter.register() is False
    assert adapter.is_registered()


def test_setup_declares_the_host_plugin_entry_point():
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as handle:
        text = handle.read()
    assert f'"{adapter.HOST_PLUGIN_GROUP}": [' in text
    assert '"fd_guided=fd_guided.integrations.fastdeploy:register"' in text
    assert adapter.register.__module__ == "fd_guided.integrations.fastdeploy.hooks"


HOST_FILES = {
    "fastdeploy/__init__.py": "",
    "fastdeploy/model_executor/__init__.py": "",
    "fastdeploy/model_executor/guided_decoding/__init__.py": '''
        def get_guided_backend(fd_config, **kwargs):
            return ("host backend", fd_config.structured_outputs_config.guided_decoding_backend)

        def schema_checker(backend_name, **kwargs):
            return ("host checker", backend_name)
        ''',
    "fastdeploy/model_executor/layers/__init__.py": "",
    "fastdeploy/model_executor/layers/sample/__init__.py": "",
    "fastdeploy/model_executor/layers/sample/sampler.py": '''
        class GuidedDecoding:
            def __init__(self, fd_config):
                self.fd_config = fd_config

        class Sampler:
            def __init__(self, fd_config=None):
                self.guided_decoding = GuidedDecoding(fd_config)
        ''',
    "fd_guided_plugin-0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: fd-guided-plugin\nVersion: 0.0\n",
    "fd_guided_plugin-0.0.dist-info/entry_points.txt": f"[{adapter.HOST_PLUGIN_GROUP}]\nfd_guided = fd_guided.integrations.fastdeploy:register\n",
}

HOST_SCRIPT = '''
import json
from importlib.metadata import entry_points
from types import SimpleNamespace as NS

def load_plugins_by_group(group):  # FastDeploy's loader, called once per process part
    return {ep.name: ep.load() for ep in entry_points(group=group)}

results = [func() for _ in range(2) for func in load_plugins_by_group("%s").values()]
from fastdeploy.model_executor import guided_decoding
from fastdeploy.model_executor.layers.sample.sampler import Sampler
import fd_guided.integrations.fastdeploy as adapter

def config(name):
    return NS(structured_outputs_config=NS(guided_decoding_backend=name, disable_any_whitespace=None, reasoning_parser=None),
              model_config=NS(model="deepseek", vocab_size=129280), scheduler_config=NS(max_num_seqs=4))

ours = guided_decoding.get_guided_backend(config("guidance"))
print(json.dumps({
    "results": results,
    "wrapped_once": not getattr(guided_decoding.get_guided_backend.__wrapped__, "__fd_guided_hook__", False),
    "backend_ours": isinstance(ours, adapter.FDGuidedBackend) and ours.config.backend == "llguidance",
    "backend_other": list(guided_decoding.get_guided_backend(config("off"))),
    "checker_ours": isinstance(guided_decoding.schema_checker("auto"), adapter.SchemaChecker),
    "checker_other": list(guided_decoding.schema_checker("no-such-backend")),
    "sampler_ours": type(Sampler(config("xgrammar")).guided_decoding).__module__,
}))
'''


def test_entry_point_registers_into_a_fastdeploy_layout_host_once(tmp_path):
    for relative, content in HOST_FILES.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    script = HOST_SCRIPT % adapter.HOST_PLUGIN_GROUP
    completed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["results"] == [True, False]
    assert report["wrapped_once"] and report["backend_ours"] and report["checker_ours"]
    assert report["backend_other"] == ["host backend", "off"]
    assert report["checker_other"] == ["host checker", "no-such-backend"]
    assert report["sampler_ours"] == "fd_guided.integrations.fastdeploy.sampler"


def test_guided_decoding_refuses_a_second_backend(tokenizer):
    config = fd_config(max_num_seqs=2)
    first, second = (get_guided_backend(config, tokenizer=tokenizer) for _ in range(2))
    decoding = GuidedDecoding(config, backend=first)
    with pytest.raises(SlotStateError):
        decoding.add_logits_processor(0, second.get_logits_processor(("regex", "a")))
    decoding.close()
    first.close()
    second.close()


def test_mtp_draft_rows_follow_fastdeploys_speculative_layout():
    import numpy as np

    from fd_guided.integrations.fastdeploy.mtp import draft_rows

    lens, encoder = np.array([3, 0, 1, 2]), np.array([0, 0, 7, 0])  # slot 2 prefills: one row
    assert draft_rows(lens, encoder, 6) == {0: 2, 2: 3, 3: 5}        # a request's draft: its last row
    assert draft_rows(np.array([1, 0, 1]), np.zeros(3), 2) == {0: 0, 2: 1}  # later substeps: one row each
    assert draft_rows(lens, encoder, 4) is None                        # no known layout: left unmasked
