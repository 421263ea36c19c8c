"""POP layouts (docs/formats.md, "POP layouts"): checkpoint and ack bodies of the revive
log, receipt handles, the POP retry topic's name; torn and corrupt ones refused."""

from __future__ import annotations

import zlib

import pytest

from tide.format import (
    ACK_REASON_ACK,
    ACK_REASON_REVIVE,
    PopAck,
    PopCheckpoint,
    PopRecordError,
    ReceiptHandle,
    ReceiptHandleError,
    decode_ack,
    decode_checkpoint,
    decode_handle,
    encode_ack,
    encode_checkpoint,
    encode_handle,
    pop_retry_topic,
)
from tide.limits import RECEIPT_HANDLE_MAX_CHARS

CK = PopCheckpoint(
    group="G1",
    topic="%RETRY%G1_T1",
    queue_id=0,
    queue_offset=41,
    physical_offset=123_456_789_012,
    size=230,
    attempt=3,
    invisible_until_ms=1_764_000_000_000,
    fifo=False,
    origin_topic="T1",
)
HANDLE = ReceiptHandle(
    checkpoint_offset=17,
    queue_id=3,
    queue_offset=99,
    invisible_until_ms=1_764_000_000_000,
    retry=True,
    broker_name="broker-a",
)


def test_checkpoint_round_trip_and_documented_body() -> None:
    body = encode_checkpoint(CK)
    assert decode_checkpoint(body) == CK
    assert body == (
        b'{"g":"G1","t":"%RETRY%G1_T1","q":0,"o":41,"p":123456789012,"s":230,"a":3,'
        b'"d":1764000000000,"f":0,"ot":"T1"}'
    )


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b'{"g":"G1","t":"T1"',  # torn
        b"[1,2]",
        b'{"g":"G1","t":"T1","q":0,"o":1,"p":2,"s":0,"a":1,"d":3,"f":0,"ot":"T1"}',  # size 0
        b'{"g":"","t":"T1","q":0,"o":1,"p":2,"s":9,"a":1,"d":3,"f":0,"ot":"T1"}',  # no group
        b'{"g":"G","t":"T1","q":-1,"o":1,"p":2,"s":9,"a":1,"d":3,"f":0,"ot":"T1"}',
        b'{"g":"G","t":"T1","q":0,"o":"1","p":2,"s":9,"a":1,"d":3,"f":0,"ot":"T1"}',
        b'{"g":"G","t":"T1","q":0,"o":1,"p":2,"s":9,"a":1,"d":3,"f":0}',  # no origin topic
        b"\xff\xfe",
        b"{" + b" " * 3000 + b"}",
    ],
)
def test_a_torn_or_corrupt_checkpoint_is_refused(body: bytes) -> None:
    with pytest.raises(PopRecordError):
        decode_checkpoint(body)


def test_ack_round_trip_and_refusals() -> None:
    ack = PopAck(checkpoint_offset=17, reason=ACK_REASON_REVIVE)
    assert encode_ack(ack) == b'{"c":17,"r":"revive"}'
    assert decode_ack(encode_ack(ack)) == ack
    assert decode_ack(b'{"c":0,"r":"ack"}') == PopAck(0, ACK_REASON_ACK)
    for body in (b'{"c":17}', b'{"c":17,"r":"gone"}', b'{"c":-1,"r":"ack"}', b'{"c":1'):
        with pytest.raises(PopRecordError):
            decode_ack(body)


def test_receipt_handle_round_trip_and_layout() -> None:
    text = encode_handle(HANDLE)
    head = "P1.17.3.99.1764000000000.1.broker-a"
    assert text == f"{head}.{zlib.crc32(head.encode()):08x}"
    assert decode_handle(text) == HANDLE


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not a receipt handle"),
        ("hello", "not a receipt handle"),
        ("P2.17.3.99.1764000000000.1.broker-a.00000000", "not a receipt handle"),
        ("P1.17.3.99.1764000000000.1.broker-a.00000000", "garbled"),
        ("P1.17.3.99.1764000000000.1", "not a receipt handle"),  # truncated
    ],
)
def test_a_garbled_or_foreign_handle_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(ReceiptHandleError, match=fragment):
        decode_handle(text)


def test_a_handle_with_a_non_number_field_is_refused_even_with_a_right_check() -> None:
    head = "P1.x7.3.99.1764000000000.1.broker-a"
    with pytest.raises(ReceiptHandleError, match="not a number"):
        decode_handle(f"{head}.{zlib.crc32(head.encode()):08x}")


def test_every_handle_is_within_the_limit() -> None:
    longest = ReceiptHandle(2**63 - 1, 2**31 - 1, 2**63 - 1, 2**63 - 1, True, "b" * 255)
    assert len(encode_handle(longest)) <= RECEIPT_HANDLE_MAX_CHARS


def test_pop_retry_topic_name() -> None:
    assert pop_retry_topic("G1", "T1") == "%RETRY%G1_T1"
    with pytest.raises(ValueError, match="119"):
        pop_retry_topic("G" * 60, "T" * 60)
