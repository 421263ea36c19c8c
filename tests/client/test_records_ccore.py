"""The client's decoding of pulled records with the compiled core (``decode_pull_records``)
against the Python decoder (``decode_pull_records_python``): the same messages on random
records (IPv4 and IPv6 hosts, one- and two-byte topic lengths, topics that are not
UTF-8), the same TideError on damaged, cut, padded and miscounted ones."""

from __future__ import annotations

import random

import pytest

from tests.format.test_ccore_fields import V4, V6, damage, random_records
from tide.client import TideError
from tide.client._records import decode_pull_records, decode_pull_records_python
from tide.client._types import ReceivedMessage
from tide.format import _core

pytestmark = pytest.mark.skipif(
    _core.ccore is None, reason="the compiled core is not built or is off"
)


def decoded(decode: object, records: bytes, count: int) -> tuple[ReceivedMessage, ...] | str:
    assert callable(decode)
    try:
        messages: tuple[ReceivedMessage, ...] = decode("broker-a", records, count)
    except TideError as exc:
        return str(exc)
    return messages


@pytest.mark.parametrize("seed", range(80))
def test_compiled_decoding_agrees(seed: int) -> None:
    rnd = random.Random(seed)
    data, built = random_records(rnd, rnd.choice([V4, V4, V6]), rnd.random() < 0.3)
    for piece in (data, damage(rnd, data), damage(rnd, data), damage(rnd, data)):
        for count in (len(built), len(built) - 1, len(built) + 1):
            want = decoded(decode_pull_records_python, piece, count)
            assert decoded(decode_pull_records, piece, count) == want


def test_a_topic_that_is_not_utf8_is_named() -> None:
    rnd = random.Random(7)
    while True:
        data, built = random_records(rnd, V4)
        if any(topic == b"\xff\xfe" for topic, _ in built):
            break
    with pytest.raises(TideError, match="topic is not UTF-8"):
        decode_pull_records("broker-a", data, len(built))
