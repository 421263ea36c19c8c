"""The producer-state snapshot and rebuild on a real store (producer_state_service.py):

* the append lock is held for the producers changed since the last snapshot (copies
  counted), nothing is written when none changed (plain appends included), and the file
  holds the whole table;
* a store without a snapshot replays only from the expiry's floor: the segment whose
  first record is the last one older than ``producer_id_expiry_ms`` (replay_floor).
"""

from __future__ import annotations

import json
from pathlib import Path

from services.storage.engine.message_store import MessageStore
from services.storage.engine.producer_state_service import replay_floor
from tests.services.storage.engine.conftest import SEGMENT_BYTES, StoreFactory, fill_segment, msg
from tide.format import (
    PRODUCER_ID,
    PRODUCER_SEQ,
    PRODUCER_STATE_FILE,
    RunWriter,
    decode_producer_state,
    pack_host,
    parse_host,
)

HOST = pack_host(parse_host("127.0.0.1:1"))
# The service's own thread never runs a round during a test: rounds are called here.
QUIET_MS = 3_600_000
EXPIRY_MS = 60_000


def send(store: MessageStore, pid: str, first: int, count: int = 2, queue_id: int = 0) -> None:
    writer = RunWriter(HOST)
    props = f"{PRODUCER_ID}\x01{pid}\x02{PRODUCER_SEQ}\x01{first}-{first + count - 1}\x02"
    for _ in range(count):
        writer.add("T", b"T", queue_id, b"body", props.encode(), 0, 0, 1)
    store.put_run_idempotent([writer.getvalue()], pid, 0, first)


def state_path(store: MessageStore) -> Path:
    return store.config.config_dir / PRODUCER_STATE_FILE


def file_producers(store: MessageStore) -> dict[str, list[tuple[int, int]]]:
    snapshot = decode_producer_state(json.loads(state_path(store).read_text()))
    return {
        pid: [(b.first_seq, b.last_seq) for b in entry.queues[("T", 0)]]
        for pid, entry in snapshot.producers.items()
    }


def test_a_snapshot_copies_only_what_changed(make_store: StoreFactory) -> None:
    store = make_store(producer_state_snapshot_interval_ms=QUIET_MS)
    service = store.producer_state_service
    for index in range(50):
        send(store, f"p{index}", 0)
    service.run_once()
    assert (service.snapshots_written, service.entries_copied) == (1, 50)
    send(store, "p7", 2)
    send(store, "new", 0)
    service.run_once()
    assert (service.snapshots_written, service.entries_copied) == (2, 52)  # 2 more copied
    files = file_producers(store)
    assert len(files) == 51 and files["p7"] == [(0, 1), (2, 3)] and files["new"] == [(0, 1)]
    # Nothing changed (a plain append is no producer's): nothing copied, nothing written.
    written = state_path(store).read_bytes()
    store.put([msg()])
    service.run_once()
    assert (service.snapshots_written, service.entries_copied) == (2, 52)
    assert state_path(store).read_bytes() == written


def test_an_expired_producer_leaves_the_snapshot(make_store: StoreFactory) -> None:
    now = [1_000_000]
    store = make_store(
        clock_ms=lambda: now[0],
        producer_id_expiry_ms=EXPIRY_MS,
        producer_state_snapshot_interval_ms=QUIET_MS,
    )
    service = store.producer_state_service
    send(store, "old", 0)
    service.run_once()
    now[0] += EXPIRY_MS // 2
    send(store, "young", 0)
    now[0] += EXPIRY_MS // 2 + 1
    service.run_once()  # "old" expires; "young" is the one changed
    assert service.entries_copied == 2
    assert list(file_producers(store)) == ["young"]


def test_the_snapshot_after_a_reopen_holds_the_whole_table(
    make_store: StoreFactory, store_dir: Path
) -> None:
    store = make_store(producer_state_snapshot_interval_ms=QUIET_MS)
    for index in range(3):
        send(store, f"p{index}", 0)
    store.close()  # the final snapshot
    reopened = make_store(producer_state_snapshot_interval_ms=QUIET_MS)
    send(reopened, "p1", 2)
    reopened.producer_state_service.run_once()
    assert reopened.producer_state_service.entries_copied == 3  # everything once after load
    assert file_producers(reopened) == {"p0": [(0, 1)], "p1": [(0, 1), (2, 3)], "p2": [(0, 1)]}


def test_without_a_snapshot_only_the_expiry_window_is_replayed(
    make_store: StoreFactory, store_dir: Path
) -> None:
    now = [10_000_000]
    store = make_store(
        clock_ms=lambda: now[0],
        producer_id_expiry_ms=EXPIRY_MS,
        producer_state_snapshot_interval_ms=QUIET_MS,
    )
    started_ms = now[0]
    send(store, "old", 0)
    fill_segment(store, leave_bytes=50)  # too little left: the next record starts segment 1
    now[0] += 1
    store.put([msg()])  # segment 1's first record
    now[0] += EXPIRY_MS // 2
    send(store, "mid", 0, queue_id=1)
    fill_segment(store, leave_bytes=50)
    now[0] = started_ms + EXPIRY_MS + 2  # "old" is past the expiry, "mid" is not
    send(store, "new", 0, queue_id=2)  # segment 2's first record
    send(store, "mid", 2, queue_id=1)
    assert store.status().max_offset > 2 * SEGMENT_BYTES
    store.close()
    state_path(store).unlink()
    # Segment 1 starts before the cutoff, segment 2 after it: every record of segment 0
    # is older than segment 1's first, so older than the cutoff. Replay from segment 1.
    cutoff_ms = now[0] - EXPIRY_MS
    assert replay_floor(store.config.commitlog_dir, started_ms, 3 * SEGMENT_BYTES) == 0
    assert replay_floor(store.config.commitlog_dir, cutoff_ms, 3 * SEGMENT_BYTES) == SEGMENT_BYTES
    reopened = make_store(
        clock_ms=lambda: now[0],
        producer_id_expiry_ms=EXPIRY_MS,
        producer_state_snapshot_interval_ms=QUIET_MS,
    )
    assert reopened.producer_replay_from == SEGMENT_BYTES
    table = reopened.producers.copy(0).producers
    assert sorted(table) == ["mid", "new"]
    assert [(b.first_seq, b.last_seq) for b in table["mid"].queues[("T", 1)]] == [(0, 1), (2, 3)]
    # A retry of a replayed batch is answered from the rebuilt window.
    assert reopened.producers.check("mid", ("T", 1), 0, 2, 3) is not None


def test_a_snapshot_newer_than_the_floor_is_replayed_from(make_store: StoreFactory) -> None:
    store = make_store(producer_state_snapshot_interval_ms=QUIET_MS)
    send(store, "p", 0)
    store.producer_state_service.run_once()
    offset = store.status().max_offset
    store.put([msg()])
    store.close()
    reopened = make_store(producer_state_snapshot_interval_ms=QUIET_MS)
    assert reopened.producer_replay_from >= offset  # the final snapshot's, not 0
    assert reopened.producers.check("p", ("T", 0), 0, 0, 1) is not None
