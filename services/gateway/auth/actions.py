"""THE table: every RPC of ``tide.v1.Gateway`` and ``apache.rocketmq.v2.MessagingService``
-> the (action, resource) pairs a caller needs, read from the request.

RocketMQ's ACL 2.0 names the same actions per request code (``auth/`` module); a method
that is missing here is refused (tests/services/gateway/auth/test_actions.py checks that
every method of both services is listed). A stream's needs are read from each request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

from tide.auth.model import Action, AnyOf, Resource, ResourceType
from tide.format import RETRY_TOPIC_PREFIX

Need: TypeAlias = tuple[Action | AnyOf, Resource]
# Reading a route is for producing or consuming (RocketMQ's QueryRoute: Pub or Sub).
PUB_OR_SUB = AnyOf((Action.PUB, Action.SUB))
# What a consumer reads about its own queues and group (offsets, members, locks): Sub does.
SUB_OR_GET = AnyOf((Action.SUB, Action.GET))
Needs: TypeAlias = Callable[[Any], list[Need]]

V1 = "/tide.v1.Gateway/"
V2 = "/apache.rocketmq.v2.MessagingService/"
CLUSTER = Resource(ResourceType.CLUSTER, "")


def topic(name: str) -> Resource:
    """A topic; a group's retry topic (``%RETRY%<group>``) is the group, as in RocketMQ's
    ACL 2.0: a consumer granted ``Sub`` on its group pulls and subscribes to its own
    retry topic without a grant on a topic whose name it does not choose."""
    if name.startswith(RETRY_TOPIC_PREFIX) and len(name) > len(RETRY_TOPIC_PREFIX):
        return Resource(ResourceType.GROUP, name[len(RETRY_TOPIC_PREFIX) :])
    return Resource(ResourceType.TOPIC, name)


def group(name: str) -> Resource:
    return Resource(ResourceType.GROUP, name)


def _on(action: Action | AnyOf, *resources: Callable[[Any], Iterator[Resource]]) -> Needs:
    """Needs ``action`` on every resource the extractors find in a request."""

    def needs(request: Any) -> list[Need]:
        found = dict.fromkeys(r for extract in resources for r in extract(request))
        return [(action, resource) for resource in found]

    return needs


def _field(kind: Callable[[str], Resource], *path: str) -> Callable[[Any], Iterator[Resource]]:
    """The resource named by the string at ``path`` (absent or empty: none)."""

    def extract(request: Any) -> Iterator[Resource]:
        value = request
        for name in path:
            value = getattr(value, name, "")
        if isinstance(value, str) and value:
            yield kind(value)

    return extract


def _cluster(_request: Any) -> Iterator[Resource]:
    yield CLUSTER


def _produce_topics(request: Any) -> Iterator[Resource]:
    # Names deduplicated before a Resource is made: a batch of 100 to one topic is one
    # need (a Resource per message made the check cost ~3 us per message).
    for name in {message.topic: None for message in request.messages}:
        yield topic(name)


def _v2_message_topics(request: Any) -> Iterator[Resource]:
    for name in {message.topic.name: None for message in request.messages}:
        yield topic(name)


def _lock_topics(request: Any) -> Iterator[Resource]:
    for queue in request.request.queues:
        if queue.topic:
            yield topic(queue.topic)


def _query_topic(request: Any) -> Iterator[Resource]:
    which = request.WhichOneof("query")
    if which in ("key", "unique_key"):
        yield topic(getattr(request, which).topic)
    else:  # by message id: the topic is not known before reading it
        yield CLUSTER


def _subscription_topics(request: Any) -> Iterator[Resource]:
    for subscription in request.subscriptions:
        yield topic(subscription.topic)


def _telemetry(request: Any) -> list[Need]:
    """A v2 client's settings: the topics it publishes to, the group it consumes as."""
    if request.WhichOneof("command") != "settings":
        return []
    settings = request.settings
    if settings.WhichOneof("pub_sub") == "publishing":
        return [(Action.PUB, topic(t.name)) for t in settings.publishing.topics]
    if settings.WhichOneof("pub_sub") == "subscription":
        subscription = settings.subscription
        needs: list[Need] = [(Action.SUB, topic(e.topic.name)) for e in subscription.subscriptions]
        if subscription.group.name:
            needs.append((Action.SUB, group(subscription.group.name)))
        return needs
    return []


def _none(_request: Any) -> list[Need]:
    """Any authenticated user (what the call reveals is the caller's own)."""
    return []


_TOPIC = _field(topic, "topic")
_GROUP = _field(group, "consumer_group")
_V2_TOPIC = _field(topic, "topic", "name")
_V2_GROUP = _field(group, "group", "name")
_V2_QUEUE_TOPIC = _field(topic, "message_queue", "topic", "name")
_SUB_TOPIC_GROUP = _on(Action.SUB, _TOPIC, _GROUP)

ACTIONS: dict[str, Needs] = {
    # tide.v1.Gateway
    V1 + "Produce": _on(Action.PUB, _produce_topics),
    V1 + "ProduceStream": _on(Action.PUB, _produce_topics),
    V1 + "Pull": _SUB_TOPIC_GROUP,
    V1 + "QueryMessage": _on(Action.GET, _query_topic),
    V1 + "GetQueueOffsets": _on(SUB_OR_GET, _TOPIC),
    V1 + "SearchOffset": _on(SUB_OR_GET, _TOPIC),
    V1 + "CommitOffset": _on(Action.UPDATE, _TOPIC, _GROUP),
    V1 + "GetOffset": _on(SUB_OR_GET, _TOPIC, _GROUP),
    V1 + "Heartbeat": _on(Action.SUB, _GROUP, _subscription_topics),
    V1 + "UnregisterConsumer": _on(Action.SUB, _GROUP),
    V1 + "GetConsumers": _on(SUB_OR_GET, _GROUP),
    V1 + "CreateTopic": _on(Action.CREATE, _TOPIC),
    V1 + "DeleteTopic": _on(Action.DELETE, _TOPIC),
    V1 + "ListTopics": _on(Action.LIST, _cluster),
    V1 + "GetTopicRoute": _on(PUB_OR_SUB, _TOPIC),
    V1 + "GetClusterInfo": _on(Action.GET, _cluster),
    V1 + "SendBack": _on(Action.SUB, _GROUP),
    V1 + "RecallMessage": _on(Action.PUB, _cluster),  # the topic is inside the handle
    V1 + "BrowseQueue": _on(Action.GET, _TOPIC),
    V1 + "CreateGroup": _on(Action.CREATE, _field(group, "group", "group_name")),
    V1 + "GetGroup": _on(Action.GET, _field(group, "group")),
    V1 + "ListGroups": _on(Action.LIST, _cluster),
    V1 + "DeleteGroup": _on(Action.DELETE, _field(group, "group")),
    V1 + "EndTransaction": _on(Action.PUB, _field(group, "producer_group")),
    V1 + "TransactionChecks": _on(Action.PUB, _field(group, "producer_group")),
    V1 + "ListTransactions": _on(Action.GET, _field(group, "producer_group")),
    V1 + "LockQueues": _on(Action.SUB, _field(group, "request", "consumer_group"), _lock_topics),
    V1 + "UnlockQueues": _on(Action.SUB, _field(group, "request", "consumer_group"), _lock_topics),
    V1 + "GetQueueLocks": _on(SUB_OR_GET, _GROUP),
    V1 + "Receive": _SUB_TOPIC_GROUP,
    V1 + "Ack": _SUB_TOPIC_GROUP,
    V1 + "ChangeInvisibleDuration": _SUB_TOPIC_GROUP,
    V1 + "ForwardToDeadLetter": _SUB_TOPIC_GROUP,
    V1 + "GetGroupLag": _on(Action.GET, _TOPIC, _GROUP),
    # users and ACLs: administration of the whole cluster
    V1 + "CreateUser": _on(Action.CREATE, _cluster),
    V1 + "UpdateUser": _on(Action.UPDATE, _cluster),
    V1 + "DeleteUser": _on(Action.DELETE, _cluster),
    V1 + "ListUsers": _on(Action.LIST, _cluster),
    V1 + "CreateAcl": _on(Action.CREATE, _cluster),
    V1 + "UpdateAcl": _on(Action.UPDATE, _cluster),
    V1 + "DeleteAcl": _on(Action.DELETE, _cluster),
    V1 + "ListAcls": _on(Action.LIST, _cluster),
    # apache.rocketmq.v2.MessagingService (RocketMQ 5 clients)
    V2 + "QueryRoute": _on(PUB_OR_SUB, _V2_TOPIC),
    V2 + "Heartbeat": _none,
    V2 + "SendMessage": _on(Action.PUB, _v2_message_topics),
    V2 + "QueryAssignment": _on(Action.SUB, _V2_TOPIC, _V2_GROUP),
    V2 + "ReceiveMessage": _on(Action.SUB, _V2_QUEUE_TOPIC, _V2_GROUP),
    V2 + "AckMessage": _on(Action.SUB, _V2_TOPIC, _V2_GROUP),
    V2 + "ForwardMessageToDeadLetterQueue": _on(Action.SUB, _V2_TOPIC, _V2_GROUP),
    V2 + "PullMessage": _on(Action.SUB, _V2_QUEUE_TOPIC, _V2_GROUP),
    V2 + "UpdateOffset": _on(Action.UPDATE, _V2_QUEUE_TOPIC, _V2_GROUP),
    V2 + "GetOffset": _on(SUB_OR_GET, _V2_QUEUE_TOPIC, _V2_GROUP),
    V2 + "QueryOffset": _on(SUB_OR_GET, _V2_QUEUE_TOPIC),
    V2 + "EndTransaction": _on(Action.PUB, _V2_TOPIC),
    V2 + "Telemetry": _telemetry,
    V2 + "NotifyClientTermination": _none,
    V2 + "ChangeInvisibleDuration": _on(Action.SUB, _V2_TOPIC, _V2_GROUP),
    V2 + "RecallMessage": _on(Action.PUB, _V2_TOPIC),
    V2 + "SyncLiteSubscription": _on(Action.SUB, _V2_TOPIC, _V2_GROUP),
}

__all__ = ["ACTIONS", "CLUSTER", "Need", "Needs"]
