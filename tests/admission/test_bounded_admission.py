"""Admission bounded on the caller's thread (issue #22): the deadline, the checks it leaves to the
compile worker, and their verdicts reaching the client and admission's cache.

Deterministic: a budget of 0 leaves every check that is not bounded by construction to later, and
the verdicts reached then are compared with those of admission deciding everything inline. The
time bound itself is measured by tools/admission_latency.py, not asserted here.
"""

import dataclasses
import pickle

import pytest
from corpus import SCHEMAS
from guided_helpers import VOCAB, add_ready, in_process_backend
from isolated import run_isolated

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.admission import cache, deferred
from fd_guided.compile import worker
from fd_guided.compile.transfer import CompileHere
from fd_guided.errors import error_class
from fd_guided.manager import GuidedDecodingManager
from fd_guided.registry import create_backend, get_backend_class
from fd_guided.schema import deadline
from fd_guided.spec import check_with_backend
from fd_guided.tokenizer import load_tokenizer

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_admission_caches")]

NO_BUDGET = GuidedConfig(admission_budget_s=0.0)
INLINE = GuidedConfig(admission_budget_s=None)
BAD_TYPE = {"guided_json": {"type": "object", "properties": {"name": {"type": "strin"}}}}
DANGLING = {"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}
GOOD = {"guided_json": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}}}
BAD_GRAMMAR = {"guided_grammar": 'root ::= item+\nitem ::= ("a" | '}
BAD_LARK = {"guided_grammar": 'start: item+\nitem: "a" |\n'}
MANY_RULES = {
    "guided_grammar": "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(10_001)) + 'r10001 ::= "a"\n'
}
GOOD_GRAMMAR = {"guided_grammar": 'root ::= "a" digits\ndigits ::= [0-9]+\n'}
BAD_REGEX = {"guided_regex": "[a-z]+(@[a-z]+"}
NESTED_REGEX = {"guided_regex": "(" * 101 + "a" + ")" * 101}
GOOD_REGEX = {"guided_regex": "[a-z]{2,8}@[a-z]+\\.com"}


def test_the_deadline_stops_only_past_its_time_and_only_where_it_is_set():
    deadline.checkpoint()  # no deadline: never raises
    with deadline.within(0.0):
        with pytest.raises(deadline.Overrun):
            deadline.checkpoint()
        with deadline.unbounded():
            deadline.checkpoint()
    with deadline.within(60.0):
        deadline.checkpoint()
        deadline.afford(1.0)
        with pytest.raises(deadline.Overrun):
            deadline.afford(120.0)  # a step that cannot stop itself and would not end in time
        with deadline.within(0.0), pytest.raises(deadline.Overrun):
            deadline.checkpoint()  # nested: the earlier deadline wins
        deadline.checkpoint()  # the outer one again
    with deadline.within(None):
        deadline.checkpoint()
    deadline.checkpoint()


def test_building_a_long_patterns_automaton_stops_at_the_deadline():
    """The NFA of a long pattern (a format's, repeated) is thousands of states built before any
    step is spent: `uri`'s beside a pattern held admission 5.5 ms past its budget."""
    from fd_guided.schema.automaton import Alphabet, Work, _Nfa

    tree = ("rep", 3000, 3000, ("set", ((0x61, 0x7A),)))
    nfa = _Nfa(Alphabet([tree]), Work())
    with deadline.within(0.0), pytest.raises(deadline.Overrun):
        nfa.build(tree)
    assert len(nfa.moves) <= 64  # stopped at the first checkpoint, not at the end
    whole = _Nfa(Alphabet([tree]), Work())
    whole.build(tree)  # no deadline: built to the end
    assert len(whole.moves) > 3000


def test_with_no_budget_the_schema_checks_are_pending_and_run_before_the_schema_is_read():
    spec = parse_guided_request(BAD_TYPE, NO_BUDGET)
    assert spec is not None and spec.pending is not None and not spec.pending.checked
    unmarked = dataclasses.replace(spec, pending=None)
    assert spec == unmarked and hash(spec) == hash(unmarked)  # one spec, one compiled grammar, pending or not
    with pytest.raises(InvalidGrammarError) as refused:
        _ = spec.schema
    assert refused.value.part == "guided_json.properties.name.type"
    assert "not a valid JSON schema" in str(refused.value)
    # Remembered on the spec admission caches: the next identical request is refused at admission.
    with pytest.raises(InvalidGrammarError, match="not a valid JSON schema") as again:
        parse_guided_request(BAD_TYPE, NO_BUDGET)
    assert again.value.part == "guided_json.properties.name.type"


def test_inline_admission_decides_everything_at_once():
    with pytest.raises(InvalidGrammarError, match="not a valid JSON schema"):
        parse_guided_request(BAD_TYPE, INLINE)
    spec = parse_guided_request(GOOD, INLINE)
    assert spec is not None and spec.pending is None


def test_a_pending_spec_is_never_compiled_unchecked():
    spec = parse_guided_request(DANGLING, NO_BUDGET)
    assert spec is not None and spec.pending is not None
    with pytest.raises(InvalidGrammarError, match="does not resolve inside the schema") as refused:
        in_process_backend("llguidance").compile_checked(spec)
    assert refused.value.part == "guided_json.properties.a.$ref"


def test_the_worker_refuses_a_pending_spec_and_the_serving_process_remembers_it():
    spec = parse_guided_request(DANGLING, NO_BUDGET)
    sent = pickle.loads(pickle.dumps(spec))  # what a compile worker receives
    assert sent.pending is not None and not sent.pending.checked
    status, class_name, message, part, feature = worker._compile(in_process_backend("llguidance"), "llguidance", sent)
    assert status == "error" and message.startswith(deferred.DEFERRED_TAG)
    received = error_class(class_name)(message, part=part, feature=feature)  # as the pool rebuilds it
    error, was_deferred = deferred.learned(spec, received)
    assert was_deferred
    assert deferred.DEFERRED_TAG not in str(error)
    assert str(error).startswith("guided_json.properties.a.$ref: reference '#/$defs/missing' does not resolve")
    with pytest.raises(InvalidGrammarError, match="does not resolve") as again:
        parse_guided_request(DANGLING, NO_BUDGET)
    assert again.value.part == "guided_json.properties.a.$ref"


def test_the_worker_compiles_a_pending_spec_whose_checks_pass():
    spec = parse_guided_request(GOOD, NO_BUDGET)
    sent = pickle.loads(pickle.dumps(spec))
    outcome = worker._compile(in_process_backend("llguidance"), "llguidance", sent)
    assert outcome[0] == "ok" and isinstance(outcome[1], bytes)
    error, was_deferred = deferred.learned(spec, InvalidGrammarError("rejected by llguidance: x", part="guided_json"))
    assert not was_deferred and str(error) == "guided_json: rejected by llguidance: x"  # other errors pass as they are


def test_the_engine_check_runs_in_the_worker_when_admission_left_it():
    # Meta-valid, so the schema checks pass; xgrammar's own check refuses `contains` on long arrays.
    fields = {"guided_json": {"type": "array", "contains": {"type": "integer"}, "minContains": 2}}
    with pytest.raises(InvalidGrammarError) as inline:
        parse_guided_request(fields, INLINE.replace(backend="xgrammar"))
    cache.PARSED.clear()
    cache.CHECKED.clear()
    spec = parse_guided_request(fields, NO_BUDGET.replace(backend="xgrammar"))  # check left to the worker
    assert spec is not None
    sent = pickle.loads(pickle.dumps(spec))
    status, _, message, part, feature = worker._compile(in_process_backend("xgrammar"), "xgrammar", sent)
    assert status == "error" and not message.startswith(deferred.DEFERRED_TAG)  # an engine's refusal, not admission's
    assert (part, feature) == (inline.value.part, inline.value.feature) and feature


def _worker_outcome(spec, engine: str = "llguidance") -> tuple:
    """What a compile worker answers for `spec` (pickled to it, as the pool sends it)."""
    sent = pickle.loads(pickle.dumps(spec))
    assert sent.pending is not None and not sent.pending.checked
    return worker._compile(in_process_backend(engine), engine, sent)


@pytest.mark.parametrize(
    "fields",
    [BAD_GRAMMAR, BAD_LARK, MANY_RULES, BAD_REGEX, NESTED_REGEX],
    ids=["ebnf_syntax", "lark_syntax", "rules", "regex_syntax", "regex_nesting"],
)
def test_a_grammar_left_to_the_worker_is_refused_there_as_inline_and_then_at_admission(fields):
    with pytest.raises(InvalidGrammarError) as inline:
        parse_guided_request(fields, INLINE)
    cache.PARSED.clear()
    spec = parse_guided_request(fields, NO_BUDGET)  # syntax and bounds: no time for them here
    assert spec is not None and spec.pending is not None
    status, class_name, message, part, feature = _worker_outcome(spec)
    assert status == "error" and message.startswith(deferred.DEFERRED_TAG)
    error, was_deferred = deferred.learned(spec, error_class(class_name)(message, part=part, feature=feature))
    assert was_deferred and str(error) == str(inline.value) and error.feature == inline.value.feature
    assert error.part == next(iter(fields))
    with pytest.raises(InvalidGrammarError) as again:
        parse_guided_request(fields, NO_BUDGET)
    assert str(again.value) == str(inline.value)


@pytest.mark.parametrize("fields", [GOOD_GRAMMAR, GOOD_REGEX], ids=["grammar", "regex"])
def test_a_good_grammar_left_to_the_worker_compiles_there(fields):
    spec = parse_guided_request(fields, NO_BUDGET)
    assert spec is not None and spec.pending is not None
    check_with_backend(get_backend_class("auto"), spec)  # the engine check waits for the syntax check
    assert not cache.CHECKED.known((get_backend_class("auto"), spec))
    for engine in ("llguidance", "xgrammar"):
        outcome = _worker_outcome(spec, engine)
        # The grammar's bytes, or word to compile it again here (`fd_guided.compile.transfer`).
        assert outcome[0] == "ok" and isinstance(outcome[1], (bytes, CompileHere)), outcome
    assert parse_guided_request(fields, INLINE).pending is None  # decided at once when there is time


def test_thread_isolation_runs_the_grammar_checks_admission_left_before_compiling():
    from fd_guided.compile.threads import ThreadCompileRunner

    spec = parse_guided_request(BAD_GRAMMAR, NO_BUDGET)
    assert spec is not None and spec.pending is not None
    runner = ThreadCompileRunner(in_process_backend("llguidance"), workers=1, timeout_s=60)
    with pytest.raises(InvalidGrammarError, match="EBNF syntax error at line 2") as refused:
        runner.submit("llguidance", spec).result(timeout=60)
    assert refused.value.part == "guided_grammar"
    with pytest.raises(InvalidGrammarError, match="EBNF syntax error at line 2"):
        parse_guided_request(BAD_GRAMMAR, NO_BUDGET)  # remembered on the spec admission holds


def _eventual_verdict(fields: dict, config: GuidedConfig) -> tuple[str, str]:
    """What a client finally learns: admission's verdict, then the checks left to the worker."""
    try:
        spec = parse_guided_request(fields, config)
        if spec is not None:
            deferred.finish_deferred_checks(spec)
            check_with_backend(get_backend_class(config.backend), spec)  # no deadline now
    except InvalidGrammarError as error:
        return type(error).__name__, str(error)
    return "admitted", ""


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_deferred_verdicts_are_those_of_inline_admission_on_the_corpus(name):
    fields = {"guided_json": SCHEMAS[name]}
    inline = _eventual_verdict(fields, INLINE)
    cache.PARSED.clear()
    cache.CHECKED.clear()
    assert _eventual_verdict(fields, NO_BUDGET) == inline


def test_every_hostile_input_is_refused_at_admission_or_by_the_checks_left_to_the_worker():
    """The hostile sets with no budget: each refusal is the one inline admission gives (one child
    interpreter: admission runs native code too)."""
    verdicts = run_isolated("""
        import json, sys
        sys.path[:0] = ["tests", "tests/admission", "tests/schema", "tests/admission"]
        from test_hostile_inputs import HOSTILE
        from test_hostile_schemas import HOSTILE as SCHEMAS
        from test_bounded_admission import INLINE, NO_BUDGET, _eventual_verdict
        from fd_guided.admission import cache
        cases = {name: fields for name, (fields, _) in HOSTILE.items() if isinstance(fields, dict)}
        cases.update({name: {"guided_json": schema, "guided_strict": False} for name, schema in SCHEMAS.items()})
        out = {}
        for name, fields in cases.items():
            row = []
            for config in (INLINE, NO_BUDGET):
                cache.PARSED.clear()
                cache.CHECKED.clear()
                row.append(list(_eventual_verdict(fields, config)))
            out[name] = row
        print(json.dumps(out))
    """)
    assert len(verdicts) >= 20
    for name, (inline, bounded) in verdicts.items():
        assert bounded == inline, (name, inline, bounded)


def serve_one_deferred_refusal(bad_request: dict, good_request: dict):
    """Admit a bad request (left undecided by a zero budget) beside a good one, serve one step of
    both, and return the manager and the bad request's finish; the good row must stay constrained."""
    manager = GuidedDecodingManager(
        create_backend("auto", load_tokenizer("deepseek"), vocab_size=VOCAB, config=NO_BUDGET), max_num_seqs=4
    )
    try:
        bad, good = manager.validate(bad_request), manager.validate(good_request)
        assert bad is not None and bad.pending is not None and good is not None
        add_ready(manager, 0, bad, prefill_done=True)
        add_ready(manager, 1, good, prefill_done=True)
        manager.begin_step([0, 1])
        import paddle

        logits = paddle.zeros([2, VOCAB], dtype="float32")
        manager.apply(logits)
        failed = [f for f in manager.accept([1, 1]) if f.slot == 0]
        assert [f.reason for f in failed] == ["error"]
        assert 0 < int(paddle.isfinite(logits[1]).sum()) < VOCAB  # the other request stayed constrained
    except BaseException:
        manager.close()
        raise
    return manager, failed[0]


def test_a_deferred_refusal_reaches_the_host_through_the_manager_and_is_then_refused_at_admission():
    manager, failed = serve_one_deferred_refusal(BAD_TYPE, GOOD)  # not decided at admission: no time
    try:
        assert "guided_json.properties.name.type" in failed.error
        assert "not a valid JSON schema" in failed.error
        with pytest.raises(InvalidGrammarError, match="not a valid JSON schema") as again:
            manager.validate(BAD_TYPE)
        assert again.value.part == "guided_json.properties.name.type"
    finally:
        manager.close()


def test_a_grammar_refused_in_the_worker_fails_its_request_alone_and_is_counted():
    manager, failed = serve_one_deferred_refusal(BAD_GRAMMAR, GOOD_GRAMMAR)
    try:
        assert "guided_grammar" in failed.error and "EBNF syntax error at line 2" in failed.error
        assert manager.metrics.value("deferred_admission_refusals_total") >= 1
        with pytest.raises(InvalidGrammarError, match="EBNF syntax error at line 2"):
            manager.validate(BAD_GRAMMAR)
    finally:
        manager.close()


def test_fastdeploys_checker_leaves_heavy_checks_to_the_runner_and_never_reads_the_schema_itself():
    from fd_guided.integrations.fastdeploy.admission import SchemaChecker, schemata_key_of, spec_from_schemata_key

    request = {"guided_json": BAD_TYPE["guided_json"]}
    _, message = SchemaChecker(NO_BUDGET, defer_backend_check=False).schema_format(request)
    assert message is None  # not decided on the engine's thread
    key = schemata_key_of(request)
    cache.PARSED.clear()  # the runner is another process
    spec = spec_from_schemata_key(key, NO_BUDGET)
    assert spec.pending is not None
    with pytest.raises(InvalidGrammarError, match="not a valid JSON schema") as refused:
        in_process_backend("llguidance").compile_checked(spec)
    assert refused.value.part == "guided_json.properties.name.type"


LONG_PATTERN = "(?:ab|cd)" * 6_000  # 54,000 characters: ~0.3 s of re's parser, which cannot stop itself


@pytest.mark.parametrize(
    "pattern, refusal",
    [(LONG_PATTERN, None), (LONG_PATTERN + "(a{1000}){1000}", "counted repetitions expand")],
)
def test_a_schema_regex_that_would_not_end_in_time_is_left_to_the_worker_with_the_inline_verdict(pattern, refusal):
    """The walks' per-byte estimate fits the budget; the regex's own check (``re``'s parser, ~6 us a
    character) does not, so it is never started on the caller's thread."""
    fields = {"guided_json": {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}}
    spec = parse_guided_request(fields, GuidedConfig(admission_budget_s=0.2))
    assert spec is not None and spec.pending is not None and not spec.pending.checked
    if refusal is None:
        assert spec.schema["properties"]["code"]["pattern"] == pattern  # admission's checks ran, and passed
        assert spec.pending.checked
        return
    with pytest.raises(InvalidGrammarError, match=refusal) as later:
        _ = spec.schema
    cache.PARSED.clear()
    cache.CHECKED.clear()
    with pytest.raises(InvalidGrammarError, match=refusal) as inline:
        parse_guided_request(fields, INLINE)
    assert str(later.value) == str(inline.value) and later.value.part == "guided_json.properties.code.pattern"
