"""fd_guided switched on inside real FastDeploy: plugin loading, config, admission, error paths.

What FastDeploy does at start-up is run for real: ``EngineArgs.create_engine_config`` (engine),
``worker_process.parse_args``/``initialize_fd_config`` (worker), the checker ``EngineService``
builds, ``EngineService._insert_zmq_task_to_scheduler``/``_send_error_response`` and
``TokenProcessor._recycle_resources``. Import-order cases run in fresh interpreters.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import fastdeploy_engine as fe
import fastdeploy_host as host

pytestmark = pytest.mark.fastdeploy

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support modules


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return fe.enabled_host(tmp_path_factory)


def run_fresh(script: str, **env) -> dict:
    """Run `script` in a new interpreter (FastDeploy extracted, ops stood in); its last line is JSON."""
    prelude = textwrap.dedent(f"""
        import json, os, sys, tempfile
        sys.path[:0] = [{TESTS!r}, {host.REPO!r}]
        import fastdeploy_host as host, fastdeploy_engine as fe
        host.fastdeploy_source(); host.install_op_stand_ins()
        model_dir = fe.make_model_dir(tempfile.mkdtemp())
    """)
    environment = {k: v for k, v in os.environ.items() if k != "FD_PLUGINS"}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


ENGINE_PROBE = """
    try:
        cfg = fe.engine_config(model_dir, guided_decoding_backend="fd_guided")
        outcome = cfg.structured_outputs_config.guided_decoding_backend
    except NotImplementedError as error:
        outcome = f"NotImplementedError: {error}"
    from fastdeploy.engine import common_engine
    checker = common_engine.schema_checker
    print(json.dumps({"backend": outcome, "checker": getattr(checker, "__wrapped__", checker).__module__,
                      "hooked": getattr(checker, "__fd_guided_hook__", False)}))
"""


def test_the_plugin_loads_only_when_named_in_FD_PLUGINS(model_dir):
    without = run_fresh(ENGINE_PROBE)
    assert without["backend"].startswith("NotImplementedError") and not without["hooked"]
    enabled = run_fresh(ENGINE_PROBE, FD_PLUGINS="fd_guided")
    assert enabled == {"backend": "fd_guided", "checker": "fastdeploy.model_executor.guided_decoding", "hooked": True}


def test_names_bound_before_the_plugin_loaded_are_replaced_too():
    # The runner, the sampler and the engine module are imported BEFORE the plugin loads (the
    # other order, after it, is what every test in test_fastdeploy_decoding.py goes through).
    report = run_fresh("""
        from fastdeploy.platforms import current_platform
        from fastdeploy.worker import gpu_model_runner
        from fastdeploy.model_executor.layers.sample import sampler
        from fastdeploy.engine import common_engine
        from fastdeploy.output import token_processor
        cfg = fe.engine_config(model_dir, guided_decoding_backend="auto")
        import fd_guided.integrations.fastdeploy as plugin
        hooked = lambda f: getattr(f, "__fd_guided_hook__", False)
        runner_backend = hooked(gpu_model_runner.get_guided_backend)
        # The plugin loaded halfway through gpu_model_runner's own import (it imports the model
        # registry): its class was not defined yet. GPUModelRunner.__init__ calls
        # get_guided_backend before anything guided, which completes the patching:
        gpu_model_runner.get_guided_backend(fd_config=cfg).close()
        print(json.dumps({
            "registered_again": plugin.register(),
            "runner_backend": runner_backend,
            "runner_request": hooked(gpu_model_runner.GPUModelRunner._init_logits_processor),
            "sampler": sampler.GuidedDecoding is plugin.GuidedDecoding,
            "engine_checker": hooked(common_engine.schema_checker),
            "engine_errors": hooked(common_engine.EngineService._send_error_response),
            "worker_errors": hooked(token_processor.TokenProcessor._recycle_resources),
            "wrapped_once": not hooked(gpu_model_runner.GPUModelRunner._init_logits_processor.__wrapped__),
        }))
    """, FD_PLUGINS="fd_guided")
    assert report == {"registered_again": False, "runner_backend": True, "runner_request": True, "sampler": True,
                      "engine_checker": True, "engine_errors": True, "worker_errors": True, "wrapped_once": True}


@pytest.mark.parametrize("name, ours", [("auto", "auto"), ("xgrammar", "xgrammar"), ("guidance", "llguidance"),
                                        ("llguidance", "llguidance"), ("fd_guided", "auto"),
                                        ("fd_guided:xgrammar", "xgrammar")])
def test_every_backend_name_survives_fastdeploys_config_in_engine_and_worker(model_dir, name, ours):
    from fastdeploy.worker import gpu_model_runner

    cfg = fe.engine_config(model_dir, guided_decoding_backend=name)
    assert cfg.structured_outputs_config.guided_decoding_backend == name
    fd_config = fe.start_worker(cfg)  # --guided_decoding_backend <name> -> the worker's FDConfig
    assert fd_config.structured_outputs_config.guided_decoding_backend == name
    backend = gpu_model_runner.get_guided_backend(fd_config=fd_config)  # the runner's bound name
    assert type(backend).__module__ == "fd_guided.integrations.fastdeploy.backend" and backend.config.backend == ours
    backend.close()


def test_off_stays_fastdeploys_and_unknown_names_fail_at_start_up(model_dir):
    from fd_guided.errors import BackendNotFoundError

    assert fe.engine_config(model_dir, guided_decoding_backend="off").structured_outputs_config.guided_decoding_backend == "off"
    with pytest.raises(BackendNotFoundError):
        fe.engine_config(model_dir, guided_decoding_backend="fd_guided:no-such-engine")
    with pytest.raises(NotImplementedError):  # FastDeploy's own refusal of a name nobody serves
        fe.engine_config(model_dir, guided_decoding_backend="outlines")


def engine_checker(cfg):
    from fastdeploy.engine import common_engine

    return common_engine.schema_checker(cfg.structured_outputs_config.guided_decoding_backend,
                                        disable_any_whitespace=cfg.structured_outputs_config.disable_any_whitespace)


BAD = [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_json": {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}}, "uniqueItems"),
    ({"guided_json": json.dumps({"type": "array", "contains": {"const": 1}})}, "contains"),
    ({"structural_tag": json.dumps({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}]})}, "triggers"),
    ({"guided_choice": ["a", 1]}, "guided_choice[1]"),
]


class RecvOnce:
    """Stands in for the engine's ZMQ request server: one request, then the context closes."""

    def __init__(self, engine, data):
        self.engine, self.data = engine, data

    def receive_json_once(self, block):
        if self.data is None:
            self.engine.running = False
            return "Context was terminated", None
        data, self.data = self.data, None
        return None, data


class Recorder:
    """Stands in for the scheduler queue and the ZMQ response server: records what they are given."""

    def __init__(self):
        self.calls = []

    def put_requests(self, requests):
        self.calls += requests
        return [(request.request_id, None) for request in requests]

    def send_response(self, request_id, outputs):
        self.calls.append((request_id, outputs))


def admit_through_the_engine(cfg, data):
    from fastdeploy.engine.common_engine import EngineService
    from fastdeploy.utils import llm_logger

    engine = EngineService.__new__(EngineService)
    engine.cfg, engine.running, engine.llm_logger = cfg, True, llm_logger
    engine.guided_decoding_checker = engine_checker(cfg)
    engine.recv_request_server, engine.scheduler, engine.send_response_server = RecvOnce(engine, data), Recorder(), Recorder()
    engine._insert_zmq_task_to_scheduler()
    return engine.scheduler.calls, engine.send_response_server.calls


@pytest.mark.parametrize("fields, named", BAD, ids=[named for _, named in BAD])
def test_bad_requests_are_refused_by_the_engine_with_400_and_the_feature_named(model_dir, fields, named):
    cfg = fe.engine_config(model_dir, guided_decoding_backend="xgrammar")
    data = {"request_id": "bad-1", "prompt_token_ids": [1, 2, 3], **fields}
    scheduled, responses = admit_through_the_engine(cfg, data)
    assert scheduled == []
    [(request_id, [output])] = responses
    assert request_id == "bad-1" and output.finished and output.error_code == 400
    assert named in output.error_msg and type(output.error_msg) is str, output.error_msg


def test_a_good_request_is_scheduled_normalised_for_the_runner(model_dir):
    cfg = fe.engine_config(model_dir, guided_decoding_backend="auto")
    scheduled, responses = admit_through_the_engine(cfg, {"request_id": "ok-1", "prompt_token_ids": [1, 2],
                                                          "guided_choice": ["yes", "no"]})
    assert responses == [] and [r.request_id for r in scheduled] == ["ok-1"]
    assert scheduled[0].guided_choice is None and "yes" in scheduled[0].guided_grammar


def test_a_workers_guided_failure_becomes_the_finishing_results_error(model_dir):
    from fastdeploy.engine.request import CompletionOutput, Request, RequestOutput
    from fastdeploy.engine.sched.resource_manager_v1 import ResourceManagerV1
    from fastdeploy.output.token_processor import TokenProcessor

    from fd_guided.integrations.fastdeploy import ErrorReports

    cfg = fe.engine_config(model_dir, guided_decoding_backend="auto")
    processor = TokenProcessor.__new__(TokenProcessor)  # the engine's output thread, without its queues
    processor.resource_manager, processor.tokens_counter = ResourceManagerV1(4, cfg, 1, "mixed", 0), {}
    results = []
    for request_id in ("failed", "fine"):
        task = Request.from_dict({"request_id": request_id, "prompt_token_ids": [1, 2]})
        task.block_tables = []
        processor.resource_manager.tasks_list[0], processor.resource_manager.stop_flags[0] = task, False
        result = RequestOutput(request_id=request_id, outputs=CompletionOutput(index=0, send_idx=0, token_ids=[1]), finished=True)
        if request_id == "failed":  # what a worker leaves when its guided request fails
            ErrorReports.for_this_deployment().post(request_id, "guided decoding failed: token 7 was rejected", 500)
        processor._recycle_resources(request_id, 0, task, result, False)
        results.append(result)
    assert (results[0].error_code, results[0].error_msg) == (500, "guided decoding failed: token 7 was rejected")
    assert results[1].error_code == 200 and results[1].error_msg is None


def test_fastdeploys_own_guided_decoding_tests_still_pass_with_fd_guided_installed():
    """Their files mock torch/xgrammar in sys.modules: each runs in its own interpreter."""
    source = host.fastdeploy_source()
    files = ["tests/layers/test_guided_decoding.py"] + sorted(
        os.path.relpath(p, source) for p in __import__("glob").glob(os.path.join(source, "tests/model_executor/guided_decoding/test_*.py")))
    env = {**os.environ, "FD_PLUGINS": "fd_guided", "PYTHONPATH": os.pathsep.join([source, TESTS, host.REPO])}
    for name in files:
        # fastdeploy_preimport: import FastDeploy (and so transformers) before the file swaps torch
        # for a MagicMock; newer transformers probe torch's __spec__ on import and fail otherwise.
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fastdeploy_preimport",
                               name], cwd=source, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{name}:\n{done.stdout[-3000:]}"
    from importlib.metadata import entry_points

    installed = [ep.value for ep in entry_points(group="fastdeploy.model_register_plugins") if ep.name == "fd_guided"]
    assert installed == ["fd_guided.integrations.fastdeploy:register"]  # installed, enabled, and still green
