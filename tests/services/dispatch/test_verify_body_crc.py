"""``--verify-body-crc``: dispatch checks body CRCs only when asked, as RocketMQ's
ReputMessageService does not (``checkMessageAndReturnSize(buffer, checkCRC=false, ...)``);
the storage checks them in recovery and ``tide store verify`` offline."""

from __future__ import annotations

from pathlib import Path

from services.dispatch.options import OPTIONS
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.storage.conftest import SEGMENT_BYTES, StorageLauncher, message
from tide.format import segment_name
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

TOPIC = "CrcFlip"
BODY_POS_V4 = 88  # docs/formats.md: the body follows 88 header bytes (IPv4 hosts)
DEADLINE_S = 30.0


def test_verify_body_crc_is_an_option_off_by_default() -> None:
    option = next(o for o in OPTIONS if o.name == "verify_body_crc")
    assert (option.type, option.default) == (bool, False)


def test_a_body_bit_flip_is_dispatched_without_verify_body_crc_and_reported_with_it(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    """A body bit flipped in the first of five commitlog segments (normal recovery checks
    only the last three, so the storage serves it): a dispatch with the defaults
    dispatches every record, the damaged one included; one with ``--verify-body-crc``
    dispatches the records before it and reports the CRC mismatch."""
    storages, dispatches = launchers
    store = tmp_path / "store"
    storage = storages.start(store)
    sent: list[pb.Message] = []
    results: list[pb.AppendResult] = []
    while not results or results[-1].physical_offset < 4 * SEGMENT_BYTES + 100_000:
        batch = [message(TOPIC, i % 2, f"m{len(results) + i}:".encode() * 500) for i in range(10)]
        results += storage.append(batch)
        sent += batch
    storage.stop()
    bad, bad_queue = results[7], sent[7].queue_id  # in the first segment
    with (store / "commitlog" / segment_name(0)).open("r+b") as segment:
        segment.seek(bad.physical_offset + BODY_POS_V4 + 3)
        byte = segment.read(1)
        segment.seek(-1, 1)
        segment.write(bytes([byte[0] ^ 0x01]))
    storage = storages.start(store)
    end = storage.status().max_offset
    assert end == results[-1].physical_offset + results[-1].size

    unchecked = dispatches.start(tmp_path / "unchecked", storage.listen)
    status = unchecked.wait_dispatched(end)
    assert (status.last_error, status.index_entry_count) == ("", 0), status
    entries = unchecked.entries(TOPIC, bad_queue, bad.queue_offset, 1).entries
    assert [(e.physical_offset, e.size) for e in entries] == [(bad.physical_offset, bad.size)]

    checked = dispatches.start(tmp_path / "checked", storage.listen, "--verify-body-crc")
    # It dispatches the records before the damaged one and never passes it; the error is
    # reported (and retried from there) as the records before it are applied.
    seen: list[dispatch_pb.DispatchStatus] = []

    def crc_error_reported() -> bool:
        status = checked.status()
        seen.append(status)
        assert status.dispatched_offset <= bad.physical_offset, status
        return "CRC" in status.last_error and status.dispatched_offset == bad.physical_offset

    wait_until(
        crc_error_reported,
        f"a CRC error reported at {bad.physical_offset}",
        DEADLINE_S,
        state=lambda: seen[-1],
    )
    assert str(bad.physical_offset) in seen[-1].last_error, seen[-1].last_error
    unchecked.stop()
    checked.stop()
    storage.stop()
