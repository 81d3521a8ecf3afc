"""tools/fill_tails.py's sample: SchemaStore schemas are decoded and walked whichever engines are
named (with only ``auto+first_masks`` it walked none: the decoding engine was never compiled)."""

import argparse
import json

import pytest
from tool_modules import import_tool

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def fill_tails():
    return import_tool("fill_tails")


SCHEMAS = {
    "point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
}


@pytest.mark.parametrize(
    "engines",
    [
        ["auto+first_masks"],
        ["llguidance"],
        ["xgrammar", "auto"],
        ["auto+first_masks", "llguidance+first_masks"],
        ["auto+first_masks", "auto+first_masks+unfactored"],
    ],
)
def test_schemastore_schemas_are_walked_by_every_engine_set(fill_tails, tmp_path, engines):
    for name, schema in SCHEMAS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(schema))
    args = argparse.Namespace(suite=0, schemastore=2, schemastore_dir=tmp_path, tokens=12, seed=0)
    report = fill_tails.new_report(engines)
    tool = fill_tails.Engines(engines)
    fill_tails.walk_sample(tool, fill_tails.prepare_sample(tool, args, report), report)
    assert report["schemastore_schemas"] == 2
    assert sorted(case for case, *_ in report["sample"]) == ["schemastore/point", "schemastore/tags"]
    for name in engines:
        assert report["fills"][name], name  # every named engine walked the decoded outputs
    assert set(fill_tails.per_part(report)) == {"schemastore"}


def test_a_saved_sample_is_walked_again_with_its_tokens(fill_tails, tmp_path):
    # --save-sample then --sample: the same outputs, each schema compiled once, every column first in turn.
    for name, schema in SCHEMAS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(schema))
    engines = ["auto+first_masks", "llguidance+first_masks"]
    tool = fill_tails.Engines(engines)
    args = argparse.Namespace(suite=0, schemastore=2, schemastore_dir=tmp_path, tokens=12, seed=0, sample=None)
    first = fill_tails.new_report(engines)
    fill_tails.walk_sample(tool, fill_tails.prepare_sample(tool, args, first), first)
    saved = tmp_path / "sample.json"
    saved.write_text(json.dumps(first["sample"]))
    again = fill_tails.new_report(engines)
    replay = fill_tails.prepare_sample(tool, argparse.Namespace(sample=saved), again)
    assert [(case, tokens) for case, _, _, tokens in replay] == [
        (case, tokens) for case, _, tokens, _ in first["sample"]
    ]
    assert again["schemastore_schemas"] == 2 and len(again["compile_s"]["llguidance+first_masks"]) == 2


def test_an_unfactored_column_compiles_xgrammars_own_grammar(fill_tails):
    # `+unfactored`: the grammar before fd_guided.backends.xgrammar_ebnf's factoring, compiled apart.
    import xgrammar as xgr

    engines = ["xgrammar", "xgrammar+unfactored", "xgrammar+first_masks+unfactored"]
    tool = fill_tails.Engines(engines)
    report = fill_tails.new_report(engines)
    compiled = tool.grammars({"type": "object", "properties": {k: {"type": "string"} for k in "abc"}}, report)
    factored, plain = compiled["xgrammar"][1].native, compiled["xgrammar+unfactored"][1].native
    assert compiled["xgrammar+first_masks+unfactored"][1] is compiled["xgrammar+unfactored"][1]
    assert "_alt ::=" in str(factored.grammar) and "_alt ::=" not in str(plain.grammar)
    assert isinstance(plain, xgr.CompiledGrammar) and tool.kept_rows["xgrammar+first_masks+unfactored"]
    with pytest.raises(SystemExit, match="unknown column mode"):
        fill_tails.kept_rows(["recurring"])
