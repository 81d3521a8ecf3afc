"""What each engine enforces exactly, per JSON Schema keyword: the table the emitter follows.

`TABLE[keyword][engine]` is ``(how, note)`` with `how` one of:
  - ``native``: handed to the engine as is (on a leaf that carries an explicit ``type``);
  - ``rewritten``: the normaliser or emitter turns it into native keywords (the note says how);
  - ``conditional``: native in the positions the note names, rewritten or refused elsewhere;
  - ``refused``: `InvalidGrammarError` with ``feature`` naming the keyword (``auto`` then tries
    the other engine).
Every verdict was measured by feeding valid and invalid instances through the engine's matcher
(tests/schema/test_engine_keywords.py keeps them honest). `emit.py` reads the ``refused`` and
``native`` entries directly; docs/json_schema_keywords.md is generated from this table
(`tools/conformance.py --keywords`), and a test fails when the two differ.
"""

from __future__ import annotations

from .one_of import MAX_ONE_OF_EXPANDED

NATIVE, REWRITTEN, CONDITIONAL, REFUSED = "native", "rewritten", "conditional", "refused"
ENGINES = ("xgrammar", "llguidance")

_BOTH_NORMALISED = {
    "allOf": "merged into the leaves (intersection of types, bounds, properties, items)",
    "oneOf": "anyOf when the branches are provably disjoint, else each branch minus the others it may overlap "
    f"(fewer than {MAX_ONE_OF_EXPANDED} others per branch)",
    "not": (
        "complement written positively (types, bounds, const/enum, required, properties); parts that cannot be written "
        "are dropped (a sound subset)"
    ),
    "if": "(if and then) or (not if and else)",
    "then": "see if",
    "else": "see if",
    "dependentRequired": "anyOf: the property absent, or it and its dependents required",
    "dependentSchemas": "anyOf: the property absent, or present and the schema",
    "dependencies": "draft 4-7: read as dependentRequired / dependentSchemas",
    "unevaluatedProperties": "additionalProperties of each leaf once its evaluated properties are static",
    "unevaluatedItems": "items of each leaf once its evaluated items are static",
    "contains": (
        "minItems/maxItems when it is true or equals the items; written per position on arrays of at most 4 items; "
        "refused otherwise"
    ),
    "minContains": "see contains",
    "maxContains": "see contains",
    "uniqueItems": (
        "dropped for at most one item; the distinct arrays enumerated over a finite item domain (at most 256); over "
        "open item domains (strings without maxLength, with at most one pattern or format that never dead-ends; "
        "numbers without bounds; integers without steps, unbounded or bounded away from 0 (a 0 begun again is "
        "refused); any value; objects that admit undeclared properties of any value), over closed objects whose last "
        "property takes such open values (properties in the schema's order, not guided_any_order; inline items have "
        "their last open property moved to the end), over strings that can run out (a maxLength, a pattern that ends: "
        "the guard counts the strings left), and over finite domains of plain literals past 256 arrays, in a "
        "json_schema request: enforced while decoding by the uniqueness guard (fd_guided.unique_guard); refused "
        "otherwise"
    ),
    "$dynamicRef": "a plain $ref when the document has a single matching $dynamicAnchor; refused otherwise",
    "$recursiveRef": "a plain $ref when the document has no $recursiveAnchor; refused otherwise",
    "format": (
        "an exact (or documented-subset) pattern per format, also color, byte (base64), draft 3's "
        "host-name/ip-address, url/datetime read as uri/date-time; binary, password, int-or-string constrain nothing; "
        "unknown formats refused unless unknown_formats='annotate'"
    ),
    "const": "an enum of one value, filtered against its sibling keywords",
    "enum": "filtered against its sibling keywords (e.g. type), emitted alone",
    "items": "draft 4-2019-09 array form read as prefixItems (additionalItems as items)",
    "additionalItems": "draft 4-2019-09: items after an items array",
}

TABLE: dict[str, dict[str, tuple[str, str]]] = {
    "type": {
        "xgrammar": (
            NATIVE,
            "one type per leaf; a subschema without type is split per type so type-specific keywords apply",
        ),
        "llguidance": (NATIVE, "one type per leaf"),
    },
    "$ref": {
        "xgrammar": (CONDITIONAL, "alone; beside other keywords the target is merged in (recursive targets: refused)"),
        "llguidance": (
            CONDITIONAL,
            "alone; beside other keywords the target is merged in (recursive targets: refused)",
        ),
    },
    "anyOf": {
        "xgrammar": (NATIVE, "only as the union of typed leaves, never with siblings"),
        "llguidance": (NATIVE, "only as the union of typed leaves, never with siblings"),
    },
    "minimum": {
        "xgrammar": (
            CONDITIONAL,
            "integers: inclusive integer bounds, clipped to +-(2^63-1) (a subset: larger integers are not "
            "produced); numbers: as given",
        ),
        "llguidance": (
            CONDITIONAL,
            "bounds clipped to +-2^53 (it compares numbers as doubles; a subset: larger values are not produced); "
            "enum integers past 2^53 refused",
        ),
    },
    "multipleOf": {
        "xgrammar": (
            CONDITIONAL,
            "integers, step <= 1000, no bounds; bounded ranges with at most 256 multiples become an enum; "
            "otherwise refused",
        ),
        "llguidance": (
            CONDITIONAL,
            "integer steps and power-of-two fractions (0.5, 0.25); decimal steps (0.01) only as an enum of a "
            "bounded range (jsonschema checks them in binary floating point)",
        ),
    },
    "minLength": {
        "xgrammar": (
            CONDITIONAL,
            "as a pattern of characters that need no escape, bounds <= 128 (a subset: no escapes, so auto prefers "
            "llguidance); beside a pattern or format, or past 128, refused (its own bounded string admits raw "
            "control characters)",
        ),
        "llguidance": (NATIVE, "code points, JSON escapes allowed"),
    },
    "pattern": {
        "xgrammar": (
            CONDITIONAL,
            "one per string, re-printed from Python's parse ({0,1} for optional groups, no raw \\\\, \" or control "
            "characters, repetitions <= 128); "
            "look-aheads of the top-level sequence and \\b written out; look-behind, look-aheads in groups, "
            "back-references, \\B refused",
        ),
        "llguidance": (
            NATIVE,
            "re-printed from Python's parse (classes with Python's meaning); several patterns become an allOf; "
            "look-aheads of the top-level sequence and \\b written out; look-behind, look-aheads in groups, "
            "back-references, \\B refused",
        ),
    },
    "prefixItems": {
        "xgrammar": (NATIVE, "false positions truncate the tuple"),
        "llguidance": (NATIVE, ""),
    },
    "minItems": {
        "xgrammar": (NATIVE, "at most 1024"),
        "llguidance": (NATIVE, "at most 1024"),
    },
    "properties": {
        "xgrammar": (
            NATIVE,
            "in schema order; a forbidden (false) optional property is dropped when additional properties are "
            "closed, refused otherwise",
        ),
        "llguidance": (NATIVE, "in schema order"),
    },
    "required": {
        "xgrammar": (
            REWRITTEN,
            "names missing from properties are declared with their patternProperties/additionalProperties schema",
        ),
        "llguidance": (NATIVE, "names missing from properties are declared as for xgrammar"),
    },
    "additionalProperties": {
        "xgrammar": (
            NATIVE,
            "explicit on every object leaf; absent means false in strict mode when properties are declared",
        ),
        "llguidance": (NATIVE, "as for xgrammar"),
    },
    "patternProperties": {
        "xgrammar": (REFUSED, "ignored by xgrammar"),
        "llguidance": (
            CONDITIONAL,
            "disjoint patterns as written (decided on their automata); up to 4 overlapping ones rewritten into one "
            "pattern per region of keys, with the intersection of their schemas",
        ),
    },
    "propertyNames": {
        "xgrammar": (
            REWRITTEN,
            "a list of names becomes declared properties; a pattern becomes patternProperties (then refused)",
        ),
        "llguidance": (
            REWRITTEN,
            "a list of names becomes declared properties; a pattern, length or format the only patternProperties key",
        ),
    },
    "minProperties": {
        "xgrammar": (
            CONDITIONAL,
            "<= 1, or implied by required names, or over declared properties only; values past 1024 refused (it "
            "wraps at 2^32); duplicate additional keys would count twice, so refused with additional properties",
        ),
        "llguidance": (
            CONDITIONAL,
            "<= 1 or implied by required names; refused with optional properties or duplicate-prone additional keys",
        ),
    },
    "maxProperties": {
        "xgrammar": (NATIVE, ""),
        "llguidance": (CONDITIONAL, "<= 1, or every declared property required"),
    },
}
for _keyword, _note in _BOTH_NORMALISED.items():
    TABLE.setdefault(_keyword, {"xgrammar": (REWRITTEN, _note), "llguidance": (REWRITTEN, _note)})
for _same, _as in (
    ("maximum", "minimum"),
    ("exclusiveMinimum", "minimum"),
    ("exclusiveMaximum", "minimum"),
    ("maxLength", "minLength"),
    ("maxItems", "minItems"),
):
    TABLE[_same] = TABLE[_as]


def how(keyword: str, engine: str) -> str:
    return TABLE[keyword][engine][0]


def markdown_table() -> str:
    """The table as Markdown (docs/json_schema_keywords.md's body)."""
    lines = ["| keyword | xgrammar | llguidance |", "|---|---|---|"]
    for keyword in sorted(TABLE, key=lambda k: k.lstrip("$").lower()):
        cells = []
        for engine in ENGINES:
            verdict, note = TABLE[keyword][engine]
            cells.append(f"**{verdict}**" + (f": {note}" if note else ""))
        lines.append(f"| `{keyword}` | " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
