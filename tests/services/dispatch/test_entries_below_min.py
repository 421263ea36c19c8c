"""GetQueueEntries when retention moves a queue's min past the offset in the middle of
the call: OUT_OF_RANGE with the new min, never "no entries" at an offset below the max
(a pull there was held as NO_NEW_MESSAGE instead of moved on as OFFSET_TOO_SMALL).

The servicer and the consume queue are real; only the interleaving is forced: the
cleanup pass lands between the servicer's range check and its read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.engine.consume_queue import ConsumeQueue, Entry
from services.dispatch.servicer import DispatchServicer, Running
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as pb

ENTRIES_PER_SEGMENT = 10
RECORD_BYTES = 100  # entry n points at commitlog offset n * 100


class CleanedMidCall(ConsumeQueue):
    """A consume queue whose next read first runs a cleanup below ``commitlog_min``."""

    commitlog_min: int | None = None

    def _cleanup_first(self) -> None:
        if self.commitlog_min is not None:
            commitlog_min, self.commitlog_min = self.commitlog_min, None
            assert self.delete_below(commitlog_min) == 1

    def get(self, queue_offset: int, max_count: int) -> list[Entry]:
        self._cleanup_first()
        return super().get(queue_offset, max_count)

    def get_bytes(self, queue_offset: int, max_count: int) -> bytes:
        self._cleanup_first()
        return super().get_bytes(queue_offset, max_count)


@pytest.mark.parametrize("spans", [False, True])
def test_the_min_passing_the_offset_mid_call_is_out_of_range(tmp_path: Path, spans: bool) -> None:
    queue = CleanedMidCall(tmp_path, "T", 0, ENTRIES_PER_SEGMENT)
    queue.load()
    queue.recover()
    for n in range(25):
        assert queue.put(n, n * RECORD_BYTES, RECORD_BYTES, 0)
    consume_queues = SimpleNamespace(find=lambda topic, queue_id: queue)
    running = cast(Running, SimpleNamespace(store=SimpleNamespace(consume_queues=consume_queues)))
    servicer = DispatchServicer(lambda: running, ArrivalHub())
    request = pb.GetQueueEntriesRequest(topic="T", queue_id=0, offset=0, max_count=5, spans=spans)
    queue.commitlog_min = 1050  # the first segment (entries 0..9) goes, the min becomes 11
    try:
        with pytest.raises(ServiceError) as raised:
            asyncio.run(servicer.GetQueueEntries(request, cast(Any, None)))
        assert raised.value.code is grpc.StatusCode.OUT_OF_RANGE
        assert "offset 0 is outside" in raised.value.message
        assert "min_offset 11, max_offset 25" in raised.value.message
    finally:
        servicer._readers.shutdown(wait=True)
        queue.close()
