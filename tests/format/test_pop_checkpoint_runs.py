"""Checkpoint runs (docs/formats.md, "POP layouts"): a Receive's checkpoints in one revive
log record, their names (run_checkpoint_id) apart from every revive offset, what a torn
or foreign run body is refused as, and the receipt handle that carries such a name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tide.format import (
    CHECKPOINT_RUN_MAX_COUNT,
    RUN_ID_FLAG,
    PopAck,
    PopCheckpoint,
    PopRecordError,
    ReceiptHandle,
    decode_ack,
    decode_checkpoints,
    decode_handle,
    encode_ack,
    encode_checkpoints,
    encode_handle,
    revive_offset_of,
    run_checkpoint_id,
)
from tide.limits import RECEIPT_HANDLE_MAX_CHARS

BASE = PopCheckpoint(
    group="G1",
    topic="T1",
    queue_id=2,
    queue_offset=41,
    physical_offset=123_456_789_012,
    size=230,
    attempt=1,
    invisible_until_ms=1_764_000_000_000,
    fifo=False,
    origin_topic="T1",
)


def _run(count: int) -> list[PopCheckpoint]:
    """``count`` checkpoints of one Receive: every third from the retry topic."""
    return [
        dataclasses.replace(
            BASE,
            topic="%RETRY%G1_T1" if i % 3 == 2 else "T1",
            queue_id=0 if i % 3 == 2 else i % 4,
            queue_offset=41 + i,
            physical_offset=BASE.physical_offset + 230 * i,
            attempt=2 if i % 3 == 2 else 1,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("count", [1, 32, CHECKPOINT_RUN_MAX_COUNT])
def test_a_run_round_trips(count: int) -> None:
    cks = _run(count)
    assert decode_checkpoints(encode_checkpoints(cks)) == cks


def test_the_documented_body() -> None:
    body = json.loads(encode_checkpoints(_run(3)))
    assert body == {
        "g": "G1",
        "d": 1_764_000_000_000,
        "f": 0,
        "ot": "T1",
        "t": ["T1", "%RETRY%G1_T1"],
        "l": [
            [0, 0, 41, 123_456_789_012, 230, 1],
            [0, 1, 42, 123_456_789_242, 230, 1],
            [1, 0, 43, 123_456_789_472, 230, 2],
        ],
    }


def test_a_run_is_of_one_receive_and_bounded() -> None:
    with pytest.raises(ValueError, match="of one Receive"):
        encode_checkpoints([BASE, dataclasses.replace(BASE, invisible_until_ms=1)])
    with pytest.raises(ValueError, match=r"1\.\.256"):
        encode_checkpoints(_run(CHECKPOINT_RUN_MAX_COUNT + 1))
    with pytest.raises(ValueError, match=r"1\.\.256"):
        encode_checkpoints([])


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "not JSON"),
        (encode_checkpoints(_run(4))[:-7], "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":["T"]}', "lacks field 'l'"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":["T"],"l":[]}', "1..256 rows"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":[""],"l":[[0,0,0,0,1,1]]}', "topic names"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":["T"],"l":[[1,0,0,0,1,1]]}', "row is not"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":["T"],"l":[[0,0,0,0,0,1]]}', "size > 0"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":["T"],"l":[[0,0,-1,0,1,1]]}', "row is not"),
        (b'{"g":"G","d":1,"f":0,"ot":"T","t":["T"],"l":[[0,0,0,1]]}', "row is not"),
    ],
)
def test_a_torn_or_foreign_run_is_refused(body: bytes, fragment: str) -> None:
    with pytest.raises(PopRecordError, match=fragment):
        decode_checkpoints(body)


def test_run_names_are_apart_from_revive_offsets() -> None:
    for offset in (0, 1, 41, 2**54 - 1):
        assert revive_offset_of(offset) == offset  # a single checkpoint's name
        names = [run_checkpoint_id(offset, i) for i in range(CHECKPOINT_RUN_MAX_COUNT)]
        assert all(name & RUN_ID_FLAG and name < 2**63 for name in names)  # an int64
        assert {revive_offset_of(name) for name in names} == {offset}
        assert len(set(names)) == CHECKPOINT_RUN_MAX_COUNT
    assert run_checkpoint_id(7, 255) < run_checkpoint_id(8, 0)  # ordered as written
    with pytest.raises(ValueError, match=r"0\.\.255"):
        run_checkpoint_id(7, CHECKPOINT_RUN_MAX_COUNT)


def test_acks_and_handles_carry_run_names() -> None:
    names = tuple(run_checkpoint_id(2**54 - 1, i) for i in range(CHECKPOINT_RUN_MAX_COUNT))
    ack = PopAck(names[0], "ack", names[1:])
    assert decode_ack(encode_ack(ack)) == ack
    handle = ReceiptHandle(names[-1], 255, 2**62, 2**62, True, "b" * 64)
    text = encode_handle(handle)
    assert decode_handle(text) == handle
    assert len(text) <= RECEIPT_HANDLE_MAX_CHARS
