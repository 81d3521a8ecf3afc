"""The manager with FD_GUIDED_BITMASK_PREFETCH=1 on CUDA logits: the fill thread uploads the
bitmask when the fill ends and apply waits for it on the GPU; the masks equal those of CPU logits
step after step, stop rows written after the upload included. Marked `cuda`; NOT RUN YET."""
import numpy as np
import pytest
import torch

from fd_guided import parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.manager import GuidedDecodingManager
from fd_guided.tokenizer import load_tokenizer
from guided_helpers import add_ready

pytestmark = pytest.mark.cuda

VOCAB = 129_280
SPEC = parse_guided_request({"guided_json": {"type": "object", "properties": {"id": {"type": "integer"}},
                                             "required": ["id"]}, "disable_any_whitespace": True})


def run(device: str, monkeypatch) -> tuple[list[list[set[int]]], int]:
    monkeypatch.setenv("FD_GUIDED_BITMASK_PREFETCH", "1")
    tokenizer = load_tokenizer("deepseek")
    manager = GuidedDecodingManager(XGrammarBackend(tokenizer, vocab_size=VOCAB), max_num_seqs=4)
    text = tokenizer.encode('{"id":123}')
    try:
        for slot in (0, 2):
            add_ready(manager, slot, SPEC, prefill_done=True)
        steps = []
        for step in range(len(text) + 1):
            manager.begin_step([0, 1, 2])
            if device == "cuda":
                torch.cuda._sleep(50 * 2_000_000)  # a forward on the logits' stream
            logits = torch.zeros(3, VOCAB, device=device)
            manager.apply(logits)
            host = logits.cpu().numpy()
            steps.append([set(np.flatnonzero(np.isfinite(row)).tolist()) for row in host])
            token = text[step] if step < len(text) else 1
            manager.accept([token, 7, 1 if step == 2 else token])  # slot 2 ends early: stop rows after
        uploader = manager.step.fill.uploader
        patched = uploader.patched_rows if uploader is not None else -1
        return steps, patched
    finally:
        manager.close()


def test_prefetched_masks_equal_cpu_masks_step_after_step(monkeypatch):
    on_gpu, patched = run("cuda", monkeypatch)
    on_cpu, _ = run("cpu", monkeypatch)
    assert on_gpu == on_cpu
    assert patched > 0  # slot 2's stop rows were written after their upload and copied again
