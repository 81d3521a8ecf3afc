"""`EngineClient`'s delivery of step updates: a chunk per event-loop iteration, in order across steps."""
import asyncio

import pytest

from fd_guided.harness.server.engine_client import EngineClient
from fd_guided.harness.server.ipc import Finished, Update
from fd_guided.harness.server.settings import ServerSettings

pytestmark = pytest.mark.cpu


def test_updates_arrive_in_order_a_chunk_per_iteration_with_other_callbacks_between():
    async def scenario():
        client = EngineClient(ServerSettings(), dispatch_chunk=3)
        queues = {index: asyncio.Queue() for index in range(2)}
        client._queues.update(queues)
        delivered_before_timer: list[int] = []
        step_one = [Update(index % 2, [100 + index]) for index in range(10)]
        step_two = [Update(0, [200]), Update(1, [201], Finished("stop"))]
        running = asyncio.get_running_loop()
        running.call_soon(client._dispatch, step_one)  # as the reader hands a step's Outputs over
        # A callback queued behind it (a timer, a new connection) runs after its first chunk, not after all.
        running.call_soon(lambda: delivered_before_timer.append(sum(q.qsize() for q in queues.values())))
        running.call_soon(client._dispatch, step_two)  # the next step's updates queue behind the first's
        for _ in range(10):
            await asyncio.sleep(0)
        client._context.term()
        received = {index: [queue.get_nowait().new_token_ids[0] for _ in range(queue.qsize())] for index, queue in queues.items()}
        return delivered_before_timer, received, 1 in client._queues

    before_timer, received, still_registered = asyncio.run(scenario())
    assert before_timer == [3]
    assert received == {0: [100, 102, 104, 106, 108, 200], 1: [101, 103, 105, 107, 109, 201]}
    assert not still_registered  # a finished request's queue is forgotten once its last update is delivered
