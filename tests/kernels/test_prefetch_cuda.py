"""fd_guided.kernels.prefetch: the bitmask copy issued when the fill ends, on a side stream, waited
for by the kernel on the GPU. Marked `cuda`; NOT RUN YET (no GPU was available when written)."""
import threading
import time

import numpy as np
import pytest
import torch
import xgrammar

from fd_guided.kernels import allocate_pinned_bitmask, apply_token_bitmask_inplace, bitmask_width
from fd_guided.kernels.prefetch import BitmaskUploader

pytestmark = pytest.mark.cuda

VOCAB = 1000


def random_rows(rows: int, seed: int) -> torch.Tensor:
    packed = np.random.default_rng(seed).integers(-(2**31), 2**31, size=(rows, bitmask_width(VOCAB)), dtype=np.int64)
    return torch.from_numpy(packed.astype(np.int32))


def oracle(host: torch.Tensor, bitmask: torch.Tensor, indices=None) -> torch.Tensor:
    expected = host.clone()
    xgrammar.apply_token_bitmask_inplace(expected, bitmask.clone(), indices=indices, backend="cpu")
    return expected


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def test_rows_written_after_the_upload_are_copied_again():
    bitmask = allocate_pinned_bitmask(8, VOCAB)
    bitmask.copy_(random_rows(8, seed=1))
    uploader = BitmaskUploader("cuda:0", 8, bitmask.shape[1])
    upload = uploader.upload(bitmask, 6)
    bitmask[2] = random_rows(1, seed=2)[0]  # a stop row written by apply, after the fill
    bitmask[7] = random_rows(1, seed=3)[0]  # a late row, beyond the upload
    host = torch.randn(8, VOCAB)
    logits = host.cuda()
    apply_token_bitmask_inplace(logits, bitmask, [0, 2, 5, 7], prefetched=upload)
    assert torch.equal(bits(logits.cpu()), bits(oracle(host, bitmask, indices=[0, 2, 5, 7])))
    assert uploader.patched_rows == 2
    with pytest.raises(ValueError, match="applied already"):
        apply_token_bitmask_inplace(logits, bitmask, prefetched=upload)


def test_the_copy_runs_beside_the_forward_not_behind_it():
    bitmask = allocate_pinned_bitmask(32, VOCAB)
    bitmask.copy_(random_rows(32, seed=4))
    uploader = BitmaskUploader("cuda:0", 32, bitmask.shape[1])
    host = torch.randn(32, VOCAB)
    logits = host.cuda()
    torch.cuda.synchronize()
    torch.cuda._sleep(400 * 2_000_000)  # the "forward", ~400 ms on the logits' stream
    uploads = []
    fill_thread = threading.Thread(target=lambda: uploads.append(uploader.upload(bitmask, 32)))  # the fill ends
    fill_thread.start()
    fill_thread.join()
    deadline = time.perf_counter() + 0.3
    while not uploader.copied[uploads[0].buffer].query() and time.perf_counter() < deadline:
        time.sleep(0.001)
    assert uploader.copied[uploads[0].buffer].query(), "the copy did not finish beside the forward"
    assert not torch.cuda.current_stream().query(), "the forward ended first: the test proves nothing"
    apply_token_bitmask_inplace(logits, bitmask, prefetched=uploads[0])
    torch.cuda.synchronize()
    assert torch.equal(bits(logits.cpu()), bits(oracle(host, bitmask)))
    assert uploader.patched_rows == 0


def test_double_buffered_uploads_across_steps_on_a_busy_gpu():
    steps = 5
    bitmask = allocate_pinned_bitmask(4, VOCAB)
    uploader = BitmaskUploader("cuda:0", 4, bitmask.shape[1])
    hosts = [torch.randn(4, VOCAB) for _ in range(steps)]
    masks = [random_rows(4, seed=10 + i) for i in range(steps)]
    logits = [h.cuda() for h in hosts]
    torch.cuda.synchronize()
    torch.cuda._sleep(300 * 2_000_000)
    for step in range(steps):
        bitmask.copy_(masks[step])  # the next fill rewrites the host bitmask while copies are queued
        upload = uploader.upload(bitmask, 4)
        apply_token_bitmask_inplace(logits[step], bitmask, None if step % 2 else [1, 3], prefetched=upload)
    bitmask.fill_(-1)
    torch.cuda.synchronize()
    for step in range(steps):
        indices = None if step % 2 else [1, 3]
        assert torch.equal(bits(logits[step].cpu()), bits(oracle(hosts[step], masks[step], indices=indices))), step
