"""Guided decoding under tensor parallelism: every rank must mask the same tokens every step.

Two modes (docs/tensor_parallel.md says which to use when):

* **per-rank** (FastDeploy's layout): every rank owns a `GuidedDecodingManager`, with its own
  matchers and bitmask, and accepts the sampled tokens the TP leader broadcasts. Identical
  logits and tokens give identical masks with no extra communication; the CPU cost of fills
  is paid on every rank. Ranks that live in one process share one `CompileService` (compiled
  grammars are immutable), see `per_rank_managers`; ranks in separate processes each build
  their own backend. Nothing mutable is shared, so a matcher is never touched by two ranks.
* **rank-0 broadcast**: only rank 0 owns a manager; it fills, masks its own logits and sends
  its bitmask rows through a `BitmaskTransport`; the other ranks apply the received rows. One
  rank pays the CPU, every step pays one collective of ``rows x ceil(vocab / 32)`` int32 words.

`BitmaskTransport` has an in-process implementation for rank threads (`ThreadBroadcast`), one
for rank processes (`PipeBroadcast`, multiprocessing pipes), and `PaddleBroadcast`, the
``paddle.distributed.broadcast`` a real stack uses on its TP group. Any numpy payload goes
through them, so the same transport also carries the sampled token ids.
"""

from __future__ import annotations

import abc
import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_guided.compile import CompileService
from fd_guided.interface import GuidedBackend
from fd_guided.kernels import apply_token_bitmask_inplace
from fd_guided.manager import GuidedDecodingManager, GuidedFinish
from fd_guided.metrics import GuidedMetrics
from fd_guided.spec import GrammarSpec

ALL_ALLOWED = -1  # a bitmask word with every bit set


# ----- per-rank mode ---------------------------------------------------------------------------


def per_rank_managers(
    backend: GuidedBackend,
    world_size: int,
    max_num_seqs: int,
    *,
    think_end_id: int | None = None,
    metrics: GuidedMetrics | None = None,
    compile_service: CompileService | None = None,
) -> list[GuidedDecodingManager]:
    """One manager per rank of a process, all sharing one compile service (and its cache).

    Each manager has its own matchers and bitmask; only immutable compiled grammars are shared.
    The caller closes the managers, then the compile service (``managers[0].compiler``).
    """
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    service = compile_service or CompileService(backend, metrics=metrics)
    return [
        GuidedDecodingManager(
            backend, max_num_seqs, metrics=service.metrics, think_end_id=think_end_id, compile_service=service
        )
        for _ in range(world_size)
    ]


def mask_digest(logits) -> str:
    """A short digest of which logits are masked (-inf), row by row: compare it across ranks.

    Works on any 2-D host array or tensor with a ``numpy()`` view (Paddle, torch CPU, numpy).
    """
    host = logits.numpy() if hasattr(logits, "numpy") else np.asarray(logits)
    return hashlib.blake2b(np.packbits(np.isneginf(host), axis=-1).tobytes(), digest_size=16).hexdigest()


# ----- transports --------------------------------------------------------------------------------


class BitmaskTransport(abc.ABC):
    """Moves one numpy array per call from rank 0 to every rank of a group, in call order.

    Every rank calls `broadcast` once per message, in the same order: rank 0 with the payload,
    the others with None. Each call returns rank 0's payload (the others must not modify it).
    """

    rank: int
    world_size: int

    @abc.abstractmethod
    def broadcast(self, payload: np.ndarray | None) -> np.ndarray:
        """Send (rank 0) or receive (other ranks) one array."""

    def close(self) -> None:  # noqa: B027 (optional: most transports hold nothing)
        """Release the transport's resources. Idempotent."""


class ThreadBroadcast:
    """An in-process broadcast group for ranks that are threads of one process.

    ``group.endpoint(rank)`` gives each rank thread its `BitmaskTransport`. Rank 0 waits until
    every other rank has taken the previous message before publishing the next one, so a slow
    rank never misses a step. `timeout_s` turns a dead rank into a TimeoutError, not a hang.
    """

    def __init__(self, world_size: int, timeout_s: float = 60.0):
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._condition = threading.Condition()
        self._sequence = 0
        self._payload: np.ndarray | None = None
        self._unread = 0

    def endpoint(self, rank: int) -> BitmaskTransport:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return _ThreadEndpoint(self, rank)

    def _publish(self, payload: np.ndarray) -> np.ndarray:
        with self._condition:
            self._wait(lambda: self._unread == 0, "the other ranks to take the previous message")
            self._payload = np.array(payload, copy=True)  # the sender may reuse its buffer
            self._sequence += 1
            self._unread = self.world_size - 1
            self._condition.notify_all()
            return self._payload

    def _receive(self, after: int) -> np.ndarray:
        with self._condition:
            self._wait(lambda: self._sequence > after, "rank 0's next message")
            payload = self._payload
            self._unread -= 1
            self._condition.notify_all()
            return payload

    def _wait(self, predicate, what: str) -> None:
        if not self._condition.wait_for(predicate, timeout=self.timeout_s):
            raise TimeoutError(f"waited {self.timeout_s} s for {what}")


class _ThreadEndpoint(BitmaskTransport):
    def __init__(self, group: ThreadBroadcast, rank: int):
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self._received = 0

    def broadcast(self, payload: np.ndarray | None) -> np.ndarray:
        if self.rank == 0:
            return self.group._publish(payload)
        message = self.group._receive(self._received)
        self._received += 1
        return message


class PipeBroadcast(BitmaskTransport):
    """A broadcast group over multiprocessing pipes, for ranks that are separate processes.

    ``PipeBroadcast.group(world_size)`` returns one endpoint per rank; pass endpoint r to the
    process of rank r (endpoints pickle into ``spawn`` children). Rank 0 writes one pipe per
    other rank; pipes are FIFO, so messages arrive in call order.
    """

    def __init__(self, rank: int, world_size: int, connections: list):
        self.rank = rank
        self.world_size = world_size
        self._connections = connections  # rank 0: one sender per other rank; others: one receiver

    @classmethod
    def group(cls, world_size: int, context=None) -> list[PipeBroadcast]:
        import multiprocessing

        context = context or multiprocessing.get_context("spawn")
        pipes = [context.Pipe(duplex=False) for _ in range(world_size - 1)]  # (receiver, sender)
        return [cls(0, world_size, [sender for _, sender in pipes])] + [
            cls(rank, world_size, [receiver]) for rank, (receiver, _) in enumerate(pipes, start=1)
        ]

    def broadcast(self, payload: np.ndarray | None) -> np.ndarray:
        if self.rank == 0:
            payload = np.ascontiguousarray(payload)
            for connection in self._connections:
                connection.send(payload)
            return payload
        return self._connections[0].recv()

    def close(self) -> None:
        for connection in self._connections:
            connection.close()


class PaddleBroadcast(BitmaskTransport):
    """``paddle.distributed.broadcast`` on a tensor-parallel group (what a serving stack uses).

    Collectives need one shape on every rank: each message is sent as `shape` (for masks
    ``(max_num_seqs, ceil(vocab / 32))`` int32), rank 0's payload zero-padded along axis 0.
    `broadcast_tensor` leaves the message on the device (`place`, Paddle's current place by
    default), in one buffer per rank reused every call: `Rank0BroadcastGuided` applies the
    received mask rows from there, so no rank copies them device -> host -> device. `broadcast`
    (a numpy array, e.g. token ids) reads it back. Not exercised by the test suite (needs a TP
    group), nor run on GPUs yet.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        shape: Sequence[int],
        dtype: str = "int32",
        group=None,
        src: int = 0,
        place=None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.shape = list(shape)
        self.dtype = dtype
        self.group = group
        self.src = src
        self.place = place
        self._buffer = None

    def broadcast_tensor(self, payload: np.ndarray | None):
        """Rank 0 sends `payload` (one host-to-device copy); every rank returns the padded message
        as a Paddle tensor on the device, valid until the next call."""
        import paddle
        import paddle.distributed as dist

        if self.rank == 0:
            padded = np.zeros(self.shape, dtype=self.dtype)  # collectives need one shape on every rank
            padded[: len(payload)] = payload
            tensor = paddle.to_tensor(padded, place=self.place) if self.place is not None else paddle.to_tensor(padded)
        else:
            if self._buffer is None:
                self._buffer = paddle.empty(self.shape, dtype=self.dtype)
                if self.place is not None:
                    self._buffer = self._buffer.to(self.place)
            tensor = self._buffer
        dist.broadcast(tensor, src=self.src, group=self.group)
        return tensor

    def broadcast(self, payload: np.ndarray | None) -> np.ndarray:
        return self.broadcast_tensor(payload).numpy()


# ----- rank-0 broadcast mode -----------------------------------------------------------------


class Rank0BroadcastGuided:
    """The manager's step hooks for one rank in rank-0-fills-and-broadcasts mode.

    Rank 0 holds the only manager (give it as `manager`); other ranks hold none. Every rank
    calls the same hooks in the same order; request bookkeeping is a no-op off rank 0, and
    `accept` returns the finished slots on rank 0 only (the TP leader owns request state).
    Each `apply` is one `transport.broadcast` of the step's bitmask rows; rows rank 0 did not
    mask travel as all-allowed words, so the other ranks mask exactly what rank 0 masked.
    """

    def __init__(
        self, transport: BitmaskTransport, manager: GuidedDecodingManager | None = None, *, kernel_impl: str = "auto"
    ):
        if (transport.rank == 0) != (manager is not None):
            raise ValueError("rank 0 needs a manager and the other ranks must not have one")
        self.transport = transport
        self.manager = manager
        self.kernel_impl = manager.kernel_impl if manager is not None else kernel_impl
        self._rows = 0

    @property
    def is_leader(self) -> bool:
        return self.manager is not None

    def add_request(self, slot: int, spec: GrammarSpec | None, **kwargs: Any) -> None:
        if self.is_leader:
            self.manager.add_request(slot, spec, **kwargs)

    def mark_prefill_done(self, slots: Sequence[int]) -> None:
        if self.is_leader:
            self.manager.mark_prefill_done(slots)

    def is_ready(self, slot: int) -> bool:
        """Rank 0 decides readiness (it alone compiles); the others follow its broadcast masks."""
        return self.manager.is_ready(slot) if self.is_leader else True

    def wait_ready(self, slots: Sequence[int], timeout_s: float | None = None) -> bool:
        return self.manager.wait_ready(slots, timeout_s) if self.is_leader else True

    def release(self, slot: int) -> None:
        if self.is_leader:
            self.manager.release(slot)

    def begin_step(self, rows: Sequence[int | None]) -> None:
        self._rows = len(rows)
        if self.is_leader:
            # Rows left unfilled this step must read "all allowed", not a previous step's mask
            # (no fill is running here: the previous apply joined it).
            _host_view(self.manager.bitmask)[: self._rows] = ALL_ALLOWED
            self.manager.begin_step(rows)

    def apply(self, logits) -> None:
        if self.is_leader:
            self.manager.apply(logits)
            send = getattr(self.transport, "broadcast_tensor", self.transport.broadcast)  # the receivers' call
            send(_host_view(self.manager.bitmask)[: self._rows])
            return
        on_device = getattr(self.transport, "broadcast_tensor", None)
        if on_device is not None:
            # The rows stay on the device: rows rank 0 left unmasked are all-allowed words, which
            # the kernel leaves bit-identical, so every row is applied and nothing is read back.
            apply_token_bitmask_inplace(logits, on_device(None)[: self._rows], impl=self.kernel_impl)
            return
        rows = self.transport.broadcast(None)[: self._rows]
        masked = np.flatnonzero((rows != ALL_ALLOWED).any(axis=1)).tolist()
        if masked:
            apply_token_bitmask_inplace(logits, rows, indices=masked, impl=self.kernel_impl)

    def accept(self, token_ids: Sequence[int]) -> list[GuidedFinish]:
        return self.manager.accept(token_ids) if self.is_leader else []

    def close(self) -> None:
        if self.is_leader:
            self.manager.close()


def _host_view(bitmask) -> np.ndarray:
    return bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)


__all__ = [
    "BitmaskTransport",
    "PaddleBroadcast",
    "PipeBroadcast",
    "Rank0BroadcastGuided",
    "ThreadBroadcast",
    "mask_digest",
    "per_rank_managers",
]
