"""Load `fd-guided serve` over HTTP and report TTFT/TPOT and the server's loop health, as JSON.

    python tools/load.py --start-server --preset small --out docs/load.json      # starts its own server
    python tools/load.py --url http://127.0.0.1:8000 --out load.json             # a server already up

Two phases, each with the same HTTP load shape, one unguided and one guided:

  background  `--background` streaming clients send requests back to back for the whole phase
              (guided phase: `--cached` schemas compiled during warm-up, i.e. cache hits);
  burst       after `--burst-delay-s`, `--cold` requests at once (guided phase: that many distinct,
              complex, never-seen JSON schemas: that many cold compiles in flight together).

Client side, per request: TTFT (send -> first content byte) and TPOT ((last - first token) /
(completion tokens - 1), from the usage of the stream). Server side, per phase (`/stats` is reset
at the start): the event loop's lag (a 10 ms timer's overshoot: p99 and max), engine step times and
the longest inter-token gap per step (a stalled decode step shows there), plus a timeline of
compiles and requests in flight (polled from `/health`), and how many guided outputs end ``stop``
and validate (`valid_outputs`: jsonschema with format checking); on the two-process server also the IPC
transit of step updates (`ipc_transit`: engine send -> API decode). A probe in a process of its
own (so the load generator's own loop does not delay it) sends ``GET /v1/models`` every
`--probe-interval-ms` on one keep-alive connection through each phase: how long a cheap endpoint
takes, seen from a client (`probe`); with `--probe-priority rr` the probe runs SCHED_RR (where
permitted), so a busy host's run queue delays the client less and the figure is more the server's.
The probe runs in a session of its own (its own scheduler autogroup, as a separate client program
would), and so does a server started here: with autogroups on (Linux's default), every process of
one session shares one CPU share, and a probe or server in the load generator's session waited
behind its SSE parsing of 136 streams. `--probe-shared` adds a second probe in this tool's session,
side by side (`probe_shared`). `--phases` runs one phase only. Bounded: `--max-requests` in all
and `--phase-timeout-s` per phase; loopback addresses only.

Side by side: ``--server LABEL=DIR`` (repeatable) starts each server from its own checkout in turn
(``LABEL=DIR;pythonpath=P`` puts P first on the server's path, e.g. uvloop and httptools, which
uvicorn then uses; ``;engine-nice=N`` sets the engine process's scheduler autogroup to nice N once
it is up),
`--rounds` times (A B A B ...), and adds `comparison`: per phase and request kind, TTFT/TPOT
percentiles over the samples each server got in all rounds, their ratios (first server / each
other), and each round's ratio of medians (the spread). Each run records the load average.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import select
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

import httpx

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MESSAGES = [{"role": "user", "content": "Fill in the record."}]


# ----- schemas ------------------------------------------------------------------------------------


def complex_schema(index: int) -> dict:
    """A distinct, compile-heavy schema per index: $defs, nested objects and arrays, enums, bounded
    strings and numbers, formats, a pattern, anyOf. The index is baked into names and enums so no
    two share a cache entry."""
    tag = f"k{index}"
    return {
        "type": "object",
        "$defs": {
            "address": {"type": "object", "properties": {
                f"street_{tag}": {"type": "string", "maxLength": 24},
                "zip": {"type": "string", "pattern": f"^[0-9]{{5}}(-{index % 10}[0-9]{{3}})?$"},
                "country": {"enum": ["FR", "DE", "JP", f"X{index}"]}}, "required": [f"street_{tag}", "zip", "country"]},
            "item": {"type": "object", "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "qty": {"type": "integer", "minimum": 1, "maximum": 50 + index},
                "price": {"type": "number", "minimum": 0, "maximum": 1000},
                "tags": {"type": "array", "items": {"enum": ["new", "sale", f"t{index}"]}, "maxItems": 3}},
                "required": ["sku", "qty"]},
        },
        "properties": {
            f"id_{tag}": {"type": "integer", "minimum": 0},
            "created": {"type": "string", "format": "date"},
            "email": {"type": "string", "format": "email"},
            "status": {"enum": ["open", "paid", "shipped", f"s{index}"]},
            "shipping": {"$ref": "#/$defs/address"},
            "billing": {"anyOf": [{"$ref": "#/$defs/address"}, {"type": "null"}]},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 4},
            "note": {"type": "string", "maxLength": 40},
        },
        "required": [f"id_{tag}", "status", "items"],
        "additionalProperties": False,
    }


def response_format(schema: dict, name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


# ----- one request --------------------------------------------------------------------------------


@dataclass
class Sample:
    kind: str
    sent: float
    ttft: float | None = None
    tpot: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    text: str = ""
    schema: dict | None = None  # a guided request's schema: its output is validated (`valid_outputs`)


async def stream_one(client: httpx.AsyncClient, model: str, kind: str, max_tokens: int, extra: dict) -> Sample:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    sample = Sample(kind, time.perf_counter())
    first = last = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                sample.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return sample
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    sample.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    if choice["delta"].get("content"):
                        sample.text += choice["delta"]["content"]
                        now = time.perf_counter()
                        first = first or now
                        last = now
                    sample.finish_reason = choice.get("finish_reason") or sample.finish_reason
    except httpx.HTTPError as error:
        sample.error = f"{type(error).__name__}: {error}"
        return sample
    if first is not None:
        sample.ttft = first - sample.sent
        if sample.tokens > 1 and last > first:
            sample.tpot = (last - first) / (sample.tokens - 1)
    return sample


# ----- one phase ----------------------------------------------------------------------------------


@dataclass
class Budget:
    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


@dataclass
class Phase:
    name: str
    samples: list[Sample] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)


async def run_phase(args, client: httpx.AsyncClient, name: str, guided: bool, budget: Budget, cold_offset: int) -> dict:
    phase = Phase(name)
    await client.post("/stats/reset")
    started = time.perf_counter()
    deadline = started + args.phase_timeout_s
    burst_done = asyncio.Event()
    cached = [complex_schema(1_000_000 + i) for i in range(args.cached)]

    async def background(worker: int) -> None:
        count = 0
        while not burst_done.is_set() and time.perf_counter() < deadline and budget.take():
            extra = {"seed": worker * 1000 + count}
            if guided:
                extra["response_format"] = response_format(cached[(worker + count) % len(cached)], "cached")
                extra.update(args.guided_extra)
            else:
                extra["ignore_eos"] = True  # unguided random text runs to max_tokens, like a long answer
            sample = await stream_one(client, args.model, "background", args.max_tokens, extra)
            sample.schema = cached[(worker + count) % len(cached)] if guided else None
            phase.samples.append(sample)
            count += 1

    async def burst() -> None:
        await asyncio.sleep(args.burst_delay_s)
        jobs = []
        for i in range(args.cold):
            if not budget.take():
                break
            extra = {"seed": i}
            if guided:
                extra["response_format"] = response_format(complex_schema(cold_offset + i), f"cold{i}")
                extra.update(args.guided_extra)
            else:
                extra["ignore_eos"] = True
            jobs.append(stream_one(client, args.model, "burst", args.max_tokens, extra))
        remaining = max(1.0, deadline - time.perf_counter())
        try:
            for i, sample in enumerate(await asyncio.wait_for(asyncio.gather(*jobs), remaining)):
                sample.schema = complex_schema(cold_offset + i) if guided else None
                phase.samples.append(sample)
        except asyncio.TimeoutError:
            print(f"  {name}: burst did not finish within --phase-timeout-s", flush=True)
        # a few more seconds of background load after the burst, to see the steps recover
        await asyncio.sleep(args.tail_s)
        burst_done.set()

    async def poll() -> None:
        while not burst_done.is_set():
            health = (await client.get("/health")).json()
            phase.timeline.append({"t": round(time.perf_counter() - started, 3), "compiles_in_flight": health["compiles_in_flight"],
                                   "requests_in_flight": health["requests_in_flight"]})
            await asyncio.sleep(0.1)

    probes = {}
    if args.probe_interval_ms > 0:
        url, interval = str(client.base_url), args.probe_interval_ms
        probes["probe"] = start_probe(url, interval, args.probe_priority, own_session=True)
        if args.probe_shared:
            probes["probe_shared"] = start_probe(url, interval, args.probe_priority, own_session=False)
    await asyncio.gather(burst(), poll(), *(background(w) for w in range(args.background)))
    wall = time.perf_counter() - started
    stats = (await client.get("/stats", params={"samples": "true"})).json()
    summary = summarise_phase(phase, stats, wall, time.time() - wall)
    for name, probe in probes.items():
        summary[name] = percentiles(stop_probe(probe))
    return summary


# ----- the probe: a cheap endpoint, timed from a process of its own -------------------------------


def start_probe(url: str, interval_ms: float, priority: str = "normal", own_session: bool = True) -> subprocess.Popen:
    """The probe process; `own_session`: in a session (so a scheduler autogroup) of its own."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--probe", url, "--probe-interval-ms", str(interval_ms),
                             "--probe-priority", priority], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            start_new_session=own_session)


def stop_probe(probe: subprocess.Popen) -> list[float]:
    out, _ = probe.communicate(b"", timeout=60)  # EOF on its stdin ends it
    return json.loads(out or b"[]")


def run_probe(url: str, interval_ms: float, priority: str = "normal") -> None:
    """`GET /v1/models` every `interval_ms` until stdin closes; prints the latencies (s) as JSON."""
    if priority == "rr":
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        except PermissionError:
            print("probe: SCHED_RR refused; running in the normal class", file=sys.stderr)
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    latencies: list[float] = []
    while not select.select([sys.stdin], [], [], interval_ms / 1000)[0]:
        started = time.perf_counter()
        connection.request("GET", "/v1/models")
        response = connection.getresponse()
        response.read()
        latencies.append(time.perf_counter() - started)
    print(json.dumps(latencies))


def percentiles(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"count": 0}

    def rank(q):
        return values[min(len(values) - 1, max(0, int(q * len(values) + 0.999999) - 1))]

    return {"count": len(values), "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": values[-1],
            "mean": sum(values) / len(values)}


def summarise_phase(phase: Phase, stats: dict, wall: float, started_unix: float) -> dict:
    kinds = sorted({s.kind for s in phase.samples})
    result = {"wall_seconds": wall, "started_unix": started_unix, "requests": len(phase.samples),
              "errors": [s.error for s in phase.samples if s.error][:10],
              "error_count": sum(1 for s in phase.samples if s.error),
              "finish_reasons": {}, "ttft": {}, "tpot": {}, "timeline": phase.timeline,
              "peak_compiles_in_flight": max((p["compiles_in_flight"] for p in phase.timeline), default=0)}
    for sample in phase.samples:
        key = f"{sample.kind}:{sample.finish_reason or 'none'}"
        result["finish_reasons"][key] = result["finish_reasons"].get(key, 0) + 1
    result["valid_outputs"] = valid_outputs(phase.samples)
    result["samples"] = {}
    for kind in kinds:
        result["ttft"][kind] = percentiles([s.ttft for s in phase.samples if s.kind == kind])
        result["tpot"][kind] = percentiles([s.tpot for s in phase.samples if s.kind == kind])
        for metric in ("ttft", "tpot"):  # raw, for pooling runs side by side (`comparison`)
            result["samples"][f"{kind}:{metric}"] = [getattr(s, metric) for s in phase.samples
                                                      if s.kind == kind and getattr(s, metric) is not None]
    for name in ("loop_lag", "engine_step", "token_gap", "ipc_transit", "heartbeat_interval"):
        result[name] = stats.get(name)
    return result


def valid_outputs(samples: list[Sample]) -> dict:
    """Per request kind, the guided outputs that end ``stop`` and validate (jsonschema, format checking)."""
    import jsonschema

    out: dict[str, int] = {}
    for sample in samples:
        if sample.schema is None or sample.finish_reason != "stop":
            continue
        try:
            value = json.loads(sample.text)
        except ValueError:
            continue
        checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
        if jsonschema.Draft202012Validator(sample.schema, format_checker=checker).is_valid(value):
            out[sample.kind] = out.get(sample.kind, 0) + 1
    return out


# ----- the run ------------------------------------------------------------------------------------


async def settle(client: httpx.AsyncClient, timeout_s: float) -> None:
    """Wait until nothing is in flight: `auto` keeps compiling a schema with xgrammar after
    llguidance served it, and a phase must not inherit the previous one's compiles."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        health = (await client.get("/health")).json()
        if health["compiles_in_flight"] == 0 and health["requests_in_flight"] == 0:
            return
        await asyncio.sleep(0.25)
    print("  warning: compiles still in flight when the phase starts", flush=True)


def check_loopback(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname
    if host not in LOOPBACK:
        raise SystemExit(f"refusing to load {host!r}: this tool talks to loopback addresses only")


def start_server(args, directory: str | None = None, pythonpath: str | None = None) -> tuple[subprocess.Popen, str]:
    """`fd-guided serve` from `directory` (a checkout; this tool's own by default), in a session of its own."""
    url = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, "-m", "fd_guided.harness.cli", "serve", "--port", str(args.port), "--preset", args.preset,
               "--max-num-seqs", str(args.max_num_seqs), "--switch-interval-ms", str(args.switch_interval_ms),
               "--log-level", "warning", "--loop-priority", args.loop_priority]
    print("+ " + (f"(cd {directory}) " if directory else "") + " ".join(command), flush=True)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    for path in (directory, pythonpath):
        if path:
            env["PYTHONPATH"] = os.path.abspath(path) + os.pathsep + env.get("PYTHONPATH", "")
    process = subprocess.Popen(command, env=env, cwd=directory, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise SystemExit("the server did not come up within 180 s")


async def run(args, url: str) -> dict:
    # Idle connections are dropped before uvicorn's 5 s keep-alive timeout: a request sent on one the
    # server is closing at that moment fails with a ReadError that is the client's race, not the server's.
    limits = httpx.Limits(max_connections=args.background + args.cold + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(args.phase_timeout_s + 30), limits=limits) as client:
        args.model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        args.guided_extra, fit_budget = await fit_budget_field(client, args)
        budget = Budget(args.max_requests)
        print(f"warm-up: compiling {args.cached} cached schemas", flush=True)
        for i in range(args.cached):
            await stream_one(client, args.model, "warmup", 4, {"response_format": response_format(complex_schema(1_000_000 + i), "c")})
        cold_offset = int(time.time()) % 100_000 * 1000  # fresh schemas on every run against a long-lived server
        report = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "phases": {}}
        # What the server's event-loop thread runs with (its --loop-priority, as the kernel applied it).
        report["loop_scheduling"] = (await client.get("/health")).json().get("loop_scheduling")
        report["fit_budget"] = fit_budget
        print(f"server event loop: {report['loop_scheduling']}", flush=True)
        for name, guided in (("unguided", False), ("guided", True)):
            if args.phases not in ("both", name):
                continue
            await settle(client, args.phase_timeout_s)
            print(f"phase {name}: {args.background} background clients, burst of {args.cold} after {args.burst_delay_s} s", flush=True)
            report["phases"][name] = await run_phase(args, client, name, guided, budget, cold_offset)
            print(format_phase(name, report["phases"][name]), flush=True)
        metrics = (await client.get("/metrics")).text
        report["server_metrics_excerpt"] = [line for line in metrics.splitlines() if line.startswith(
            ("fd_guided_cache_misses_total", "fd_guided_cache_hits_total", "fd_guided_compile_seconds_count",
             "fd_guided_compile_seconds_sum", "fd_guided_requests_by_backend_total", "fd_guided_budget_"))]
        return report


async def fit_budget_field(client: httpx.AsyncClient, args) -> tuple[dict, str]:
    """What guided requests add for `--fit-budget`, and what the server does. ``off`` sends
    ``guided_fit_budget: false`` (no budget steering: its search at a request's start can take
    seconds per complex schema at 64 tokens, docs/benchmarks.md), unless the server refuses the
    field: one from before budget steering (issue #24) does not know it, and does not steer."""
    if args.fit_budget == "default":
        return {}, "the server's default"
    body = {"model": args.model, "prompt": "x", "max_tokens": 1, "guided_fit_budget": False,
            "response_format": response_format({"type": "object"}, "probe")}
    status = (await client.post("/v1/completions", json=body)).status_code
    if status == 200:
        return {"guided_fit_budget": False}, "off (guided_fit_budget: false)"
    return {}, f"off (the server refused guided_fit_budget with {status}: it predates budget steering)"


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def format_phase(name: str, phase: dict) -> str:
    lines = [f"  {name}: {phase['requests']} requests in {phase['wall_seconds']:.1f} s, {phase['error_count']} errors, "
             f"peak compiles in flight {phase['peak_compiles_in_flight']}, finish {phase['finish_reasons']}, "
             f"stop and valid {phase.get('valid_outputs')}"]
    for kind in phase["ttft"]:
        ttft, tpot = phase["ttft"][kind], phase["tpot"][kind]
        lines.append(f"    {kind:<10} TTFT ms p50 {_ms(ttft.get('p50'))} p99 {_ms(ttft.get('p99'))} max {_ms(ttft.get('max'))}"
                     f" | TPOT ms p50 {_ms(tpot.get('p50'))} p99 {_ms(tpot.get('p99'))} max {_ms(tpot.get('max'))}")
    for key, label in (("loop_lag", "event-loop lag"), ("engine_step", "engine step"), ("token_gap", "inter-token gap"),
                       ("ipc_transit", "IPC transit"), ("heartbeat_interval", "heartbeat"), ("probe", "GET /v1/models"),
                       ("probe_shared", "GET (shared)")):
        s = phase.get(key)
        if not s:
            continue
        lines.append(f"    {label:<16} ms p50 {_ms(s.get('p50'))} p99 {_ms(s.get('p99'))} max {_ms(s.get('max'))} (n={s['count']})")
    return "\n".join(lines)


def run_once(args, directory: str | None = None, options: dict | None = None) -> dict:
    """One run: against --url, or a server started from `directory` (with `options`, see the
    docstring) and stopped after."""
    options = options or {}
    process, url = start_server(args, directory, options.get("pythonpath")) if args.start_server else (None, args.url)
    if "engine-nice" in options:
        engine_pid = httpx.get(url + "/health", timeout=10).json()["engine_pid"]
        with open(f"/proc/{engine_pid}/autogroup", "w") as autogroup:  # its session's share of the CPU
            autogroup.write(options["engine-nice"])
    load_before = os.getloadavg()
    try:
        report = asyncio.run(run(args, url))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    report["load_average"] = {"before": load_before, "after": os.getloadavg()}
    return report


def compare_servers(args, servers: list[tuple[str, str]]) -> dict:
    """Each server in turn, `args.rounds` times; their runs and `comparison` (see the docstring)."""
    runs = []
    for round_index in range(args.rounds):
        for label, spec in servers:
            directory, *pairs = spec.split(";")
            options = dict(pair.split("=", 1) for pair in pairs)
            print(f"round {round_index + 1}/{args.rounds}: {label} ({spec})", flush=True)
            runs.append({"server": label, "round": round_index, "directory": directory, "options": options,
                         **run_once(args, directory, options)})
    return {"config": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs,
            "comparison": comparison(runs, [label for label, _ in servers])}


def format_comparison(report: dict) -> str:
    lines = []
    for key, entry in report["comparison"].items():
        ratios = {k: v for k, v in entry.items() if "/" in k and "per round" not in k}
        for name, ratio in ratios.items():
            rounds = entry.get(f"{name} per round (p50)", [])
            lines.append(f"  {key:<28} {name}: p50 {ratio['p50']:.2f} p99 {ratio['p99']:.2f} mean {ratio['mean']:.2f}"
                         f" | per-round p50 ratios {[round(r, 2) if r else None for r in rounds]}")
    return "\n".join(lines)


def comparison(runs: list[dict], labels: list[str]) -> dict:
    """Per phase and kind: each server's TTFT/TPOT over all its rounds' samples, the first server's
    ratio to each other, and per round the ratio of the servers' medians."""
    result: dict = {}
    for phase in sorted({name for run in runs for name in run["phases"]}):
        for kind in ("background", "burst"):
            for metric in ("ttft", "tpot"):
                pooled = {label: [v for run in runs if run["server"] == label and phase in run["phases"]
                                  for v in run["phases"][phase]["samples"].get(f"{kind}:{metric}", [])]
                          for label in labels}
                stats = {label: percentiles(values) for label, values in pooled.items()}
                entry = {"servers": stats}
                first = stats[labels[0]]
                for other in labels[1:]:
                    if first.get("count") and stats[other].get("count"):
                        entry[f"{labels[0]}/{other}"] = {q: first[q] / stats[other][q] for q in ("p50", "p90", "p99", "mean")}
                        entry[f"{labels[0]}/{other} per round (p50)"] = [
                            _median_ratio(runs, phase, kind, metric, labels[0], other, r)
                            for r in sorted({run["round"] for run in runs})]
                result[f"{phase}:{kind}:{metric}"] = entry
    return result


def _median_ratio(runs, phase, kind, metric, first, other, round_index) -> float | None:
    medians = []
    for label in (first, other):
        run = next((r for r in runs if r["server"] == label and r["round"] == round_index and phase in r["phases"]), None)
        summary = run["phases"][phase][metric].get(kind, {}) if run else {}
        medians.append(summary.get("p50"))
    return medians[0] / medians[1] if None not in medians and medians[1] else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running server (loopback only)")
    parser.add_argument("--start-server", action="store_true", help="start `fd-guided serve` for the run, then stop it")
    parser.add_argument("--port", type=int, default=8123, help="port for --start-server")
    parser.add_argument("--preset", default="small", help="model preset for --start-server")
    parser.add_argument("--max-num-seqs", type=int, default=96, help="engine slots for --start-server (room for the burst)")
    parser.add_argument("--switch-interval-ms", type=float, default=1.0, help="GIL switch interval for --start-server")
    parser.add_argument("--loop-priority", default="auto", choices=("auto", "realtime", "normal"),
                        help="the event-loop thread's CPU class for --start-server (`fd-guided serve --loop-priority`)")
    parser.add_argument("--model", help="model id (default: the server's)")
    parser.add_argument("--background", type=int, default=8, help="streaming clients sending back to back")
    parser.add_argument("--cold", type=int, default=64, help="requests in the burst (distinct cold schemas when guided)")
    parser.add_argument("--cached", type=int, default=4, help="schemas compiled in warm-up, used by background clients")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--burst-delay-s", type=float, default=2.0)
    parser.add_argument("--tail-s", type=float, default=2.0, help="background load kept after the burst finishes")
    parser.add_argument("--phase-timeout-s", type=float, default=240.0)
    parser.add_argument("--max-requests", type=int, default=2000, help="requests in all, both phases")
    parser.add_argument("--phases", default="both", choices=("both", "unguided", "guided"))
    parser.add_argument("--probe-interval-ms", type=float, default=20.0, help="GET /v1/models this often (0: no probe)")
    parser.add_argument("--probe-priority", default="normal", choices=("normal", "rr"), help="the probe's CPU class")
    parser.add_argument("--probe-shared", action="store_true", help="a second probe in this tool's own session")
    parser.add_argument("--fit-budget", default="default", choices=("default", "off"),
                        help="budget steering of guided requests (off: guided_fit_budget false, where known)")
    parser.add_argument("--server", action="append", metavar="LABEL=DIR",
                        help="with --start-server: a server from this checkout; repeat to compare, taking turns")
    parser.add_argument("--rounds", type=int, default=1, help="turns of every --server")
    parser.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)  # the probe process itself
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.probe:
        check_loopback(args.probe)
        run_probe(args.probe, args.probe_interval_ms, args.probe_priority)
        return 0
    if not args.start_server:
        check_loopback(args.url)
    if args.server:
        if not args.start_server:
            raise SystemExit("--server needs --start-server")
        report = compare_servers(args, [tuple(spec.split("=", 1)) for spec in args.server])
        print(format_comparison(report), flush=True)
    else:
        report = run_once(args)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
