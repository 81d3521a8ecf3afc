"""fd_guided.schema.regex: Python's reading of a pattern, re-printed so engines never admit more.

The differential tests feed every short string over an alphabet of awkward characters (quote,
backslash, newline, control, non-ASCII) through real matchers and compare with ``re.search``.
"""
import itertools
import json
import random
import re

import pytest

from fd_guided.schema import regex
from fd_guided.schema.refusal import Refusal
from fd_guided.schema.regex import extendable

from engine_probe import ENGINES, accepts, spec_for

pytestmark = pytest.mark.cpu

ALPHABET = ["a", "b", '"', "\\", "\n", "é", "1", "\x01"]
STRINGS = [""] + ["".join(p) for n in (1, 2) for p in itertools.product(ALPHABET, repeat=n)]
TEXTS = sorted({json.dumps(s) for s in STRINGS} | {json.dumps(s, ensure_ascii=False) for s in STRINGS})


def engine_accepted(engine: str, pattern: str) -> list[str]:
    spec = spec_for(engine, {"type": "string", "pattern": pattern})
    return [text for text in TEXTS if accepts(engine, spec, text)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pattern", [
    r"^a(b[0-9]{1,6})?$",        # xgrammar's JSON-schema path dropped "b" here ("a12" was admitted)
    r"^[0-9]{1,4}(\.[0-9]{1,2})?$",
    r"^a\\b$", r'^a"b$', r"^a\nb$", r"^[\\\"a]$", r"^[^\\]$", r'^[^"]$', r"^[\x00-\x1f]$",
    r"^\S$", r"^\W$", r"^\D$", r"^.$", r"a", r"b$", r"^(a|)b?$", r"a(?=b)", r"^(?=a)[ab]", r"\ba\b", r"(a|\b)b", r"é\b",
])
def test_engines_never_admit_more_than_python(engine, pattern):
    try:
        regex.translate(pattern, engine)
    except Refusal:
        pytest.skip(f"{engine} refuses {pattern!r}")
    for text in engine_accepted(engine, pattern):
        assert re.search(pattern, json.loads(text)), (engine, pattern, text)


def test_random_patterns_against_both_engines():
    """A seeded sample of generated patterns: what an engine admits, Python's re.search admits."""
    rng = random.Random(7)
    atoms = ["a", "b", r"\"", r"\\", r"\n", "é", ".", "[ab]", "[^a]", r"\d", r"\w", r"\S", r"[^\\]", r"[\x00-\x1f]"]

    def draw(depth=0):
        roll = rng.random()
        if depth > 2 or roll < 0.35:
            return rng.choice(atoms)
        if roll < 0.6:
            return "".join(draw(depth + 1) for _ in range(2))
        if roll < 0.75:
            return f"({draw(depth + 1)}|{draw(depth + 1)})"
        return f"({draw(depth + 1)}){rng.choice(['?', '*', '+', '{1,2}', '{0,2}'])}"

    for _ in range(6):
        pattern = rng.choice(["^{}$", "{}", "^{}"]).format(draw())
        for engine in ENGINES:
            try:
                regex.translate(pattern, engine)
            except Refusal:
                continue
            for text in engine_accepted(engine, pattern):
                assert re.search(pattern, json.loads(text)), (engine, pattern, text)


def test_optional_groups_print_as_counted_repeats():
    assert regex.translate(r"^a(b[0-9]{1,6})?$", "xgrammar") == "^a(b[0-9]{1,6}){0,1}$"


def test_xgrammar_classes_lose_quote_backslash_and_controls():
    assert regex.translate(r"^[\\\"a]$", "xgrammar") == "^a$"
    with pytest.raises(Refusal, match="escaped characters"):
        regex.translate(r'^"$', "xgrammar")


def test_search_semantics_become_full_match():
    assert regex.translate("ab", "llguidance").startswith("^(")
    tree, _ = regex.parse("ab")
    full = regex.full_match_tree(tree, regex.PLAIN_JSON_CHARS)
    assert full[0] == "cat" and full[1][0][0] == "rep" and full[1][-1][0] == "rep"


@pytest.mark.parametrize("pattern, feature", [
    (r"^(a(?=b))*$", "look-ahead"), (r"x(a|(?!a)b)", "look-ahead"), (r"(?=a)\ba", "look-ahead"), (r"^(?<=a)b", "look-behind"), (r"^(a)\1$", "back-references"), (r"\Bword", r"\\B"),
    (r"(?i)abc", "flags"), (r"a^b", "anchors"), ("(" * 500 + "a" + ")" * 500, "RecursionError|nested"),
    ("[a-", "cannot read"),
])
def test_unsupported_constructs_are_refused(pattern, feature):
    with pytest.raises(Refusal, match=feature):
        regex.translate(pattern, "llguidance")


def test_xgrammar_bounded_repetitions_stay_under_its_compile_limit():
    with pytest.raises(Refusal, match="above 128"):
        regex.translate("^[a-z]{1,256}$", "xgrammar")
    assert regex.translate("^[a-z]{1,256}$", "llguidance")


def test_shorthands_inside_negated_classes_are_exact():
    tree, _ = regex.parse(r"[^\d]")
    assert not regex.contains(tree[1], ord("٣"))  # an Arabic-Indic digit is \d to Python
    positive, _ = regex.parse(r"\d")
    assert positive[1] == ((48, 57),)  # positive shorthands keep their ASCII members (a subset)


@pytest.mark.parametrize("pattern, full_match, expected", [
    ("^[a-z]+$", False, True), ("abc", False, True), ("^x", False, True), ("^(a+|b+)$", False, True),
    ("^[a-z]+-[0-9]+$", False, True), ("^.*$", False, True),
    ("^abc$", False, False), ("^(a|b+)$", False, False), ("^(foo|bar)$", False, False), ("^\\d{4}$", False, False),
    ('^["]+$', False, False), ("^a(b[0-9]{1,6})?$", False, False), ("(", False, False),
    ("[a-z]+", True, True), ("[a-z]{3}", True, False),
    # decided on the automaton: an optional end, a look-ahead, an end that a repetition can pass
    ("^/?([^/]+/)*[^/]+/?$", False, True), ("^(?!all$).*$", False, True), (r"^[a-z]+:[a-z]+( \(.+\))?$", False, True),
    (r"^\d+(\.\d+)?x$", False, False), (r"^\{?[0-9A-F]{8}\}?$", False, False), ("^(ab*|c)$", False, False),
])
def test_extendable_means_no_prefix_is_a_dead_end(pattern, full_match, expected):
    assert extendable(pattern, full_match=full_match) is expected


# ----- look-aheads: an exact difference (or intersection) of regular languages at their position ------

LOOK_AHEADS = [
    r"^(?!all$).*$", r"^(?!variables$)([a-zA-Z][a-zA-Z0-9_]+)$", r"^(?!@@)[@a-zA-Z0-9_-]+$",
    r"^(?!org\.bukkit\.)([a-zA-Z_$][a-zA-Z\d_$]*\.)*[a-zA-Z_$][a-zA-Z\d_$]*$", r"^(?![i|I][o|O][b|B])",
    r"^(?=a)[a-c]+$", r"^(?!(ab|b|abc)$)[a-c]*$", r"^(?!a)(?!.*c$)[a-c]+", r"^(?!a|bb)",
    r"^(?!.*(cb|\{a\}))[a-c{}]*\.[bB]$", r"^(?=.*b)(?!.*c)[abc]{2,5}$",
    # anchors Python's parser moves inside a group when it factors a common prefix out
    r"^ab$|^ac$|^b$", r"^a|^b$", r"^ab$|^ac", r"x(a|b$)", r"^(?:^[a-c]+:)?[^\s]*$", r"^$|^\./[a-c]+\.b$",
    # anchors written inside a group (its sequence spliced into the branch)
    r"^(a(b)?$)|(^c[ab]*$)", r"(^ab$)|(^b)", r"^(a(bc$))",
    # a look-ahead ending the pattern (no $): the search may run past it, so it is a plain suffix
    r"((?:[^\/]*\/)*)(?=\.(yaml|yml|json))", r"a(?=b)", r"^a(?=bc)", r"(a|b)(?=c|bb)", r"^(?!a)b(?=c)",
    # look-aheads inside the sequence: the rest of the string at their position
    r"^(.*?)\s(warn\s(>=|==|<=|>|<))(?=\s)(.*?)per\s(test|interval)$", r"a(?=b)c", r"a(?=b)b", r"a(?!b)[a-c]", r"(?!a)b",
    r"^x(?=.*y)[xyz]*$", r"a(?=bc?)b(?!c)", r"[ab]+(?=c)c*$", r"(?=a)", r"(?!a)", r"^a(?!b$)",
    # an optional trailing part beside the search's .* (its $ no longer inside the pattern)
    r"^\/(([A-c0-9\-\%]+\/)*[A-c0-9\-\%]+$)?", r"a(b$)?", r"(^b)?a", r"a(b\b)?",
]


def _python_text(tree: tuple) -> str:
    return regex._print(tree, lambda point, in_class: re.escape(chr(point)))


@pytest.mark.parametrize("pattern", LOOK_AHEADS)
def test_look_aheads_are_resolved_exactly(pattern):
    """Against Python's own re.search on every short string over the pattern's letters and
    thousands of random longer ones: never a string Python rejects (sound), and every string it
    accepts except those ending in a newline (a final $ reads strictly: a documented subset)."""
    tree, _ = regex.parse(pattern)
    full = regex.restrict(regex.full_match_tree(tree, regex._ALL), regex._ALL)
    ours = re.compile(r"(?!)" if full == regex.EMPTY_SET else _python_text(full))
    letters = sorted(set("abcvIOo@.\n{}|B") | {c for c in pattern if c.isalnum() or c in "@._$"})
    rng = random.Random(pattern)
    texts = ["".join(t) for n in range(4) for t in itertools.product(letters[:9], repeat=n)]
    texts += ["".join(rng.choice(letters) for _ in range(rng.randint(1, 14))) for _ in range(5000)]
    texts += ["variables", "variable", "variablesx", "org.bukkit.x", "org.bukkitx", "all", "all\n", "alll", "@@a", "IOB", "abc", "ab"]
    for text in texts:
        accepted, python = ours.fullmatch(text) is not None, re.search(pattern, text) is not None
        assert not accepted or python, ("unsound", text)
        assert accepted or not python or text.endswith("\n"), ("missing", text)


WORD_BOUNDARIES = [
    r"\bword", r"a\b", r"\b(?:high|medium|low|HIGH)\b", r"\b[0-9a-f]{2}\b-[0-9a-f]{2}-\b[0-9a-f]{3}\b",
    r"https?:\/\/(www\.)?[-a-zA-Z0-9@:%._\+~#=]{1,256}\.[a-zA-Z0-9()]{1,6}\b([-a-zA-Z0-9()@:%_\+.~#?&//=]*)",  # the common URL pattern
    r"^\b$", r"\b", r"^a\b", r"(?a)\bé", r"\bé\b", r"x\b\by", r"(a|\b)b", r"^(?!a\b)[a-c ]+$", r"a?\bb", r"(ab|c )\b(d| e)",
    r"^[a-c]+\b", r"\b_\b", r"^(\ba|b\b)+$",
]


@pytest.mark.parametrize("pattern", WORD_BOUNDARIES)
def test_word_boundaries_are_written_out_exactly(pattern):
    """``\\b`` against Python's re.search (exhaustive short strings over letters, digits, ``_``,
    non-ASCII word and non-word characters, then random longer ones): the same strings,
    whether the boundary was written out next to its items or on the whole pattern's automaton."""
    tree, _ = regex.parse(pattern)
    full = regex.full_match_tree(tree, regex._ALL)
    ours = None if full == regex.EMPTY_SET else re.compile(_python_text(full), re.DOTALL)
    letters = sorted(set("ab -.é_1x/:\n") | {c for c in pattern if c.isalnum()})
    rng = random.Random(pattern)
    texts = ["".join(t) for n in range(4) for t in itertools.product(letters[:9], repeat=n)]
    texts += ["".join(rng.choice(letters) for _ in range(rng.randint(1, 14))) for _ in range(3000)]
    texts += ["http://www.a.com/x", "https://ab.cd", "http://a.b_", "x https://ab.c1_ é", "high", "a high", "highx"]
    for text in texts:
        accepted, python = ours is not None and ours.fullmatch(text) is not None, re.search(pattern, text) is not None
        assert accepted == python or (python and text.endswith("\n") and "$" in pattern), (text, accepted, python)  # a final $ reads strictly


def test_a_negative_look_ahead_ending_in_dollar_also_refuses_a_final_newline():
    tree, _ = regex.parse(r"^(?!all$).*")
    full = re.compile(_python_text(regex.full_match_tree(tree, regex._ALL)), re.DOTALL)
    assert not full.fullmatch("all") and not full.fullmatch("all\n") and full.fullmatch("all\nx")


@pytest.mark.parametrize("pattern, feature", [
    (r"^(?![\s\S]{0,1000}x)", "look-ahead"), ("^(?!" + "|".join(f"w{i}" for i in range(3000)) + ")", "look-ahead"),
    ("a(?=a)" * 300, "look-aheads"), ("x(?!y)" * 300, "look-aheads"),  # an automaton each: counted first
    ("\\b" * 500, "word boundaries"), ("(a\\b)" * 200, "word boundaries"), ("[a-z]{1,50}(?![a-z]{1,50}x)" * 8, "look-ahead"),
])
def test_costly_look_aheads_are_refused_quickly(pattern, feature):
    import time

    started = time.perf_counter()
    with pytest.raises(Refusal, match=feature):
        regex.translate(pattern, "llguidance")
    assert time.perf_counter() - started < 10  # a budget of steps, not of seconds: generous here


@pytest.mark.parametrize("patterns", [[".*", "additionalProperties"], ["^a", "b$", "ab"], ["^x[0-9]+$", "^[a-z]+$", "1"]])
def test_pattern_regions_are_disjoint_and_exact(patterns):
    """Every string lies in the region of exactly the patterns Python's re.search says match it."""
    from fd_guided.schema import languages

    trees = [regex.full_match_tree(regex.parse(p)[0], regex.ALL_CHARS) for p in patterns]
    regions = {subset: re.compile(_python_text(tree)) for subset, tree in languages.regions(trees, regex.ALL_CHARS).items()}
    rng = random.Random(7)
    letters = sorted(set("".join(patterns).replace("^", "").replace("$", "").replace(".", "").replace("*", "")) | {"q", "0"})
    texts = ["".join(t) for n in range(4) for t in itertools.product(letters[:6], repeat=n)]
    texts += ["".join(rng.choice(letters) for _ in range(rng.randint(0, 24))) for _ in range(3000)] + ["additionalProperties"]
    for text in texts:
        expected = frozenset(i for i, p in enumerate(patterns) if re.search(p, text))
        found = [subset for subset, compiled in regions.items() if compiled.fullmatch(text)]
        assert found == ([expected] if expected else []), (text, expected, found)
