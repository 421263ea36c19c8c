"""The compiled recovery walk (``tide.format._ccore.replay_records``) against its Python
reference (``replay_records_python``, scan_record per record): the same stop, count and
queue offset table on random commitlogs (V1 and V2 magics, IPv6 hosts, blank markers,
transaction records without a queue entry) and damaged ones (bytes changed, cut short,
zeroed, wrong offsets, non-UTF-8 topics, wrong CRCs). Skipped when the extension is not
built (test_core_selection fails if it should have been)."""

from __future__ import annotations

import random

import pytest

from tests.tail.test_batch import make_record, random_stream
from tests.tail.test_ccore_scan import damage
from tide.format import _core
from tide.format._record import replay_records_python

pytestmark = pytest.mark.skipif(
    _core.replay_records is None, reason="the compiled core is not built or is off"
)


def assert_same(
    data: bytes, pos: int, limit: int, base: int, check_crc: bool, max_body: int
) -> tuple[int, int]:
    assert _core.replay_records is not None
    start = {("BatchTopic", 1): 3}
    python_table, compiled_table = dict(start), dict(start)
    python = replay_records_python(
        data, pos, limit, base, python_table, check_crc=check_crc, max_body_bytes=max_body
    )
    compiled = _core.replay_records(data, pos, limit, base, check_crc, max_body, compiled_table)
    assert (compiled, compiled_table) == (python, python_table)
    return python


@pytest.mark.parametrize("seed", range(60))
def test_random_commitlogs_replay_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    data, offsets = random_stream(rnd, rnd.randint(1, 60))
    pos = rnd.choice(offsets)
    stop, count = assert_same(data, pos, len(data), 0, rnd.random() < 0.5, 1 << 30)
    assert count and stop > pos  # (a record is there)


@pytest.mark.parametrize("seed", range(250))
def test_damaged_commitlogs_replay_the_same(seed: int) -> None:
    rnd = random.Random(50_000 + seed)
    data, _ = random_stream(rnd, rnd.randint(1, 30), blanks=rnd.random() < 0.5)
    data = damage(rnd, data)
    for check_crc in (False, True):
        assert_same(data, 0, len(data), rnd.choice([0, 0, 7]), check_crc, rnd.choice([1 << 30, 50]))


def test_transaction_records_take_no_offset_and_a_bad_topic_stops_the_walk() -> None:
    first = make_record(0, b"a", queue_offset=9)
    prepared = bytearray(make_record(len(first), b"b", queue_offset=10))
    prepared[39] |= 1 << 2  # sys_flag: transaction prepared
    bad_topic = bytearray(make_record(len(first) + len(prepared), b"c", topic="XY"))
    bad_topic[88 + 1 + 1] = 0xFF
    data = first + bytes(prepared) + bytes(bad_topic)
    assert assert_same(data, 0, len(data), 0, True, 1 << 30) == (len(first) + len(prepared), 2)


def test_limits_outside_the_buffer_are_refused_by_both() -> None:
    data = make_record(0, b"a")
    assert _core.replay_records is not None
    with pytest.raises(ValueError, match="limit <= len"):
        replay_records_python(data, 0, len(data) + 1, 0, {})
    with pytest.raises(ValueError, match="limit <= len"):
        _core.replay_records(data, 0, len(data) + 1, 0, True, 1 << 30, {})
