"""Which member of a broker serves reads: its master, or a slave while the master is down.

Pull, QueryMessage, GetQueueOffsets and SearchOffset read from the broker's master
(storage + dispatch). When a read finds the master unreachable (UNAVAILABLE,
DEADLINE_EXCEEDED or CANCELLED from its storage or its dispatch) it is tried at once on
the live slave with the lowest broker id, and the master is marked failed for
``--fault-isolation-ms`` (RocketMQ's latency fault tolerance): while marked, reads go
straight to the slave. A marked master is used again as soon as the gateway's channels to
its storage and its dispatch are connected again (asking starts a reconnection), or when
the mark expires. A master missing from the route (expired at the name servers) is not
tried. A slave's records are byte-identical to the master's, so offsets are the same on
both, and so are the message ids (a storage builds them from each record's store host:
the master that wrote it).

Consumer offsets and produce never use this: they live on, and go to, the master only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from services.gateway.brokers import BrokerChannels, BrokerUnreachable
from services.gateway.fault import LatencyFaultTolerance
from services.gateway.routes import MASTER_ID, Member
from tide.quoting import quote
from tide.server import ServiceError

log = logging.getLogger("tide.gateway.readers")

# Members of one broker a read tries at most (the master and the lowest-id slaves).
MAX_READ_MEMBERS = 3
_T = TypeVar("_T")


def is_slave(member: Member) -> bool:
    return member.broker_id != MASTER_ID


class ReadMembers:
    """Per broker: the order in which its members are asked for a read."""

    def __init__(
        self,
        channels: BrokerChannels,
        *,
        isolation_ms: int,
        clock_ms: Callable[[], float] | None = None,
    ) -> None:
        self._channels = channels
        # Keyed by the master's storage address (a restarted master may move).
        self._fault = LatencyFaultTolerance(isolation_ms=isolation_ms, clock_ms=clock_ms)

    def order(self, members: Sequence[Member]) -> list[Member]:
        """The members to try, best first: the master unless it is marked failed and not
        connected again, then the slaves by id; a marked master comes last."""
        if len(members) == 1:  # no slave (the usual case): nothing to choose
            return list(members)
        ranked = sorted(members, key=lambda member: member.broker_id)
        master = ranked[0] if ranked and ranked[0].broker_id == MASTER_ID else None
        slaves = [member for member in ranked if is_slave(member)][: MAX_READ_MEMBERS - 1]
        if master is None:
            return slaves
        if not slaves or self.usable(master):
            return [master, *slaves]
        return [*slaves, master]

    def usable(self, master: Member) -> bool:
        """Whether reads should go to ``master`` now."""
        if self._fault.is_available(master.storage):
            return True
        addresses = [master.storage, *([master.dispatch] if master.dispatch else [])]
        if all(self._channels.connected(address) for address in addresses):
            self._fault.update(master.storage, 0)
            log.info(
                "master of broker %s (%s) is connected again; reads go to it",
                master.broker_name,
                master.storage,
            )
            return True
        return False

    def failed(self, member: Member, error: ServiceError) -> None:
        """``member`` could not be reached by a read."""
        if is_slave(member):
            log.warning(
                "slave %d of broker %s (%s) is unreachable too: %s",
                member.broker_id,
                member.broker_name,
                member.storage,
                error.message,
            )
            return
        was_available = self._fault.is_available(member.storage)
        self._fault.update(member.storage, 0, isolation=True)
        if was_available:
            log.warning(
                "master of broker %s (%s) is unreachable (%s); reads go to its slave until "
                "it is connected again (at most --fault-isolation-ms %d)",
                member.broker_name,
                member.storage,
                error.message,
                self._fault.isolation_ms,
            )

    async def read(
        self,
        broker_name: str,
        members: Sequence[Member],
        call: Callable[[Member], Awaitable[_T]],
    ) -> tuple[_T, Member]:
        """``call`` on the first member in :meth:`order` that can be reached, and that
        member. Only BrokerUnreachable moves on to the next member; when every member was
        unreachable the master's (else the first) error is raised, naming the others."""
        order = self.order(members)
        if not order:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"broker {quote(broker_name)} has no live member (master or slave) in the route; "
                "retry when it is back",
            )
        errors: list[tuple[Member, BrokerUnreachable]] = []
        for member in order:
            try:
                return await call(member), member
            except BrokerUnreachable as exc:
                self.failed(member, exc)
                errors.append((member, exc))
        if len(errors) == 1:
            raise errors[0][1]
        first = next((e for m, e in errors if not is_slave(m)), errors[0][1])
        others = "; ".join(
            f"broker id {member.broker_id} ({member.storage}): {exc.message}"
            for member, exc in errors
            if exc is not first
        )
        raise BrokerUnreachable(f"{first.message}; also unreachable: {others}")
