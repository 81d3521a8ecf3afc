"""The engine process tokenises each prompt once: the bounded length check's ids are the engine
request's (`PromptBound.tokenize` -> `ReferenceEngine.submit(prompt_ids=...)`), shared by the ``n``
choices of one prompt. A real tiny engine and the engine process's `EngineServer` admission, in
this process (its engine thread is not started: the test steps the engine itself); the only thing
added is a count of calls around the real tokenizer's encode.
"""
import dataclasses

import pytest
import zmq

from fd_guided.harness.engine.engine import ReferenceEngine
from fd_guided.harness.server import ipc
from fd_guided.harness.server.engine_process import EngineServer
from fd_guided.harness.server.settings import ServerSettings

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def admission():
    engine = ReferenceEngine.default(preset="tiny", max_num_seqs=8)
    encode, calls = engine.tokenizer.encode, []

    def counting_encode(text):
        calls.append(len(text))
        return encode(text)

    engine.tokenizer = dataclasses.replace(engine.tokenizer, encode=counting_encode)
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.bind("inproc://from-engine")
    push.connect("inproc://from-engine")
    server = EngineServer(engine, ServerSettings(preset="tiny"), push)
    yield server, calls, pull, encode
    server._admission.shutdown()
    engine.close()
    push.close(0)
    pull.close(0)
    context.term()


def admit(server: EngineServer, pull, requests: list[dict], first_index: int) -> ipc.Admitted:
    indices = list(range(first_index, first_index + len(requests)))
    server._admit(ipc.Submit(first_index, indices, requests, seed=1))
    assert pull.poll(10_000)
    return ipc.from_engine.decode(pull.recv())


def run_to_end(engine) -> dict[int, int]:
    """Step until nothing is left; each request's prompt tokens as the engine counted them."""
    prompt_tokens = {}
    while engine.has_unfinished():
        for update in engine.step():
            if update.finished is not None:
                prompt_tokens[update.index] = update.finished.prompt_tokens
    return prompt_tokens


def test_three_choices_of_one_prompt_are_tokenised_once_and_decode_from_those_ids(admission):
    server, calls, pull, encode = admission
    calls.clear()
    prompt = "Name three colours, please: "
    admitted = admit(server, pull, [{"prompt": prompt, "max_tokens": 3, "ignore_eos": True}] * 3, first_index=0)
    assert admitted.error is None
    assert calls == [len(prompt)], calls  # one encode, of the whole prompt, for three engine requests
    assert run_to_end(server.engine) == {0: len(encode(prompt)), 1: len(encode(prompt)), 2: len(encode(prompt))}


def test_a_long_prompt_that_fits_is_tokenised_whole_once_after_its_bounded_pieces(admission):
    server, calls, pull, encode = admission
    calls.clear()
    prompt = "alpha beta " * 1_000  # 11,000 characters, ~2,000 tokens: past one 8,192-character piece
    admitted = admit(server, pull, [{"prompt": prompt, "max_tokens": 2}], first_index=10)
    assert admitted.error is None
    assert calls.count(len(prompt)) == 1 and sum(calls) == 2 * len(prompt), calls  # pieces, then whole once
    assert run_to_end(server.engine) == {10: len(encode(prompt))}


def test_a_prompt_past_the_context_is_refused_and_nothing_is_queued(admission):
    server, calls, pull, _ = admission
    calls.clear()
    admitted = admit(server, pull, [{"prompt": "alpha beta " * 14_000, "max_tokens": 2}] * 2, first_index=20)
    assert admitted.error is not None and admitted.error.code == "context_length_exceeded", admitted
    assert "at least" in admitted.error.message and max(calls) <= 8_192, calls
    assert not server.engine.has_unfinished()
