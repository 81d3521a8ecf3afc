"""How long trivial requests wait behind cold heavy schemas on FastDeploy's request-insertion thread.

    FD_GUIDED_FASTDEPLOY_SRC=... .venv-fastdeploy/bin/python tools/admission_wait.py SCHEMA_DIR
        [--heavy 20] [--backend auto] [--json out.json]

FastDeploy's engine admits requests on one thread (``EngineService._insert_zmq_task_to_scheduler``
calls the guided checker for each request, serially). This drives that real code (the snapshot,
extracted and with its compiled ops stood in, as the FastDeploy tests do; ``FD_PLUGINS=fd_guided``)
with a burst: the ``--heavy`` largest schemas under SCHEMA_DIR, each followed by a trivial guided
request, all arriving at once. A trivial request waits for everything ahead of it; its wait is
the time from the burst's start to the end of its own admission. Run three times: every verdict
inline (``FD_GUIDED_ADMISSION_BUDGET_MS=inline``: the checker before issue #22's bounded
admission), the default (admission bounded by `GuidedConfig.admission_budget_s`; what overruns is
decided in the compile worker), and the default with ``FD_GUIDED_DEFER_SCHEMA_CHECKS=1`` (the
backend's check never runs on the thread).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integrations" / "fastdeploy"), str(REPO)]


class _TmpFactory:
    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"fd-guided-{name}-"))


MODES = {  # name -> (FD_GUIDED_ADMISSION_BUDGET_MS, FD_GUIDED_DEFER_SCHEMA_CHECKS)
    "inline": ("inline", "0"),
    "bounded": ("", "0"),
    "bounded_defer": ("", "1"),
}


def _engine(cfg):
    """`admit(data)`: FastDeploy's ``EngineService._insert_zmq_task_to_scheduler`` for one request,
    with one checker built up front, as the engine builds it at start-up (the tests' helper builds
    one per call: ~30-400 ms of plugin patching that is no admission's)."""
    from fastdeploy.engine.common_engine import EngineService
    from fastdeploy.utils import llm_logger
    from test_fastdeploy_startup import Recorder, RecvOnce, engine_checker

    checker = engine_checker(cfg)

    def admit(data: dict) -> None:
        engine = EngineService.__new__(EngineService)
        engine.cfg, engine.running, engine.llm_logger = cfg, True, llm_logger
        engine.guided_decoding_checker = checker
        engine.recv_request_server = RecvOnce(engine, data)
        engine.scheduler, engine.send_response_server = Recorder(), Recorder()
        engine._insert_zmq_task_to_scheduler()

    return admit


def _burst(cfg, requests: list[dict], mode: str) -> list[tuple[str, float, float]]:
    """(kind, seconds its own admission took, seconds since the burst began when it was done)."""
    from fd_guided.admission import cache

    budget, defer = MODES[mode]
    os.environ["FD_GUIDED_ADMISSION_BUDGET_MS"] = budget  # read whenever a GuidedConfig is made
    os.environ["FD_GUIDED_DEFER_SCHEMA_CHECKS"] = defer
    admit = _engine(cfg)  # its GuidedConfig reads the environment set above
    cache.PARSED.clear()
    cache.CHECKED.clear()
    rows, started = [], time.perf_counter()
    for index, (kind, fields) in enumerate(requests):
        begun = time.perf_counter()
        admit({"request_id": f"r{index}", "prompt_token_ids": [1, 2, 3], **fields})
        done = time.perf_counter()
        rows.append((kind, done - begun, done - started))
    return rows


def _summary(rows) -> dict:
    trivial = sorted(done for kind, _, done in rows if kind == "trivial")
    own = sorted(seconds for _, seconds, _ in rows)
    pick = lambda values, q: values[min(len(values) - 1, int(q * len(values)))] * 1e3
    return {
        "trivial_wait_p50_ms": pick(trivial, 0.5),
        "trivial_wait_max_ms": trivial[-1] * 1e3,
        "per_request_p50_ms": pick(own, 0.5),
        "per_request_p99_ms": pick(own, 0.99),
        "per_request_max_ms": own[-1] * 1e3,
        "burst_ms": rows[-1][2] * 1e3,
        "slowest_ms": sorted((round(seconds * 1e3, 1) for _, seconds, _ in rows), reverse=True)[:4],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--heavy", type=int, default=20)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import fastdeploy_engine as fe

    model_dir = fe.enabled_host(_TmpFactory())
    cfg = fe.engine_config(model_dir, guided_decoding_backend=args.backend)
    files = sorted(Path(args.folder).rglob("*.json"), key=lambda p: p.stat().st_size)
    files = [p for p in files if p.stat().st_size < 1 << 20][-args.heavy :]
    report = {}
    for mode in MODES:
        requests = []
        for index, path in enumerate(files):
            requests.append(("heavy", {"guided_json": path.read_text(encoding="utf-8", errors="replace")}))
            requests.append(
                ("trivial", {"guided_json": {"type": "object", "properties": {f"k{index}_{mode}": {"type": "string"}}}})
            )
        _burst(cfg, [("trivial", {"guided_regex": "[a-z]+"})], mode)  # first-use costs
        report[mode] = _summary(_burst(cfg, requests, mode))
        rounded = {k: v if isinstance(v, list) else round(v, 1) for k, v in report[mode].items()}
        print(mode, json.dumps(rounded), flush=True)
    report["setup"] = {"heavy": [p.name for p in files], "backend": args.backend}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
