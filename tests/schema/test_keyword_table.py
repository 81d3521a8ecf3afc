"""docs/json_schema_keywords.md is generated from the table the emitter follows: it must not drift."""
from pathlib import Path

import pytest

from fd_guided.schema.capabilities import ENGINES, REFUSED, TABLE, how, markdown_table

pytestmark = pytest.mark.cpu
DOC = Path(__file__).resolve().parents[2] / "docs" / "json_schema_keywords.md"


def test_doc_matches_the_code():
    text = DOC.read_text(encoding="utf-8")
    assert markdown_table() in text, "regenerate with: python tools/conformance.py --keywords"


def test_every_verdict_is_known_and_refusals_hold():
    from engine_probe import spec_for
    from fd_guided import InvalidGrammarError

    for keyword, per_engine in TABLE.items():
        assert set(per_engine) == set(ENGINES), keyword
    # A keyword the table says is refused is refused by that engine (with the feature named).
    assert how("patternProperties", "xgrammar") == REFUSED
    for schema in ({"type": "object", "patternProperties": {"^a": {}}}, {"type": "string", "minLength": 1, "pattern": "a"}):
        with pytest.raises(InvalidGrammarError) as caught:
            spec_for("xgrammar", schema)
        assert caught.value.feature
