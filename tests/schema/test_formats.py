"""Format patterns admit only strings jsonschema's format checker (with the [format] extras) accepts."""
import datetime
import ipaddress
import json
import random
import re

import jsonschema
import pytest

from fd_guided.harness.conformance import suite_root
from fd_guided.schema.formats import DATE, DATE_TIME, FORMAT_PATTERNS, IPV4

from sampling import sample

pytestmark = pytest.mark.cpu
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
ALL_CHECKERS = jsonschema.FormatChecker()  # every format jsonschema knows (also draft 3's "color")


def test_the_format_extras_are_installed():
    """Without them jsonschema silently skips these formats and every output would 'validate'."""
    assert {"date-time", "time", "uri", "hostname", "duration", "iri", "json-pointer"} <= set(CHECKER.checkers)


@pytest.mark.parametrize("name", sorted(FORMAT_PATTERNS))
def test_every_sampled_string_passes_the_checker(name):
    rng = random.Random(hash(name) & 0xFFFF)
    pattern = FORMAT_PATTERNS[name]
    for text in sample(rf"\A(?:{pattern})\Z", rng, count=1500):
        assert re.fullmatch(pattern, text)
        judge = CHECKER if name in CHECKER.checkers else ALL_CHECKERS  # the latter's "time" is draft 3's
        assert judge.conforms(text, name), (name, text)


def test_formats_outside_json_schema_mean_what_their_name_says():
    """"byte" strings decode as base64; "color" is jsonschema's CSS checker's; draft 3's names
    are their later ones; OpenAPI's descriptive formats constrain nothing."""
    import base64
    from fd_guided.schema import for_engine

    rng = random.Random(5)
    for text in sample(rf"\A(?:{FORMAT_PATTERNS['byte']})\Z", rng, count=500):
        base64.b64decode(text, validate=True)  # raises on anything but padded base64
    assert not re.fullmatch(FORMAT_PATTERNS["byte"], "abc") and re.fullmatch(FORMAT_PATTERNS["byte"], "YWJj")
    assert re.fullmatch(FORMAT_PATTERNS["color"], "Navy") and not re.fullmatch(FORMAT_PATTERNS["color"], "#ffff")
    assert FORMAT_PATTERNS["host-name"] == FORMAT_PATTERNS["hostname"] and FORMAT_PATTERNS["ip-address"] == FORMAT_PATTERNS["ipv4"]
    for fmt in ("password", "binary", "int-or-string"):
        assert for_engine("llguidance", {"type": "string", "format": fmt}) == {
            "type": "string", "$schema": "https://json-schema.org/draft/2020-12/schema"}


def test_patterns_refuse_every_invalid_string_of_the_suite():
    root = suite_root()
    if root is None:
        pytest.skip("JSON-Schema-Test-Suite not found (set FD_GUIDED_JSON_SCHEMA_SUITE)")
    checked = 0
    for draft in ("draft2020-12", "draft7"):
        for path in sorted((root / "tests" / draft / "optional" / "format").glob("*.json")):
            for case in json.loads(path.read_text()):
                pattern = FORMAT_PATTERNS.get(case["schema"].get("format"))
                for test in case["tests"]:
                    if pattern is None or not isinstance(test["data"], str) or test["valid"]:
                        continue
                    checked += 1
                    assert not re.fullmatch(pattern, test["data"]), (path.name, test["description"])
    assert checked > 150


def test_date_pattern_matches_python_on_random_dates():
    rng = random.Random(0)
    for _ in range(20_000):
        text = f"{rng.randint(0, 9999):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}"
        try:
            datetime.date.fromisoformat(text)
            ok = True
        except ValueError:
            ok = False
        assert (re.fullmatch(DATE, text) is not None) == ok, text


def test_ipv4_pattern_refuses_leading_zeros():
    rng = random.Random(1)
    for _ in range(20_000):
        text = ".".join(str(rng.choice([rng.randint(0, 300), "0" + str(rng.randint(0, 99))])) for _ in range(4))
        try:
            ipaddress.IPv4Address(text)
            ok = True
        except ValueError:
            ok = False
        assert (re.fullmatch(IPV4, text) is not None) == ok, text


def test_date_time_accepts_lowercase_separators_and_fractions():
    assert re.fullmatch(DATE_TIME, "2024-02-29t23:59:59.123456789z")
    assert not re.fullmatch(DATE_TIME, "2023-02-29T00:00:00Z")
    assert not re.fullmatch(DATE_TIME, "2024-01-01T24:00:00Z")


@pytest.mark.parametrize("fmt, good, bad", [
    ("date-time", "2024-02-29T10:00:00Z", "2024-02-30T10:00:00Z"), ("time", "10:00:00Z", "10:00:00"),
    ("uri", "https://a.b/c", "not a uri"), ("hostname", "example.com", "-bad-.com"), ("duration", "P1D", "1D"),
])
def test_outputs_are_judged_with_format_checking(fmt, good, bad):
    from fd_guided import parse_guided_request
    from fd_guided.harness.validate import missing_format_checkers, validate_output

    assert missing_format_checkers() == []
    spec = parse_guided_request({"guided_json": {"type": "string", "format": fmt}})
    assert validate_output(spec, json.dumps(good)).valid and not validate_output(spec, json.dumps(bad)).valid


def test_regex_format_strings_are_also_ecmascript_regexes(tmp_path):
    """The 'regex' pattern is a subset valid in both dialects: Python's re (jsonschema's checker)
    and ECMA-262, with and without the u flag, judged by node's own RegExp."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node (an ECMA-262 engine) is not installed")
    texts = list(sample(rf"\A(?:{FORMAT_PATTERNS['regex']})\Z", random.Random(3), count=3000))
    assert any("(" in text for text in texts) and any("[" in text for text in texts)
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    script = ("const texts = require(process.argv[1]); const bad = [];"
              "for (const t of texts) for (const f of ['', 'u']) { try { new RegExp(t, f) } catch (e) { bad.push([t, f, e.message]) } }"
              "console.log(JSON.stringify(bad))")
    result = subprocess.run([node, "-e", script, str(tmp_path / "texts.json")], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("text", ["(a", "a)", "[a", "a{2,1}", "*a", "a**", "[z-a]", "(?P<n>a)", "(?<=a)b", r"\1", "a{,5}", "^*"])
def test_the_regex_format_refuses_invalid_or_unportable_regexes(text):
    assert not re.fullmatch(FORMAT_PATTERNS["regex"], text)
