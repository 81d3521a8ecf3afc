"""Grammar syntax at admission: errors named by line and column on every admission path, no valid
grammar refused (differential against the engines' own parsers), and a pass linear in the text."""

from __future__ import annotations

import random
import time

import pytest
import xgrammar as xgr
from llguidance import LLMatcher

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.admission.fields import grammar_is_lark
from fd_guided.admission.syntax import check_syntax
from fd_guided.integrations.fastdeploy.admission import SchemaChecker

ISSUE_CASES = [
    ('root ::= ("a" | ', "line 1, column 10"),
    ('start: "a" |', "line 1, column 12"),
    ('start: x\nx: "a" | "b" |\n', "line 2, column 14"),
    ('root ::= "a" | b\nb ::= [0-9', "line 2, column 7"),
    ('root ::= "a\n', "line 1, column 10"),
    ('root ::= ( | "a")', "line 1, column 12"),
    ('root ::= * "a"', "line 1, column 10"),
    ('root ::= "a")', "line 1, column 13"),
    ("root ::= x", "line 1, column 10"),
    ('a ::= "x"', "line 1, column 1"),
    ("start: /ab+/ | (\n", "line 1, column 16"),
]

VALID = [
    'root ::= "a" | "b"',
    "root ::= ()",
    'root ::= "" | "a"',
    'root ::= item ("," item)*\nitem ::= [a-z]+ | "\\"" [^"]* "\\""  # comment\n',
    'root ::= "a"{2,3} b?\nb ::= [0-9]+',
    'root ::= x.y\nx.y ::= "a"',
    'root ::= TagDispatch(("<a>", root))',
    'root ::= "a" (= "b")',
    'start: "a" | "b"',
    'start: item ("," item)*\nitem: /[a-z]+/i -> word\n    | NUMBER\nNUMBER: /[0-9]+/\n',
    "?start: value\nvalue: \"a\"i | 'b' | [value]\n// comment\n",
    'start: %json {"type": "object"}',
    'start: x\n%import common.WS\n%ignore WS\nx: "a"',
    'start: "a" <|im_end|>',
    'start: ( | "a")',
    'start: A\nA.2: "x"',
]


@pytest.mark.parametrize("grammar, position", ISSUE_CASES)
def test_syntax_errors_are_refused_at_admission_naming_the_position(grammar, position):
    with pytest.raises(InvalidGrammarError) as refused:
        parse_guided_request({"guided_grammar": grammar}, check_backend=False)
    assert refused.value.part == "guided_grammar" and refused.value.feature is None
    assert position in str(refused.value), str(refused.value)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_every_admission_path_refuses_the_issue_grammars(backend):
    config = GuidedConfig(backend=backend)
    checker = SchemaChecker(config)
    for grammar in ('root ::= ("a" | ', 'start: "a" |'):
        with pytest.raises(InvalidGrammarError, match="column"):
            parse_guided_request({"guided_grammar": grammar}, config)
        request = {"guided_grammar": grammar}
        _, message = checker.schema_format(request)
        assert message is not None and "column" in message and getattr(message, "http_status", None) == 400


@pytest.mark.parametrize("grammar", VALID)
def test_valid_grammars_are_admitted(grammar):
    spec = parse_guided_request({"guided_grammar": grammar}, check_backend=False)
    assert spec is not None and spec.source == grammar


def test_structural_tags_are_checked_inside():
    def tag(content):
        return {"structural_tag": {"format": {"type": "tag", "begin": "<a>", "content": content, "end": "</a>"}}}

    for content, part in [
        ({"type": "grammar", "grammar": 'root ::= ("a" | '}, "content.grammar"),
        ({"type": "regex", "pattern": "(ab"}, "content.pattern"),
        ({"type": "json_schema", "json_schema": {"type": "objectx"}}, "content.json_schema"),
    ]:
        with pytest.raises(InvalidGrammarError) as refused:
            parse_guided_request(tag(content), check_backend=False)
        assert refused.value.part.startswith(f"structural_tag.format.{part}"), refused.value.part
    assert parse_guided_request(tag({"type": "grammar", "grammar": 'root ::= "x"'}), check_backend=False)
    assert parse_guided_request(tag({"type": "regex", "pattern": r"\p{L}+"}), check_backend=False)  # Rust's syntax


def _engine_accepts(grammar: str, lark: bool) -> bool:
    if lark:
        try:
            if not LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_lark(grammar))[0]:
                return True
        except Exception:  # noqa: BLE001 - the engine's refusal, whatever its type
            pass
        try:
            xgr.Grammar.from_lark(grammar)
            return True
        except Exception:  # noqa: BLE001
            return False
    try:
        xgr.Grammar.from_ebnf(grammar)
        return True
    except Exception:  # noqa: BLE001
        return False


def test_no_grammar_an_engine_reads_is_refused():
    """Differential: valid grammars and ~2,000 mutants of them (deletions, insertions, truncations).
    Whatever this pass refuses, the engines' own parsers refuse too (xgrammar's for EBNF; for Lark,
    both llguidance's and xgrammar's), except the one deliberate rule: a Lark rule ending in '|'."""
    rng = random.Random(7)
    grammars = list(VALID)
    for grammar in VALID:
        for _ in range(120):
            at = rng.randrange(len(grammar) + 1)
            op = rng.random()
            grammars.append(
                grammar[:at] + grammar[at + 1 :]
                if op < 0.4
                else grammar[:at] + rng.choice('()|"[]*?{}:=a /') + grammar[at:]
                if op < 0.75
                else grammar[:at]
            )
    false_refusals, caught, missed = [], 0, 0
    for grammar in grammars:
        lark = grammar_is_lark(grammar)
        try:
            check_syntax(grammar, lark)
            refused = None
        except InvalidGrammarError as error:
            refused = str(error)
        accepted = _engine_accepts(grammar, lark)
        if refused and accepted and not (lark and "missing after '|'" in refused):
            false_refusals.append((grammar, refused))
        caught += bool(refused and not accepted)
        missed += bool(not refused and not accepted)
    assert not false_refusals, false_refusals[:5]
    assert caught > 3 * missed, (caught, missed)  # most syntax errors are found here (~80%), not in a worker


def test_the_pass_is_linear():
    def seconds(n: int) -> float:
        grammar = "root ::= " + " | ".join(f'"{i}" ( x [a-z] )*' for i in range(n)) + '\nx ::= "y"'
        started = time.perf_counter()
        check_syntax(grammar, False)
        return time.perf_counter() - started

    seconds(100)
    small, large = min(seconds(2_000) for _ in range(3)), min(seconds(20_000) for _ in range(3))
    assert large < 25 * small, (small, large)  # 10x the text: ~10x the time (shared cores: slack)
