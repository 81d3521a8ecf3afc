"""fd_guided.kernels on CUDA: zero copy per producer, in place, stream order, staging reuse.

Every test is marked `cuda`: tests/conftest.py skips them without a GPU (and fails them under
--require-cuda). Nothing here touches CUDA at import time, so the module collects on CPU machines.
"""
import importlib.util

import numpy as np
import pytest
import torch
import xgrammar

from fd_guided.kernels import (
    allocate_pinned_bitmask,
    apply_token_bitmask_inplace,
    bitmask_width,
    to_torch_view,
)
from fd_guided.kernels import cuda as cuda_kernel
from fd_guided.kernels.dlpack import producer_stream, producer_torch_stream

pytestmark = pytest.mark.cuda

PRODUCERS = ("torch", "cupy", "paddle")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BIG_VOCAB = 129_280


def make_bitmask(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Pinned int32 bitmask whose rows cycle through all-masked, all-allowed, sparse and random."""
    rng = np.random.default_rng(seed)
    width = bitmask_width(vocab)
    allowed = np.zeros((rows, width * 32), dtype=bool)
    for row in range(rows):
        kind = row % 4
        if kind == 1:
            allowed[row] = True
        elif kind == 2:
            allowed[row, rng.choice(vocab, size=min(vocab, 50), replace=False)] = True
        elif kind == 3:
            allowed[row] = rng.random(width * 32) < 0.5
    packed = np.packbits(allowed, axis=1, bitorder="little").view(np.int32)
    bitmask = allocate_pinned_bitmask(rows, width * 32)
    bitmask.copy_(torch.from_numpy(packed.copy()))
    return bitmask


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def cpu_oracle(host_logits: torch.Tensor, bitmask, indices=None, vocab_size=None) -> torch.Tensor:
    expected = host_logits.clone()
    xgrammar.apply_token_bitmask_inplace(
        expected, bitmask.cpu(), indices=indices, vocab_size=vocab_size, backend="cpu"
    )
    return expected


def random_host_logits(rows: int, vocab: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)).to(dtype)


def require_paddle_cuda():
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddle is not installed")
    import paddle

    if not paddle.is_compiled_with_cuda():
        pytest.skip("installed paddle is a CPU-only build")
    return paddle


def make_producer(kind: str, host: torch.Tensor):
    """(tensor owned by `kind` on cuda:0 holding `host`, function reading it back as a CPU torch tensor)."""
    if kind == "torch":
        tensor = host.cuda()
        return tensor, lambda: tensor.cpu()
    if kind == "cupy":
        cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
        if host.dtype == torch.bfloat16:
            pytest.skip("CuPy has no bfloat16")
        array = cupy.asarray(host.numpy())
        return array, lambda: torch.from_numpy(cupy.asnumpy(array))
    paddle = require_paddle_cuda()
    tensor = paddle.from_dlpack(host.cuda()).clone()  # paddle-owned GPU memory
    return tensor, lambda: torch.from_dlpack(tensor).cpu()


@pytest.mark.parametrize("producer", PRODUCERS)
def test_write_through_torch_view_is_seen_by_producer(producer):
    tensor, read_back = make_producer(producer, torch.zeros(3, 8))
    with producer_stream(tensor):
        view = to_torch_view(tensor)
        assert view.is_cuda
        view[1, 2] = 42.0
    torch.cuda.synchronize()  # test-side only: read the result
    assert read_back()[1, 2].item() == 42.0


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_results_equal_cpu_oracle(producer, dtype):
    host = random_host_logits(8, 1000, dtype)
    bitmask = make_bitmask(10, 1000)
    expected = cpu_oracle(host, bitmask[:8])
    tensor, read_back = make_producer(producer, host)
    apply_token_bitmask_inplace(tensor, bitmask)
    torch.cuda.synchronize()
    assert torch.equal(bits(read_back()), bits(expected))


@pytest.mark.parametrize("impl", ("auto", "cuda", "torch"))
def test_impls_in_place_on_torch_tensor(impl):
    host = random_host_logits(4, 640)
    bitmask = make_bitmask(4, 640)
    logits = host.cuda()
    pointer = logits.data_ptr()
    apply_token_bitmask_inplace(logits, bitmask, impl=impl)
    assert logits.data_ptr() == pointer
    assert torch.equal(bits(logits.cpu()), bits(cpu_oracle(host, bitmask)))


def test_paddle_gpu_tensor_masked_in_place():
    host = random_host_logits(4, 640)
    bitmask = make_bitmask(4, 640)
    tensor, read_back = make_producer("paddle", host)
    pointer, same_object = tensor.data_ptr(), tensor
    apply_token_bitmask_inplace(tensor, bitmask)
    assert tensor is same_object and tensor.data_ptr() == pointer
    assert torch.equal(bits(read_back()), bits(cpu_oracle(host, bitmask)))


@pytest.mark.parametrize("producer", ("torch", "paddle"))
def test_paddle_impl_on_gpu_logits(producer):
    require_paddle_cuda()
    host = random_host_logits(5, 1000, torch.bfloat16)
    bitmask = make_bitmask(5, 1000)
    tensor, read_back = make_producer(producer, host)
    apply_token_bitmask_inplace(tensor, bitmask, [0, 3, 4], impl="paddle")
    torch.cuda.synchronize()
    assert torch.equal(bits(read_back()), bits(cpu_oracle(host, bitmask, indices=[0, 3, 4])))


def test_cpu_impl_rejects_cuda_logits():
    with pytest.raises(ValueError, match="impl='cpu' needs cpu logits"):
        apply_token_bitmask_inplace(torch.zeros(2, 64, device="cuda"), make_bitmask(2, 64), impl="cpu")


def _delay_gpu(stream_work_ms: int = 50) -> None:
    """Keep the current stream busy so that later work on it runs late."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(stream_work_ms * 2_000_000)  # ~cycles at ~2 GHz
    else:
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(stream_work_ms):
            a = a @ a / 4096


def test_runs_on_producers_current_torch_stream():
    """Work queued on a side stream must be visible to the kernel without any synchronize."""
    vocab = 1000
    logits = torch.zeros(4, vocab, device="cuda")
    bitmask = allocate_pinned_bitmask(4, vocab)
    bitmask.zero_()
    bitmask[:, 0] = 1  # only token 0 allowed
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _delay_gpu()
        logits.fill_(1.0)  # runs late; a kernel on another stream would be overwritten by it
        apply_token_bitmask_inplace(logits, bitmask)
    side.synchronize()
    assert (logits[:, 0] == 1.0).all()
    assert torch.isneginf(logits[:, 1:]).all()


def test_runs_on_paddles_current_stream():
    tensor, read_back = make_producer("paddle", torch.zeros(2, 320))
    import paddle

    if not hasattr(paddle.device, "stream_guard"):
        pytest.skip("this paddle has no paddle.device.stream_guard")
    stream = paddle.device.Stream()
    bitmask = allocate_pinned_bitmask(2, 320)
    bitmask.zero_()
    with paddle.device.stream_guard(stream):
        assert producer_torch_stream(tensor).cuda_stream == stream.stream_base.cuda_stream
        tensor.fill_(2.0)
        apply_token_bitmask_inplace(tensor, bitmask)
    stream.synchronize()
    assert torch.isneginf(read_back()).all()


def test_host_bitmask_may_be_refilled_as_soon_as_apply_returns():
    vocab = 1000
    logits = torch.zeros(4, vocab, device="cuda")
    bitmask = allocate_pinned_bitmask(4, vocab)
    bitmask.zero_()  # everything masked
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _delay_gpu()  # the host-to-device copy is queued behind this
        apply_token_bitmask_inplace(logits, bitmask)
    bitmask.fill_(-1)  # the host refills for the next step while the GPU is still busy
    stream.synchronize()
    assert torch.isneginf(logits).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_indices_touch_only_their_rows(dtype):
    host = random_host_logits(6, 1000, dtype)
    bitmask = make_bitmask(6, 1000)
    indices = [5, 0, 2]
    logits = host.cuda()
    apply_token_bitmask_inplace(logits, bitmask, indices)
    result = bits(logits.cpu())
    assert torch.equal(result, bits(cpu_oracle(host, bitmask, indices=sorted(indices))))
    for untouched in (1, 3, 4):
        assert torch.equal(result[untouched], bits(host)[untouched])


def test_padded_vocab():
    host = random_host_logits(3, BIG_VOCAB)
    full = make_bitmask(3, BIG_VOCAB)
    logits = host.cuda()
    apply_token_bitmask_inplace(logits, full)
    assert torch.equal(bits(logits.cpu()), bits(cpu_oracle(host, full)))

    masked = allocate_pinned_bitmask(3, BIG_VOCAB)
    masked.zero_()
    logits = host.cuda()
    apply_token_bitmask_inplace(logits, masked, vocab_size=129_000)
    result = logits.cpu()
    assert torch.isneginf(result[:, :129_000]).all()
    assert torch.equal(bits(result[:, 129_000:]), bits(host[:, 129_000:]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_logits(dtype):
    vocab = 1000
    host_big = random_host_logits(5, vocab + 45, dtype)
    big = host_big.cuda()
    view = big[1:, 7 : 7 + vocab]
    bitmask = make_bitmask(4, vocab)
    apply_token_bitmask_inplace(view, bitmask)
    result = bits(big.cpu())
    expected = cpu_oracle(host_big[1:, 7 : 7 + vocab].contiguous(), bitmask)
    assert torch.equal(result[1:, 7 : 7 + vocab], bits(expected))
    outside = torch.ones(result.shape, dtype=torch.bool)
    outside[1:, 7 : 7 + vocab] = False
    assert torch.equal(result[outside], bits(host_big)[outside])


def test_bitmask_already_on_device():
    host = random_host_logits(4, 1000)
    bitmask = make_bitmask(4, 1000)
    logits = host.cuda()
    apply_token_bitmask_inplace(logits, bitmask.cuda(), [1, 3])
    assert torch.equal(bits(logits.cpu()), bits(cpu_oracle(host, bitmask, indices=[1, 3])))


def test_device_buffer_reused_across_calls():
    vocab = 1000
    bitmask = make_bitmask(6, vocab)
    width = bitmask.shape[1]
    logits = random_host_logits(6, vocab).cuda()
    apply_token_bitmask_inplace(logits, bitmask)
    staging = cuda_kernel.staging_buffers(logits.device.index, width)
    pointers = (staging.device_rows.data_ptr(), staging.device_compact.data_ptr())
    for indices in (None, [0, 4], None, [5]):
        apply_token_bitmask_inplace(logits, bitmask, indices)
        current = cuda_kernel.staging_buffers(logits.device.index, width)
        assert current is staging
        assert (current.device_rows.data_ptr(), current.device_compact.data_ptr()) == pointers
    assert all(slot.rows.is_pinned() for slot in staging.slots)


@pytest.mark.parametrize("indices", (None, [0, 2]), ids=("all_rows", "indices"))
@pytest.mark.parametrize("bitmask_on", ("pinned_host", "device"))
def test_apply_never_waits_for_the_gpu(indices, bitmask_on):
    """The host enqueues and returns while the stream is still busy: no sync of any kind."""
    host = random_host_logits(4, 1000)
    bitmask = make_bitmask(4, 1000)
    logits = host.cuda()
    device_bitmask = bitmask.cuda() if bitmask_on == "device" else bitmask
    apply_token_bitmask_inplace(logits, device_bitmask, indices)  # warm-up: buffers, Triton compile
    torch.cuda.synchronize()
    logits.copy_(host.cuda())
    stream = torch.cuda.current_stream()
    _delay_gpu(200)
    apply_token_bitmask_inplace(logits, device_bitmask, indices)
    assert not stream.query(), "apply waited for the GPU work queued before it"
    stream.synchronize()
    assert torch.equal(bits(logits.cpu()), bits(cpu_oracle(host, bitmask, indices=indices)))
