"""Admission bounds on what may reach a native grammar compiler, checked in pure Python.

Compilers recurse over reference chains and rule chains (llguidance overflows an 8 MiB native stack
at ~3,000 chained ``$ref``s or Lark rules, which kills the process), expand counted repetitions
into automaton states, and slow down with input size. Compiles run in killable worker processes
(`fd_guided.compile`), so a bomb that slips through costs only its request; these bounds make the
common bombs fail fast, at admission, with an `InvalidGrammarError` naming the limit, and keep
every native recursion well inside the stacks we run it on (see `fd_guided.compile.threads`).

Every check here is iterative or recursion-bounded, and linear in the input (one pass over the
text, or one memoised walk over the schema): admission on the caller's thread stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import InvalidGrammarError


@dataclass(frozen=True)
class AdmissionLimits:
    """Bounds on a constraint, checked at admission (all inclusive).

    Defaults sit far above real-world constraints (SchemaStore's ~580 schemas: at most 27 nested
    levels and reference chains of a few dozen) and far below what crashes or stalls the engines.
    """

    max_constraint_bytes: int = 1 << 20
    max_regex_bytes: int = 64 << 10
    max_choices: int = 20_000
    max_schema_patterns: int = 1_000
    max_ref_depth: int = 500
    max_grammar_rules: int = 10_000
    max_rule_depth: int = 1_000
    max_regex_nesting: int = 100
    max_repetition: int = 100_000

    def __post_init__(self):
        for name, value in self.__dict__.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AdmissionLimits.{name} must be a positive int, got {value!r}")


# ----- sizes ----------------------------------------------------------------------------------------


def check_size(text: str, limit: int, part: str, what: str = "constraint") -> None:
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > limit:
        raise InvalidGrammarError(
            f"the {what} is {size:,} bytes, over the limit of {limit:,}",
            part=part,
            feature=f"{what} larger than {limit:,} bytes",
        )


# ----- regexes --------------------------------------------------------------------------------------


def check_regex(pattern: str, limits: AdmissionLimits, part: str) -> None:
    """Bound a regex's size, group nesting and expanded repetition (``(a{1000}){1000}`` is 10^6 states)."""
    check_size(pattern, limits.max_regex_bytes, part, "regex")
    depth = regex_nesting(pattern)
    if depth > limits.max_regex_nesting:
        raise InvalidGrammarError(
            f"groups nested {depth} deep, over the limit of {limits.max_regex_nesting}",
            part=part,
            feature=f"regex groups nested deeper than {limits.max_regex_nesting}",
        )
    parsed = _python_parse(pattern)
    if parsed is None:
        return  # not Python syntax: the engine's own parser decides (in the compile worker)
    size = _expanded_size(parsed)
    if size > limits.max_repetition:
        raise InvalidGrammarError(
            f"counted repetitions expand to ~{size:,} states, over the limit of {limits.max_repetition:,}",
            part=part,
            feature=f"regex repetition expanding past {limits.max_repetition:,}",
        )


def regex_nesting(pattern: str) -> int:
    """The deepest group nesting of `pattern` (escapes and character classes skipped), in one pass."""
    depth = deepest = 0
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":  # a leading "]" is a literal
                i += 1
            continue
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def _python_parse(pattern: str):
    try:
        from re import _parser as sre_parse  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse
    try:
        return sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


def _expanded_size(parsed) -> int:
    """Atoms of a parsed regex with bounded repetitions multiplied out (unbounded ones count once)."""
    try:
        from re import _constants as sre
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_constants as sre
    total = 0
    for op, arg in parsed:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            low, high, item = arg
            times = low if high == sre.MAXREPEAT else high
            total += max(1, times) * _expanded_size(item)
        elif op is sre.SUBPATTERN:
            total += _expanded_size(arg[-1])
        elif op is sre.BRANCH:
            total += sum(_expanded_size(branch) for branch in arg[1])
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            total += _expanded_size(arg[1])
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            total += _expanded_size(arg)
        elif op is sre.GROUPREF_EXISTS:
            total += sum(_expanded_size(branch) for branch in arg[1:] if branch is not None)
        else:
            total += 1
    return total


def resolve_local_ref(root: Any, ref: str) -> Any:
    """The node a local JSON pointer (``#``, ``#/a/0/b``, with ``~0``/``~1`` escapes) names, or None."""
    node: Any = root
    for token in ref[2:].split("/") if len(ref) > 2 else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


# ----- JSON schemas ---------------------------------------------------------------------------------

_VALUE_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def schema_ref_depth(schema: Any) -> int:
    """How deep a compiler that expands ``$ref``s depth-first (each target once) recurses.

    Levels are counted as schema nesting plus one per ``$ref`` hop, along the walk a compiler makes:
    document order, each reference target entered once (cycles are compiled as rules, not
    re-entered). A 3,000-link ``$ref`` chain counts ~3,000; a wide schema of many shallow
    definitions counts its deepest path only. Iterative: the walk cannot overflow Python's stack.
    """
    entered: set[int] = set()
    deepest = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, list):
            stack.extend((child, depth) for child in reversed(node))
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = resolve_local_ref(schema, ref)
            if isinstance(target, (dict, list)) and id(target) not in entered:
                entered.add(id(target))
                stack.append((target, depth + 1))
        for key, child in reversed(list(node.items())):
            if key not in _VALUE_KEYWORDS and isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return deepest


def check_schema(
    schema: Any, limits: AdmissionLimits, part: str, before_regex: Callable[[str], None] | None = None
) -> None:
    """Bound a schema's reference depth and every regex inside it. `before_regex(pattern)` runs
    before each regex is checked (admission's deadline: parsing a regex cannot stop itself)."""
    depth = schema_ref_depth(schema)
    if depth > limits.max_ref_depth:
        raise InvalidGrammarError(
            f"$ref chains and nesting reach {depth} levels, over the limit of {limits.max_ref_depth}",
            part=part,
            feature=f"$ref chains deeper than {limits.max_ref_depth}",
        )
    patterns = list(_schema_patterns(schema))
    if len(patterns) > limits.max_schema_patterns:
        # Each one is parsed here and compiled by every engine: 8,000 patternProperties cost seconds.
        raise InvalidGrammarError(
            f"{len(patterns):,} regexes (pattern/patternProperties), over the limit of {limits.max_schema_patterns:,}",
            part=part,
            feature=f"schemas with more than {limits.max_schema_patterns:,} regexes",
        )
    for pattern, where in patterns:
        if before_regex is not None:
            before_regex(pattern)
        check_regex(pattern, limits, f"{part}{where}")


def _schema_patterns(schema: Any) -> Iterator[tuple[str, str]]:
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            yield node["pattern"], f"{path}.pattern"
        if isinstance(node.get("patternProperties"), dict):
            for key in node["patternProperties"]:
                yield key, f"{path}.patternProperties"
        for key, child in node.items():
            if key not in _VALUE_KEYWORDS and isinstance(child, (dict, list)):
                stack.append((child, f"{path}.{key}"))


# ----- EBNF and Lark grammars -------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<skip>\s+|//[^\n]*|\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"i?|'(?:[^'\\\n]|\\.)*'i?)
      | (?P<cls>\[(?:[^\]\\]|\\.)*\])
      | (?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
      | (?P<define>::=|:(?!:))
      | (?P<alias>->)
      | (?P<name>[?!]?[A-Za-z_][\w.-]*)
      | (?P<other>.)""",
    re.VERBOSE,
)


def grammar_rules(text: str) -> dict[str, list[str]]:
    """Rule name -> names its body references, for EBNF (``a ::= ...``) and Lark (``a: ...``).

    An approximation made for bounding, not parsing: strings, classes, regexes and comments are
    skipped; a name followed by ``::=`` or ``:`` starts a rule; a name after ``->`` is an alias.
    """
    rules: dict[str, list[str]] = {}
    current: list[str] | None = None
    pending: str | None = None
    after_alias = False
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind == "skip":
            continue
        if kind == "define" and pending is not None:
            current = rules.setdefault(pending.lstrip("?!").split(".")[0], [])
            pending = None
            continue
        if pending is not None and current is not None:
            current.append(pending)
        pending = None
        if kind == "name":
            if after_alias:
                after_alias = False
                continue
            pending = match.group()
        after_alias = kind == "alias"
    if pending is not None and current is not None:
        current.append(pending)
    return rules


def rule_depth(rules: dict[str, list[str]], root: str) -> int:
    """How deep a compiler that expands rules depth-first (each once) recurses from `root`. Iterative."""
    entered = {root}
    deepest = 0
    stack = [(root, 1)]
    while stack:
        name, depth = stack.pop()
        deepest = max(deepest, depth)
        for child in reversed(rules.get(name, ())):
            child = child.lstrip("?!")
            if child in rules and child not in entered:
                entered.add(child)
                stack.append((child, depth + 1))
    return deepest


def check_grammar(
    text: str, lark: bool, limits: AdmissionLimits, part: str, rules: dict[str, list[str]] | None = None
) -> None:
    """Bound a grammar's size, rule count and rule-chain depth (`rules`: its rule graph, when the
    caller has it already)."""
    check_size(text, limits.max_constraint_bytes, part, "grammar")
    if rules is None:
        rules = grammar_rules(text)
    if len(rules) > limits.max_grammar_rules:
        raise InvalidGrammarError(
            f"{len(rules):,} rules, over the limit of {limits.max_grammar_rules:,}",
            part=part,
            feature=f"grammars of more than {limits.max_grammar_rules:,} rules",
        )
    root = "start" if lark else "root"
    depth = max((rule_depth(rules, name) for name in ([root] if root in rules else list(rules)[:1])), default=0)
    if depth > limits.max_rule_depth:
        raise InvalidGrammarError(
            f"rule chains reach {depth:,} levels, over the limit of {limits.max_rule_depth:,}",
            part=part,
            feature=f"rule chains deeper than {limits.max_rule_depth:,}",
        )


def check_choices(choices: list[str], limits: AdmissionLimits, part: str) -> None:
    if len(choices) > limits.max_choices:
        raise InvalidGrammarError(
            f"{len(choices):,} choices, over the limit of {limits.max_choices:,}",
            part=part,
            feature=f"more than {limits.max_choices:,} choices",
        )
    check_size("".join(choices), limits.max_constraint_bytes, part, "choice list")
