"""Refusals reach FastDeploy's HTTP clients as 400, through the snapshot's own API server.

Each backend's run is one subprocess (`api_server_peer.py`): FastDeploy's ``api_server`` module
imported with its CLI, its app started by its own lifespan (the plugin loads there, from
``FD_PLUGINS``), requests posted over HTTP to its routes, the engine's sockets served by a peer
built from FastDeploy's ZMQ servers. A guided refusal is answered by the API server itself, before
tokenisation: HTTP 400, OpenAI's error body naming the field and the feature, nothing sent to the
engine. What stays 500 (an engine's own ``error_code=400`` result; FastDeploy's other errors) is
asserted too: the first is the upstream change in docs/fastdeploy-upstream.md.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import fastdeploy_engine as fe
import fastdeploy_host as host

pytestmark = pytest.mark.fastdeploy

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_server_peer.py")
# Imported by FastDeploy's api_server.py (gunicorn, aiozmq) or by the test client (httpx).
API_SERVER_NEEDS = ("gunicorn", "aiozmq", "httpx")
UPSTREAM_DOC = os.path.join(host.REPO, "docs", "fastdeploy-upstream.md")
MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}
# (name, guided fields of the body, the field OpenAI's error names, what its message must say)
REFUSED = [
    ("malformed EBNF", {"guided_grammar": 'root ::= ("a" | '}, "guided_grammar", "line 1, column 10"),
    ("unsupported schema feature",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
     "response_format", "uniqueItems"),
    ("bad regex", {"guided_regex": "(unclosed"}, "guided_regex", "not a valid regular expression"),
]
# Answered by the engine peer (api_server_peer.ENGINE_ANSWERS), after our check let them through.
ANSWERED = {"guided_regex": "[ab]+"}  # answered "ab", then EOS
ENGINE_REFUSES = {"guided_regex": "[a-z]+"}
WORKER_REFUSES = {"guided_regex": "[0-9]+"}
ENGINE_MESSAGE = "invalid guided decoding request: refused by the engine"
WORKER_MESSAGE = "guided decoding failed: refused by the worker"
ENGINE_FAILURE = "engine failure: no free blocks"
CACHE_FAILURE = "failed to send cache"  # FastDeploy's own 400 (token_processor.py), for user "cache"


def _body(endpoint, **fields):
    prompt = {"messages": MESSAGES} if endpoint == "chat" else {"prompt": "hi"}
    return {"path": "/v1/chat/completions" if endpoint == "chat" else "/v1/completions",
            "body": {**prompt, "max_tokens": 4, **fields}}


CASES = {}
for _name, _fields, _, _ in REFUSED:
    for _endpoint in ("chat", "completions"):
        CASES[_name, _endpoint] = _body(_endpoint, **_fields)
CASES["stream"] = _body("chat", stream=True, **REFUSED[2][1])
for _endpoint in ("chat", "completions"):
    CASES["answered", _endpoint] = _body(_endpoint, **ANSWERED)
    CASES["engine refuses", _endpoint] = _body(_endpoint, **ENGINE_REFUSES)
    CASES["worker refuses", _endpoint] = _body(_endpoint, **WORKER_REFUSES)
    CASES["engine fails", _endpoint] = _body(_endpoint)
    CASES["engine fails with 400", _endpoint] = _body(_endpoint, user="cache")
CASES["other parameter error"] = _body("chat", reasoning_max_tokens=0)
# A client's schema, admitted: sent on to the engine as its compact text (`documents_as_text`).
OBJECT_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
for _endpoint in ("chat", "completions"):
    CASES["schema as objects", _endpoint] = _body(
        _endpoint, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": OBJECT_SCHEMA}})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    os.environ["FD_PLUGINS"] = "fd_guided"
    path = fe.make_model_dir(str(tmp_path_factory.mktemp("model")))
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # chat requests tokenise
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return path


def _serve(model_dir, backend, source):
    """One API server on `source` (a snapshot directory); every case of `CASES` posted to it: name -> answer."""
    missing = [name for name in API_SERVER_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"FastDeploy's api_server imports {', '.join(missing)} (its requirements.txt): not installed")
    env = {**os.environ, "FD_PLUGINS": "fd_guided", host.SNAPSHOT_ENV: source,
           "PYTHONPATH": os.pathsep.join([source, host.REPO, os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, PEER, "--model", model_dir, "--max-model-len", "2048", "--guided-decoding-backend", backend]
    done = subprocess.run(argv, input=json.dumps(list(CASES.values())), capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == len(CASES)
    return dict(zip(CASES, results))


@pytest.fixture(scope="module", params=["auto", "xgrammar", "llguidance"])
def answers(request, model_dir):
    return _serve(model_dir, request.param, host.fastdeploy_source())


@pytest.fixture(scope="module")
def upstream_answers(model_dir, tmp_path_factory):
    """The same, on the snapshot with docs/fastdeploy-upstream.md's patch applied (``patch -p1``)."""
    source = str(tmp_path_factory.mktemp("fastdeploy-patched"))
    snapshot = host.find_snapshot()
    if os.path.isdir(snapshot):
        shutil.copytree(snapshot, source, dirs_exist_ok=True)
    else:
        with tarfile.open(snapshot) as archive:
            archive.extractall(source, filter="data")
    with open(UPSTREAM_DOC, encoding="utf-8") as handle:
        diff = re.search(r"```diff\n(.*?)```", handle.read(), re.S).group(1)
    applied = subprocess.run(["patch", "-p1", "--forward"], input=diff, cwd=source, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return _serve(model_dir, "auto", source)


@pytest.mark.parametrize("name, param, said", [case[0::2] + case[3:] for case in REFUSED],
                         ids=[name for name, *_ in REFUSED])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_refused_guided_request_is_http_400_naming_the_field_before_the_engine(answers, name, param, said,
                                                                                   endpoint):
    answer = answers[name, endpoint]
    assert answer["status"] == 400, answer
    error = answer["body"]["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith("invalid guided decoding request: ") and said in error["message"], error
    assert "Traceback" not in error["message"]
    assert answer["reached_engine"] == []  # refused before tokenisation, nothing sent


def test_a_streaming_request_is_refused_before_its_stream_starts(answers):
    answer = answers["stream"]
    assert answer["status"] == 400 and answer["body"]["error"]["param"] == "guided_regex", answer
    assert answer["reached_engine"] == []


def test_a_good_request_is_answered_through_the_watch_unchanged(answers):
    chat, completion = answers["answered", "chat"], answers["answered", "completions"]
    assert chat["reached_engine"] == [ANSWERED] and completion["reached_engine"] == [ANSWERED]
    assert chat["status"] == 200 and completion["status"] == 200, (chat, completion)
    assert chat["body"]["choices"][0]["message"]["content"] == "ab", chat
    assert completion["body"]["choices"][0]["text"] == "ab", completion
    assert chat["body"]["choices"][0]["finish_reason"] == "stop" == completion["body"]["choices"][0]["finish_reason"]


@pytest.mark.parametrize("case, fields, message", [("engine refuses", ENGINE_REFUSES, ENGINE_MESSAGE),
                                                   ("worker refuses", WORKER_REFUSES, WORKER_MESSAGE)])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_refusal_that_comes_back_from_the_engine_or_a_worker_is_400_too(answers, case, fields, message, endpoint):
    """A good request reaches the engine unchanged; the engine's checker (``outputs=None``) or a
    worker's report (on the finishing result) refuses it: 400, the message as they wrote it."""
    answer = answers[case, endpoint]
    assert answer["reached_engine"] == [fields]  # the API server's check let it through, unchanged
    assert answer["status"] == 400, answer
    assert answer["body"]["error"] == {"message": message, "type": "invalid_request_error",
                                       "param": "guided_regex", "code": "400"}


@pytest.mark.parametrize("case, message", [("engine fails", ENGINE_FAILURE), ("engine fails with 400", CACHE_FAILURE)])
def test_fastdeploys_own_engine_failure_still_breaks_its_http_layer(answers, case, message):
    """What only upstream can fix: an engine error result for a plain request (``outputs=None``), left
    to FastDeploy, a 400 included. Chat: the response processor reads ``outputs["token_ids"]`` before
    the error check, so the client gets 500 with a TypeError, the engine's message lost. Completions:
    the ValueError is logged and swallowed, ``None`` returned, and the route streams ``None``: 200, no
    body."""
    chat = answers[case, "chat"]
    assert chat["reached_engine"] == [{}] and chat["status"] == 500, chat
    assert "'NoneType' object is not subscriptable" in chat["body"]["error"]["message"], chat
    assert message not in chat["body"]["error"]["message"]
    completion = answers[case, "completions"]
    assert completion["status"] == 200 and completion["body"] == "", completion


def test_with_the_upstream_patch_engine_failures_carry_their_message(upstream_answers):
    for endpoint in ("chat", "completions"):
        answer = upstream_answers["engine fails", endpoint]
        assert answer["status"] == 500, answer
        assert answer["body"]["error"] == {"message": ENGINE_FAILURE, "type": "internal_error", "param": None,
                                           "code": "500"}, answer
        answer = upstream_answers["engine fails with 400", endpoint]  # the patch's own path, not the plugin's
        assert answer["status"] == 400, answer
        assert answer["body"]["error"] == {"message": CACHE_FAILURE, "type": "invalid_request_error",
                                           "param": None, "code": "400"}, answer
        for case, message in (("engine refuses", ENGINE_MESSAGE), ("worker refuses", WORKER_MESSAGE)):
            assert upstream_answers[case, endpoint]["status"] == 400, upstream_answers[case, endpoint]
            assert upstream_answers[case, endpoint]["body"]["error"]["message"] == message
        for name, *_ in REFUSED:  # the plugin's own refusals are unchanged by the patch
            assert upstream_answers[name, endpoint]["status"] == 400, upstream_answers[name, endpoint]
            assert upstream_answers[name, endpoint]["body"]["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_an_admitted_schema_given_as_objects_reaches_the_engine_as_its_compact_text(answers, endpoint):
    """The engine's checker then finds it again by its text (a sampled hash and a comparison), not
    by writing the dict again on its one request-insertion thread."""
    reached = answers["schema as objects", endpoint]["reached_engine"]
    assert len(reached) == 1, reached
    text = reached[0]["guided_json"]
    assert isinstance(text, str) and text == json.dumps(OBJECT_SCHEMA, separators=(",", ":")), reached


def test_fastdeploys_other_parameter_errors_keep_their_status(answers):
    answer = answers["other parameter error"]
    assert answer["status"] == 500 and answer["body"]["error"]["param"] == "reasoning_max_tokens", answer
    assert answer["reached_engine"] == []


def test_run_as_python_m_the_routes_module_is_main_and_is_patched():
    """``python -m fastdeploy.entrypoints.openai.api_server`` runs the routes in ``__main__``, whose
    ``__spec__`` names the module (what runpy sets): `api_server_module` finds it there."""
    script = (
        "import importlib.machinery, json, sys\n"
        "from starlette.responses import JSONResponse as Original  # this script's globals are __main__'s\n"
        "main = sys.modules['__main__']\n"
        "main.__spec__ = importlib.machinery.ModuleSpec('fastdeploy.entrypoints.openai.api_server', None)\n"
        "main.JSONResponse = Original\n"
        "from fd_guided.integrations.fastdeploy import api_server\n"
        "assert api_server.api_server_module() is main\n"
        "api_server.install_api_server(main, '__mark__')\n"
        "api_server.install_api_server(main, '__mark__')\n"
        "assert main.JSONResponse.__mro__[1] is Original  # wrapped once\n"
        "body = {'error': {'message': 'm', 'type': 'invalid_request', 'param': 'guided_regex', 'code': '400'}}\n"
        "other = {'error': {'message': 'm', 'type': 'invalid_request_error', 'param': 'logprobs', 'code': None}}\n"
        "answers = [main.JSONResponse(content=c, status_code=s) for c, s in ((body, 500), (other, 500), (body, 200))]\n"
        "print(json.dumps([[a.status_code, json.loads(a.body)] for a in answers]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": host.REPO})
    assert done.returncode == 0, done.stderr[-3000:]
    [refused, other, ok] = json.loads(done.stdout.strip().splitlines()[-1])
    assert refused == [400, {"error": {"message": "m", "type": "invalid_request_error", "param": "guided_regex",
                                       "code": "400"}}]
    assert other[0] == 500 and ok[0] == 200 and ok[1]["error"]["type"] == "invalid_request"
