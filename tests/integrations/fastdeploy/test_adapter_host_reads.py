"""Host reads (device-to-host transfers, each a sync on a GPU) of the FastDeploy adapter's hooks,
counted per step: none while nothing is guided, one batched read per hook that needs host values
otherwise (the sampled tokens; the verification's lengths and drafts; its accepted tokens; the MTP
layout; the drafts taken). Driven in FastDeploy's call order with Paddle tensors standing in for
the runner's device tensors (`share_inputs`); `HostReads` counts what fd_guided's own code reads.
The same counts inside real FastDeploy: test_fastdeploy_host_reads.py (FastDeploy stage). The
``gpu`` cases run the same hooks on Paddle GPU tensors (the CUDA mask path) and count only reads
of device tensors; marked `cuda`, NOT RUN YET (no GPU was available when they were written)."""
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from fd_runner import VOCAB, fd_config

from fd_guided.harness.bench.syncs import HostReads
from fd_guided.integrations.fastdeploy import GuidedDecoding, get_guided_backend
from fd_guided.integrations.fastdeploy.mtp import DraftMasking
from fd_guided.integrations.fastdeploy.speculative import SpeculativeGuidedDecoding
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

SLOTS, K = 4, 2
REGEX_KEY = ("regex", "[a-c]{6}")
PLACES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", marks=pytest.mark.cuda, id="gpu")]
_place = {"name": "cpu"}


@pytest.fixture(params=PLACES)
def place(request):
    if request.param == "gpu" and not paddle.is_compiled_with_cuda():
        pytest.skip("installed paddle is a CPU-only build")
    _place["name"] = request.param
    yield request.param
    _place["name"] = "cpu"


def on_place(array) -> paddle.Tensor:
    return paddle.to_tensor(array, place=paddle.CUDAPlace(0) if _place["name"] == "gpu" else paddle.CPUPlace())


def counting() -> HostReads:
    return HostReads(count_host_tensors=_place["name"] == "cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def logits(rows: int) -> paddle.Tensor:
    return on_place(np.random.default_rng(rows).standard_normal((rows, VOCAB)).astype("float32"))


def tokens(values) -> paddle.Tensor:
    return on_place(np.asarray(values, dtype=np.int64).reshape(-1, 1))


def guide(guided, backend, slot: int) -> None:
    """A guided request's PREFILL task, then the step that ends its prefill (FastDeploy's order)."""
    guided.add_logits_processor(slot, backend.get_logits_processor(REGEX_KEY, enable_thinking=False))
    guided.pre_process([slot])
    assert guided.manager.wait_ready([slot], timeout_s=60)


def test_the_sampler_reads_nothing_without_guided_rows_and_once_with(tokenizer, place):
    config = fd_config(max_num_seqs=SLOTS)
    backend = get_guided_backend(config, tokenizer=tokenizer)
    guided = GuidedDecoding(config, backend)  # bound, as after any earlier guided request
    guided.add_logits_processor(0, None)
    try:
        guided.add_logits_processor(3, backend.get_logits_processor(REGEX_KEY, enable_thinking=False))
        with counting() as reads:
            for _ in range(3):  # slot 3 still prefilling: nothing guided in the batch yet
                guided.pre_process([])
                guided.apply_token_mask(logits(SLOTS))
                guided.update_output_tokens(tokens([7, 7, 7, -1]))
        assert reads.total == 0, reads.by_caller
        guided.pre_process([3])
        assert guided.manager.wait_ready([3], timeout_s=60)
        a = tokenizer.encode("a")[0]
        with counting() as reads:
            guided.apply_token_mask(logits(SLOTS))
            guided.update_output_tokens(tokens([7, 7, 7, a]))
            for _ in range(2):
                guided.pre_process([])
                guided.apply_token_mask(logits(SLOTS))
                guided.update_output_tokens(tokens([7, 7, 7, a]))
        assert reads.total == 3, reads.by_caller  # one per step: the sampled tokens
        assert guided.manager.finish_of(3) is None  # the reads were the real ones: "a" accepted
    finally:
        guided.close()
        backend.close()


def speculative_inputs(lens, encoder, drafts) -> dict:
    return {"seq_lens_this_time": on_place(np.asarray(lens, np.int32).reshape(-1, 1)),
            "seq_lens_encoder": on_place(np.asarray(encoder, np.int32).reshape(-1, 1)),
            "draft_tokens": on_place(np.asarray(drafts, np.int64)),
            "accept_tokens": on_place(np.full((SLOTS, K + 1), -1, np.int64)),
            "accept_num": on_place(np.zeros(SLOTS, np.int32))}


def spec_config():
    config = fd_config(max_num_seqs=SLOTS)
    config.speculative_config = SimpleNamespace(method="mtp", num_speculative_tokens=K, num_model_steps=K)
    return config


def test_speculative_verification_reads_nothing_unguided_and_one_batch_per_hook_guided(tokenizer, place):
    config = spec_config()
    backend = get_guided_backend(config, tokenizer=tokenizer)
    guided = SpeculativeGuidedDecoding(config, backend)
    a, z = tokenizer.encode("a")[0], tokenizer.encode("z")[0]
    try:
        guided.add_logits_processor(0, None)
        drafts = np.zeros((SLOTS, K + 1), np.int64)
        drafts[:2, 1:] = [a, z]
        inputs = speculative_inputs([K + 1, K + 1, 0, 0], [0, 0, 0, 0], drafts)
        with counting() as reads:
            for _ in range(3):
                guided.pre_process([])
                guided.mask_verification_rows(logits(2 * (K + 1)), inputs)
                guided.accept_verified(inputs["accept_tokens"])
        assert reads.total == 0, reads.by_caller
        guide(guided, backend, 1)
        with counting() as reads:
            guided.mask_verification_rows(logits(2 * (K + 1)), inputs)
            assert reads.total == 1, reads.by_caller  # lens, encoder and drafts in one transfer
            # slot 1's draft "z" breaks [a-c]{6}: cut to -1 in place, without reading the tensor again
            assert inputs["draft_tokens"].numpy()[1].tolist() == [0, a, -1]
            inputs["accept_tokens"][1, :2] = on_place(np.array([a, a], np.int64))
            inputs["accept_num"][1] = 2
            guided.accept_verified(inputs["accept_tokens"])
        assert reads.total == 2, reads.by_caller  # and the accepted tokens with their counts
        assert guided.manager.finish_of(1) is None
    finally:
        guided.close()
        backend.close()


def test_mtp_substeps_read_nothing_unguided_and_one_batch_per_hook_guided(tokenizer, place):
    config = spec_config()
    backend = get_guided_backend(config, tokenizer=tokenizer)
    guided = SpeculativeGuidedDecoding(config, backend)
    masking = DraftMasking(guided, num_model_steps=K)
    guided.draft_masking = masking
    try:
        def substeps() -> None:
            for substep in range(K):
                inputs = {"seq_lens_this_time": on_place(np.array([[1], [1], [0], [0]], np.int32)),
                          "seq_lens_encoder": on_place(np.zeros((SLOTS, 1), np.int32)), "substep": substep}
                rows = logits(2)
                masking.mask(rows, inputs)
                masking.advance(paddle.argmax(rows, axis=-1))

        guided.add_logits_processor(0, None)
        assert guided.manager is not None
        with counting() as reads:
            substeps()
        assert reads.total == 0, reads.by_caller
        guide(guided, backend, 1)
        with counting() as reads:
            substeps()
        assert reads.total == 2 * K, reads.by_caller  # per substep: the layout, then the drafts taken
        assert masking.session is None  # closed after the last substep
    finally:
        guided.close()
        backend.close()
