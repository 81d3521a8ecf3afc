"""How a grammar compiled in a worker reaches the serving process: its serialized bytes, or a
second compile here when sending them would cost more than compiling again.

xgrammar 0.2.9 serializes a compiled grammar with one copy of the grammar's whole character FSM
per rule (the rules share one FSM in memory; upstream xgrammar PR #740 proposes writing it once),
so its JSON grows with rules x FSM size, not with the grammar's `memory_size_bytes`. Measured on
30 SchemaStore schemas (deepseek vocabulary, 2 cores): a schema compiled in 0.13 s wrote 39 MB in
2.3 s and took 1.2 s more to load; one of 41 MB in memory wrote 156 MB in 9.5 s, growing its worker
by ~1.7 GiB (its compile had grown it by ~0.1 GiB) and the serving process by ~1.5 GiB to load.
Small grammars pay too: a regex compiled in 3 ms took 12 ms to write, a JSON object schema
compiled in 5 ms 26 ms (loading then holds the GIL in stretches of up to 11-30 ms).
The compile is deterministic: the same spec, config and tokenizer give the same grammar, and the
worker has just shown it finishes within its time and memory budgets. So where the estimated
bytes are many, or sending them costs more than twice the compile did, the worker sends
`CompileHere` instead and the serving process compiles the spec again on a loader thread (a native
compile releases the GIL: ticks of a 1 ms timer beside it were late by at most 9 ms), unless the
compile grew the worker by more than loading the bytes would grow the serving process.
"""

from __future__ import annotations

from dataclasses import dataclass

# Serializing in the worker plus loading here, per serialized byte (xgrammar 0.2.9: 35-80 ns a
# byte to write, ~25 to read, over the 30 schemas above).
TRANSFER_S_PER_BYTE = 75e-9
# Loading bytes here grows this process by about this many times their size at its peak
# (xgrammar 0.2.9: 156 MB grew it by ~1.5 GiB; writing them grew the worker ~11x).
LOAD_MEMORY_PER_BYTE = 10
# Sending must cost this many times the compile before compiling again here pays (a quick grammar
# is not compiled twice to save a few milliseconds).
COMPILE_AGAIN_FACTOR = 2.0


@dataclass(frozen=True)
class CompileHere:
    """A worker's reply instead of the bytes: compile the spec again in the serving process.

    `estimated_bytes`: the backend's estimate of the serialized size (the serving process reads it
    to decide whether to write the grammar for a shared cache, without estimating again)."""

    estimated_bytes: int


def compile_here(
    estimated_bytes: int | None, compile_s: float, compile_growth_bytes: int, max_bytes: int | None
) -> bool:
    """True when the serving process should compile again rather than receive the bytes: more
    than `max_bytes` estimated (`GuidedConfig.compile_transfer_max_bytes`), or sending them would
    take over `COMPILE_AGAIN_FACTOR` times the compile; but never when the compile grew the
    worker by more than loading the bytes would grow this process. `estimated_bytes` None (the
    backend's bytes are few, as llguidance's grammar text is) or `max_bytes` None always sends."""
    if max_bytes is None or estimated_bytes is None:
        return False
    if compile_growth_bytes > LOAD_MEMORY_PER_BYTE * estimated_bytes:
        return False
    if estimated_bytes > max_bytes:
        return True
    return estimated_bytes * TRANSFER_S_PER_BYTE > COMPILE_AGAIN_FACTOR * compile_s
