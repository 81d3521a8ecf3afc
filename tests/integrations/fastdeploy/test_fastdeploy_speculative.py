"""fd_guided under FastDeploy's speculative decoding: its config, its runner's insertion, its real
``SpeculativeSampler.forward_cuda``, with the compiled verification ops stood in.

Run for real: ``EngineArgs.create_engine_config`` and the worker's ``initialize_fd_config`` with a
``speculative_config`` (FastDeploy turned guided decoding off there, and asserted against it),
``GPUModelRunner.__init__`` (which builds the ``SpeculativeSampler``), ``insert_tasks_v1`` and
``_get_p_done_idxs_gd``, ``SpeculativeSampler.forward_cuda`` (softmax, ``padding_sampling_params``).
Stood in (CUDA ops, numpy here; docs/integration.md): the penalty op (identity), top-k/top-p
sampling (as in tests/fastdeploy_host.py), ``top_p_candidates`` and ``speculate_verify`` (written
from their call sites: a draft is accepted while it is among its row's top-p candidates, then the
row's sampled token ends the chain), and the bookkeeping of FastDeploy's speculative
``post_process`` (its ops are CUDA-only): this loop appends accepted tokens and truncates caches.
Drafts come from prompt lookup over each request's own tokens (what FastDeploy's ``ngram_match``
does), unaware of the grammar: the mask must catch what they get wrong.
"""

import numpy as np
import pytest

import fastdeploy_engine as fe
import fastdeploy_host as host
from corpus import REGEXES, SCHEMAS
from fd_guided import parse_guided_request
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output
from fd_guided.harness.engine.model import SeqChunk
from fd_guided.harness.engine.speculative import NgramDrafter, SpeculativeConfig
from fd_runner import tiny_model

pytestmark = pytest.mark.fastdeploy

K = 3


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    return fe.enabled_host(tmp_path_factory)


def test_speculative_decoding_no_longer_turns_guided_decoding_off(fd):
    spec = {"method": "ngram", "num_speculative_tokens": K}
    cfg = fe.engine_config(fd, guided_decoding_backend="auto", speculative_config=spec)
    assert cfg.structured_outputs_config.guided_decoding_backend == "auto"  # FastDeploy set "off" here
    fd_config = fe.start_worker(cfg)
    assert fd_config.structured_outputs_config.guided_decoding_backend == "auto"
    assert fd_config.speculative_config.method == "ngram"
    assert fe.engine_config(fd, guided_decoding_backend="off", speculative_config=spec).structured_outputs_config.guided_decoding_backend == "off"


def top_p_candidates(probs, top_p, output_padding_offset, max_candidate_len, max_model_len):
    """Per row: tokens by descending probability until their mass reaches top_p (1.0 here), at
    most max_candidate_len; in float32 the mass may stop short of 1, so 0-probability tokens can
    be candidates (why fd_guided cuts drafts past the grammar's chain)."""
    host_probs = probs.numpy()
    order = np.argsort(-host_probs, axis=1, kind="stable")[:, :max_candidate_len]
    scores = np.take_along_axis(host_probs, order, axis=1)
    lengths = np.minimum((np.cumsum(scores, axis=1) < 1.0).sum(axis=1) + 1, max_candidate_len)
    import paddle

    return paddle.to_tensor(scores), paddle.to_tensor(order.astype(np.int64)), paddle.to_tensor(lengths.astype(np.int32))


def speculate_verify(sampled, accept_tokens, accept_num, step_idx, stop_flags, seq_lens_encoder, seq_lens_decoder,
                     draft_tokens, seq_lens_this_time, verify_tokens, verify_scores, max_dec_len, end_tokens, is_block_step,
                     output_cum_offsets, actual_candidate_len, actual_draft_token_num, topp, max_seq_len, verify_window,
                     enable_topp, benchmark_mode, accept_all_drafts):
    """Accept drafts while each is among its row's candidates; the row's sampled token ends the chain."""
    tokens, candidates, lengths = sampled.numpy().reshape(-1), verify_tokens.numpy(), actual_candidate_len.numpy().reshape(-1)
    drafts, lens, encoder = draft_tokens.numpy(), seq_lens_this_time.numpy().reshape(-1), seq_lens_encoder.numpy().reshape(-1)
    out, counts, steps, stops = accept_tokens.numpy().copy(), accept_num.numpy().copy(), step_idx.numpy().copy(), stop_flags.numpy().copy()
    ends, limits = set(end_tokens.numpy().reshape(-1).tolist()), max_dec_len.numpy().reshape(-1)
    row = 0
    for i, n in enumerate(lens.tolist()):
        if n <= 0:
            counts[i] = 0
            continue
        rows = 1 if encoder[i] > 0 else n
        chain = []
        for j in range(rows - 1):
            draft = int(drafts[i, j + 1])
            if draft not in candidates[row + j, :lengths[row + j]].tolist():
                break
            chain.append(draft)
        chain.append(int(tokens[row + len(chain)]))
        for cut, token in enumerate(chain):
            if token in ends or steps[i] + cut + 1 >= limits[i]:
                chain, stops[i] = chain[:cut + 1], True
                break
        out[i, :len(chain)], counts[i] = chain, len(chain)
        steps[i] += len(chain)
        drafts[i, 0] = chain[-1]
        row += rows
    for tensor, value in ((accept_tokens, out), (accept_num, counts), (step_idx, steps), (stop_flags, stops), (draft_tokens, drafts)):
        host._assign(tensor, value)


def install_verification_stand_ins():
    import fastdeploy.model_executor.ops.gpu as gpu_ops

    gpu_ops.speculate_get_token_penalty_multi_scores = lambda *args, **kwargs: None  # penalties: none set here
    gpu_ops.top_p_candidates = top_p_candidates
    gpu_ops.speculate_verify = speculate_verify


class SpeculativeLoop:
    """The engine and runner bookkeeping around the real sampler, one verification step at a time."""

    def __init__(self, runner, model, tokenizer):
        self.runner, self.model, self.tokenizer = runner, model, tokenizer
        self.drafter = NgramDrafter(SpeculativeConfig("ngram", K))
        self.engine = fe.Engine(runner, model, tokenizer.eos_token_ids)  # requests, sampling stand-ins
        install_verification_stand_ins()
        self.invalid_drafts = 0

    def run(self, requests, max_steps: int = 200):
        import paddle

        from fastdeploy.engine.request import RequestType

        s = self.runner.share_inputs
        states = {r.request_id: self.engine.add(r) for r in requests}
        for state in states.values():
            state.request.task_type, state.request.idx = RequestType.PREFILL, state.slot
            state.request.prefill_start_index, state.request.prefill_end_index = 0, len(state.to_prefill)
        rows = len(states)
        self.runner.insert_tasks_v1([st.request for st in states.values()], rows)
        tasks = [st.request for st in states.values()]
        live = dict(states)
        for _ in range(max_steps):
            if not live:
                return states
            p_done = self.runner._get_p_done_idxs_gd(tasks, rows) if tasks else []
            self.runner.sampler.pre_process(p_done)
            chunks, lens, encoder, drafts = {}, np.zeros(rows, np.int32), np.zeros(rows, np.int32), s["draft_tokens"].numpy()
            for state in live.values():
                i = state.slot
                if tasks:  # the prefill step: one row per request
                    chunks[i] = SeqChunk(state.cache, state.to_prefill)
                    lens[i], encoder[i] = len(state.to_prefill), len(state.to_prefill)
                    continue
                tokens = list(state.request.prompt_token_ids) + list(state.request.output_token_ids)
                chain = self.propose(state, tokens)
                drafts[i, 0], drafts[i, 1:1 + len(chain)] = tokens[-1], chain
                chunks[i] = SeqChunk(state.cache, tokens[state.cache.length:] + chain, True, num_logits=len(chain) + 1)
                lens[i] = len(chain) + 1
            host._assign(s["draft_tokens"], drafts)
            host._assign(s["seq_lens_this_time"], lens.reshape(s["seq_lens_this_time"].shape))
            host._assign(s["seq_lens_encoder"], encoder.reshape(s["seq_lens_encoder"].shape))
            order = sorted(chunks)
            logits = paddle.to_tensor(self.model.forward_batch([chunks[i] for i in order]).numpy())
            with host.platform_reports_cuda():
                self.runner.sampler.forward_cuda(logits, fe.sampling_metadata(self.runner), 2048, s)
            cut = s["draft_tokens"].numpy()
            self.invalid_drafts += sum(int((cut[i, 1:lens[i]] == -1).sum()) for i in chunks if not encoder[i])
            self.runner.sampler.post_process(s["accept_tokens"])  # what execute_model calls
            accepted, counts = s["accept_tokens"].numpy(), s["accept_num"].numpy().reshape(-1)
            self.after_verification({i: (1 if encoder[i] else int(counts[i])) for i in order}, logits.shape[1])
            tasks = []
            for rid, state in list(live.items()):
                i = state.slot
                before = len(state.request.prompt_token_ids) + len(state.request.output_token_ids)
                emitted = accepted[i, :counts[i]].tolist()
                state.request.output_token_ids.extend(emitted)
                fed = (list(state.request.prompt_token_ids) + list(state.request.output_token_ids))
                keep = before + max(0, len(emitted) - 1)  # the accepted drafts stay cached, the last token is fed next
                state.cache.truncate(min(state.cache.length, keep, len(fed)))
                if emitted and emitted[-1] in self.tokenizer.eos_token_ids or len(state.request.output_token_ids) >= 96:
                    state.finished = "stop" if emitted and emitted[-1] in self.tokenizer.eos_token_ids else "length"
                    del live[rid]
            host._assign(s["stop_flags"], np.zeros(s["stop_flags"].shape))
        raise AssertionError(f"still running: {list(live)}")

    def propose(self, state, tokens) -> list[int]:
        """Prompt lookup over the request's own tokens (FastDeploy's ngram_match), grammar-blind."""
        candidates = self.drafter.candidates(tokens, K)
        return candidates[0] if candidates else []

    def after_verification(self, rows_per_slot: dict[int, int], vocab: int) -> None:
        """Where FastDeploy's runner calls ``proposer.run``: nothing to do for prompt lookup."""


class MTPLoop(SpeculativeLoop):
    """Drafts from FastDeploy's real ``MTPSampler`` (built from the worker's config, as
    ``MTPProposer`` does), K substeps after each verification. The MTP head stands in as random
    logits: its argmax is grammar-blind, so every unmasked draft would be a guess. Substep 0 has
    FastDeploy's speculative layout (a decoding request's rows are its accepted tokens, the draft
    comes from the last), later substeps one row per request."""

    def __init__(self, runner, model, tokenizer, fd_config):
        from fastdeploy.model_executor.layers.sample.sampler import MTPSampler

        super().__init__(runner, model, tokenizer)
        with host.platform_reports_cuda():
            self.mtp = MTPSampler(fd_config)
        self.rng = np.random.default_rng(7)
        self.drafts: dict[int, list[int]] = {}

    def propose(self, state, tokens) -> list[int]:
        return self.drafts.pop(state.slot, [])

    def after_verification(self, rows_per_slot: dict[int, int], vocab: int) -> None:
        import paddle

        slots = sorted(rows_per_slot)
        size = self.runner.share_inputs["seq_lens_this_time"].shape[0]
        chains = {i: [] for i in slots}
        for substep in range(K):
            lens, encoder = np.zeros((size, 1), np.int32), np.zeros((size, 1), np.int32)
            for i in slots:
                lens[i] = rows_per_slot[i] if substep == 0 else 1
            ends = np.cumsum([int(lens[i]) for i in slots]) - 1
            inputs = {"seq_lens_this_time": paddle.to_tensor(lens), "seq_lens_encoder": paddle.to_tensor(encoder),
                      "substep": substep, "output_padding_offset": None, "output_cum_offsets": None,
                      "batch_token_num": paddle.to_tensor(lens.reshape(-1)), "cu_batch_token_offset": None}
            logits = paddle.to_tensor(self.rng.normal(size=(int(ends[-1]) + 1, vocab)).astype(np.float32))
            with host.platform_reports_cuda():
                next_tokens, _ = self.mtp.forward_cuda(logits, fe.sampling_metadata(self.runner), 2048, inputs)
            taken = next_tokens.numpy().reshape(-1)
            for i, end in zip(slots, ends):
                chains[i].append(int(taken[end]))
            # draft_model_update: a request whose draft is an end token stops drafting.
            slots = [i for i in slots if chains[i][-1] not in self.tokenizer.eos_token_ids]
            if not slots:
                break
        self.drafts = chains


def guided_requests(cfg, loop, tokenizer):
    from test_fastdeploy_decoding import admitted

    fields = [{"guided_json": SCHEMAS["person"]}, {"guided_json": SCHEMAS["array_of_objects"]},
              {"guided_regex": REGEXES["hex_color"]}, {"guided_choice": ["alpha", "beta"]}]
    return fields, [admitted(cfg, loop.engine.request(f"r{i}", tokenizer.encode(f"Give item {i}:"), max_tokens=96, **f))
                    for i, f in enumerate(fields)]


def assert_valid_outputs(states, fields, tokenizer, at_least: int) -> None:
    finished = 0
    for state, field in zip(states.values(), fields):
        text = tokenizer.decode([t for t in state.request.output_token_ids if t not in tokenizer.eos_token_ids])
        assert state.finished in ("stop", "length"), state
        if state.finished == "stop":
            finished += 1
            verdict = validate_output(parse_guided_request(field), text)
            assert verdict.valid, (field, text, verdict.reason)
    assert finished >= at_least


def mtp_run(fd, masked: bool):
    from fd_guided.integrations.fastdeploy import mtp

    tokenizer = load_tokenizer("deepseek")
    cfg = fe.engine_config(fd, guided_decoding_backend="auto", max_num_seqs=4,
                           speculative_config={"method": "ngram", "num_speculative_tokens": K})
    fd_config = fe.start_worker(cfg)
    fd_config.speculative_config.num_model_steps = K  # the MTP loop's substeps (an ngram config has 1)
    runner = fe.build_runner(fd_config)
    if not masked:
        mtp._by_config.pop(id(fd_config))  # the MTP sampler finds no guided decoding: drafts unmasked
    loop = MTPLoop(runner, tiny_model(), tokenizer, fd_config)
    fields, requests = guided_requests(cfg, loop, tokenizer)
    states = loop.run(requests)
    assert_valid_outputs(states, fields, tokenizer, at_least=3)
    return loop, runner.sampler.guided_decoding.manager


def test_mtp_drafts_are_sampled_under_the_grammar(fd):
    loop, manager = mtp_run(fd, masked=True)
    assert manager.metrics.value("draft_tokens_total") > 0
    # Every MTP draft the grammar could judge obeyed it: none was cut before verification, and
    # the matchers were rolled back after each drafting round (the outputs above are valid).
    assert loop.invalid_drafts == 0 and manager.metrics.value("draft_tokens_invalid_total") == 0
    assert manager.step.drafting is None


def test_unmasked_mtp_drafts_break_the_grammar(fd):
    """The control: the same loop without the MTP hook proposes drafts the verification must cut."""
    loop, manager = mtp_run(fd, masked=False)
    assert loop.invalid_drafts > 0 and manager.metrics.value("draft_tokens_invalid_total") > 0


def test_verification_rows_are_masked_and_every_output_is_valid(fd):
    from fd_guided.integrations.fastdeploy.speculative import SpeculativeGuidedDecoding

    tokenizer = load_tokenizer("deepseek")
    cfg = fe.engine_config(fd, guided_decoding_backend="auto", max_num_seqs=4,
                           speculative_config={"method": "ngram", "num_speculative_tokens": K})
    fd_config = fe.start_worker(cfg)
    runner = fe.build_runner(fd_config)
    assert isinstance(runner.sampler.guided_decoding, SpeculativeGuidedDecoding)
    loop = SpeculativeLoop(runner, tiny_model(), tokenizer)
    fields, requests = guided_requests(cfg, loop, tokenizer)
    states = loop.run(requests)
    manager = runner.sampler.guided_decoding.manager
    assert manager.metrics.value("draft_tokens_total") > 0
    assert_valid_outputs(states, fields, tokenizer, at_least=3)
    assert manager.metrics.value("rejected_tokens_total") == 0
    # Grammar-invalid drafts were proposed, and cut in draft_tokens before FastDeploy's verifier saw them.
    assert manager.metrics.value("draft_tokens_invalid_total") > 0 and loop.invalid_drafts > 0
