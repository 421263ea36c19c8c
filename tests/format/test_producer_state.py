"""The idempotent producers' layouts (docs/formats.md "Idempotent producers"): the
__PSEQ property and the producerState.json snapshot, round trip and refusals."""

from __future__ import annotations

import json

import pytest

from tide.format import (
    PRODUCER_ID_MAX_CHARS,
    BatchEntry,
    ProducerEntry,
    ProducerStateError,
    ProducerStateSnapshot,
    decode_producer_state,
    encode_producer_state,
    format_sequences,
    parse_sequences,
    producer_id_error,
)


def test_sequences_round_trip_and_refusals() -> None:
    assert format_sequences(7, 9) == "7-9"
    assert parse_sequences("7-9") == (7, 9)
    for bad in ("", "7", "9-7", "a-b", "-1-2"):
        with pytest.raises(ProducerStateError):
            parse_sequences(bad)


def test_producer_ids() -> None:
    assert producer_id_error("spark:q1.p-0_e3") is None
    assert producer_id_error("") is not None
    assert producer_id_error("a b") is not None
    assert producer_id_error("x" * (PRODUCER_ID_MAX_CHARS + 1)) is not None


def test_snapshot_round_trip_through_json() -> None:
    batch = BatchEntry(3, 4, 1_700_000_000_000, [100, 180], [3, 4], [80, 81])
    snapshot = ProducerStateSnapshot(
        4096, {"p-1": ProducerEntry(1_700_000_000_001, {("T", 2): [batch]}, epoch=7)}
    )
    doc = json.loads(json.dumps(encode_producer_state(snapshot)))
    assert doc["version"] == 1 and doc["commitlogOffset"] == 4096
    assert doc["producers"]["p-1"]["epoch"] == 7
    assert decode_producer_state(doc) == snapshot


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"version": 2, "commitlogOffset": 0, "producers": {}},
        {"version": 1, "commitlogOffset": -1, "producers": {}},
        {"version": 1, "commitlogOffset": 0, "producers": {"a b": {}}},
        {
            "version": 1,
            "commitlogOffset": 0,
            "producers": {
                "p": {
                    "lastAppendMs": 1,
                    "queues": [
                        {
                            "topic": "T",
                            "queueId": 0,
                            "batches": [
                                {
                                    "firstSeq": 0,
                                    "lastSeq": 1,  # two records, one column entry
                                    "storeTimestampMs": 1,
                                    "physicalOffsets": [0],
                                    "queueOffsets": [0],
                                    "sizes": [80],
                                }
                            ],
                        }
                    ],
                }
            },
        },
    ],
)
def test_bad_snapshots_are_refused(doc: object) -> None:
    with pytest.raises(ProducerStateError):
        decode_producer_state(doc)
