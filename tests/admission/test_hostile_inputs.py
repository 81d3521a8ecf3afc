"""Hostile, malformed and runaway constraints: typed errors, no crash, no stall, the batch goes on.

Each engine-level case runs in a fresh interpreter (`tests.isolated`): a native crash fails the
test instead of the suite. Outputs that finish are validated with jsonschema (formats on).
"""
import pytest

from fd_guided import InvalidGrammarError, parse_guided_request

from isolated import run_isolated

pytestmark = pytest.mark.cpu


def _ref_chain(links: int) -> dict:
    defs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(links)}
    defs[f"a{links}"] = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


# name -> (request fields, words the error must contain)
HOSTILE = {
    "ref_chain_3000": ({"guided_json": _ref_chain(3000)}, "$ref chains"),
    "lark_chain_3000": ({"guided_grammar": "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(3000)) + "r3000: /a(?=b)/\n"}, "rule chains"),
    "ebnf_rules_20000": ({"guided_grammar": "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(20000)) + 'r20000 ::= "a"\n'}, "rules"),
    "choices_100k": ({"guided_choice": [f"w{i}" for i in range(100_000)]}, "choices"),
    "non_utf8_bytes": ({"guided_json": b'{"type": "string", "pattern": "\xff\xfe"}'}, "UTF-8"),
    "nested_groups_500": ({"guided_json": {"type": "string", "pattern": "(" * 500 + "a" + ")" * 500}}, "nested"),
    "bytes_key": ({"guided_json": {"type": "object", "properties": {b"a": {"type": "string"}}}}, "keys must be strings"),
    "set_value": ({"guided_json": {"type": "object", "required": {"a"}}}, "not a JSON value"),
    "tuple_key": ({"guided_json": {"type": "object", "properties": {("a",): {}}}}, "keys must be strings"),
    "json_100000_deep": ({"guided_json": "[" * 100_000 + "]" * 100_000}, "nested"),
    "repetition_bomb": ({"guided_regex": "(a{1000}){1000}"}, "repetitions"),
    "nan_bound": ({"guided_json": {"type": "number", "maximum": float("nan")}}, "not a JSON number"),
    "lone_surrogate": ({"guided_regex": "a\ud800b"}, "Unicode"),
    "pattern_properties_8000": ({"guided_json": {"type": "object", "patternProperties": {
        f"^p{i}_[a-z]+$": {"type": "string", "description": "x" * 20} for i in range(8000)}}}, "regexes"),
    "schema_over_1mb": ({"guided_json": {"type": "object", "properties": {
        f"field_{i}": {"type": "string", "description": "d" * 80} for i in range(9000)}}}, "bytes"),
    "unclosed_regex": ({"guided_regex": "(unclosed"}, "regular expression"),
    # errors at the end of the largest texts: finding them is ~0.3-1 s of pure Python
    "regex_63k_unclosed": ({"guided_regex": "(?:ab|cd)" * 7000 + "(x"}, "regular expression"),
    "ebnf_9000_rules_unclosed": ({"guided_grammar": "root ::= r0\n" + "".join(
        f"r{i} ::= r{i + 1} | \"x\"\n" for i in range(9000)) + 'r9000 ::= ("a" | \n'}, "syntax error at line 9002"),
    "fields_not_a_mapping": (["guided_json"], "mapping"),
    # minItems past a finite uniqueItems domain: enumerating the unique arrays walked every
    # permutation of the 29 values (it never ended) before it learned none is long enough
    # a look-ahead whose automaton would grow past its bounds: refused within a step budget
    "lookahead_automaton": ({"guided_json": {"type": "string", "pattern": r"^(?![\s\S]{0,1000}x)"}}, "look-ahead"),
    # overlapping patternProperties whose regions would need a huge automaton: refused, not computed
    "pattern_regions_automaton": ({"guided_json": {"type": "object", "patternProperties": {
        "a.{0,200}b": {}, "b.{0,200}a": {}, ".{0,100}c{50}": {}, "(x|y){30}z": {}}}}, "patternProperties whose patterns overlap"),
    "unique_min_past_domain": ({"guided_json": {"type": "array", "uniqueItems": True, "minItems": 30,
                                                "items": {"enum": [f"v{i}" for i in range(29)]}}}, "admits no value"),
}


@pytest.fixture(scope="module")
def admission_verdicts():
    """Every hostile case through admission, all in one child interpreter (admission runs native
    code too: jsonschema-rs): name -> (exception type, message)."""
    return run_isolated("""
        import json, sys
        sys.path[:0] = ["tests", "tests/admission"]
        from test_hostile_inputs import HOSTILE
        from fd_guided import parse_guided_request
        verdicts = {}
        for name, (fields, _) in HOSTILE.items():
            try:
                parse_guided_request(fields)
                verdicts[name] = ["admitted", ""]
            except BaseException as error:
                verdicts[name] = [type(error).__name__, str(error)]
        print(json.dumps(verdicts))
    """)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_admission_refuses_with_a_typed_error_naming_the_problem(name, admission_verdicts):
    kind, message = admission_verdicts[name]
    assert kind == "InvalidGrammarError", (kind, message)
    assert HOSTILE[name][1] in message, message


def test_admission_errors_are_invalid_grammar_errors_in_process_too():
    # The same path in this process, for the cases native code never sees (typed, not a crash).
    for name in ("bytes_key", "set_value", "nan_bound", "lone_surrogate", "fields_not_a_mapping"):
        with pytest.raises(InvalidGrammarError):
            parse_guided_request(HOSTILE[name][0])


def test_hostile_requests_fail_alone_in_a_batch_that_goes_on():
    """The whole path, in a child process: admission, compile workers, decoding, validation."""
    result = run_isolated("""
        import json, sys
        sys.path[:0] = ["tests", "tests/admission"]
        from test_hostile_inputs import HOSTILE
        from fd_guided.harness.validate import validate_output
        from fd_guided.harness.engine import ReferenceEngine
        good = {"prompt": "ok?", "guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
                "disable_any_whitespace": True}
        unsat = [{"prompt": "x", "guided_json": {"$ref": "#"}},
                 {"prompt": "x", "guided_json": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}},
                 {"prompt": "x", "guided_regex": "[^\\\\s\\\\S]"}]
        requests = [good] + [{"prompt": "x", **fields} if isinstance(fields, dict) else fields for fields, _ in HOSTILE.values()] + unsat + [good]
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=8)
        results = engine.generate(requests, max_tokens=24)
        engine.close()
        rows = [{"reason": r.finish_reason, "error": r.error,
                 "valid": validate_output(r.spec, r.text).valid if r.spec is not None and r.finish_reason == "stop" else None}
                for r in results]
        print(json.dumps(rows))
    """, timeout_s=300)
    first_good, last_good = result[0], result[-1]
    hostile = result[1:-1]
    assert first_good["reason"] in ("stop", "length") and first_good["valid"] in (True, None), first_good
    assert last_good["reason"] in ("stop", "length") and last_good["valid"] in (True, None), last_good
    for row in hostile:
        # Either refused with a message, or (the unsatisfiable ones an engine may still admit) finished
        # with an error while decoding: never a "stop" with an invalid output.
        assert row["reason"] == "error" and row["error"], row
    assert all(row["valid"] is not False for row in result)


def test_a_good_request_behind_four_compile_bombs_is_served_first():
    result = run_isolated("""
        import json
        from fd_guided import GuidedConfig
        from fd_guided.limits import AdmissionLimits
        from fd_guided.harness.validate import validate_output
        from fd_guided.harness.engine import ReferenceEngine
        config = GuidedConfig(compile_timeout_s=6.0)
        bombs = [{"prompt": "pick", "guided_choice": [f"b{b}w{i}x{i * 7919 % 100003}" for i in range(20000)]} for b in range(4)]
        good = {"prompt": "ok?", "guided_regex": "(yes|no)"}
        engine = ReferenceEngine.default(preset="tiny", max_num_seqs=8, guided_config=config)
        engine.generate([{"prompt": "warm", "guided_regex": "[a-z]"}], max_tokens=2)  # workers up
        results = engine.generate(bombs + [good], max_tokens=8)
        engine.close()
        print(json.dumps([{"reason": r.finish_reason, "ttft": r.ttft_seconds, "error": r.error,
                           "valid": validate_output(r.spec, r.text).valid if r.finish_reason == "stop" else None} for r in results]))
    """, timeout_s=300)
    *bombs, good = result
    assert good["reason"] == "stop" and good["valid"], good
    # Its first token came before any bomb's: it did not queue behind their compiles.
    assert all(b["ttft"] is None or good["ttft"] < b["ttft"] for b in bombs), result
    assert all(b["reason"] in ("stop", "length", "error") and b["valid"] is not False for b in bombs), bombs


def test_admission_never_fetches_a_meta_schema_it_does_not_know():
    """A ``$schema`` naming a URL is not retrieved (jsonschema-rs would fetch it over HTTP, from
    the caller's thread): a local server sees no connection, and the verdict is `jsonschema`'s."""
    import socket
    import threading

    from fd_guided import GuidedConfig

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connections: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:  # the timeout, or the socket closed
                continue
            connections.append(connection.recv(200))
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    try:
        for uri in (f"http://127.0.0.1:{port}/meta.json#", f"http://127.0.0.1:{port}/draft-03/schema#"):
            fields = {"guided_json": {"$schema": uri, "type": "object"}}
            try:
                parse_guided_request(fields, GuidedConfig(admission_budget_s=None))
            except InvalidGrammarError:
                pass
    finally:
        stop.set()
        thread.join(2)
        server.close()
    assert connections == []
