"""Schemas and regexes made faithful for llguidance: what llguidance enforces is what jsonschema checks.

`prepare_schema` rewrites a JSON schema before llguidance sees it (strict formats, Python's meaning of
regex classes, an explicit draft, strict objects) and raises `Refusal` for what cannot be made
faithful; `json_options` turns a request's JSON layout into llguidance's options.
"""
from __future__ import annotations

import copy
import functools
import re
from fractions import Fraction
from typing import Any, Iterator

from ..errors import InvalidGrammarError
from ..spec import JsonFormat, resolve_local_ref
from .formats import STRICT_FORMAT_PATTERNS
from .schema_walk import DATA_KEYWORDS, subschemas

WHITESPACE_CHARS = r"[\x20\x0A\x0D\x09]"
_COMBINERS = ("allOf", "anyOf", "oneOf", "$ref")


class Refusal(Exception):
    """Raised while preparing a grammar: `feature` cannot be enforced faithfully."""

    def __init__(self, feature: str, location: str = ""):
        super().__init__(feature)
        self.feature = feature
        self.location = location


def json_options(fmt: JsonFormat) -> dict[str, Any]:
    """llguidance JSON options for a request's layout: bounded whitespace or fixed separators."""
    if fmt.any_whitespace:
        bound = "*" if fmt.max_whitespace_cnt is None else f"{{0,{fmt.max_whitespace_cnt}}}"
        return {"whitespace_flexible": True, "whitespace_pattern": WHITESPACE_CHARS + bound,
                "item_separator": ",", "key_separator": ":", "coerce_one_of": False, "lenient": False}
    item, key = fmt.separators or (",", ":")
    return {"whitespace_flexible": False, "item_separator": item, "key_separator": key, "coerce_one_of": False, "lenient": False}



# ----- JSON-schema preparation --------------------------------------------------------------------


def prepare_schema(schema: Any, *, strict: bool, path: str = "$") -> dict:
    """A copy of `schema` that llguidance enforces exactly as jsonschema validates (module docstring).

    Raises `Refusal` for constructs that cannot be made faithful.
    """
    if not isinstance(schema, dict):
        return schema
    doc = copy.deepcopy(schema)
    doc.pop("x-guidance", None)  # request-level options must not be overridden from inside the schema
    in_combination: set[int] = set()
    roots = [(doc, path)] + [(node, f"{path}{ref[1:]}") for ref, node in _ref_targets(doc)]
    for node, _ in roots:
        _mark_combined(node, doc, in_combination, set())
    seen: set[int] = set()
    for node, where in roots:
        _prepare_node(node, where, strict, seen, in_combination)
    # The draft jsonschema validates with, by its canonical URI: llguidance would try to download
    # a meta-schema it does not know (https variants, "http://json-schema.org/schema").
    doc["$schema"] = validator_class(schema).META_SCHEMA["$schema"]
    return doc


def validator_class(schema: dict):
    """The jsonschema validator class that checks outputs of `schema` (as `fd_guided.validate` does)."""
    import jsonschema

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _ref_targets(doc: dict) -> Iterator[tuple[str, Any]]:
    refs: set[str] = set()
    _collect_refs(doc, refs)
    for ref in sorted(refs):
        node = resolve_local_ref(doc, ref)
        if node is not None:
            yield ref, node


def _collect_refs(node: Any, refs: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            refs.add(ref)
        for key, child in node.items():
            if key not in DATA_KEYWORDS:
                _collect_refs(child, refs)
    elif isinstance(node, list):
        for child in node:
            _collect_refs(child, refs)


def _mark_combined(node: Any, doc: dict, marked: set[int], visiting: set[int]) -> None:
    """Mark (by id) every subschema that is a branch of a combinator, following $refs from branches.

    Strict mode must not close those: ``allOf: [{$ref: base}, {properties: ...}]`` would become
    unsatisfiable if `base` forbade the other branch's properties.
    """
    for child, _ in subschemas(node, ""):
        _mark_combined(child, doc, marked, visiting)
    if not isinstance(node, dict):
        return
    # Closing a branch is harmless when it alone decides which keys are allowed: a single allOf
    # branch, or anyOf/oneOf branches (each validated on its own) under a parent without keys.
    parent_has_keys = any(k in node for k in ("properties", "patternProperties", "additionalProperties"))
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = node.get(keyword)
        if not isinstance(branches, list):
            continue
        if not parent_has_keys and (keyword != "allOf" or len(branches) == 1):
            continue
        for branch in branches:
            _mark_branch(branch, doc, marked, visiting)


def _mark_branch(branch: Any, doc: dict, marked: set[int], visiting: set[int]) -> None:
    if not isinstance(branch, dict) or id(branch) in visiting:
        return
    visiting.add(id(branch))
    marked.add(id(branch))
    ref = branch.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        _mark_branch(resolve_local_ref(doc, ref), doc, marked, visiting)


def _prepare_node(node: Any, path: str, strict: bool, seen: set[int], combined: set[int]) -> None:
    if not isinstance(node, dict) or id(node) in seen:
        return
    seen.add(id(node))
    node.pop("$schema", None)  # one draft per document: the root's, set by prepare_schema
    _prepare_format(node, path)
    _prepare_patterns(node, path)
    _check_multiple_of(node, path)
    if strict and id(node) not in combined and _is_closable_object(node):
        node["additionalProperties"] = False
    for child, child_path in subschemas(node, path):
        _prepare_node(child, child_path, strict, seen, combined)


def _is_closable_object(node: dict) -> bool:
    if "additionalProperties" in node or "unevaluatedProperties" in node or any(k in node for k in _COMBINERS):
        return False
    kind = node.get("type")
    return isinstance(node.get("properties"), dict) or kind == "object" or (isinstance(kind, list) and "object" in kind)


def _prepare_format(node: dict, path: str) -> None:
    fmt = node.get("format")
    if not isinstance(fmt, str):
        return
    kind = node.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is not None and "string" not in kinds:
        del node["format"]  # format constrains strings only: on a number it is an annotation
        return
    if fmt in STRICT_FORMAT_PATTERNS:
        del node["format"]
        strict_pattern = {"pattern": f"^{STRICT_FORMAT_PATTERNS[fmt]}$"}
        if "pattern" in node:
            node["allOf"] = list(node.get("allOf") or []) + [strict_pattern]
        else:
            node.update(strict_pattern)


def _prepare_patterns(node: dict, path: str) -> None:
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        python_compiles(pattern, f"json schema {path}.pattern")
        try:
            node["pattern"] = python_exact_regex(pattern)
        except Refusal as refusal:
            raise Refusal(refusal.feature, f"{path}.pattern") from None
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        rewritten = {}
        for key, child in patterns.items():
            python_compiles(key, f"json schema {path}.patternProperties")
            try:
                rewritten[python_exact_regex(key)] = child
            except Refusal as refusal:
                raise Refusal(refusal.feature, f"{path}.patternProperties") from None
        node["patternProperties"] = rewritten


def _check_multiple_of(node: dict, path: str) -> None:
    step = node.get("multipleOf")
    if not isinstance(step, float) or step.is_integer():
        return
    denominator = Fraction(str(step)).denominator
    if denominator & (denominator - 1):
        raise Refusal(f"multipleOf {step!r} (a decimal step that binary floating-point validators check inexactly)", f"{path}.multipleOf")


def python_compiles(pattern: str, where: str) -> None:
    # Outputs are validated with Python's `re`: a pattern it cannot read cannot be checked.
    try:
        re.compile(pattern)
    except re.error as error:
        raise InvalidGrammarError(f"not a valid (Python) regular expression: {error}", part=where) from None


# ----- regexes with Python's meaning --------------------------------------------------------------

_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": r"\t\n\x0B\x0C\r\x20"}
_PYTHON_PREDICATES = {"d": str.isdecimal, "w": lambda c: c.isalnum() or c == "_", "s": str.isspace}


def _python_class(kind: str) -> str:
    """Python `re`'s ``\\d``/``\\w``/``\\s`` for str patterns as explicit code-point ranges."""
    return _code_point_ranges(kind, False)


def _python_complement(kind: str) -> str:
    """The complement of `_python_class(kind)` (Unicode scalar values only)."""
    return _code_point_ranges(kind, True)


@functools.lru_cache(maxsize=6)
def _code_point_ranges(kind: str, negate: bool) -> str:
    predicate = _PYTHON_PREDICATES[kind]
    ranges, start = [], None
    for point in range(0x110000 + 1):
        inside = point <= 0x10FFFF and not 0xD800 <= point <= 0xDFFF and predicate(chr(point)) != negate
        if inside and start is None:
            start = point
        elif not inside and start is not None:
            ranges.append((start, point - 1))
            start = None
    return "".join(f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges)


@functools.lru_cache(maxsize=4096)
def python_exact_regex(pattern: str) -> str:
    """`pattern` rewritten so llguidance's (Rust) regex never matches more than Python's `re` does.

    Positive shorthands become ASCII classes (a subset of Python's Unicode ones); negated
    shorthands, and shorthands inside negated classes, become Python's exact sets. Rust-only class
    syntax is refused (`Refusal`).
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = negated = False
    class_start = 0
    while i < n:
        char = pattern[i]
        if char == "\\":
            if i + 1 >= n:
                raise Refusal("a regex ending in a lone backslash")
            escaped = pattern[i + 1]
            lower = escaped.lower()
            if lower in _ASCII_CLASSES:
                is_negated_shorthand = escaped.isupper()
                if not in_class:
                    out.append(f"[^{_python_class(lower)}]" if is_negated_shorthand else f"[{_ASCII_CLASSES[lower]}]")
                elif is_negated_shorthand:
                    out.append(_python_complement(lower))
                else:
                    out.append(_python_class(lower) if negated else _ASCII_CLASSES[lower])
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if char == "[":
                raise Refusal("a nested character class or POSIX class in a regex (Rust and Python read it differently)")
            if char in "&~-" and pattern[i + 1:i + 2] == char and i > class_start:
                raise Refusal(f"the class operator {char * 2!r} in a regex (Rust and Python read it differently)")
            if char == "]" and i > class_start:
                in_class = False
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            negated = pattern[i + 1:i + 2] == "^"
            out.append("[^" if negated else "[")
            i += 2 if negated else 1
            class_start = i  # a "]" right here is a literal in both dialects
            continue
        out.append(char)
        i += 1
    return "".join(out)


