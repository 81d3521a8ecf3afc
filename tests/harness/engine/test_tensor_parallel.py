"""Tensor parallel: every rank masks the same tokens and accepts the same tokens, every step.

Each rank runs the same loop, as TP workers do: admit requests into slots, build the step's
logits from the same seeded "model", mask them, let rank 0 sample and broadcast the token ids
(FastDeploy broadcasts ``sampled_token_ids`` from the TP leader), accept them. Recorded per
rank and step: a digest of the masked logits, the broadcast tokens and each rank's own greedy
pick (equal only if masks and logits are). Layouts: rank threads in one process (per-rank
managers over one shared compile service, with a compile storm running beside them: the
layout where a shared matcher crashed another engine), rank processes (each with its own
backend), and rank-0-fills-and-broadcasts over both transports.
"""
import multiprocessing
import threading
import time

import numpy as np
import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.harness.parallel import PipeBroadcast, Rank0BroadcastGuided, ThreadBroadcast, mask_digest, per_rank_managers
from fd_guided.tokenizer import load_tokenizer
from fd_guided.harness.validate import validate_output
from fd_guided.harness.engine.token_prior import structural_token_prior

from corpus import CHOICES, REGEXES, SCHEMAS

pytestmark = pytest.mark.cpu

VOCAB = 129_280
EOS = 1
BANK_ROWS = 48
MAX_TOKENS = 40


def request_specs(count: int) -> list:
    """`count` distinct specs: the corpus plus numbered variants, so compiles keep happening."""
    fields = [{"guided_json": schema} for schema in SCHEMAS.values()]
    fields += [{"guided_regex": pattern} for pattern in REGEXES.values()]
    fields += [{"guided_choice": choices} for choices in CHOICES.values()]
    variant = 0
    while len(fields) < count:
        fields.append({"guided_json": {**SCHEMAS["person"], "title": f"variant {variant}"}})
        fields.append({"guided_regex": f"[a-f]{{{variant % 7 + 1}}}-[0-9]{{{variant % 5 + 1}}}#{variant}"})
        variant += 1
    # Compact JSON (short outputs that finish), and only what the ranks' xgrammar backend enforces.
    config = GuidedConfig(any_whitespace=False, backend="xgrammar")
    specs = []
    for field in fields:
        try:
            specs.append(parse_guided_request(field, config))
        except InvalidGrammarError:
            continue
    return specs[:count]


class SeededModel:
    """Identical logits on every rank: a structural prior plus rows of a seeded noise bank."""

    def __init__(self, tokenizer, seed: int = 0):
        texts = list(tokenizer.token_bytes) + [None] * (VOCAB - tokenizer.vocab_size)
        self.prior = structural_token_prior(texts, list(tokenizer.eos_token_ids), 1.0)
        self.bank = np.random.default_rng(seed).standard_normal((BANK_ROWS, VOCAB), dtype=np.float32)

    def logits(self, step: int, slots: list[int]) -> np.ndarray:
        rows = [(step * 7 + slot * 13) % BANK_ROWS for slot in slots]
        return self.bank[rows] + self.prior


class RankLoop:
    """One rank's copy of the engine loop; `guided` is a manager or a `Rank0BroadcastGuided`."""

    def __init__(self, rank, guided, tokens, model, specs, *, slots, steps):
        self.rank, self.guided, self.tokens, self.model = rank, guided, tokens, model
        self.specs, self.slots, self.steps = specs, slots, steps
        self.digests: list[str] = []
        self.sampled: list[tuple[int, ...]] = []
        self.own_picks: list[tuple[int, ...]] = []
        self.outputs: list[tuple[int, list[int]]] = []  # (spec index, tokens) of finished requests
        self.errors: list[str] = []

    def run(self) -> "RankLoop":
        running: dict[int, tuple[int, list[int]]] = {}
        next_request = 0
        for step in range(self.steps):
            for slot in range(self.slots):
                if slot not in running:
                    spec_index = next_request % len(self.specs)
                    self.guided.add_request(slot, self.specs[spec_index], prefill_done=True)
                    assert self.guided.wait_ready([slot], timeout_s=120)  # the scheduler's readiness gate
                    running[slot] = (spec_index, [])
                    next_request += 1
            rows = sorted(running)
            logits = self.model.logits(step, rows)
            self.guided.begin_step(rows)
            self.guided.apply(logits)
            self.digests.append(mask_digest(logits))
            own = tuple(int(t) for t in logits.argmax(axis=1))
            sampled = self.tokens.broadcast(np.asarray(own, dtype=np.int64) if self.rank == 0 else None)
            sampled = tuple(int(t) for t in sampled)
            self.own_picks.append(own)
            self.sampled.append(sampled)
            self.errors += [f.error for f in self.guided.accept(list(sampled)) if f.reason == "error"]
            for slot, token in zip(rows, sampled):
                spec_index, output = running[slot]
                if token == EOS or len(output) + 1 >= MAX_TOKENS:
                    self.outputs.append((spec_index, output if token == EOS else None))
                    self.guided.release(slot)
                    del running[slot]
                else:
                    output.append(token)
        return self


def assert_identical(loops: list[RankLoop], reference: RankLoop | None = None) -> None:
    reference = reference or loops[0]
    for loop in loops:
        assert loop.errors == []
        for step, (digest, expected) in enumerate(zip(loop.digests, reference.digests)):
            assert digest == expected, f"rank {loop.rank} mask differs at step {step}"
        assert loop.sampled == reference.sampled
        assert loop.own_picks == loop.sampled, f"rank {loop.rank} would have sampled differently"
        assert len(loop.digests) == len(reference.digests)


def check_finished_outputs(loop: RankLoop, specs, tokenizer) -> int:
    finished = 0
    for spec_index, output in loop.outputs:
        if output is not None:
            finished += 1
            verdict = validate_output(specs[spec_index], tokenizer.decode(output))
            assert verdict.valid, (specs[spec_index].describe(), tokenizer.decode(output), verdict.reason)
    return finished


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture(scope="module")
def backend(tokenizer):
    backend = XGrammarBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(compile_timeout_s=60))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def model(tokenizer):
    return SeededModel(tokenizer)


def run_threads(loops: list[RankLoop]) -> None:
    failures: list[BaseException] = []

    def target(loop):
        try:
            loop.run()
        except BaseException as error:  # surfaced below, with the rank
            failures.append(error)
            raise

    threads = [threading.Thread(target=target, args=(loop,), name=f"rank-{loop.rank}") for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a rank thread hung"
    assert not failures, failures


def compile_storm(service, specs, stop: threading.Event) -> None:
    """Keep the shared compile service busy with distinct specs while the ranks step."""
    for spec in specs:
        if stop.is_set():
            return
        service.submit(spec)
        time.sleep(0.005)


@pytest.mark.slow
def test_rank_threads_with_own_managers_agree_every_step_under_concurrent_compiles(backend, model, tokenizer):
    world, steps = 4, 1500
    specs = request_specs(120)
    managers = per_rank_managers(backend, world, max_num_seqs=6)
    service = managers[0].compiler
    assert all(m.compiler is service for m in managers) and len({id(m.bitmask) for m in managers}) == world
    tokens = ThreadBroadcast(world)
    loops = [RankLoop(r, managers[r], tokens.endpoint(r), model, specs, slots=6, steps=steps) for r in range(world)]
    storm_specs = [parse_guided_request({"guided_json": {**SCHEMAS["invoice"], "title": f"storm {i}"}}) for i in range(150)]
    stop = threading.Event()
    storm = threading.Thread(target=compile_storm, args=(service, storm_specs, stop))
    started = time.perf_counter()
    storm.start()
    try:
        run_threads(loops)
    finally:
        stop.set()
        storm.join()
        for manager in managers:
            manager.close()
        service.close()
    elapsed = time.perf_counter() - started
    assert_identical(loops)
    assert sum(len(loop.digests) for loop in loops) == world * steps
    assert check_finished_outputs(loops[0], specs, tokenizer) >= 50
    requests = len(loops[0].outputs) + 6
    assert service.metrics.value("requests_total") >= world * len(loops[0].outputs)
    assert service.metrics.value("cache_misses_total") >= 100  # distinct compiles happened mid-run
    assert service.metrics.value("compiles_in_flight") == 0
    assert requests > 100, requests
    print(f"{world} rank threads x {steps} steps in {elapsed:.1f} s")


def test_rank0_broadcast_threads_mask_exactly_like_per_rank_managers(backend, model):
    world, steps = 3, 300
    specs = request_specs(40)
    per_rank = per_rank_managers(backend, world, max_num_seqs=4)
    reference_tokens = ThreadBroadcast(world)
    reference = [RankLoop(r, per_rank[r], reference_tokens.endpoint(r), model, specs, slots=4, steps=steps) for r in range(world)]
    run_threads(reference)
    for manager in per_rank:
        manager.close()
    masks, tokens = ThreadBroadcast(world), ThreadBroadcast(world)
    leader = per_rank_managers(backend, 1, max_num_seqs=4)[0]
    broadcast = [RankLoop(r, Rank0BroadcastGuided(masks.endpoint(r), leader if r == 0 else None), tokens.endpoint(r),
                          model, specs, slots=4, steps=steps) for r in range(world)]
    run_threads(broadcast)
    leader.close()
    leader.compiler.close()
    assert_identical(reference)
    assert_identical(broadcast, reference=reference[0])


def rank_process(rank: int, world: int, tokens: PipeBroadcast, masks: PipeBroadcast, steps: int, results) -> None:
    """One TP rank in its own process: its own tokenizer, backend and manager."""
    try:
        tokenizer = load_tokenizer("deepseek")
        backend = XGrammarBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(compile_timeout_s=60))
        model, specs = SeededModel(tokenizer), request_specs(40)
        manager = per_rank_managers(backend, 1, max_num_seqs=4)[0]
        per_rank = RankLoop(rank, manager, tokens, model, specs, slots=4, steps=steps).run()
        manager.close()
        leader = per_rank_managers(backend, 1, max_num_seqs=4)[0] if rank == 0 else None
        guided = Rank0BroadcastGuided(masks, leader)
        broadcast = RankLoop(rank, guided, tokens, model, specs, slots=4, steps=steps).run()
        results.put((rank, per_rank.digests, per_rank.sampled, per_rank.own_picks, broadcast.digests, broadcast.sampled, per_rank.errors, None))
    except BaseException as error:
        results.put((rank, None, None, None, None, None, None, repr(error)))
        raise


@pytest.mark.slow
def test_rank_processes_agree_every_step_in_both_modes():
    world, steps = 3, 300
    context = multiprocessing.get_context("spawn")
    tokens, masks = PipeBroadcast.group(world, context), PipeBroadcast.group(world, context)
    results = context.Queue()
    processes = [context.Process(target=rank_process, args=(r, world, tokens[r], masks[r], steps, results)) for r in range(world)]
    for process in processes:
        process.start()
    try:
        reports = sorted(results.get(timeout=300) for _ in range(world))
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()
    for rank, *_, failure in reports:
        assert failure is None, f"rank {rank}: {failure}"
    reference_digests, reference_tokens = reports[0][1], reports[0][2]
    assert len(reference_digests) == steps
    for rank, digests, sampled, own, broadcast_digests, broadcast_sampled, errors, _ in reports:
        assert errors == []
        assert digests == reference_digests, f"rank {rank} per-rank masks differ"
        assert sampled == reference_tokens and own == sampled
        assert broadcast_digests == reference_digests, f"rank {rank} broadcast masks differ from per-rank masks"
        assert broadcast_sampled == reference_tokens
    assert all(process.exitcode == 0 for process in processes)


def test_transports_deliver_in_order_and_refuse_bad_setups(backend):
    group = ThreadBroadcast(2, timeout_s=0.2)
    sender, receiver = group.endpoint(0), group.endpoint(1)
    sender.broadcast(np.arange(3))
    with pytest.raises(TimeoutError):
        sender.broadcast(np.arange(4))  # rank 1 has not taken the first message yet
    assert receiver.broadcast(None).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        group.endpoint(2)
    with pytest.raises(ValueError):
        Rank0BroadcastGuided(sender, None)
    manager = per_rank_managers(backend, 1, max_num_seqs=2)[0]
    with pytest.raises(ValueError):
        Rank0BroadcastGuided(receiver, manager)
    manager.close()
    manager.compiler.close()
