"""String formats as exact (or documented-smaller) regular expressions.

Engines enforce some formats loosely (xgrammar's ``ipv4`` admits ``1.02.3.4``, its ``date``
``2023-02-30``; llguidance's ``date`` likewise) and most not at all, and a ``pattern`` next to a
native format is ignored by xgrammar. The normaliser therefore never hands an engine a ``format``:
each one below becomes a ``pattern`` (Python syntax, full match) that then goes through
`fd_guided.schema.regex` like any other pattern.

Every pattern admits only strings that both judges accept: `jsonschema`'s format checker with the
``jsonschema[format]`` extras (rfc3339-validator, rfc3987, fqdn, isoduration, jsonpointer, ...) and
the JSON-Schema-Test-Suite's optional format tests. Where the format is wider than a regex can say
simply, the pattern is a documented subset (`SUBSET_NOTES`): a valid output is always in the
format, some valid strings cannot be produced. tests/schema/test_formats.py checks each pattern
against the checkers on generated strings.
"""

from __future__ import annotations

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_YEAR = r"([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)"
DATE = (
    rf"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
DATE_TIME = rf"{DATE}[Tt]{TIME}"

# RFC 3339 appendix A: P (date [time] | time | weeks); components 1-9 digits (isoduration's limit
# is far above; 9 keeps the grammar small).
_N = r"[0-9]{1,9}"
_DUR_TIME = rf"T({_N}H({_N}M({_N}S)?)?|{_N}M({_N}S)?|{_N}S)"
_DUR_DATE = rf"({_N}D|{_N}M({_N}D)?|{_N}Y({_N}M({_N}D)?)?)"
DURATION = rf"P({_DUR_DATE}({_DUR_TIME})?|{_DUR_TIME}|{_N}W)"

_HEX = "[0-9a-fA-F]"
UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"


def _label(size: int) -> str:
    """A hostname label of at most `size` characters without "--" (excludes the punycode "xn--")."""
    return rf"([A-Za-z0-9]{{1,{size}}}|[A-Za-z0-9](-?[A-Za-z0-9]){{1,{(size - 1) // 2}}})"


# At most 3 labels of 63 or 8 labels of 30 characters: never past the 253-character limit.
HOSTNAME = rf"({_label(63)}(\.{_label(63)}){{0,2}}|{_label(30)}(\.{_label(30)}){{3,7}})"

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
EMAIL = rf"{_ATEXT}{{1,64}}(\.{_ATEXT}{{1,64}}){{0,7}}@{HOSTNAME}"

_H16 = rf"{_HEX}{{1,4}}"


def _ipv6() -> str:
    forms = [rf"({_H16}:){{7}}{_H16}", rf"({_H16}:){{6}}{IPV4}"]
    for left in range(0, 8):  # "::" with `left` groups before it and up to 7 - left after it
        head = "" if left == 0 else rf"({_H16}:){{{left - 1}}}{_H16}" if left > 1 else _H16
        room = 7 - left
        tail = "" if room == 0 else rf"({_H16}(:{_H16}){{0,{room - 1}}})?"
        forms.append(f"{head}::{tail}")
        if left <= 5:
            v4_room = 5 - left
            middle = "" if v4_room == 0 else rf"({_H16}:){{0,{v4_room}}}"
            forms.append(f"{head}::{middle}{IPV4}")
    return "(" + "|".join(forms) + ")"


IPV6 = _ipv6()

# RFC 3986 (URI) and RFC 3987 (IRI, with the Basic Multilingual Plane part of ucschar).
_PCT = rf"%{_HEX}{{2}}"
_SUB = r"[!$&'()*+,;=]"


def _uri_parts(unreserved: str) -> dict[str, str]:
    pchar = rf"({unreserved}|{_PCT}|{_SUB}|[:@])"
    segment_nz_nc = rf"({unreserved}|{_PCT}|{_SUB}|@)+"
    userinfo = rf"({unreserved}|{_PCT}|{_SUB}|:)*"
    host = rf"(\[{IPV6}\]|{IPV4}|({unreserved}|{_PCT}|{_SUB})*)"
    authority = rf"({userinfo}@)?{host}(:[0-9]*)?"
    abempty = rf"(/{pchar}*)*"
    absolute = rf"/({pchar}+(/{pchar}*)*)?"
    rootless = rf"{pchar}+(/{pchar}*)*"
    noscheme = rf"{segment_nz_nc}(/{pchar}*)*"
    tail = rf"(\?({pchar}|[/?])*)?(#({pchar}|[/?])*)?"
    scheme = r"[A-Za-z][A-Za-z0-9+.-]*"
    absolute_uri = rf"{scheme}:(//{authority}{abempty}|{absolute}|{rootless}|){tail}"
    relative = rf"(//{authority}{abempty}|{absolute}|{noscheme}|){tail}"
    return {"absolute": absolute_uri, "reference": rf"({absolute_uri}|{relative})"}


_URI = _uri_parts(r"[A-Za-z0-9._~-]")
_IRI = _uri_parts(r"[A-Za-z0-9._~\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef-]")
JSON_POINTER = r"(/([^~/]|~[01])*)*"
# jsonschema refuses a digit after a 0 anywhere in the prefix ("106"), the suite refuses leading zeros.
RELATIVE_JSON_POINTER = rf"(0|[1-9]+0?)(#|{JSON_POINTER})"

# ECMA-262 regular expressions: a regular subset that both Python's `re` (jsonschema's checker
# compiles the string) and ECMA-262 (with and without the u flag) accept. Groups nest at most
# three deep (bounded nesting keeps the language regular); no look-around, back-references,
# named groups, inline flags or Unicode escapes; a class range is a digit or same-case letter
# range written in order (``a-f``: ``f-a`` is an error in both); ``{n,m}`` needs n to be one digit
# (so n <= m is a character comparison); metacharacters are literal only when escaped.
_RE_META = r"\\^$.|?*+()\[\]{}"
_RE_ESCAPE = r"\\[dDwWsSntrfv\\^$.|?*+()\[\]{}/]"
_RE_CLASS_ITEM = r"\\[dDwWsSntrfv\\\[\]^\-]|[^\\\[\]\-]"


def _re_class_ranges() -> str:
    ranges = []
    for alphabet in ("0123456789", "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"):
        for low in alphabet[:-1]:
            ranges.append(f"{low}-[{low}-{alphabet[-1]}]")
        ranges.append(f"{alphabet[-1]}-{alphabet[-1]}")
    return "|".join(ranges)


_RE_COUNT = "|".join([r"\{[0-9]{1,3},?\}"] + [rf"\{{{d},([{d}-9]|[1-9][0-9]{{1,2}})\}}" for d in range(10)])
_RE_QUANTIFIER = rf"([?*+]|{_RE_COUNT})\??"
_RE_ATOM = rf"[^{_RE_META}]|{_RE_ESCAPE}|\[\^?({_re_class_ranges()}|{_RE_CLASS_ITEM})+\]|\."


def _re_alternation(depth: int) -> str:
    item = rf"({_RE_ATOM})({_RE_QUANTIFIER})?|[\^$]|\\[bB]"
    if depth:
        item += rf"|\((\?:)?{_re_alternation(depth - 1)}\)({_RE_QUANTIFIER})?"
    return rf"({item}|\|)*"


REGEX = _re_alternation(3)

# CSS 2.1 colours as jsonschema's "color" checker reads them: one of the 17 names (any case) or
# #rgb / #rrggbb (rgb() forms are left out: the checker refuses them).
_CSS21_NAMES = (
    "aqua",
    "black",
    "blue",
    "fuchsia",
    "gray",
    "green",
    "lime",
    "maroon",
    "navy",
    "olive",
    "orange",
    "purple",
    "red",
    "silver",
    "teal",
    "white",
    "yellow",
)
COLOR = (
    "("
    + "|".join("".join(f"[{c.lower()}{c.upper()}]" for c in name) for name in _CSS21_NAMES)
    + rf"|#({_HEX}{{3}}|{_HEX}{{6}}))"
)
# OpenAPI "byte": base64 (RFC 4648 section 4) with its padding.
BASE64 = r"([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"

FORMAT_PATTERNS = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "duration": DURATION,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "uuid": UUID,
    "hostname": HOSTNAME,
    "idn-hostname": HOSTNAME,
    "email": EMAIL,
    "idn-email": EMAIL,
    "uri": _URI["absolute"],
    "uri-reference": _URI["reference"],
    "iri": _IRI["absolute"],
    "iri-reference": _IRI["reference"],
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "regex": REGEX,
    # Formats outside JSON Schema's list with one clear meaning elsewhere. jsonschema checks only
    # "color" of these (its CSS 2.1 checker, in FormatChecker()); the others no validator checks,
    # so any string is valid and the pattern narrows to what the name means (sound, documented).
    "color": COLOR,
    "byte": BASE64,
    "host-name": HOSTNAME,
    "ip-address": IPV4,
    "url": _URI["absolute"],
    "datetime": DATE_TIME,
}

# OpenAPI/Kubernetes formats that only describe a string (a UI hint, raw octets, the string side
# of an IntOrString): no validator checks them and they name no syntax, so they constrain nothing.
ANNOTATION_FORMATS = frozenset({"binary", "password", "int-or-string"})

# Formats JSON Schema defines that no regular expression captures (refused unless annotated).
UNSUPPORTED_FORMATS = {"uri-template": "no exact pattern is implemented"}

# Where a pattern is smaller than the format (sound: it only drops valid strings).
SUBSET_NOTES = {
    "time": "no leap second (23:59:60): the rfc3339 checker jsonschema uses rejects it",
    "date-time": "no leap second (see time)",
    "duration": "each component has at most 9 digits",
    "hostname": "ASCII labels without '--' (no punycode A-labels); at most 3 labels of 63 or 8 of 30 characters",
    "idn-hostname": "as hostname: ASCII only",
    "email": "dot-atom local part (no quoted strings), hostname domain (no address literals)",
    "idn-email": "as email: ASCII only",
    "iri": "non-ASCII characters from the Basic Multilingual Plane only; no private-use characters",
    "iri-reference": "as iri",
    "relative-json-pointer": "no 0 before another digit in the prefix (jsonschema's checker refuses 106)",
    "color": "the 17 CSS 2.1 names and #rgb/#rrggbb (jsonschema's checker); no rgb() forms",
    "host-name": "draft 3's name for hostname: as hostname",
    "ip-address": "draft 3's name for ipv4: as ipv4",
    "url": "read as uri (no validator checks 'url')",
    "datetime": "read as date-time (no validator checks 'datetime')",
    "regex": (
        "valid in both Python's re and ECMA-262; groups nest at most 3 deep; no look-around, "
        "back-references, named groups, flags or \\u/\\x escapes; ranges only within digits or one "
        "letter case; {n,m} with a one-digit n"
    ),
}


def format_pattern(name: str) -> str | None:
    """The full-match Python regex for format `name`, or None when none is known."""
    return FORMAT_PATTERNS.get(name)
