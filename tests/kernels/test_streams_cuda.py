"""The CUDA path's stream ordering, staging reuse, devices and the native-kernel option, under a
busy GPU: each test delays a stream so that a missing wait shows up as a wrong result.

Marked `cuda`: skipped without a GPU, failures under --require-cuda. NOT RUN YET: no GPU was
available when these were written (docs/integration.md, "What has run on a GPU").
"""
import importlib.util

import numpy as np
import pytest
import torch
import xgrammar

from fd_guided.kernels import allocate_pinned_bitmask, apply_token_bitmask_inplace, bitmask_width, dlpack, warm_up_cuda
from fd_guided.kernels import cuda as cuda_kernel

pytestmark = pytest.mark.cuda

VOCAB = 1000


def paddle_cuda():
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddle is not installed")
    import paddle

    if not paddle.is_compiled_with_cuda():
        pytest.skip("installed paddle is a CPU-only build")
    return paddle


def delay_torch(ms: int = 100) -> None:
    """Keep torch's current stream busy for about `ms`."""
    torch.cuda._sleep(ms * 2_000_000)


def delay_paddle(paddle, ms: int = 100) -> None:
    """Keep paddle's current stream busy (paddle has no sleep kernel: chained matmuls)."""
    a = paddle.randn([4096, 4096])
    for _ in range(max(1, ms // 5)):
        a = paddle.matmul(a, a) / 4096.0


def oracle(host: torch.Tensor, bitmask: torch.Tensor, indices=None, vocab_size=None) -> torch.Tensor:
    expected = host.clone()
    xgrammar.apply_token_bitmask_inplace(expected, bitmask.cpu(), indices=indices, vocab_size=vocab_size, backend="cpu")
    return expected


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def random_bitmask(rows: int, vocab: int, seed: int) -> torch.Tensor:
    packed = np.random.default_rng(seed).integers(-(2**31), 2**31, size=(rows, bitmask_width(vocab)), dtype=np.int64)
    bitmask = allocate_pinned_bitmask(rows, vocab)
    bitmask.copy_(torch.from_numpy(packed.astype(np.int32)))
    return bitmask


def test_a_torch_bitmask_written_late_on_torchs_stream_is_read_after_the_write_by_paddle_logits():
    paddle = paddle_cuda()
    logits = paddle.ones([4, VOCAB], dtype="float32")
    device_bitmask = torch.full((4, bitmask_width(VOCAB)), -1, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        delay_torch()
        device_bitmask.zero_()  # late: everything masked; a read not waiting for it sees "all allowed"
        apply_token_bitmask_inplace(logits, device_bitmask)
    paddle.device.synchronize()
    torch.cuda.synchronize()
    assert np.isneginf(logits.numpy()).all()


def test_the_bitmasks_next_write_waits_for_the_read_on_paddles_stream():
    paddle = paddle_cuda()
    logits = paddle.ones([4, VOCAB], dtype="float32")
    device_bitmask = torch.zeros((4, bitmask_width(VOCAB)), dtype=torch.int32, device="cuda")  # all masked
    torch.cuda.synchronize()
    delay_paddle(paddle)  # the kernel on paddle's stream runs late
    apply_token_bitmask_inplace(logits, device_bitmask)
    device_bitmask.fill_(-1)  # torch's next write: must not overtake the kernel's read
    paddle.device.synchronize()
    torch.cuda.synchronize()
    assert np.isneginf(logits.numpy()).all()


def test_paddle_logits_written_late_on_paddles_stream_are_masked_after_the_write():
    paddle = paddle_cuda()
    logits = paddle.zeros([3, VOCAB], dtype="float32")
    bitmask = allocate_pinned_bitmask(3, VOCAB)
    bitmask.zero_()
    delay_paddle(paddle)
    logits.fill_(2.0)  # late on paddle's stream: a kernel not ordered after it would be overwritten
    apply_token_bitmask_inplace(logits, bitmask)
    sampled = paddle.argmax(logits, axis=-1)  # paddle's next work, after the kernel by stream order
    paddle.device.synchronize()
    assert np.isneginf(logits.numpy()).all() and sampled.shape == [3]


def test_an_unreachable_paddle_stream_is_masked_with_paddle_ops_or_refused(monkeypatch):
    paddle = paddle_cuda()
    monkeypatch.setattr(dlpack, "_paddle_current_stream", lambda device: None)
    host = torch.randn(4, VOCAB)
    bitmask = random_bitmask(4, VOCAB, seed=3)
    logits = paddle.to_tensor(host.numpy(), place=paddle.CUDAPlace(0))
    apply_token_bitmask_inplace(logits, bitmask, [0, 2])
    assert torch.equal(bits(torch.from_numpy(logits.numpy())), bits(oracle(host, bitmask, indices=[0, 2])))
    with pytest.raises(dlpack.StreamOrderError):  # a torch device bitmask cannot be ordered with it
        apply_token_bitmask_inplace(logits, bitmask.cuda())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strided_paddle_views(dtype):
    paddle = paddle_cuda()
    host = torch.randn(5, VOCAB + 45).to(getattr(torch, dtype))
    big = paddle.from_dlpack(host.cuda()).clone()
    view = paddle.from_dlpack(torch.from_dlpack(big)[1:, 7:7 + VOCAB])  # a strided paddle tensor on big's memory
    assert list(view.strides) == [VOCAB + 45, 1]
    bitmask = random_bitmask(4, VOCAB, seed=4)
    apply_token_bitmask_inplace(view, bitmask)
    result = torch.from_dlpack(big).cpu()
    assert torch.equal(bits(result[1:, 7:7 + VOCAB]), bits(oracle(host[1:, 7:7 + VOCAB].contiguous(), bitmask)))
    outside = torch.ones(result.shape, dtype=torch.bool)
    outside[1:, 7:7 + VOCAB] = False
    assert torch.equal(bits(result)[outside], bits(host)[outside])


def test_staging_slots_reused_while_the_gpu_is_busy_keep_each_steps_mask():
    steps = 5  # more than the two pinned slots: a slot is refilled while its last copy may be queued
    hosts = [torch.randn(4, VOCAB) for _ in range(steps)]
    masks = [random_bitmask(4, VOCAB, seed=10 + i) for i in range(steps)]
    shared = allocate_pinned_bitmask(4, VOCAB)  # the manager's one host bitmask, refilled every step
    logits = [h.cuda() for h in hosts]
    torch.cuda.synchronize()
    delay_torch(300)
    for step in range(steps):
        shared.copy_(masks[step])
        apply_token_bitmask_inplace(logits[step], shared, None if step % 2 else [0, 3])
    shared.fill_(-1)
    torch.cuda.synchronize()
    for step in range(steps):
        indices = None if step % 2 else [0, 3]
        assert torch.equal(bits(logits[step].cpu()), bits(oracle(hosts[step], masks[step], indices=indices))), step


def test_staging_growth_while_busy():
    hosts = [torch.randn(rows, VOCAB) for rows in (2, 40, 3)]
    masks = [random_bitmask(len(h), VOCAB, seed=20 + i) for i, h in enumerate(hosts)]
    logits = [h.cuda() for h in hosts]
    torch.cuda.synchronize()
    delay_torch(200)
    for t, m in zip(logits, masks):
        apply_token_bitmask_inplace(t, m)  # 40 rows outgrow the staging made for 2
    torch.cuda.synchronize()
    for t, h, m in zip(logits, hosts, masks):
        assert torch.equal(bits(t.cpu()), bits(oracle(h, m)))


@pytest.mark.parametrize("producer", ["torch", "paddle"])
def test_logits_on_the_second_gpu(producer):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    host = torch.randn(4, VOCAB)
    bitmask = random_bitmask(4, VOCAB, seed=5)
    torch.cuda.set_device(0)
    if producer == "torch":
        logits = host.to("cuda:1")
        read = lambda: logits.cpu()  # noqa: E731
    else:
        paddle = paddle_cuda()
        logits = paddle.to_tensor(host.numpy(), place=paddle.CUDAPlace(1))
        read = lambda: torch.from_numpy(logits.numpy())  # noqa: E731
    apply_token_bitmask_inplace(logits, bitmask, [1, 2])
    torch.cuda.synchronize(1)
    assert torch.equal(bits(read()), bits(oracle(host, bitmask, indices=[1, 2])))
    assert cuda_kernel.staging_buffers(1, bitmask.shape[1]) is not None


def native_kernel_or_skip():
    try:
        from xgrammar.kernels import apply_token_bitmask_inplace_cuda  # noqa: F401  (builds with nvcc)
    except (ImportError, RuntimeError, OSError) as error:
        pytest.skip(f"xgrammar's CUDA kernel cannot be built here: {error}")


def test_the_native_kernel_leaves_padding_alone_and_takes_taller_bitmasks():
    native_kernel_or_skip()
    padded, vocab = 129_280 + 64, 129_000
    host = torch.randn(3, padded)
    bitmask = random_bitmask(8, 129_280, seed=6)  # taller than the logits
    logits = host.cuda()
    cuda_kernel.apply_token_bitmask_inplace_cuda(logits, bitmask, None, vocab, backend="cuda")
    result = logits.cpu()
    assert torch.equal(bits(result), bits(oracle(host, bitmask[:3], vocab_size=vocab)))
    assert torch.equal(bits(result[:, vocab:]), bits(host[:, vocab:]))


def test_the_native_kernel_gives_unaligned_views_to_triton():
    native_kernel_or_skip()
    host = torch.randn(4, VOCAB + 8)
    big = host.cuda()
    view = big[:, 1:1 + VOCAB]  # 4-byte offset: float4 stores would be misaligned
    assert view.data_ptr() % 16
    bitmask = random_bitmask(4, VOCAB, seed=7)
    cuda_kernel.apply_token_bitmask_inplace_cuda(view, bitmask, (0, 2), VOCAB, backend="cuda")
    assert torch.equal(bits(big.cpu()[:, 1:1 + VOCAB]), bits(oracle(host[:, 1:1 + VOCAB].contiguous(), bitmask, indices=[0, 2])))


def test_warm_up_then_a_step_compiles_nothing():
    warm_up_cuda(VOCAB)
    logits = torch.randn(3, VOCAB, dtype=torch.bfloat16, device="cuda")
    bitmask = random_bitmask(3, VOCAB, seed=8)
    torch.cuda.synchronize()
    delay_torch(200)
    apply_token_bitmask_inplace(logits, bitmask, [0, 2])  # a Triton compile here would outlast the delay's start
    assert not torch.cuda.current_stream().query(), "apply waited (a compile or a sync) behind the queued work"
    torch.cuda.synchronize()
