"""K+1 rows per request masked in place through the device kernels: the speculative step's rows on
GPU logits (DLPack views of Paddle and torch CUDA tensors into the CUDA kernel) must equal the same
step on CPU logits. The GPU cases are marked `cuda` (skipped without a GPU, failures under
--require-cuda); the CPU case runs the same body everywhere, so the test itself is checked here."""
import numpy as np
import pytest

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.manager import DraftTree, GuidedDecodingManager
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer
from guided_helpers import add_ready

VOCAB = 129_280
SCHEMA = {"guided_json": {"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"enum": ["a", "b"]}},
                          "required": ["id", "tag"]}, "disable_any_whitespace": True}
PLACES = [pytest.param(("paddle", "cpu", "cpu"), marks=pytest.mark.cpu, id="paddle-cpu"),
          pytest.param(("paddle", "gpu", "cuda"), marks=pytest.mark.cuda, id="paddle-gpu"),
          pytest.param(("torch", "cuda", "cuda"), marks=pytest.mark.cuda, id="torch-cuda")]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def make_logits(producer: str, device: str, rows: int, dtype: str):
    host = np.random.default_rng(1).standard_normal((rows, VOCAB)).astype("float32")
    if producer == "paddle":
        import paddle

        return paddle.to_tensor(host, place=paddle.CUDAPlace(0) if device == "gpu" else paddle.CPUPlace()).astype(dtype)
    import torch

    return torch.from_numpy(host).to(device=device, dtype=getattr(torch, dtype))


def finite_sets(logits) -> list[set[int]]:
    host = logits.astype("float32").cpu().numpy() if hasattr(logits, "place") else logits.float().cpu().numpy()
    return [set(np.flatnonzero(np.isfinite(row)).tolist()) for row in host]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("place", PLACES)
def test_speculative_rows_are_masked_in_place_on_every_path(tokenizer, place, dtype):
    producer, device, impl = place
    backend = create_backend("xgrammar", tokenizer, vocab_size=VOCAB, config=GuidedConfig(backend="xgrammar", compile_isolation="thread"))
    manager = GuidedDecodingManager(backend, max_num_seqs=4, max_draft_tokens=4, kernel_impl=impl)
    spec = parse_guided_request(SCHEMA)
    ids = tokenizer.encode('{"id":12,"tag":"a"}')
    for slot in (0, 2, 3):
        add_ready(manager, slot, spec, prefill_done=True)
    bad = tokenizer.encode("[")[0]
    drafts = [ids[:4], [], [ids[0], bad, ids[1]], DraftTree((ids[0], ids[1], bad), (0, 1, 1))]
    slots = [0, 1, 2, 3]  # slot 1: unguided
    rows = sum(DraftTree.of(d).num_nodes for d in drafts)
    manager.begin_speculative_step(slots, drafts)
    logits = make_logits(producer, device, rows, dtype)
    pointer = logits.data_ptr()
    manager.apply(logits)
    assert logits.data_ptr() == pointer  # in place
    got = finite_sets(logits)
    # The reference: one fresh matcher per row, advanced by the row's draft path.
    expected = []
    for i in range(5):  # request 0: the state after ids[:i]
        expected.append(_allowed_after(backend, spec, ids[:i]))
    expected.append(set(range(VOCAB)))  # request 1: unguided
    expected += [_allowed_after(backend, spec, []), _allowed_after(backend, spec, ids[:1]), {1}, {1}]  # request 2: chain ends
    expected += [_allowed_after(backend, spec, []), _allowed_after(backend, spec, ids[:1]), _allowed_after(backend, spec, ids[:2]),
                 {1}]  # request 3: a tree, one branch rejected
    assert [len(s) for s in got] == [len(s) for s in expected]
    assert got == expected
    manager.close()


def _allowed_after(backend, spec, prefix) -> set[int]:
    import torch

    grammar = backend.new_grammar(backend.compile(spec))
    assert grammar.accept_tokens(prefix) == len(prefix)
    bitmask = torch.zeros((1, (VOCAB + 31) // 32), dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits[:VOCAB]).tolist())
