"""The gateway's checks of transactional produce messages and its half record
(services/gateway/validate.py, message_types.py, transactions.py)."""

from __future__ import annotations

import grpc
import pytest

from services.gateway.message_types import check_message_types
from services.gateway.transactions import add_half
from services.gateway.validate import check_produce_messages
from tide.format import (
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    SYSFLAG_TRANSACTION_MASK,
    TRAN_MSG,
    TRANS_HALF_TOPIC,
    TRANSACTION_ID,
    UNIQ_KEY,
    RunWriter,
    TopicMessageType,
    decode_record,
    pack_host,
    parse_host,
)
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

BODY_LIMIT = 1 << 20


def half(**fields: object) -> pb.ProduceMessage:
    return pb.ProduceMessage(topic="T_tx", body=b"x", transactional=True, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (half(), "producer_group is empty"),
        (half(producer_group="bad group"), "producer_group"),
        (half(producer_group="PG", transaction_id="a b"), "transaction_id"),
        (half(producer_group="PG", delay_level=2), "cannot be delayed"),
        (pb.ProduceMessage(topic="T", body=b"x", producer_group="PG"), "set transactional"),
    ],
)
def test_bad_transactional_messages_are_refused_naming_the_field(
    message: pb.ProduceMessage, text: str
) -> None:
    with pytest.raises(ServiceError) as raised:
        check_produce_messages([message], BODY_LIMIT)
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert text in raised.value.message and "messages[0]" in raised.value.message


def test_a_transactional_message_takes_the_general_path_and_is_typed_transaction() -> None:
    message = half(producer_group="PG")
    check = check_produce_messages([message], BODY_LIMIT)
    assert check.transactional and check.routed and check.typed
    check_message_types(
        [message], {"T_tx": TopicMessageType.TRANSACTION}, typed=True, type_check=True
    )
    with pytest.raises(ServiceError, match="takes NORMAL messages"):
        check_message_types(
            [message], {"T_tx": TopicMessageType.NORMAL}, typed=True, type_check=True
        )


def test_the_half_record_goes_to_the_half_topic_with_its_real_queue() -> None:
    writer = RunWriter(pack_host(parse_host("10.0.0.1:5000")))
    message = half(producer_group="PG", properties={"user": "1"})
    add_half(writer, message, 3, "UNIQ", 1_000)
    data = writer.getvalue()
    record = decode_record(data, 0, len(data), check_crc=False)
    assert (record.topic, record.queue_id, record.body) == (TRANS_HALF_TOPIC, 0, b"x")
    props = record.properties
    assert (props[REAL_TOPIC], props[REAL_QID], props[TRAN_MSG]) == ("T_tx", "3", "true")
    assert (props[PGROUP], props[TRANSACTION_ID], props[UNIQ_KEY]) == ("PG", "UNIQ", "UNIQ")
    assert props["user"] == "1"
    # NOT_TYPE, as RocketMQ stores a half: a PREPARED record takes no queue offset.
    assert record.sys_flag & SYSFLAG_TRANSACTION_MASK == 0
