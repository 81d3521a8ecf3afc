"""xgrammar's grammar of a JSON schema, with each chain of optional properties factored: the same
language, a cheaper mask inside the values before them.

xgrammar's JSON-schema converter writes an object's optional properties (in order) as a chain of
rules, one per property, each alternative starting again with the separator W (``ws{0, 2} ","
ws{0, 2}``, ``[ \\n\\r\\t]* "," [ \\n\\r\\t]*``, ``", "``...)::

    part_k    ::= ((part_k1) | (W "\\"key_k\\"" ... part_k1))
    part_last ::= ("" | (W "\\"key_last\\"" ...))       or a rule E (additional properties) ending it

so after a value of property k, every later property's alternative carries its own copy of W.
Inside a string value xgrammar checks each token that may close the string (``",``, ``"}``,
``",\\n``...) against every one of those copies: 230-260 us a fill inside a long free string of a
29-property SchemaStore schema (`8407d7f1f337`), 13 us with one property (docs/benchmarks.md, issue
#25 item 2). `factored` rewrites each chain of two links or more as::

    part_k     ::= ((E) | (W part_k_alt))                 ("" | (W part_k_alt)) when E is ""
    part_k_alt ::= (("\\"key_k\\"" ... part_k1) | (part_k1_alt))
    part_m_alt ::= (("\\"key_m\\"" ... E))              the chain's last link m

the same language: concatenation distributes over union, so by induction from the last link
part_k = E | W (K_k part_k1 | K_k1 part_k2 | ... | K_m E), with one W after the value. Only rules
of exactly these shapes, chained through the same W text, are rewritten; anything else (another
xgrammar version's output, a shape not recognised) is left as it was, and `factored` returns None
when nothing changed, so the caller compiles the schema as before.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import xgrammar as xgr

logger = logging.getLogger(__name__)

_RULE = re.compile(r"^([A-Za-z_][\w.]*) ::= (.*)$")
_SPACE = r"(?:whitespace(?:_\d+)?\{0, \d+\}|\[ \\n\\r\\t\]\*)"
_SEPARATOR = r"(?:" + _SPACE + r' )?"[^"\\]*"(?: ' + _SPACE + r")?"
# ((NEXT) | (W BODY NEXT))  and  ("" | (W BODY)); BODY is checked to be one plain sequence below.
_LINK = re.compile(r"^\(\((\w+)\) \| \((" + _SEPARATOR + r") (.+) (\w+)\)\)$")
_LAST = re.compile(r'^\(""\s\|\s\((' + _SEPARATOR + r") (.+)\)\)$")
_SUFFIX = "_alt"


def factored(ebnf: str) -> str | None:
    """`ebnf` (xgrammar's printed grammar of a JSON schema) with its optional-property chains
    factored (see the module docstring), or None when no chain was found (or a name would clash)."""
    rules: dict[str, str] = {}
    for line in ebnf.splitlines():
        match = _RULE.match(line)
        if match is None or match.group(1) in rules:
            return None  # not one rule per line as xgrammar prints it: leave the grammar alone
        rules[match.group(1)] = match.group(2)
    links = dict(_chain_links(rules))
    ends = _chain_ends(links)

    def chained_next(name: str) -> str | None:  # the next link of `name`'s chain, if there is one
        separator, _, following = links[name]
        if following in links and following in ends and links[following][0] == separator:
            return following
        return None

    chained = {member for name in ends if (following := chained_next(name)) for member in (name, following)}
    if not chained or any(name + _SUFFIX in rules for name in chained):
        return None
    out = []
    for name, body in rules.items():
        if name not in chained:
            out.append(f"{name} ::= {body}")
            continue
        separator, sequence, following = links[name]
        end = ends[name]
        head = '""' if end is None else f"({end})"
        out.append(f"{name} ::= ({head} | ({separator} {name}{_SUFFIX}))")
        if following is None:
            out.append(f"{name}{_SUFFIX} ::= (({sequence}))")
        elif chained_next(name) is not None:
            out.append(f"{name}{_SUFFIX} ::= (({sequence} {following}) | ({following}{_SUFFIX}))")
        else:
            out.append(f"{name}{_SUFFIX} ::= (({sequence} {following}))")
    return "\n".join(out) + "\n"


def _chain_links(rules: dict[str, str]) -> Iterator[tuple[str, tuple[str, str, str | None]]]:
    """(rule, (its separator W, its property's sequence, the next rule; None for a ("" | ...) link))
    for every rule of one of the two shapes."""
    for name, body in rules.items():
        link = _LINK.match(body)
        if link is not None and link.group(1) == link.group(4) and _plain_sequence(link.group(3)):
            yield name, (link.group(2), link.group(3), link.group(1))
            continue
        last = _LAST.match(body)
        if last is not None and _plain_sequence(last.group(2)):
            yield name, (last.group(1), last.group(2), None)


def _chain_ends(links: dict[str, tuple[str, str, str | None]]) -> dict[str, str | None]:
    """Each link's chain end E: following next rules through links with the same W, the rule where
    that stops (None: the chain ends with a ("" | ...) link). A cycle gets no entry."""
    ends: dict[str, str | None] = {}
    for start in links:
        path, name = [], start
        while True:
            if name in ends:
                end = ends[name]
                break
            path.append(name)
            following = links[name][2]
            if following is None:
                end = None
                break
            if following not in links or links[following][0] != links[name][0]:
                end = following
                break
            if following in path:
                path = []  # a cycle: leave these rules alone
                break
            name = following
        for member in path:
            ends[member] = end
    return ends


def _plain_sequence(text: str) -> bool:
    """True if `text` is a sequence of elements: brackets balanced, no ``|`` outside them (string
    literals and character classes read with their escapes)."""
    depth, i = 0, 0
    while i < len(text):
        char = text[i]
        if char in '"[':
            close = '"' if char == '"' else "]"
            i += 1
            while i < len(text) and text[i] != close:
                i += 2 if text[i] == "\\" else 1
            if i >= len(text):
                return False
        elif char in "({":
            depth += 1
        elif char in ")}":
            depth -= 1
            if depth < 0:
                return False
        elif char == "|" and depth == 0:
            return False
        i += 1
    return depth == 0


# Off only to measure the grammar as xgrammar writes it (tools/fill_tails.py's `unfactored` columns).
ENABLED = True


def compile_json_schema(compiler: xgr.GrammarCompiler, schema: str, options: dict[str, Any]) -> xgr.CompiledGrammar:
    """`compiler.compile_json_schema(schema, **options)`, from the factored grammar when it has
    optional-property chains (the same language). A printed grammar xgrammar cannot read back is
    compiled as before; xgrammar's own errors about the schema propagate from that compile."""
    if ENABLED:
        try:
            grammar = xgr.Grammar.from_json_schema(schema, **options)
        except (RuntimeError, ValueError, TypeError):
            grammar = None  # the schema's error: compile_json_schema below raises it
        if grammar is not None:
            text = factored(str(grammar))
            if text is None:
                # No chain: the grammar already converted, compiled as it is (the same compiled
                # grammar as compile_json_schema's: printed equal for every SchemaStore schema
                # under 200 KB, three option sets, xgrammar 0.2.6 and 0.2.9), not converted again.
                return compiler.compile_grammar(grammar)
            try:
                return compiler.compile_grammar(text)
            except (RuntimeError, ValueError) as error:
                logger.warning("xgrammar could not read back its factored grammar (%s); compiling it unfactored", error)
    return compiler.compile_json_schema(schema, **options)
