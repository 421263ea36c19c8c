"""tide.format's transaction layouts (docs/formats.md, "Transactional messages"): the half
message's properties, the op record's body and properties, the checks file."""

from __future__ import annotations

import pytest

from tide.format import (
    OP_TAG,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    TRAN_RESOLUTION,
    TRANSACTION_ID,
    UNIQ_KEY,
    committed_properties,
    decode_properties,
    decode_transaction_checks,
    encode_transaction_checks,
    half_properties,
    op_body,
    op_properties,
    parse_op_body,
)


def test_half_properties_follow_the_producers_and_replace_stale_bookkeeping() -> None:
    given = {"user": "1", UNIQ_KEY: "U", REAL_TOPIC: "stale", PGROUP: "stale"}
    half = half_properties(given, "T_orders", 3, "PG", "tx-1")
    assert list(half) == ["user", UNIQ_KEY, REAL_TOPIC, REAL_QID, TRAN_MSG, PGROUP, TRANSACTION_ID]
    assert (half[REAL_TOPIC], half[REAL_QID], half[TRAN_MSG]) == ("T_orders", "3", "true")
    assert (half[PGROUP], half[TRANSACTION_ID]) == ("PG", "tx-1")


def test_the_committed_copy_drops_only_the_real_destination() -> None:
    half = half_properties({"user": "1", UNIQ_KEY: "U"}, "T", 0, "PG", "tx")
    committed = committed_properties(half)
    assert REAL_TOPIC not in committed and REAL_QID not in committed
    assert committed[UNIQ_KEY] == "U" and committed[TRAN_MSG] == "true"
    assert committed[PGROUP] == "PG" and committed["user"] == "1"


def test_op_record_body_and_properties() -> None:
    assert op_body(1234) == b"1234"
    assert parse_op_body(op_body(0)) == 0
    assert decode_properties(op_properties("commit")) == {TAGS: OP_TAG, TRAN_RESOLUTION: "commit"}
    for bad in (b"", b"-1", b"12a", b"9" * 20):
        with pytest.raises(ValueError, match="queue offset"):
            parse_op_body(bad)


def test_checks_file_round_trips_and_refuses_other_documents() -> None:
    document = encode_transaction_checks({7: 2, 3: 1})
    assert document == {"version": 1, "checks": {"3": 1, "7": 2}}
    assert decode_transaction_checks(document) == {3: 1, 7: 2}
    for bad in ({}, {"version": 2, "checks": {}}, {"version": 1, "checks": {"x": 1}}):
        with pytest.raises(ValueError, match="transaction check"):
            decode_transaction_checks(bad)
