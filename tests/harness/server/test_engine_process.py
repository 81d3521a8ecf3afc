"""`fd-guided serve` in two processes: bounded inputs, aborts, the engine process dying or hanging,
clean shutdown.

One server (tiny preset) serves the module; the tests run in order, the last three kill its engine
process, make it hang, and then stop the server. Everything is real: the CLI's server, its engine
process, compile workers, the `openai` client and raw sockets.
"""
import concurrent.futures
import json
import os
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess, openai_client

pytestmark = pytest.mark.cpu

MODEL = "fd-guided-tiny"
MESSAGES = [{"role": "user", "content": "Answer please."}]
BIG = 20 << 20  # ~20 MB bodies: the 21 MB chat body
LIMIT = 4 << 20  # the server's default --max-body-bytes


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--preset", "tiny", "--max-num-seqs", "16")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def health(server) -> httpx.Response:
    return httpx.get(server.base_url + "/health", timeout=10)


def metric(server, name: str, **labels) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def send_big(port: int, chunked: bool) -> tuple[int, int]:
    """POST a ~20 MB chat body a MiB at a time, stopping as soon as the server answers; returns
    (the status the server answered, the bytes sent by then)."""
    body = json.dumps({"messages": [{"role": "user", "content": "word " * (BIG // 5)}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + (b"Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {len(body)}\r\n".encode()) + b"\r\n")
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        answer = b""
        for start in range(0, len(body), 1 << 20):
            sock.settimeout(0.05)
            try:
                answer += sock.recv(65536)
            except (TimeoutError, BlockingIOError):
                pass
            if answer:
                break
            sock.settimeout(60)
            piece = body[start:start + (1 << 20)]
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        sock.settimeout(60)
        while b"\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return int(answer.split(b" ", 2)[1]), sent


def test_oversized_bodies_are_413_before_they_are_read_and_others_are_served(server, client):
    pid = server.process.pid
    baseline = rss_bytes(pid)
    peak = [baseline]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            big = [pool.submit(send_big, server.port, chunked) for chunked in (False, False, False, True, True)]
            served = pool.submit(client.completions.create, model=MODEL, prompt="hi", max_tokens=4,
                                 extra_body={"guided_choice": ["yes", "no"]})
            answers = [future.result() for future in big]
            assert served.result().choices[0].text in ("yes", "no")
    finally:
        stop.set()
        watcher.join()
    assert [status for status, _ in answers] == [413] * 5
    for (_, sent), chunked in zip(answers, (False, False, False, True, True)):
        # refused after the headers (Content-Length) or once past the bound (chunked), never at the end
        assert sent <= (LIMIT + (2 << 20) if chunked else 2 << 20), sent
    assert peak[0] - baseline < 64 << 20, f"the API process grew by {(peak[0] - baseline) >> 20} MiB"
    assert metric(server, "fd_guided_server_requests_refused_total", reason="body_too_large") >= 5


def test_a_prompt_past_the_context_is_refused_without_tokenising_it_all(server, client):
    # 3 MB (under the body bound) of ordinary words, ~600,000 tokens: more UTF-8 bytes than the context
    # times the longest token, refused with nothing tokenised (the message says "more than")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 600_000}], max_tokens=8)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert "more than 4096 tokens" in caught.value.body["message"]
    # 150 KB, under that byte bound: refused after a few 8,192-character pieces ("at least N", N far
    # below the ~28,000 tokens of the whole prompt)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="alpha beta " * 14_000, max_tokens=8)
    message = caught.value.body["message"]
    assert caught.value.body["code"] == "context_length_exceeded" and "at least" in message
    assert int(message.split("at least ")[1].split()[0]) < 8_000, message
    # a prompt that fits, with max_tokens that do not
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello " * 100, max_tokens=4090)
    assert caught.value.body["code"] == "context_length_exceeded" and "max_tokens (4090)" in caught.value.body["message"]


def test_a_client_that_goes_away_aborts_its_engine_requests(server, client):
    before = metric(server, "fd_guided_engine_requests_finished_total", reason="abort")
    stream = client.completions.create(model=MODEL, prompt="x", max_tokens=3000, stream=True, extra_body={"ignore_eos": True})
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    with pytest.raises(httpx.ReadTimeout):  # non-streaming: the client gives up while it decodes
        httpx.post(server.base_url + "/v1/completions", timeout=2,
                   json={"prompt": "y", "max_tokens": 3000, "ignore_eos": True})
    deadline = time.monotonic() + 20
    while metric(server, "fd_guided_engine_requests_finished_total", reason="abort") < before + 2:
        assert time.monotonic() < deadline, "the engine did not abort both requests"
        time.sleep(0.2)
    assert health(server).json()["requests_in_flight"] == 0


def drain_until_error(stream, text_of, started: threading.Barrier, outcomes: list[str]) -> None:
    """Read `stream` to its end, meeting the others at `started` once its first text (`text_of(choice)`)
    arrived; record "finished" or the error it ended with."""
    announced = False
    try:
        for chunk in stream:
            if not announced and chunk.choices and text_of(chunk.choices[0]):
                announced = True
                started.wait(timeout=60)
    except openai.APIError as error:
        outcomes.append(f"error: {error.message}")
        return
    outcomes.append("finished")


def test_the_engine_process_dying_mid_stream_fails_every_client_and_the_server_recovers(server, client):
    first = health(server).json()
    engine_pid = first["engine_pid"]
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "warm", "schema": {"type": "object"}}})  # compile workers exist
    started = threading.Barrier(6)  # four streams, the plain request, this thread
    outcomes: list[str] = []

    def stream_until_error(seed: int) -> None:
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3000, stream=True, seed=seed,
                                                extra_body={"ignore_eos": True})
        drain_until_error(stream, lambda choice: choice.delta.content, started, outcomes)

    def plain() -> None:
        started.wait(timeout=60)
        try:
            client.completions.create(model=MODEL, prompt="z", max_tokens=3000, extra_body={"ignore_eos": True})
            outcomes.append("finished")
        except openai.APIStatusError as error:
            outcomes.append(f"status {error.status_code}")

    threads = [threading.Thread(target=stream_until_error, args=(seed,)) for seed in range(4)] + [threading.Thread(target=plain)]
    for thread in threads:
        thread.start()
    started.wait(timeout=60)
    time.sleep(0.3)  # the plain request is decoding too
    os.kill(engine_pid, signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["error: the engine process died (exit status -9); the request was lost, retry shortly"] * 4 + \
        ["status 503"], outcomes
    down = health(server)
    assert down.status_code == 503 and down.json()["engine_pid"] is None
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert caught.value.status_code == 503 and caught.value.body["code"] == "engine_unavailable"
    deadline = time.monotonic() + 5
    while group_alive(engine_pid):  # the dead engine's compile zygote and workers go with it
        assert time.monotonic() < deadline, "processes of the dead engine's group are still alive"
        time.sleep(0.05)
    deadline = time.monotonic() + 120
    while health(server).status_code != 200:
        assert time.monotonic() < deadline, "the engine process did not come back"
        time.sleep(0.25)
    back = health(server).json()
    assert back["engine_generation"] == first["engine_generation"] + 1 and back["engine_pid"] != engine_pid
    answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"guided_choice": ["on", "off"]})
    assert answer.choices[0].text in ("on", "off")
    assert metric(server, "fd_guided_server_engine_restarts_total") == 1
    assert metric(server, "fd_guided_server_engine_up") == 1



def test_a_hung_engine_process_is_killed_every_client_gets_the_error_and_the_server_recovers(server, client):
    """SIGSTOP: the engine process is alive (its pidfd never fires) and answers nothing. Its heartbeat
    stops, so the API process kills its group after the 5 s deadline and handles it as a death."""
    deadline = time.monotonic() + 120
    while health(server).status_code != 200:  # the previous test's engine restart
        assert time.monotonic() < deadline
        time.sleep(0.25)
    first = health(server).json()
    engine_pid = first["engine_pid"]
    restarts = metric(server, "fd_guided_server_engine_restarts_total")
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "warm3", "schema": {"type": "array"}}})  # compile workers exist
    started = threading.Barrier(4)  # three streams, this thread
    outcomes: list[str] = []

    def stream_until_error(seed: int) -> None:
        stream = client.completions.create(model=MODEL, prompt="go", max_tokens=3000, stream=True, seed=seed,
                                           extra_body={"ignore_eos": True})
        drain_until_error(stream, lambda choice: choice.text, started, outcomes)

    threads = [threading.Thread(target=stream_until_error, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    started.wait(timeout=60)
    stopped_at = time.monotonic()
    os.killpg(engine_pid, signal.SIGSTOP)  # the engine and its compile processes: alive, silent
    try:
        for thread in threads:
            thread.join(timeout=30)
        failed_after = time.monotonic() - stopped_at
        assert len(outcomes) == 3 and all(o.startswith("error: the engine process was killed, not answering: no "
                                                        "message from it for ") for o in outcomes), outcomes
        assert all(o.endswith(" s (deadline 5 s); the request was lost, retry shortly") for o in outcomes), outcomes
        assert 4.5 <= failed_after < 15.0, failed_after  # the deadline counts from its last message
        deadline = time.monotonic() + 5
        while group_alive(engine_pid):
            assert time.monotonic() < deadline, "processes of the hung engine's group are still alive"
            time.sleep(0.05)
    finally:
        if group_alive(engine_pid):
            os.killpg(engine_pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while health(server).status_code != 200:
        assert time.monotonic() < deadline, "the engine process did not come back"
        time.sleep(0.25)
    back = health(server).json()
    assert back["engine_generation"] == first["engine_generation"] + 1 and back["engine_pid"] != engine_pid
    answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=4,
                                       extra_body={"guided_choice": ["up", "down"]})
    assert answer.choices[0].text in ("up", "down")
    assert metric(server, "fd_guided_server_engine_restarts_total") == restarts + 1
    beats = httpx.get(server.base_url + "/stats", timeout=10).json()["heartbeat_interval"]
    assert beats["count"] > 0 and beats["max"] < 5.0, beats  # the new engine's, well inside the deadline

def test_shutdown_leaves_no_process_behind(server, client):
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "warm2", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})
    engine_pid = health(server).json()["engine_pid"]
    assert group_alive(engine_pid)
    server.process.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully (the app's lifespan stops the engine), then exits by the signal it caught
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not group_alive(engine_pid), "the engine or a compile process outlived the server"
