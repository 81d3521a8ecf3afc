"""The `fd-guided` command line.

    fd-guided generate                      # the built-in demo requests on the embedded default model
    fd-guided generate --json-schema '{"type":"object",...}' --prompt "..."
    fd-guided generate --requests reqs.jsonl --max-tokens 128
    fd-guided backends                      # registered backends
    fd-guided serve --preset small --port 8000   # OpenAI-compatible HTTP server (fd_guided.harness.server)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from typing import Sequence

DEMO_REQUESTS = [
    {"prompt": "Give me a user profile as JSON.", "guided_json": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "format": "email"},
            "roles": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "age", "roles"],
    }},
    {"prompt": "An order:", "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": {
        "type": "object",
        "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                                          "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                           "required": ["sku", "qty"]}},
        "properties": {"id": {"type": "integer"}, "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 3},
                       "status": {"enum": ["new", "paid", "shipped"]}},
        "required": ["id", "items", "status"],
    }}}},
    {"prompt": "Any JSON object please.", "response_format": {"type": "json_object"}},
    {"prompt": "A date:", "guided_regex": r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"},
    {"prompt": "Sentiment?", "guided_choice": ["positive", "negative", "neutral"]},
    {"prompt": "An arithmetic expression:", "guided_grammar": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"'},
    {"prompt": "A greeting in Lark:", "guided_grammar": 'start: GREETING " " NAME\nGREETING: "hello" | "hi"\nNAME: /[a-z]{2,8}/'},
    {"prompt": "Unconstrained text."},
]


def main(argv: Sequence[str] | None = None) -> int:
    # Paddle warns at import that ccache is missing; it only matters for building Paddle extensions.
    warnings.filterwarnings("ignore", message="No ccache found")
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return args.handler(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fd-guided", description="Guided decoding for Paddle serving stacks.")
    commands = parser.add_subparsers(dest="command")
    generate = commands.add_parser("generate", help="run requests on the reference engine and validate the outputs")
    generate.add_argument("--prompt", default="Answer:", help="prompt for an inline request")
    generate.add_argument("--json-schema", help="inline JSON schema (or @file)")
    generate.add_argument("--regex", help="inline regex constraint")
    generate.add_argument("--choice", action="append", help="a choice (repeat the flag)")
    generate.add_argument("--grammar", help="inline EBNF or Lark grammar (or @file)")
    generate.add_argument("--requests", help="JSONL file, one request dict per line")
    generate.add_argument("--max-tokens", type=int, default=96)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--preset", default="small", help="built-in model size: tiny, small, base")
    generate.add_argument("--tokenizer", default="deepseek", help="deepseek, qwen, or a tokenizer.json path")
    generate.add_argument("--backend", default="auto", help="auto (default), xgrammar or llguidance")
    generate.add_argument("--max-num-seqs", type=int, default=32)
    generate.add_argument("--speculative", choices=("ngram", "draft_model"), help="draft and verify tokens with this drafter")
    generate.add_argument("--num-draft-tokens", type=int, default=4, help="K, drafts per step (with --speculative)")
    generate.add_argument("--unmasked-drafts", action="store_true", help="let drafts ignore the grammar (acceptance drops)")
    generate.add_argument("--jump-forward", action="store_true", help="emit the tokens a grammar forces without sampling them")
    generate.add_argument("--json", dest="json_out", action="store_true", help="print one JSON object per output")
    generate.set_defaults(handler=_generate)
    bench = commands.add_parser("bench", help="measure guided-decoding cost side by side (steps, kernels, ttft)")
    bench.add_argument("--only", nargs="+", choices=("steps", "kernels", "ttft", "spec", "jump_forward"),
                       help="run only these parts (spec and jump_forward run only when named)")
    bench.add_argument("--spec-ks", type=int, nargs="+", default=[1, 3, 5, 7], help="draft lengths K for --only spec")
    bench.add_argument("--preset", default="small")
    bench.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    bench.add_argument("--rounds", type=int, default=3)
    bench.add_argument("--decode-steps", type=int, default=24)
    bench.add_argument("--json", dest="json_path", help="write the machine-readable report here")
    bench.set_defaults(handler=_bench)
    backends = commands.add_parser("backends", help="list registered guided-decoding backends")
    backends.set_defaults(handler=_backends)
    _serve_parser(commands)
    return parser


def _serve_parser(commands) -> None:
    serve = commands.add_parser(
        "serve", help="serve the OpenAI API (chat/completions, completions, tools) over HTTP",
        description="An OpenAI-compatible server on the reference engine: the embedded Paddle model (random "
                    "weights, constrained output) behind /v1/chat/completions, /v1/completions and /v1/models, "
                    "with response_format, guided_* fields, tool calling, streaming, /metrics, /health and /stats.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--preset", default="small", help="built-in model size: tiny, small, base")
    serve.add_argument("--tokenizer", default="deepseek", help="deepseek, qwen, or a tokenizer.json path")
    serve.add_argument("--backend", default="auto", help="guided-decoding backend: auto, xgrammar or llguidance")
    serve.add_argument("--chat-template", default="hermes", choices=("hermes", "llama3"),
                       help="chat format and tool-call syntax: hermes (<tool_call> JSON) or llama3 (JSON calls)")
    serve.add_argument("--served-model-name", help="the model id clients send; fd-guided-PRESET when not given")
    serve.add_argument("--max-num-seqs", type=int, default=32, help="requests decoded together (engine slots)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per forward (prefill chunks)")
    serve.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request gives none")
    serve.add_argument("--admission-threads", type=int, default=1, help="threads validating requests off the event loop")
    serve.add_argument("--switch-interval-ms", type=float, default=1.0,
                       help="Python's GIL switch interval for the process (Python's default is 5): shorter keeps "
                            "the event loop's wait for the GIL short while engine and admission threads are busy")
    serve.add_argument("--loop-priority", default="auto", choices=("auto", "realtime", "normal"),
                       help="CPU class of the event-loop thread alone: auto tries SCHED_RR priority 1 (needs "
                            "CAP_SYS_NICE or RLIMIT_RTPRIO; falls back to normal), so a busy host cannot delay it by "
                            "a scheduler slice; realtime insists; normal never asks")
    serve.add_argument("--max-body-bytes", type=int, default=4 << 20,
                       help="request bodies past this are refused with 413 before they are read")
    serve.add_argument("--seed", type=int, default=0, help="seed of the model's random weights")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.set_defaults(handler=_serve)


def _serve(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fd_guided.harness.server import ServerSettings, serve

    settings = ServerSettings(preset=args.preset, tokenizer=args.tokenizer, backend=args.backend, seed=args.seed,
                              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                              chat_template=args.chat_template, served_model_name=args.served_model_name,
                              default_max_tokens=args.default_max_tokens, admission_threads=args.admission_threads,
                              switch_interval_s=args.switch_interval_ms / 1000, loop_priority=args.loop_priority,
                              max_body_bytes=args.max_body_bytes)
    serve(settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _read_inline(value: str | None) -> str | None:
    if value and value.startswith("@"):
        with open(value[1:], encoding="utf-8") as handle:
            return handle.read()
    return value


def _requests_from_args(args) -> list[dict]:
    if args.requests:
        with open(args.requests, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    inline = {"guided_json": _read_inline(args.json_schema), "guided_regex": args.regex,
              "guided_choice": args.choice, "guided_grammar": _read_inline(args.grammar)}
    inline = {k: v for k, v in inline.items() if v}
    if inline:
        return [{"prompt": args.prompt, **inline}]
    return [dict(request) for request in DEMO_REQUESTS]


def _generate(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fd_guided.config import GuidedConfig
    from fd_guided.harness.validate import validate_output
    from fd_guided.harness.engine import ReferenceEngine

    requests = _requests_from_args(args)
    started = time.perf_counter()
    from fd_guided.harness.engine import SpeculativeConfig

    speculative = SpeculativeConfig(args.speculative, args.num_draft_tokens, masked_drafts=not args.unmasked_drafts) \
        if args.speculative else None
    engine = ReferenceEngine.default(
        preset=args.preset, tokenizer=args.tokenizer, seed=args.seed, speculative=speculative,
        guided_config=GuidedConfig(backend=args.backend, jump_forward=args.jump_forward), max_num_seqs=args.max_num_seqs,
    )
    load_seconds = time.perf_counter() - started
    results = engine.generate(requests, max_tokens=args.max_tokens, seed=args.seed)
    checked = valid = 0
    for request, result in zip(requests, results):
        verdict = validate_output(result.spec, result.text) if result.spec and result.finish_reason == "stop" else None
        checked += verdict is not None
        valid += bool(verdict and verdict.valid)
        _print_result(args, request, result, verdict)
    _print_summary(engine, results, checked, valid, load_seconds)
    engine.close()
    return 0 if checked == valid else 1


def _print_result(args, request: dict, result, verdict) -> None:
    kind = result.spec.kind if result.spec else "none"
    status = "-" if verdict is None else ("valid" if verdict.valid else f"INVALID ({verdict.reason})")
    if args.json_out:
        print(json.dumps({"index": result.index, "kind": kind, "finish_reason": result.finish_reason, "text": result.text,
                          "tokens": len(result.token_ids), "validation": status, "error": result.error}, ensure_ascii=False))
        return
    print(f"[{result.index}] {kind:<14} finish={result.finish_reason:<6} tokens={len(result.token_ids):<4} check={status}")
    print(f"    prompt: {request.get('prompt', '')[:80]!r}")
    print(f"    output: {result.text[:400]!r}")
    if result.error:
        print(f"    error:  {result.error}")


def _print_summary(engine, results, checked: int, valid: int, load_seconds: float) -> None:
    stats = engine.stats
    guided = stats.guided
    finish_counts = {}
    for result in results:
        finish_counts[result.finish_reason] = finish_counts.get(result.finish_reason, 0) + 1
    print("\nsummary")
    print(f"  requests: {len(results)}  finish reasons: {finish_counts}")
    print(f"  constrained outputs finished and validated: {valid}/{checked} valid")
    print(f"  generated tokens: {stats.generated_tokens} in {stats.wall_seconds:.2f}s  ({stats.tokens_per_second:.1f} tokens/s, {stats.steps} steps)")
    print(f"  model load: {load_seconds:.2f}s  forward+mask: {stats.forward_seconds:.2f}s  sampling: {stats.sample_seconds:.2f}s")
    if stats.draft_tokens or stats.jump_tokens:
        print(f"  speculative: {stats.draft_tokens} drafts ({stats.draft_seconds:.2f}s drafting), acceptance length "
              f"{stats.acceptance_length:.2f}; jump-forward: {stats.jump_tokens} tokens; "
              f"forward passes per token {stats.forward_passes_per_token:.3f}")
    if guided:
        print(
            "  guided time: compile wait {compile_wait:.4f}s, fill {fill:.4f}s (overlapped; host waited {fill_join:.4f}s), "
            "apply {apply:.4f}s, accept {accept:.4f}s".format(**guided)
        )
        metrics = engine.manager.metrics
        print(f"  compiles: {metrics.value('cache_misses_total')} compiled, {metrics.value('cache_hits_total')} cache hits, "
              f"{metrics.histogram_sum('compile_seconds'):.3f}s compiling in the background")


def _bench(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fd_guided.harness.bench import PARTS, format_report, run_bench

    report = run_bench(tuple(args.only or PARTS), preset=args.preset, batches=tuple(args.batches), rounds=args.rounds,
                       decode_steps=args.decode_steps, spec_ks=tuple(args.spec_ks), progress=lambda line: print(line, flush=True))
    print(format_report(report))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0


def _backends(args) -> int:
    from fd_guided.registry import available_backends

    for name in available_backends():
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
