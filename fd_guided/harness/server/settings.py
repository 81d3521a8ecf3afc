"""`ServerSettings`: what `fd-guided serve` is started with; both processes read it (no heavy imports)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    """What `fd-guided serve` is started with (its flags, one to one)."""

    preset: str = "small"
    tokenizer: str = "deepseek"
    backend: str = "auto"
    seed: int = 0
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    chat_template: str = "hermes"
    served_model_name: str | None = None
    default_max_tokens: int = 256
    admission_threads: int = 1
    lag_interval_s: float = 0.01
    # sys.setswitchinterval for both processes (`serve` and the engine process set it). Python's
    # default, 5 ms, is how long a thread that wants the GIL waits before the holder is asked to drop
    # it. Measured here (2 cores, 3 threads spinning in Python beside an asyncio 10 ms timer): 5 ms ->
    # lag p50 14 ms, p99 106 ms; 1 ms -> p50 2.5 ms, p99 24 ms; 0.5 ms -> p50 4.1 ms, p99 22 ms. In the
    # engine process it keeps the step thread's wait behind admission short in the same way.
    switch_interval_s: float = 0.001
    # The event-loop thread's CPU class (`loop_priority.MODES`): auto tries SCHED_RR priority 1 for
    # that thread alone and falls back to the normal class; see loop_priority for why and the risks.
    # `fd-guided serve` defaults to auto; an app embedded in another program leaves its loop alone.
    loop_priority: str = "normal"
    # Bounded inputs (`bounds.py`): a request body past this is refused with 413 before it is read
    # in full. 4 MiB holds the largest constraint admission takes (limits.max_constraint_bytes,
    # 1 MiB) beside a prompt that can still fit the context (4,096 tokens of at most 128 bytes).
    max_body_bytes: int = 4 << 20
    # A dead engine process is started again after this (doubling while it keeps dying young, up to 30 s).
    restart_delay_s: float = 0.5
    # An engine process that says nothing for this long (its heartbeat comes every 100 ms), or whose
    # one step runs this long, counts as hung: killed and restarted (`liveness.py`).
    engine_silence_timeout_s: float = 5.0
    engine_step_timeout_s: float = 60.0

    @property
    def model_name(self) -> str:
        return self.served_model_name or f"fd-guided-{self.preset}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerSettings:
        return cls(**json.loads(text))
