"""tools/coverage_report.py end to end on a small folder: counts, reasons, validation, reports."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

TOOL = Path(__file__).resolve().parent.parent / "tools" / "coverage_report.py"


def test_report_on_a_small_folder(tmp_path):
    schemas = tmp_path / "schemas"
    (schemas / "nested").mkdir(parents=True)
    (schemas / "plain.json").write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))
    (schemas / "nested" / "all_of.json").write_text(json.dumps({"allOf": [{"type": "integer", "minimum": 1}, {"maximum": 3}]}))
    (schemas / "unique.json").write_text(json.dumps({"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}))
    (schemas / "broken.json").write_text("{not json")
    out_json, out_md = tmp_path / "report.json", tmp_path / "report.md"
    run = subprocess.run([sys.executable, str(TOOL), str(schemas), "--backends", "llguidance", "--generate", "5",
                          "--max-tokens", "32", "--json", str(out_json), "--markdown", str(out_md)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out_json.read_text())
    summary = report["summary"][0]
    assert (summary["schemas"], summary["accepted"], summary["rejected"], summary["crashed"]) == (4, 2, 2, 0)
    assert summary["valid"] + summary["length_cut"] == summary["generated"] == 2 and summary["invalid"] == 0
    reasons = dict(summary["top_rejections"])
    assert any("uniqueItems" in r for r in reasons) and any(r.startswith("malformed JSON") for r in reasons)
    markdown = out_md.read_text()
    assert "| llguidance | 2 | 2 | 0 | 0 |" in markdown and "uniqueItems" in markdown


def test_the_engines_alone_are_counted_beside(tmp_path):
    """llguidance counts as refusing only on an error or a warning (`not` is unimplemented there);
    xgrammar converts what it only partly enforces; malformed JSON counts for neither."""
    sys.path.insert(0, str(TOOL.parent))
    from raw_engines import raw_counts

    counts = raw_counts([json.dumps({"type": "integer"}), json.dumps({"type": "string", "not": {"const": "a"}}), "{not json"])
    assert counts == {"schemas": 3, "llguidance": 1, "xgrammar": 2, "failed": 0}
