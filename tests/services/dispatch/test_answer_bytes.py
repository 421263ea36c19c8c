"""A GetQueueEntries answer carrying records is bounded by bytes whatever max_bytes asks
(0 included): real storage and dispatch processes, a tail cache holding more than a
gRPC message takes (64 MiB), a queue of ~64 MiB of records."""

from __future__ import annotations

from pathlib import Path

from services.dispatch.servicer import MAX_RECORDS_ANSWER_BYTES
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, DispatchLauncher
from tests.services.storage.conftest import MAX_BODY_BYTES, StorageLauncher, message
from tide.v1 import dispatch_pb2 as pb

MIB = 1024 * 1024
MESSAGES = 1024  # GetQueueEntries' max_count: one call could ask for all of them
PER_APPEND = 128


def test_records_answer_is_cut_at_the_limit_when_max_bytes_is_0(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path, topic_name: str
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(
        tmp_path / "dispatch", storage.listen, "--tail-cache-bytes", str(128 * MIB)
    )
    body = b"r" * (MAX_BODY_BYTES - 1024)
    for _ in range(MESSAGES // PER_APPEND):
        storage.append([message(topic_name, 0, body) for _ in range(PER_APPEND)])
    dispatch.wait_dispatched(storage.status().max_offset, timeout_s=60.0)
    reply = dispatch.stub.GetQueueEntries(
        pb.GetQueueEntriesRequest(
            topic=topic_name, queue_id=0, offset=0, max_count=MESSAGES, spans=True, records=True
        ),
        timeout=RPC_TIMEOUT_S,
    )
    # Without the bound the answer (~64 MiB of records) would pass gRPC's message limit
    # and the call would fail; with it, the records stop at 32 MiB and next_offset says
    # where to go on.
    assert 0 < len(reply.records) <= MAX_RECORDS_ANSWER_BYTES
    assert len(reply.records) == sum(span.size for span in reply.spans)
    taken = sum(span.count for span in reply.spans)
    assert reply.next_offset == taken < MESSAGES
    # A smaller max_bytes still applies.
    small = dispatch.stub.GetQueueEntries(
        pb.GetQueueEntriesRequest(
            topic=topic_name,
            queue_id=0,
            offset=0,
            max_count=MESSAGES,
            spans=True,
            records=True,
            max_bytes=MIB,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert 0 < len(small.records) <= MIB
