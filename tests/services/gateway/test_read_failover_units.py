"""Pure logic of reads failing over to a slave (readers.py) and of produce statuses.

The channels here are a stand-in for connectivity only (which addresses are connected);
the cluster tests (tests/test_ha_cluster.py) run the same code against real processes.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.gateway.brokers import BrokerChannels, BrokerUnreachable
from services.gateway.produce_results import STATUS as _STATUS
from services.gateway.readers import ReadMembers
from services.gateway.routes import Member
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

MASTER = Member("broker-a", 0, "m:1", "m:2")
SLAVE = Member("broker-a", 1, "s:1", "s:2")
SLAVE2 = Member("broker-a", 2, "t:1", "t:2")


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000.0

    def __call__(self) -> float:
        return self.now_ms


class Connectivity(BrokerChannels):
    """Only ``connected`` differs from the real channels: no channel is opened."""

    def __init__(self) -> None:
        super().__init__()
        self.up: set[str] = set()

    def connected(self, address: str) -> bool:
        return address in self.up


def make(isolation_ms: int = 30_000) -> tuple[ReadMembers, Connectivity, FakeClock]:
    channels, clock = Connectivity(), FakeClock()
    return ReadMembers(channels, isolation_ms=isolation_ms, clock_ms=clock), channels, clock


def test_master_first_then_slaves_by_id() -> None:
    members, _, _ = make()
    assert members.order([SLAVE2, MASTER, SLAVE]) == [MASTER, SLAVE, SLAVE2]
    assert members.order([SLAVE2, SLAVE]) == [SLAVE, SLAVE2]  # master gone from the route
    assert members.order([MASTER]) == [MASTER]
    assert members.order([]) == []


def test_a_failed_master_goes_last_until_connected_again_or_the_mark_expires() -> None:
    members, channels, clock = make(isolation_ms=5_000)
    members.failed(MASTER, BrokerUnreachable("down"))
    assert members.order([MASTER, SLAVE]) == [SLAVE, MASTER]
    channels.up = {MASTER.storage}  # the dispatch is not connected yet
    assert members.order([MASTER, SLAVE]) == [SLAVE, MASTER]
    channels.up = {MASTER.storage, MASTER.dispatch}
    assert members.order([MASTER, SLAVE]) == [MASTER, SLAVE]
    channels.up = set()
    members.failed(MASTER, BrokerUnreachable("down again"))
    assert members.order([MASTER, SLAVE]) == [SLAVE, MASTER]
    clock.now_ms += 5_000
    assert members.order([MASTER, SLAVE]) == [MASTER, SLAVE]
    # Without a slave the master is tried whatever its mark.
    members.failed(MASTER, BrokerUnreachable("down"))
    assert members.order([MASTER]) == [MASTER]


def test_a_failed_slave_marks_nothing() -> None:
    members, _, _ = make()
    members.failed(SLAVE, BrokerUnreachable("down"))
    assert members.order([MASTER, SLAVE]) == [MASTER, SLAVE]


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_read_fails_over_on_unreachable_only() -> None:
    members, _, _ = make()
    asked: list[int] = []

    async def master_down(member: Member) -> str:
        asked.append(member.broker_id)
        if member is MASTER:
            raise BrokerUnreachable("Read on broker broker-a master failed: UNAVAILABLE")
        return f"from {member.broker_id}"

    assert run(members.read("broker-a", [MASTER, SLAVE], master_down)) == ("from 1", SLAVE)
    assert asked == [0, 1]
    # Marked: the next read goes straight to the slave.
    assert run(members.read("broker-a", [MASTER, SLAVE], master_down)) == ("from 1", SLAVE)
    assert asked == [0, 1, 1]

    async def refused(member: Member) -> str:
        raise ServiceError(grpc.StatusCode.NOT_FOUND, "no such message")

    with pytest.raises(ServiceError) as info:
        run(members.read("broker-a", [SLAVE, MASTER], refused))
    assert info.value.code is grpc.StatusCode.NOT_FOUND  # not an outage: no failover


def test_every_member_unreachable_names_them_all() -> None:
    members, _, _ = make()

    async def down(member: Member) -> str:
        raise BrokerUnreachable(f"{member.storage} is down")

    with pytest.raises(BrokerUnreachable) as info:
        run(members.read("broker-a", [MASTER, SLAVE], down))
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    assert info.value.message.startswith("m:1 is down")  # the master's error first
    assert "broker id 1 (s:1): s:1 is down" in info.value.message

    with pytest.raises(ServiceError) as empty:
        run(members.read("broker-a", [], down))
    assert empty.value.code is grpc.StatusCode.UNAVAILABLE
    assert "broker 'broker-a' has no live member" in empty.value.message


@pytest.mark.parametrize(
    "name", ["PUT_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"]
)
def test_every_append_status_has_its_produce_status(name: str) -> None:
    expected = "SEND_OK" if name == "PUT_OK" else name
    status = _STATUS[storage_pb.AppendStatus.Value(name)]
    assert pb.ProduceResult.Status.Name(status) == expected


def test_no_append_status_is_left_unmapped() -> None:
    assert set(_STATUS) == set(storage_pb.AppendStatus.values())
