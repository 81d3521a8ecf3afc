"""The engine conformance corpus of tests/test_engine.py, run on the llguidance and auto backends
with both real tokenizers: every finished output must validate."""
import pytest

from fd_guided import GuidedConfig
from fd_guided.harness.engine import ReferenceEngine

from test_engine import MAX_TOKENS, check_results, corpus_requests

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("tokenizer", ["deepseek", "qwen"])
@pytest.mark.parametrize("backend", ["llguidance", "auto"])
def test_conformance_corpus(backend, tokenizer):
    # auto waits for its preferred engine here (no race): which engine is first ready is timing, and
    # this test is about routing by what each engine enforces.
    engine = ReferenceEngine.default(preset="tiny", tokenizer=tokenizer, max_num_seqs=32,
                                     guided_config=GuidedConfig(backend=backend, auto_first_ready=False))
    requests = corpus_requests()
    results = engine.generate(requests, max_tokens=MAX_TOKENS, seed=1)
    check_results(requests, results, min_finished_fraction=0.75)
    used = engine.manager.metrics.labelled("requests_by_backend_total")
    assert sum(used.values()) == len(requests)
    # auto: xgrammar for most of the corpus, llguidance for the oneOf schema it cannot enforce exactly
    assert set(used) == ({"llguidance"} if backend == "llguidance" else {"xgrammar", "llguidance"})
    engine.close()


def test_bad_requests_fail_alone_on_llguidance():
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=8, guided_config=GuidedConfig(backend="llguidance"))
    requests = [
        {"prompt": "ok", "guided_choice": ["red", "green"]},
        {"prompt": "bad", "guided_json": {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}},
        {"prompt": "bad", "guided_regex": "(unclosed"},
        {"prompt": "ok", "guided_json": {"allOf": [{"type": "integer", "minimum": 3}, {"maximum": 5}]}},
    ]
    results = engine.generate(requests, max_tokens=MAX_TOKENS)
    assert results[1].finish_reason == "error" and "uniqueItems" in results[1].error
    assert results[2].finish_reason == "error" and "guided_regex" in results[2].error
    assert results[0].text in ("red", "green") and results[3].text in ("3", "4", "5")
    engine.close()
