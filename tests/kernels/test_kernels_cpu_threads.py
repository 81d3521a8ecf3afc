"""The C kernel split across threads (`_cpu_mask.apply(threads=)`): bit-identical to xgrammar's CPU
kernel (or the torch reference, itself identical to it) for every thread count, row selection, dtype and vocab tail; run in a subprocess (a crash in
the new threaded path fails this test only)."""
import pytest
from isolated import run_isolated

pytestmark = pytest.mark.cpu


def test_every_thread_count_matches_xgrammar():
    result = run_isolated("""
        import json
        import numpy as np, torch, xgrammar
        from fd_guided.kernels import cpu
        from fd_guided.kernels.torch_native import apply_token_bitmask_inplace_torch

        assert cpu.FAST_PATH_AVAILABLE
        rng = np.random.default_rng(3)
        checked = 0
        # 16,384 tokens = one work unit: vocabs below, at and across unit and word boundaries
        for vocab in (33, 16_384, 16_384 + 31, 3 * 16_384 + 1, 129_280):
            width = (vocab + 31) // 32
            for rows, indices in ((1, None), (7, None), (9, [8, 0, 3]), (5, [])):
                allowed = rng.random((rows, width * 32)) < rng.choice([0.001, 0.5, 0.97], size=(rows, 1))
                bitmask = torch.from_numpy(np.packbits(allowed, axis=1, bitorder="little").view(np.int32).copy())
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    logits = torch.randn(rows, vocab + 5).to(dtype)  # wider than the vocab
                    expected = logits.clone()
                    if vocab % 32 == 0 and indices is None:
                        xgrammar.apply_token_bitmask_inplace(expected, bitmask, vocab_size=vocab, backend="cpu")
                    elif indices != []:  # (no rows: nothing changes)
                        # the torch reference (bit-identical to xgrammar: tests/kernels/test_kernels_cpu.py):
                        # xgrammar's CPU kernel corrupted the heap here on rows whose vocab is not a
                        # multiple of 32 (vocab 33, bf16), even without our kernel in the process
                        apply_token_bitmask_inplace_torch(expected, bitmask, tuple(indices) if indices is not None else None, vocab)
                    for path in cpu._cpu_mask.paths():
                        for threads in (1, 2, 3, 0):
                            got = logits.clone()
                            used = cpu._cpu_mask.apply(got.data_ptr(), got.stride(0), str(dtype).split(".")[1],
                                                       bitmask.data_ptr(), bitmask.stride(0), vocab, rows, indices,
                                                       path=path, threads=threads)
                            assert 0 <= used <= max(1, threads or 16), used
                            view = torch.int32 if got.element_size() == 4 else torch.int16
                            assert torch.equal(got.view(view), expected.view(view)), (vocab, rows, indices, dtype, path, threads)
                            checked += 1
        print(json.dumps({"checked": checked}))
    """)
    assert result["checked"] >= 5 * 4 * 3 * 4


def test_more_than_one_thread_really_runs_on_a_big_call():
    result = run_isolated("""
        import json, torch
        from fd_guided.kernels import cpu
        logits, bitmask = torch.randn(8, 129_280), torch.zeros(8, 4040, dtype=torch.int32)
        used = cpu._cpu_mask.apply(logits.data_ptr(), 129_280, "float32", bitmask.data_ptr(), 4040, 129_280, 8, threads=2)
        small = cpu._cpu_mask.apply(logits.data_ptr(), 129_280, "float32", bitmask.data_ptr(), 4040, 100, 1, threads=2)
        print(json.dumps({"used": used, "small": small, "all_masked": bool(torch.isneginf(logits).all())}))
    """)
    assert result == {"used": 2, "small": 1, "all_masked": True}
