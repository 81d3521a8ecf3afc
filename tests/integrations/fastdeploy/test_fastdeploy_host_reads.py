"""Inside real FastDeploy (its runner, Sampler, SpeculativeSampler, MTPSampler, post_process):
an out-of-mask token a logits processor let through fails its request with a visible error, and
fd_guided's hooks read nothing from the device in a step with nothing guided, one batched read
per hook otherwise. `HostReads` counts the reads fd_guided's own code makes (FastDeploy's and the
stood-in ops' reads are not counted); on a GPU each one is a sync."""
import fastdeploy_engine as fe
import pytest
from fd_runner import tiny_model
from test_fastdeploy_decoding import admitted, content, worker
from test_fastdeploy_speculative import K, MTPLoop, SpeculativeLoop

from fd_guided.harness.bench.syncs import HostReads
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.fastdeploy

PROCESSOR = "fastdeploy_processors:ForceTokenLogitsProcessor"


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    return fe.enabled_host(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def test_a_token_a_fastdeploy_logits_processor_unmasks_fails_the_request_visibly(fd, tokenizer):
    cfg, runner, engine = worker(fd, tokenizer, logits_processors=[PROCESSOR])
    assert [type(p).__name__ for p in runner.share_inputs["logits_processors"]] == ["ForceTokenLogitsProcessor"]
    z = tokenizer.encode("z")[0]
    forced = admitted(cfg, engine.request("forced", tokenizer.encode("Letters:"), max_tokens=4, guided_regex="[a-c]{6}",
                                          logits_processors_args={"force_token": z}))
    clean = admitted(cfg, engine.request("clean", tokenizer.encode("Letters:"), max_tokens=12, guided_regex="[a-c]{6}"))
    done = engine.run([forced, clean])
    assert forced.output_token_ids[0] == z  # the processor won over the mask
    assert done["forced"].finished == "error"
    assert done["forced"].error == f"guided decoding: token {z} outside the grammar at position 0"
    metrics = runner.guided_backend.metrics
    assert metrics.value("out_of_mask_tokens_total") == 1 and metrics.labelled("host_forced_tokens_total") in ({}, {"stop": 1})
    assert done["clean"].finished == "stop" and len(content(tokenizer, clean)) == 6  # the other request is untouched


def test_plain_steps_read_nothing_unguided_and_the_tokens_once_guided(fd, tokenizer):
    cfg, runner, engine = worker(fd, tokenizer)
    warm = admitted(cfg, engine.request("warm", tokenizer.encode("Pick:"), guided_choice=["x", "y"]))
    engine.run([warm])  # the manager is bound from here on, as in a serving worker
    plain = [engine.request(f"plain{i}", tokenizer.encode("Say:"), max_tokens=6) for i in range(2)]
    with HostReads() as reads:
        engine.run(plain)
    assert reads.total == 0, reads.by_caller
    guided = admitted(cfg, engine.request("g", tokenizer.encode("Letters:"), max_tokens=8, guided_regex="[a-c]{6}"))
    per_step = []
    with HostReads() as reads:
        engine.add(guided)
        while engine.running:
            before = reads.total
            engine.step()
            per_step.append(reads.total - before)
    assert per_step == [1] * len(per_step) and len(per_step) >= 2, per_step  # the sampled tokens, once per step


class CountingLoop:
    """Per verification step (and its MTP substeps), the reads fd_guided made."""

    def __init__(self, loop, reads: HostReads):
        self.loop, self.reads, self.per_step, self._last = loop, reads, [], 0
        original = loop.after_verification

        def after_verification(rows_per_slot, vocab):
            original(rows_per_slot, vocab)  # MTP: the K substeps of drafting run here
            self.per_step.append(reads.total - self._last)
            self._last = reads.total

        loop.after_verification = after_verification


def speculative_worker(fd, tokenizer, mtp: bool):
    cfg = fe.engine_config(fd, guided_decoding_backend="auto", max_num_seqs=4,
                           speculative_config={"method": "ngram", "num_speculative_tokens": K})
    fd_config = fe.start_worker(cfg)
    if mtp:
        fd_config.speculative_config.num_model_steps = K
    runner = fe.build_runner(fd_config)
    loop = MTPLoop(runner, tiny_model(), tokenizer, fd_config) if mtp else SpeculativeLoop(runner, tiny_model(), tokenizer)
    return cfg, loop


@pytest.mark.parametrize("mtp", [False, True], ids=["ngram", "mtp"])
def test_speculative_steps_read_nothing_unguided_and_one_batch_per_hook_guided(fd, tokenizer, mtp):
    cfg, loop = speculative_worker(fd, tokenizer, mtp)  # its loop runs max_num_seqs (4) requests at a time
    say = [loop.engine.request(f"w{i}", tokenizer.encode(f"Say {i}:"), max_tokens=8) for i in range(3)]
    warm = admitted(cfg, loop.engine.request("warm", tokenizer.encode("Pick:"), max_tokens=8, guided_choice=["x", "y"]))
    loop.run([warm, *say])  # binds the manager; the slot is reset when the next request takes it
    loop.engine.running.clear()
    plain = [loop.engine.request(f"p{i}", tokenizer.encode(f"Say {i}:"), max_tokens=8) for i in range(4)]
    with HostReads() as reads:
        counting = CountingLoop(loop, reads)
        loop.run(plain)
    assert reads.total == 0 and counting.per_step, (reads.by_caller, counting.per_step)
    loop.engine.running.clear()
    guided = [admitted(cfg, loop.engine.request(f"g{i}", tokenizer.encode("Letters:"), max_tokens=8, guided_regex="[a-c]{6}"))
              for i in range(2)] + [loop.engine.request(f"q{i}", tokenizer.encode(f"Say {i}:"), max_tokens=8) for i in range(2)]
    with HostReads() as reads:
        counting = CountingLoop(loop, reads)
        loop.run(guided)
    # verification: lengths + drafts before the mask, accepted tokens after; MTP: per substep the
    # layout and the drafts taken
    bound = 2 + (2 * K if mtp else 0)
    assert counting.per_step and max(counting.per_step) <= bound, (counting.per_step, reads.by_caller)
    assert max(counting.per_step) >= 2
