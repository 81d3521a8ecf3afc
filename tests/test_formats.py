"""The strict format patterns agree exactly with the validators jsonschema uses."""
import datetime
import ipaddress
import random
import re

import pytest

from fd_guided.backends.formats import DATE, DATE_TIME, IPV4, with_strict_formats

pytestmark = pytest.mark.cpu


def python_date_ok(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
        return True
    except ValueError:
        return False


def python_ipv4_ok(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
        return True
    except ValueError:
        return False


def test_date_pattern_matches_python_on_random_dates():
    rng = random.Random(0)
    for _ in range(50_000):
        text = f"{rng.randint(0, 9999):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}"
        assert (re.fullmatch(DATE, text) is not None) == python_date_ok(text), text
    for text, ok in [("2024-02-29", True), ("2023-02-29", False), ("2000-02-29", True), ("1900-02-29", False), ("0000-01-01", False)]:
        assert (re.fullmatch(DATE, text) is not None) is ok


def test_ipv4_pattern_matches_python_including_leading_zeros():
    rng = random.Random(1)
    for _ in range(50_000):
        text = ".".join(str(rng.choice([rng.randint(0, 300), "0" + str(rng.randint(0, 99))])) for _ in range(4))
        assert (re.fullmatch(IPV4, text) is not None) == python_ipv4_ok(text), text


def test_date_time_pattern():
    assert re.fullmatch(DATE_TIME, "2024-02-29T23:59:59.5+08:00")
    assert not re.fullmatch(DATE_TIME, "2023-02-29T00:00:00Z")
    assert not re.fullmatch(DATE_TIME, "2024-01-01T24:00:00Z")


def test_rewrite_touches_only_schema_positions():
    schema = {"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"}, "e": {"type": "string", "format": "email"}},
              "default": {"format": "ipv4"}}
    rewritten = with_strict_formats(schema)
    assert "format" not in rewritten["properties"]["ip"] and rewritten["properties"]["ip"]["pattern"].startswith("^")
    assert rewritten["properties"]["e"]["format"] == "email"
    assert rewritten["default"] == {"format": "ipv4"}
    assert schema["properties"]["ip"]["format"] == "ipv4"  # the input is not modified


def test_properties_named_like_keywords_are_not_rewritten():
    schema = {"type": "object", "properties": {"format": {"type": "string", "format": "date"},
                                                 "minLength": {"type": "integer"}}}
    rewritten = with_strict_formats(schema)
    assert set(rewritten["properties"]) == {"format", "minLength"}
    assert "pattern" in rewritten["properties"]["format"] and "format" not in rewritten["properties"]["format"]
