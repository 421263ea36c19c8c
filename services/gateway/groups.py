"""Consumer group configs through the gateway (RocketMQ's mqadmin updateSubGroup and
friends): kept by each broker's storage (config/subscriptionGroup.json), so a change goes
to every master broker of the chosen set, as CreateTopic does, and a read asks every
master broker and answers the first (by broker name) that has the group."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.routes import Member
from services.gateway.validate import check_group, check_topic, invalid
from tide.format import group_topic_error
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

if TYPE_CHECKING:  # the async stub exists in the type stubs only
    from tide.v1.storage_pb2_grpc import StorageAsyncStub

_T = TypeVar("_T")
Targets = Callable[[list[str], str], Awaitable[list[Member]]]
Call = Callable[["StorageAsyncStub", float], Awaitable[_T]]


class GroupAdmin:
    def __init__(self, channels: BrokerChannels, targets: Targets, timeout_s: float) -> None:
        """``targets(broker_names, cluster_name)``: the master brokers a change goes to
        (Admin.targets: NOT_FOUND for an unknown name, UNAVAILABLE for none)."""
        self._channels = channels
        self._targets = targets
        self._timeout_s = timeout_s

    async def create(self, request: pb.CreateGroupRequest) -> pb.CreateGroupResponse:
        """Upsert on every target; the storage checks the config field by field."""
        name = request.group.group_name
        check_group(name, "group.group_name")
        error = group_topic_error(name)
        if error is not None:
            raise invalid(f"group.group_name: {error}")
        targets = await self._targets(list(request.broker_names), request.cluster_name)
        upsert = storage_pb.UpsertGroupRequest(group=request.group)
        await self._on_all(
            targets, "UpsertGroup", lambda stub, t: stub.UpsertGroup(upsert, timeout=t)
        )
        return pb.CreateGroupResponse(broker_names=[m.broker_name for m in targets])

    async def get(self, request: storage_pb.GetGroupRequest) -> storage_pb.GetGroupResponse:
        check_group(request.group, "group")
        answers = await self._on_all(
            await self._targets([], ""),
            "GetGroup",
            lambda stub, t: stub.GetGroup(request, timeout=t),
        )
        for answer in answers:
            if answer.found:
                return answer
        return answers[0]  # the defaults

    async def list_groups(
        self, request: storage_pb.ListGroupsRequest
    ) -> storage_pb.ListGroupsResponse:
        if request.offsets_topic:
            check_topic(request.offsets_topic)
        answers = await self._on_all(
            await self._targets([], ""),
            "ListGroups",
            lambda stub, t: stub.ListGroups(request, timeout=t),
        )
        groups: dict[str, storage_pb.GroupConfig] = {}
        for answer in answers:  # by broker name: the first broker's config of a group wins
            for group in answer.groups:
                groups.setdefault(group.group_name, group)
        # Offsets live on the masters: a group with one on any broker's queue of the topic.
        offset_groups = sorted({g for answer in answers for g in answer.offset_groups})
        return storage_pb.ListGroupsResponse(
            groups=[groups[name] for name in sorted(groups)], offset_groups=offset_groups
        )

    async def delete(
        self, request: storage_pb.DeleteGroupRequest
    ) -> storage_pb.DeleteGroupResponse:
        check_group(request.group, "group")
        answers = await self._on_all(
            await self._targets([], ""),
            "DeleteGroup",
            lambda stub, t: stub.DeleteGroup(request, timeout=t),
        )
        return storage_pb.DeleteGroupResponse(existed=any(a.existed for a in answers))

    async def on_masters(self, what: str, call: Call[_T], *, first_only: bool = False) -> list[_T]:
        """``call`` on every master broker (or the first by name), as a change to every
        group config goes (the users and ACLs use it too: services/gateway/auth/admin.py)."""
        targets = await self._targets([], "")
        return await self._on_all(targets[:1] if first_only else targets, what, call)

    async def _on_all(self, targets: list[Member], what: str, call: Call[_T]) -> list[_T]:
        """``call`` on every target at once, answers in the targets' order. A failure
        fails the whole call, naming the brokers where it was done (run it again: every
        change is an idempotent upsert or delete)."""

        async def one(member: Member) -> _T:
            try:
                return await call(self._channels.storage(member.storage), self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise broker_error(
                    exc, f"{what} on broker {member.broker_name} ({member.storage})"
                ) from exc

        outcomes = await asyncio.gather(*(one(m) for m in targets), return_exceptions=True)
        answers: list[_T] = []
        failed: list[tuple[Member, BaseException]] = []
        for member, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed.append((member, outcome))
            else:
                answers.append(outcome)
        if not failed:
            return answers
        first = failed[0][1]
        if not isinstance(first, ServiceError):
            raise first
        failed_names = {m.broker_name for m, _ in failed}
        done = [m.broker_name for m in targets if m.broker_name not in failed_names]
        suffix = f" (done on: {', '.join(done)}; run it again)" if done else ""
        raise ServiceError(first.code, first.message + suffix)
