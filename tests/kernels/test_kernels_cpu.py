"""fd_guided.kernels on CPU: every impl against xgrammar's own CPU kernel, bit for bit."""
import subprocess
import sys

import numpy as np
import paddle
import pytest
import torch
import xgrammar

from fd_guided.kernels import (
    IMPLS,
    allocate_pinned_bitmask,
    apply_token_bitmask_inplace,
    bitmask_width,
    to_paddle_view,
    to_torch_view,
)
from fd_guided.kernels import cpu as cpu_kernel
from fd_guided.kernels import paddle as paddle_kernel

pytestmark = pytest.mark.cpu

CPU_IMPLS = ("cpu", "paddle", "torch", "auto")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DENSITIES = ("zeros", "ones", "sparse", "nearly_all", "random", "mixed")
BIG_VOCAB = 129_280


def make_bitmask(rows: int, vocab: int, density: str, seed: int = 0) -> torch.Tensor:
    """int32 (rows, ceil(vocab/32)); "mixed" gives every row a different density."""
    rng = np.random.default_rng(seed)
    width = bitmask_width(vocab)
    allowed = np.zeros((rows, width * 32), dtype=bool)
    for row in range(rows):
        kind = DENSITIES[row % 5] if density == "mixed" else density
        if kind == "ones":
            allowed[row] = True
        elif kind == "sparse":
            allowed[row, rng.choice(vocab, size=min(vocab, 50), replace=False)] = True
        elif kind == "nearly_all":
            allowed[row] = rng.random(width * 32) > 0.03
        elif kind == "random":
            allowed[row] = rng.random(width * 32) < 0.5
    return torch.from_numpy(np.packbits(allowed, axis=1, bitorder="little").view(np.int32).copy())


def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bit patterns, so -inf, NaN and signed zeros compare exactly."""
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def xgrammar_reference(logits: torch.Tensor, bitmask, indices=None, vocab_size=None) -> torch.Tensor:
    expected = logits.clone()
    xgrammar.apply_token_bitmask_inplace(
        expected, bitmask, indices=indices, vocab_size=vocab_size, backend="cpu"
    )
    return expected


def random_logits(rows: int, vocab: int, dtype=torch.float32, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)


def as_paddle(t: torch.Tensor) -> paddle.Tensor:
    return paddle.from_dlpack(t.clone())


def paddle_bits(p: paddle.Tensor) -> torch.Tensor:
    return bits(torch.from_dlpack(p).clone())


# ---- results identical to xgrammar -----------------------------------------------------------


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("density", DENSITIES)
def test_torch_logits_match_xgrammar(impl, dtype, density):
    vocab = 1000  # 31 full words + an 8-bit tail word
    logits = random_logits(7, vocab, dtype)
    bitmask = make_bitmask(9, vocab, density)  # more bitmask rows than logits rows is allowed
    expected = xgrammar_reference(logits, bitmask[:7])
    result = apply_token_bitmask_inplace(logits, bitmask, impl=impl)
    assert result is None
    assert torch.equal(bits(logits), bits(expected))


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("density", ("mixed", "random"))
def test_paddle_logits_match_xgrammar(impl, dtype, density):
    logits = random_logits(6, 777, dtype)
    bitmask = make_bitmask(6, 777, density)
    expected = xgrammar_reference(logits, bitmask)
    target = as_paddle(logits)
    apply_token_bitmask_inplace(target, bitmask, impl=impl)
    assert torch.equal(paddle_bits(target), bits(expected))


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_float32_oracle_agrees_for_half_types(impl):
    """fp16/bf16 results equal the float32 result cast down (the mask does not depend on dtype)."""
    logits = random_logits(4, 640)
    bitmask = make_bitmask(4, 640, "mixed")
    oracle = xgrammar_reference(logits, bitmask)
    for dtype in (torch.float16, torch.bfloat16):
        half = logits.to(dtype)
        apply_token_bitmask_inplace(half, bitmask, impl=impl)
        assert torch.equal(bits(half), bits(oracle.to(dtype)))


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_numpy_bitmask_and_numpy_logits(impl):
    logits = random_logits(3, 300).numpy()
    bitmask = make_bitmask(3, 300, "mixed").numpy()
    expected = xgrammar_reference(torch.from_numpy(logits), torch.from_numpy(bitmask))
    apply_token_bitmask_inplace(logits, bitmask, impl=impl)
    assert torch.equal(bits(torch.from_numpy(logits)), bits(expected))


def test_torch_fallback_of_cpu_path_when_extension_missing(monkeypatch):
    monkeypatch.setattr(cpu_kernel, "_cpu_mask", None)
    logits = random_logits(5, 1000, torch.bfloat16)
    bitmask = make_bitmask(5, 1000, "mixed")
    expected = xgrammar_reference(logits, bitmask)
    apply_token_bitmask_inplace(logits, bitmask, impl="cpu")
    assert torch.equal(bits(logits), bits(expected))


ROW_LOOPS = cpu_kernel._cpu_mask.paths() if cpu_kernel.FAST_PATH_AVAILABLE else ()


def few_masked_bitmask(rows: int, vocab: int, seed: int = 2) -> torch.Tensor:
    """All allowed but 1-40 scattered tokens per row (free text minus a few special tokens)."""
    rng = np.random.default_rng(seed)
    allowed = np.ones((rows, bitmask_width(vocab) * 32), dtype=bool)
    for row in range(rows):
        allowed[row, rng.choice(vocab, size=int(rng.integers(1, min(vocab, 40) + 1)), replace=False)] = False
    return torch.from_numpy(np.packbits(allowed, axis=1, bitorder="little").view(np.int32).copy())


@pytest.mark.parametrize("row_loop", ROW_LOOPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("vocab", (31, 512, 1000, 1553, BIG_VOCAB, 151_936))
def test_every_row_loop_matches_xgrammar(row_loop, dtype, vocab):
    """Each C row loop, forced, on vocab sizes below, at and across its 512-token blocks."""
    masks = torch.cat([make_bitmask(6, vocab, "mixed"), few_masked_bitmask(3, vocab)])
    rows = masks.shape[0]
    wide = random_logits(rows, vocab + 37, dtype)  # strided rows: the row stride exceeds the vocab
    logits = wide[:, 5:5 + vocab]
    expected = wide.clone()
    expected[:, 5:5 + vocab] = xgrammar_reference(logits.contiguous(), masks)
    cpu_kernel._cpu_mask.apply(
        logits.data_ptr(), logits.stride(0), str(dtype).split(".")[-1], masks.data_ptr(), masks.stride(0),
        vocab, rows, [1, 2, 4, 6, 7, 8], path=row_loop,
    )
    touched = [1, 2, 4, 6, 7, 8]
    assert torch.equal(bits(wide[touched]), bits(expected[touched]))
    untouched = [0, 3, 5]
    assert torch.equal(bits(wide[untouched]), bits(random_logits(rows, vocab + 37, dtype)[untouched]))


def test_row_loop_choice_is_checked():
    logits, masks = torch.zeros(1, 64), torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="path must be"):
        cpu_kernel._cpu_mask.apply(logits.data_ptr(), 64, "float32", masks.data_ptr(), 2, 64, 1, path="sse9")
    assert ROW_LOOPS[-1] == "portable"


def test_fast_path_is_built_and_active():
    from fd_guided.kernels import _cpu_mask

    assert cpu_kernel.FAST_PATH_AVAILABLE
    assert cpu_kernel._cpu_mask is _cpu_mask


# ---- indices: mixed guided / unguided batch --------------------------------------------------


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("producer", ("torch", "paddle"))
def test_indices_touch_only_their_rows(impl, dtype, producer):
    logits = random_logits(6, 1000, dtype)
    before = bits(logits.clone())
    bitmask = make_bitmask(6, 1000, "mixed")
    indices = [4, 1, 2]  # unordered on purpose
    expected = xgrammar_reference(logits, bitmask, indices=sorted(indices))
    if producer == "paddle":
        target = as_paddle(logits)
        apply_token_bitmask_inplace(target, bitmask, indices, impl=impl)
        after = paddle_bits(target)
    else:
        apply_token_bitmask_inplace(logits, bitmask, indices, impl=impl)
        after = bits(logits)
    assert torch.equal(after, bits(expected))
    for untouched in (0, 3, 5):
        assert torch.equal(after[untouched], before[untouched])


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_indices_as_tensor_and_bitmask_with_more_rows(impl):
    logits = random_logits(3, 200)
    bitmask = make_bitmask(8, 200, "random")
    expected = xgrammar_reference(logits, bitmask, indices=[2])
    apply_token_bitmask_inplace(logits, bitmask, torch.tensor([2]), impl=impl)
    assert torch.equal(bits(logits), bits(expected))


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_empty_indices_change_nothing(impl):
    logits = random_logits(3, 200)
    before = logits.clone()
    apply_token_bitmask_inplace(logits, make_bitmask(3, 200, "zeros"), [], impl=impl)
    assert torch.equal(bits(logits), bits(before))


# ---- padded vocab ------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("producer", ("torch", "paddle"))
def test_full_size_vocab(impl, producer):
    logits = random_logits(3, BIG_VOCAB)
    bitmask = make_bitmask(3, BIG_VOCAB, "mixed")
    expected = xgrammar_reference(logits, bitmask)
    if producer == "paddle":
        target = as_paddle(logits)
        apply_token_bitmask_inplace(target, bitmask, impl=impl)
        assert torch.equal(paddle_bits(target), bits(expected))
    else:
        apply_token_bitmask_inplace(logits, bitmask, impl=impl)
        assert torch.equal(bits(logits), bits(expected))


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vocab_size_smaller_than_logits_leaves_tail_untouched(impl, dtype):
    tokenizer_vocab = 129_000
    logits = random_logits(3, BIG_VOCAB, dtype)
    before = bits(logits.clone())
    bitmask = make_bitmask(3, BIG_VOCAB, "zeros")  # everything masked, padding bits included
    expected = xgrammar_reference(logits, bitmask, vocab_size=tokenizer_vocab)
    apply_token_bitmask_inplace(logits, bitmask, vocab_size=tokenizer_vocab, impl=impl)
    assert torch.equal(bits(logits), bits(expected))
    assert torch.isneginf(logits[:, :tokenizer_vocab].float()).all()
    assert torch.equal(bits(logits)[:, tokenizer_vocab:], before[:, tokenizer_vocab:])


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_bitmask_narrower_than_logits_leaves_extra_columns_untouched(impl):
    logits = random_logits(2, 1000)  # bitmask covers 960 tokens (30 words)
    before = bits(logits.clone())
    bitmask = make_bitmask(2, 960, "zeros")
    apply_token_bitmask_inplace(logits, bitmask, impl=impl)
    assert torch.isneginf(logits[:, :960]).all()
    assert torch.equal(bits(logits)[:, 960:], before[:, 960:])


# ---- strided rows, in place, zero copy ---------------------------------------------------------


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_slice_of_wider_tensor(impl, dtype):
    vocab = 1000
    big = random_logits(5, vocab + 45, dtype)
    original = bits(big.clone())
    view = big[1:, 7 : 7 + vocab]  # row stride 1045, offset 1052 elements
    bitmask = make_bitmask(4, vocab, "mixed")
    expected = xgrammar_reference(view.contiguous(), bitmask)
    apply_token_bitmask_inplace(view, bitmask, impl=impl)
    assert torch.equal(bits(view.contiguous()), bits(expected))
    outside = torch.ones_like(original, dtype=torch.bool)
    outside[1:, 7 : 7 + vocab] = False
    assert torch.equal(bits(big)[outside], original[outside])


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paddle_slice_of_wider_tensor(impl, dtype):
    vocab = 1000
    source = random_logits(5, vocab + 45, dtype)
    big = as_paddle(source)
    view = big[1:, 7 : 7 + vocab]
    assert not view.is_contiguous()
    bitmask = make_bitmask(4, vocab, "mixed")
    expected = xgrammar_reference(source[1:, 7 : 7 + vocab].contiguous(), bitmask, indices=[0, 2, 3])
    apply_token_bitmask_inplace(view, bitmask, [0, 2, 3], impl=impl)
    after = paddle_bits(big)
    assert torch.equal(after[1:, 7 : 7 + vocab], bits(expected))
    outside = torch.ones(after.shape, dtype=torch.bool)
    outside[1:, 7 : 7 + vocab] = False
    assert torch.equal(after[outside], bits(source)[outside])


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_paddle_tensor_masked_in_place(impl):
    target = paddle.to_tensor(np.zeros((2, 64), dtype=np.float32))
    pointer = target.data_ptr()
    bitmask = torch.tensor([[0x0000FFFF, -1], [-1, 0]], dtype=torch.int32)
    same_object = target
    apply_token_bitmask_inplace(target, bitmask, impl=impl)
    assert target is same_object and target.data_ptr() == pointer
    values = target.numpy()
    assert np.isneginf(values[0, 16:32]).all() and (values[0, :16] == 0).all()
    assert (values[0, 32:] == 0).all() and np.isneginf(values[1, 32:]).all()


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_torch_tensor_masked_in_place(impl):
    target = torch.zeros(2, 64)
    pointer = target.data_ptr()
    apply_token_bitmask_inplace(target, torch.tensor([[1, 0], [0, -1]], dtype=torch.int32), impl=impl)
    assert target.data_ptr() == pointer
    assert target[0, 0] == 0 and torch.isneginf(target[0, 1:]).all()
    assert torch.isneginf(target[1, :32]).all() and (target[1, 32:] == 0).all()


def test_torch_view_of_paddle_tensor_shares_memory():
    source = paddle.to_tensor(np.zeros((3, 5), dtype=np.float32))
    view = to_torch_view(source)
    view[1, 2] = 123.0
    assert source.numpy()[1, 2] == 123.0
    strided = paddle.to_tensor(np.zeros((3, 8), dtype=np.float32))
    to_torch_view(strided[1:, 2:6])[0, 0] = 7.0
    assert strided.numpy()[1, 2] == 7.0


def test_paddle_view_of_torch_tensor_shares_memory():
    source = torch.zeros(3, 5)
    view = to_paddle_view(source)
    view[2, 4] = 9.0
    assert source[2, 4] == 9.0


def test_paddle_device_bitmask_rows_match_host_rows():
    """The on-device bitmask branch (XPU/NPU bitmasks), exercised on the CPU place."""
    bitmask = make_bitmask(6, 300, "mixed")
    words = bitmask_width(300)
    for indices in (None, (5, 0, 3)):
        host = paddle_kernel._host_rows(bitmask, indices, 4, words)
        device = paddle_kernel._device_rows(as_paddle(bitmask), indices, 4, words, paddle.CPUPlace())
        np.testing.assert_array_equal(device.numpy(), host)


# ---- argument errors -------------------------------------------------------------------------


def _good():
    return random_logits(3, 100), make_bitmask(3, 100, "random")


ERROR_CASES = {
    "unknown impl": (lambda l, b: dict(logits=l, bitmask=b, impl="gpu"), ValueError, "unknown impl 'gpu'; valid: auto, cpu, paddle, cuda, torch"),
    "cuda impl on cpu": (lambda l, b: dict(logits=l, bitmask=b, impl="cuda"), ValueError, "impl='cuda' needs cuda logits"),
    "1-D logits": (lambda l, b: dict(logits=l[0], bitmask=b), ValueError, "logits must be 2-D"),
    "3-D bitmask": (lambda l, b: dict(logits=l, bitmask=b[None]), ValueError, "bitmask must be 2-D"),
    "int64 bitmask": (lambda l, b: dict(logits=l, bitmask=b.long()), TypeError, "bitmask dtype must be int32, got int64"),
    "int logits": (lambda l, b: dict(logits=l.int(), bitmask=b), TypeError, "logits dtype must be one of"),
    "index too large": (lambda l, b: dict(logits=l, bitmask=b, indices=[0, 3]), ValueError, r"indices\[1\] = 3 out of range"),
    "negative index": (lambda l, b: dict(logits=l, bitmask=b, indices=[-1]), ValueError, r"indices\[0\] = -1 out of range"),
    "index beyond bitmask rows": (lambda l, b: dict(logits=l, bitmask=b[:2], indices=[2]), ValueError, "out of range"),
    "bool indices": (lambda l, b: dict(logits=l, bitmask=b, indices=[True, False]), TypeError, "row numbers"),
    "float index": (lambda l, b: dict(logits=l, bitmask=b, indices=[1.0]), TypeError, "row numbers"),
    "indices not a sequence": (lambda l, b: dict(logits=l, bitmask=b, indices=3), TypeError, "sequence of ints"),
    "bitmask too few rows": (lambda l, b: dict(logits=l, bitmask=b[:2]), ValueError, "bitmask too small for the rows"),
    "vocab_size too large": (lambda l, b: dict(logits=l, bitmask=b, vocab_size=101), ValueError, r"vocab_size=101 is outside \[0, logits width 100\]"),
    "bitmask too narrow": (lambda l, b: dict(logits=l, bitmask=b[:, :2], vocab_size=100), ValueError, "bitmask too narrow"),
    "vocab stride": (lambda l, b: dict(logits=torch.zeros(100, 3).t(), bitmask=b), ValueError, "stride 1 along the vocab"),
    "not a tensor": (lambda l, b: dict(logits=[[0.0] * 100] * 3, bitmask=b), TypeError, "expected a paddle.Tensor, a torch.Tensor or a DLPack producer"),
    "bitmask not a tensor": (lambda l, b: dict(logits=l, bitmask=b.tolist()), TypeError, "got list"),
}


@pytest.mark.parametrize("case", ERROR_CASES, ids=str)
def test_argument_errors(case):
    build, error, message = ERROR_CASES[case]
    logits, bitmask = _good()
    before = logits.clone()
    with pytest.raises(error, match=message):
        apply_token_bitmask_inplace(**build(logits, bitmask))
    assert torch.equal(bits(logits), bits(before))  # nothing written on a rejected call


def test_paddle_logits_errors_name_the_problem():
    logits = paddle.zeros([2, 64], dtype="float32")
    with pytest.raises(TypeError, match="bitmask dtype must be int32, got int64"):
        apply_token_bitmask_inplace(logits, paddle.zeros([2, 2], dtype="int64"))
    with pytest.raises(ValueError, match="bitmask too small"):
        apply_token_bitmask_inplace(logits, paddle.zeros([1, 2], dtype="int32"), impl="paddle")


# ---- helpers and import hygiene ---------------------------------------------------------------


def test_bitmask_width_and_allocation():
    assert [bitmask_width(v) for v in (1, 32, 33, BIG_VOCAB)] == [1, 1, 2, 4040]
    bitmask = allocate_pinned_bitmask(4, 100)
    assert bitmask.shape == (4, 4) and bitmask.dtype == torch.int32
    assert (bitmask == -1).all()
    assert bitmask.is_pinned() == torch.cuda.is_available()
    assert IMPLS == ("auto", "cpu", "paddle", "cuda", "torch")


def test_importing_kernels_loads_no_heavy_library():
    code = (
        "import sys, fd_guided; before = set(sys.modules); import fd_guided.kernels; "
        "heavy = {'torch', 'paddle', 'xgrammar', 'triton'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_real_grammar_masks_match_xgrammar(dtype):
    """Masks xgrammar filled while a JSON document was constrained with the DeepSeek tokenizer."""
    from fd_guided.harness.bench.kernels import allowed_fractions, json_trace_bitmasks

    bitmask = json_trace_bitmasks(BIG_VOCAB)
    fractions = allowed_fractions(bitmask, BIG_VOCAB)
    assert (fractions < 0.01).any() and (fractions > 0.9).any()  # structural states and string bodies
    logits = random_logits(bitmask.shape[0], BIG_VOCAB, dtype)
    expected = xgrammar_reference(logits, bitmask)
    apply_token_bitmask_inplace(logits, bitmask, impl="cpu")
    assert torch.equal(bits(logits), bits(expected))
