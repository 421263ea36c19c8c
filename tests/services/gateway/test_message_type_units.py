"""services/gateway/message_types.py and validate.ProduceCheck.typed without a cluster:
every branch of the type check (the cluster test covers the wiring)."""

from __future__ import annotations

import pytest

from services.gateway.message_types import check_message_types, check_produce_topics
from services.gateway.validate import check_produce_messages
from tide.format import TopicMessageType as T
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb


def check(
    messages: list[pb.ProduceMessage], types: dict[str, T], *, type_check: bool = True
) -> None:
    typed = check_produce_messages(messages, 1 << 20).typed
    check_message_types(messages, types, typed=typed, type_check=type_check)


def refused(messages: list[pb.ProduceMessage], types: dict[str, T], *fragments: str) -> None:
    with pytest.raises(ServiceError) as info:
        check(messages, types)
    for fragment in fragments:
        assert fragment in info.value.message


def test_typed_is_set_by_properties_or_a_delay_field() -> None:
    def typed(**fields: object) -> bool:
        message = pb.ProduceMessage(topic="T", body=b"b", **fields)  # type: ignore[arg-type]
        return check_produce_messages([message], 1 << 20).typed

    assert not typed()
    assert not typed(tags="a", keys=["k"], sharding_key="s")
    assert typed(properties={"a": "b"})
    assert typed(delay_level=1) and typed(deliver_at_ms=5) and typed(delay_ms=5)
    assert typed(tags="a", delay_ms=5)


def test_normal_topics_take_normal_messages_and_refuse_the_others() -> None:
    normal = {"N": T.NORMAL}
    check([pb.ProduceMessage(topic="N", body=b"b", tags="x")], normal)
    check([pb.ProduceMessage(topic="N", body=b"b", sharding_key="s")], normal)
    refused(
        [
            pb.ProduceMessage(topic="N", body=b"b"),
            pb.ProduceMessage(topic="N", body=b"b", delay_ms=1),
        ],
        normal,
        "messages[1]",
        "is DELAY",
    )
    refused(
        [pb.ProduceMessage(topic="N", body=b"b", properties={"TRAN_MSG": "true"})],
        normal,
        "is TRANSACTION",
    )
    refused(
        [pb.ProduceMessage(topic="N", body=b"b", properties={"__SHARDINGKEY": "g"})],
        normal,
        "is FIFO",
    )


def test_typed_topics() -> None:
    types = {"D": T.DELAY, "F": T.FIFO, "M": T.MIXED, "X": T.TRANSACTION}
    check([pb.ProduceMessage(topic="D", body=b"b", delay_level=2)], types)
    check([pb.ProduceMessage(topic="D", body=b"b", deliver_at_ms=9)], types)
    check([pb.ProduceMessage(topic="F", body=b"b", sharding_key="g")], types)
    check([pb.ProduceMessage(topic="X", body=b"b", properties={"TRAN_MSG": "true"})], types)
    check([pb.ProduceMessage(topic="M", body=b"b")], types)
    refused([pb.ProduceMessage(topic="D", body=b"b")], types, "takes DELAY", "is NORMAL")
    refused([pb.ProduceMessage(topic="F", body=b"b", tags="t")], types, "no message group")
    refused(
        [pb.ProduceMessage(topic="M", body=b"b"), pb.ProduceMessage(topic="F", body=b"b")],
        types,
        "messages[1]",
    )


def test_off_skips_the_type_check_but_not_the_conflict() -> None:
    types = {"N": T.NORMAL, "D": T.DELAY}
    check([pb.ProduceMessage(topic="N", body=b"b", delay_ms=1)], types, type_check=False)
    check([pb.ProduceMessage(topic="D", body=b"b")], types, type_check=False)
    conflict = pb.ProduceMessage(
        topic="N", body=b"b", properties={"TRAN_MSG": "true"}, delay_level=1
    )
    with pytest.raises(ServiceError, match="cannot be delayed"):
        check([conflict], types, type_check=False)


def test_system_topics_are_refused_naming_the_first_message() -> None:
    messages = [pb.ProduceMessage(topic="T"), pb.ProduceMessage(topic="%DLQ%g")]
    with pytest.raises(ServiceError, match=r"messages\[1\]\.topic: .*dead-letter topic"):
        check_produce_topics(messages, {"T", "%DLQ%g"})
    check_produce_topics(messages[:1], {"T"})
