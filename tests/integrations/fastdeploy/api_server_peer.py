"""FastDeploy's OpenAI API server, run as one of its workers runs it, with an in-process engine peer.

Run in a subprocess (`run_api_server`): argv is FastDeploy's own CLI (``api_server.py`` parses it
at import), ``FD_PLUGINS=fd_guided``. The app is FastDeploy's (``api_server.app``), started by its
own lifespan (``with TestClient(app)``: ``create_engine_config`` -- where the plugin loads --,
``EngineClient``, the serving handlers, the dealer connections, the ZMQ push client), and every
request goes through its routes over HTTP (httpx's ASGI transport).

The engine's side is ours, built from FastDeploy's parts: the IPC signals the engine creates,
its request socket (``ZmqIpcServer`` PULL: what reaches it is recorded) and its response router
(``ZmqIpcServer`` ROUTER with its ``recv_result_handle`` thread), through which each request that
reached it is answered with an error result (``ENGINE_ANSWERS``): by the engine's own
``EngineService._send_error_response``, or as a ``RequestOutput`` that finishes with a token.

stdin: a JSON list of ``{"path", "body"}``; stdout, last line: a JSON list of
``{"status", "body", "reached_engine"}`` (``reached_engine``: the guided fields of each task the
engine's socket received for that request).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag",
                 "guided_json_object")
# What the engine answers, by the task's guided_regex, else its user: (error_code, error_msg, with
# outputs). The engine checker's refusal (`_send_error_response`, outputs None); a worker's report on the
# finishing result (it carries the stop token); FastDeploy's own failures of a plain request, a 500 and
# a 400 (token_processor.py sends 400 for a failed cache transfer).
ENGINE_ANSWERS = {
    "[a-z]+": (400, "invalid guided decoding request: refused by the engine", False),
    "[0-9]+": (400, "guided decoding failed: refused by the worker", True),
    "cache": (400, "failed to send cache", False),
    "[ab]+": (200, None, True),  # a finished answer: ANSWER_TEXT's tokens, then EOS (1)
    None: (500, "engine failure: no free blocks", False),
}

ANSWER_TEXT = "ab"


def create_engine_signals(suffix: int) -> list:
    """The shared-memory signals ``EngineService`` creates and ``EngineClient`` attaches to."""
    from fastdeploy.inter_communicator import IPCSignal

    return [IPCSignal(name=name, array=np.zeros([1], dtype=np.int32), dtype=np.int32, suffix=suffix, create=True)
            for name in ("worker_healthy_live_signal", "model_weights_status", "prefix_tree_status",
                         "kv_cache_status")]


class EnginePeer:
    """The engine's two sockets: requests recorded, each answered with the engine's error result."""

    def __init__(self, name: int, model_dir: str):
        import zmq
        from tokenizers import Tokenizer

        from fastdeploy.engine.common_engine import EngineService
        from fastdeploy.inter_communicator import ZmqIpcServer
        from fastdeploy.utils import llm_logger

        self.received: list[dict] = []
        tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.answer_ids = tokenizer.encode(ANSWER_TEXT, add_special_tokens=False).ids + [1]
        self.engine = EngineService.__new__(EngineService)  # only its response path is used
        self.engine.llm_logger = llm_logger
        self.engine.send_response_server = ZmqIpcServer(name=name, mode=zmq.ROUTER)
        self.requests = ZmqIpcServer(name=name, mode=zmq.PULL)
        threading.Thread(target=self.engine.send_response_server.recv_result_handle, daemon=True).start()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            err, task = self.requests.receive_json_once(block=True)
            if err is not None:
                return
            if task:
                self.received.append(task)
                self._answer(task)

    def _answer(self, task: dict) -> None:
        from fastdeploy.engine.request import CompletionOutput, RequestOutput

        code, message, with_outputs = ENGINE_ANSWERS[task.get("guided_regex") or task.get("user")]
        if not with_outputs:
            self.engine._send_error_response(task["request_id"], message, code)
            return
        from fastdeploy.engine.request import RequestMetrics

        outputs = CompletionOutput(index=0, send_idx=0, token_ids=self.answer_ids if code == 200 else [1])
        result = RequestOutput(task["request_id"], outputs=outputs, finished=True, error_code=code, error_msg=message,
                               metrics=RequestMetrics(arrival_time=time.time()))
        self.engine.send_response_server.send_response(task["request_id"], [result])

    def remove_socket_files(self) -> None:
        """Their /dev/shm files. The sockets themselves are left to the process's exit: closing one
        while its thread waits on it aborts libzmq (``pfd.revents & POLLIN``)."""
        for server in (self.requests, self.engine.send_response_server):
            if os.path.exists(server.file_name):
                os.remove(server.file_name)

    def reached(self, since: int) -> list[dict]:
        return [{name: task[name] for name in GUIDED_FIELDS if task.get(name) is not None}
                for task in self.received[since:]]


def main() -> None:
    sys.path[:0] = [TESTS]
    import fastdeploy_host as host

    cases = json.load(sys.stdin)
    host.fastdeploy_source()
    host.install_op_stand_ins()
    port, queue_id = os.getpid() % 20000 + 30000, os.getpid() % 20000 + 10000
    os.environ["INFERENCE_MSG_QUEUE_ID"] = str(queue_id)
    sys.argv = ["api_server", *sys.argv[1:], "--port", str(port)]
    signals = create_engine_signals(queue_id)
    peer = EnginePeer(port, sys.argv[sys.argv.index("--model") + 1])
    from fastapi.testclient import TestClient

    from fastdeploy.entrypoints.openai import api_server

    results = []
    # raise_server_exceptions=False: an exception in a route is answered 500, as uvicorn answers it.
    with TestClient(api_server.app, raise_server_exceptions=False) as client:  # lifespan: FD_PLUGINS load
        for case in cases:
            before = len(peer.received)
            response = client.post(case["path"], json=case["body"])
            time.sleep(0.05 if response.status_code == 400 else 0)  # a task sent would have arrived
            results.append({"status": response.status_code, "body": _body(response),
                            "reached_engine": peer.reached(before)})
    peer.remove_socket_files()
    for signal in signals:
        signal.clear()
    print(json.dumps(results))


def _body(response):
    try:
        return response.json()
    except ValueError:
        return response.text  # a stream: its events


if __name__ == "__main__":
    main()
