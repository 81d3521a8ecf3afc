"""Grammar syntax at admission: EBNF (xgrammar's dialect) and Lark, in one linear pure-Python pass.

The engines' own parsers are native and exact, but not bounded on the caller's thread: on hostile
1 MB grammars xgrammar's EBNF parser took 0.7-1.6 s and llguidance's Lark validator 13 s (and a
30,000-rule chain ran past a minute), so they run only in the compile workers. This pass tokenizes
once (one compiled regex), keeps a stack of open brackets and one "an element is expected" flag,
and refuses only what every engine that reads the dialect refuses, naming the line and column:

  - an unterminated string, character class (EBNF) or regex (Lark); a bracket closed by the
    wrong one, never closed, or closed without being opened;
  - an alternative missing after ``|`` (``root ::= ("a" | ``; a Lark rule or group ending in ``|``):
    write ``""`` for the empty string; in EBNF also an empty first alternative (``( | "a")``) and a
    quantifier with nothing before it (``::= *``), which xgrammar refuses;
  - an EBNF rule with an empty body, a grammar without its root rule (``root`` in EBNF, ``start``
    in Lark), and a reference to a rule the grammar never defines.

What needs more than syntax (xgrammar's ``(=`` look-aheads and macros, llguidance's ``%json`` and
``%import`` directives, regex bodies) is left to the engine, in the worker: those spans are only
balanced here. The same pass yields the rule graph the bounds of `fd_guided.limits` are taken on.

Under admission's deadline (`fd_guided.schema.deadline`) the pass stops itself (a checkpoint every
`_CHECK_EVERY` tokens: ~1 us a token, a 1 MB grammar is ~0.3 s) and the grammar's checks are left
to the compile worker (`fd_guided.admission.deferred`), which runs `check_grammar_text` before the
compile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from ..errors import InvalidGrammarError
from ..limits import AdmissionLimits, check_grammar, check_regex, check_size
from ..schema.deadline import afford, checkpoint
from .documents import check_text

_EBNF_TOKEN = re.compile(
    r"""(?P<skip>[ \t\r\n]+|\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*")
      | (?P<cls>\[(?:[^\]\\\n]|\\.)*\])
      | (?P<define>::=)
      | (?P<name>[A-Za-z_][\w.-]*)
      | (?P<bar>\|)
      | (?P<open>[({])
      | (?P<close>[)}])
      | (?P<quant>[*+?])
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_LARK_TOKEN = re.compile(
    r"""(?P<skip>[ \t\r\n]+|//[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"i?|'(?:[^'\\\n]|\\.)*'i?)
      | (?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
      | (?P<special><[^<>\s]*>)
      | (?P<directive>%[A-Za-z_]\w*)
      | (?P<define>:(?!:))
      | (?P<alias>->)
      | (?P<name>[?!]?[A-Za-z_]\w*(?:\.\d+)?)
      | (?P<bar>\|)
      | (?P<open>[(\[{])
      | (?P<close>[)\]}])
      | (?P<quant>[*+?])
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_PAIRS = {")": "(", "]": "[", "}": "{"}
_CHECK_EVERY = 256  # tokens between two looks at the deadline
# What `limits.check_grammar`'s walk of the rule graph costs per rule (measured ~1.4 us on a loaded
# 2-core host; rounded up): it cannot stop itself, so it starts only when it fits the deadline.
BOUNDS_SECONDS_PER_RULE = 3e-6
# What `limits.check_regex` and ``re.compile`` cost per character of pattern together (measured
# 3-9 us on a loaded 2-core host, linear up to the 64 KB limit): a pattern of a few hundred
# characters is checked at admission, a longer one by the compile worker.
REGEX_SECONDS_PER_CHAR = 6e-6
_UNTERMINATED = {'"': "string literal", "'": "string literal", "[": "character class", "/": "regex"}


@dataclass
class Grammar:
    """What the pass learnt: rule name -> the names its body references (for the bounds)."""

    rules: dict[str, list[str]] = field(default_factory=dict)


def check_syntax(text: str, lark: bool, part: str = "guided_grammar") -> Grammar:
    """Check `text` (EBNF, or Lark with `lark`) and return its rule graph. Raises InvalidGrammarError
    naming the line and column of the first error. Linear in the text; never recurses."""
    return _Pass(text, lark, part).run()


def check_grammar_text(text: str, lark: bool, limits: AdmissionLimits, part: str = "guided_grammar") -> None:
    """A grammar's syntax (`check_syntax`), then its size, rule count and rule-chain depth
    (`limits.check_grammar`, on the rule graph the pass found). Under a deadline: `Overrun` once
    it is spent, before the verdict."""
    rules = check_syntax(text, lark, part).rules
    afford(len(rules) * BOUNDS_SECONDS_PER_RULE)
    check_grammar(text, lark, limits, part, rules=rules)


def check_regex_syntax(pattern: str, limits: AdmissionLimits, part: str) -> None:
    """A regex as Python's ``re`` (which judges outputs) reads it, within the bounds of `limits`.
    Under a deadline: `Overrun` before the bounds and ``re``'s parse when they would not end in
    time (`REGEX_SECONDS_PER_CHAR`: a 64 KB pattern is ~0.3-0.5 s)."""
    if "\x00" in pattern:
        raise InvalidGrammarError("must not contain NUL characters", part=part)
    check_text(pattern, part)
    check_size(pattern, limits.max_regex_bytes, part, "regex")
    afford(len(pattern) * REGEX_SECONDS_PER_CHAR)  # neither step below can stop itself
    check_regex(pattern, limits, part)
    try:
        re.compile(pattern)
    except re.error as error:
        if "bad escape \\p" in str(error) or "bad escape \\P" in str(error):
            feature = "Unicode property escapes (\\p{...}, \\P{...})"
            raise InvalidGrammarError(
                f"{feature} cannot be enforced: Python's re, which judges outputs, does not read them",
                part=part,
                feature=feature,
            ) from None
        raise InvalidGrammarError(f"not a valid regular expression: {error}", part=part) from None
    except (RecursionError, OverflowError, ValueError) as error:
        raise InvalidGrammarError(
            f"not a regular expression Python's re can read ({type(error).__name__})", part=part
        ) from None


class _Pass:
    def __init__(self, text: str, lark: bool, part: str):
        self.text, self.lark, self.part = text, lark, part
        self.grammar = Grammar()
        self.body: list[str] | None = None  # the current rule's references
        self.stack: list[tuple[str, int, bool]] = []  # (bracket, position, lenient: macro/directive/%json)
        self.expect = False  # an element must come next (after ::=, |, or an opening bracket in EBNF)
        self.rule_start = -1
        self.references: list[tuple[str, int]] = []
        self.directives = False
        self.bar_at = -1  # the last '|'

    def run(self) -> Grammar:
        tokens = (_LARK_TOKEN if self.lark else _EBNF_TOKEN).finditer(self.text)
        pending: re.Match | None = None  # a name that may start a rule (followed by ::= or :)
        after_alias = False
        for count, token in enumerate(tokens):
            if not count % _CHECK_EVERY:
                checkpoint()
            kind = token.lastgroup
            if kind == "skip":
                continue
            if pending is not None:
                if kind == "define" and not self.stack and (not self.lark or self._at_line_start(pending.start())):
                    self._start_rule(pending, token.end())
                    pending = None
                    continue
                self._element_name(pending)
                pending = None
            if kind == "name" and not after_alias and not self._lenient():
                pending = token
                continue
            after_alias = kind == "alias"
            self._token(kind, token)
        if pending is not None:
            self._element_name(pending)
        self._end_rule(len(self.text))
        self._finish()
        return self.grammar

    # ----- tokens ----------------------------------------------------------------------------------

    def _token(self, kind: str | None, token: re.Match) -> None:
        value, at = token.group(), token.start()
        if kind == "other" and value in _UNTERMINATED and not self._lenient():
            self._fail(at, f"unterminated {_UNTERMINATED[value]}")
        if kind == "directive":
            self.directives = True
            if self._at_line_start(at):  # a %directive line ends the rule before it
                self._end_rule(at)
                self.body = None
            else:
                self.expect = False  # inline (%json {...}): an element
            return
        if self.body is None and not self._lenient() and kind not in ("open", "close"):
            if self.lark and kind in ("string", "regex", "special", "other", "quant", "bar", "alias"):
                return  # the rest of a %directive line
            self._fail(at, f"{value[:20]!r} outside any rule (a rule starts with 'name {':' if self.lark else '::='}')")
        if kind == "bar":
            if self.expect and not self.lark and not self._lenient():
                self._fail(at, "an alternative is missing before '|' (write \"\" for the empty string)")
            self.expect = True
            self.bar_at = at
            return
        if kind == "open":
            if value == "{" and self.expect and not self.lark and not self._lenient():
                self._fail(at, "a repetition with nothing before it to repeat")
            lenient = self._lenient() or value == "{" or self._macro_call(at)
            self.stack.append((value, at, lenient))
            self.expect = not self.lark and not lenient and value == "("
            if self.lark and value in "([":
                self.expect = False
            return
        if kind == "close":
            self._close(value, at)
            return
        if kind == "quant":
            if self.expect and not self._lenient():
                self._fail(at, f"{value!r} with nothing before it to repeat")
            return
        self.expect = False

    def _close(self, value: str, at: int) -> None:
        if not self.stack or self.stack[-1][0] != _PAIRS[value]:
            if self.stack:
                opener, where, _ = self.stack[-1]
                self._fail(at, f"{value!r} closes {opener!r} opened at {self._where(where)}")
            self._fail(at, f"{value!r} closes nothing")
        opener, where, lenient = self.stack.pop()
        if self.expect and not lenient and self.bar_at > where:
            self._fail(self.bar_at, "an alternative is missing after '|' (write \"\" for the empty string)")
        self.expect = False

    def _macro_call(self, at: int) -> bool:
        """xgrammar's ``Name(...)`` macros (TagDispatch) and ``(=`` look-aheads: only balanced here."""
        if self.text.startswith("(=", at):
            return True
        return not self.lark and at > 0 and (self.text[at - 1].isalnum() or self.text[at - 1] == "_")

    def _lenient(self) -> bool:
        return bool(self.stack) and self.stack[-1][2]

    def _element_name(self, token: re.Match) -> None:
        if self.body is None:
            if self.lark:
                return  # a name on a %directive line
            self._fail(token.start(), f"{token.group()[:40]!r} outside any rule (a rule starts with 'name ::=')")
        self.expect = False
        macro = not self.lark and self.text.startswith("(", token.end())
        if not macro and self.body is not None and not any(entry[2] for entry in self.stack):
            name = token.group().lstrip("?!")
            self.body.append(name)
            self.references.append((name, token.start()))

    # ----- rules -----------------------------------------------------------------------------------

    def _start_rule(self, name: re.Match, body_at: int) -> None:
        self._end_rule(name.start())
        rule = name.group().lstrip("?!")
        if self.lark:
            rule = rule.split(".")[0]  # a priority (NAME.2)
        self.body = self.grammar.rules.setdefault(rule, [])
        self.rule_start = body_at
        self.expect = not self.lark

    def _end_rule(self, at: int) -> None:
        if self.body is None:
            return
        if self.stack:
            opener, where, _ = self.stack[-1]
            self._fail(where, f"{opener!r} is never closed")
        if self.expect:
            if self.text[self.rule_start : at].strip() == "" and not self.lark:
                self._fail(self.rule_start, 'a rule with an empty body (write "" for the empty string)')
            self._fail(
                self.bar_at if self.bar_at >= self.rule_start else at,
                "an alternative is missing after '|' (write \"\" for the empty string)",
            )

    def _finish(self) -> None:
        if self.stack:
            opener, where, _ = self.stack[-1]
            self._fail(where, f"{opener!r} is never closed")
        root = "start" if self.lark else "root"
        if root not in self.grammar.rules:
            self._fail(0, f"the grammar defines no {root!r} rule")
        if self.lark and self.directives:
            return  # %import/%declare/%json may bring names this pass cannot see
        for count, (name, at) in enumerate(self.references):
            if not count % _CHECK_EVERY:
                checkpoint()
            if name not in self.grammar.rules:
                self._fail(at, f"rule {name[:60]!r} is not defined")

    def _at_line_start(self, at: int) -> bool:
        line = self.text.rfind("\n", 0, at) + 1
        return self.text[line:at].strip() == ""

    def _where(self, at: int) -> str:
        line = self.text.count("\n", 0, at) + 1
        column = at - self.text.rfind("\n", 0, at)
        return f"line {line}, column {column}"

    def _fail(self, at: int, message: str) -> NoReturn:
        raise InvalidGrammarError(
            f"{'Lark' if self.lark else 'EBNF'} syntax error at {self._where(at)}: {message}", part=self.part
        )
