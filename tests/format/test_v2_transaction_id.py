"""The RocketMQ 5 transaction id layout (docs/formats.md, "RocketMQ 5 transaction ids")."""

from __future__ import annotations

import pytest

from tide.format import (
    HalfLocation,
    V2TransactionIdError,
    encode_v2_transaction_id,
    parse_v2_transaction_id,
)

MSG_ID = "7F00000100002A9F0000000000003F2A"


def test_the_documented_example() -> None:
    half = HalfLocation("broker-a", 17, MSG_ID, "0102FC00000001082A0B1B268B00000000")
    text = encode_v2_transaction_id(half)
    assert text == f"broker-a.17.{MSG_ID}.0102FC00000001082A0B1B268B00000000"
    assert parse_v2_transaction_id(text) == half


def test_a_transaction_id_with_dots_round_trips() -> None:
    half = HalfLocation("b|1%x", 0, MSG_ID, "my.own.id")
    assert parse_v2_transaction_id(encode_v2_transaction_id(half)) == half


@pytest.mark.parametrize(
    "text",
    ["", "nope", "b.1.AB", "b..AB.x", "b.-1.AB.x", "b.1x.AB.x", ".1.AB.x", "b.1..x", "b.1.AB."],
)
def test_other_text_is_refused_saying_what_to_give(text: str) -> None:
    with pytest.raises(V2TransactionIdError, match="SendMessage"):
        parse_v2_transaction_id(text)
