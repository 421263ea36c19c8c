"""Every bound on what a request may carry, in one place, and how errors quote input.

Each limit is one constant here, checked at the edge (the service that receives the
request) with a status naming it, honoured by every service behind it, and listed in
docs/operations.md "Limits" (tests/test_docs.py keeps that table in sync with
:data:`LIMITS`).

:func:`request_error` checks every string field's length and every repeated or map
field's count of a ``tide.v1`` request against :data:`FIELD_LIMITS` before a handler
sees it (tide.server's interceptor calls it for every RPC, streamed requests
included; the streams in :data:`IN_BAND_STREAMS` check each request in their handler
and answer in-band). Fields whose bound is a service option (a batch's message count) are
checked by their handler against that option, and message types a hot path checks
itself field by field (:data:`CHECKED_BY_HANDLER`) are not walked twice.

:func:`quote` (tide.quoting) is how an error message repeats input: cut to
:data:`QUOTE_MAX_CHARS` with the full length said, so no status message grows with the
request.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from tide.format import FIXED_BYTES_V4, MAX_DELAY_LEVELS
from tide.format import MAX_PROPERTIES_BYTES as PROPERTIES_MAX_BYTES
from tide.format import PRODUCER_ID_MAX_CHARS as FORMAT_PRODUCER_ID_MAX_CHARS
from tide.naming import CONSUMER_GROUP_MAX_CHARS, TAG_MAX_CHARS, TOPIC_MAX_BYTES
from tide.quoting import QUOTE_MAX_CHARS, quote

# Re-exported: one import for the limits, the properties' bound and quoting.
__all__ = ["PROPERTIES_MAX_BYTES", "QUOTE_MAX_CHARS", "quote"]

# -- names and addresses ----------------------------------------------------------------
NAME_MAX_CHARS = 64  # a cluster or broker name (RocketMQ's broker names are short)
ADDRESS_MAX_CHARS = 255  # HOST:PORT
CLIENT_ID_MAX_CHARS = 255  # a consumer group member's id
# -- messages -----------------------------------------------------------------------------
# PROPERTIES_MAX_BYTES (tide.format): a record stores its properties' length in 2 bytes
# (RocketMQ: Short.MAX_VALUE); tags, keys, the unique key and user properties count.
PROPERTIES_MAX_COUNT = 1_024  # user properties per message
KEYS_MAX_COUNT = 64  # keys per message; the dispatch indexes every one
KEY_MAX_CHARS = 1_024  # one key, on produce and in a key query alike
UNIQUE_KEY_MAX_CHARS = 128
SHARDING_KEY_MAX_CHARS = 1_024
# An idempotent producer's id (a property value and a JSON key; tide.format's layout).
PRODUCER_ID_MAX_CHARS = FORMAT_PRODUCER_ID_MAX_CHARS
MSG_ID_MAX_CHARS = 64  # an offset message id is 32 (IPv4) or 56 (IPv6) hex digits
# The highest --max-message-body-bytes of any service (gateway and storage): a record of
# that body, with the longest topic and properties, still fits one gRPC message (64 MiB)
# with room for a Pull answer's framing.
MESSAGE_BODY_MAX_BYTES = 32 * 1024 * 1024
# A Produce call or ProduceStream request, serialized: the gateway checks it first (its
# server takes up to APPEND_MAX_BYTES, so one a little larger is told this limit rather
# than gRPC's own error); 64 MiB, what tide.client sends at most.
PRODUCE_MAX_BYTES = 64 * 1024 * 1024
# Messages of one Produce: the highest the gateway's --max-produce-messages may be.
PRODUCE_MESSAGES_MAX = 100_000
# How many bytes more a produced message takes as a record in the gateway's Append than
# in the Produce request: the record's fixed fields with an IPv6 born host (103), the
# UNIQ_KEY property the gateway adds (42), the names around tags and keys (12), less the
# framing a message has in the request (152 at most; tests/services/gateway checks it).
RECORD_OVERHEAD_MAX_BYTES = 192
# The largest Append a storage takes (its gRPC receive limit, and the gateway's send
# limit to it): the records of any Produce the gateway accepts fit, so a request within
# PRODUCE_MAX_BYTES is never refused on the way by gRPC.
APPEND_MAX_BYTES = PRODUCE_MAX_BYTES + PRODUCE_MESSAGES_MAX * RECORD_OVERHEAD_MAX_BYTES
# The largest record a store can hold: the fixed fields with two IPv6 hosts (+12 bytes
# each), the longest body, topic and properties. Whatever reads records whole honours it
# (the Tail follower's and a commitlog's bound on one record), whatever a storage's own
# --max-message-body-bytes (a slave holds what its master took; a store keeps records
# taken under an earlier setting).
RECORD_MAX_BYTES = (
    FIXED_BYTES_V4 + 2 * 12 + MESSAGE_BODY_MAX_BYTES + TOPIC_MAX_BYTES + PROPERTIES_MAX_BYTES
)
# -- subscriptions ------------------------------------------------------------------------
EXPRESSION_MAX_CHARS = 4_096
EXPRESSION_MAX_TAGS = 256  # distinct tags in one expression (and tag codes per lookup)
SUBSCRIPTIONS_MAX_COUNT = 1_024  # per heartbeat
# -- counts of other repeated fields ------------------------------------------------------
PULL_MAX_MESSAGES = 1_024  # one Pull; and the consume queue entries one lookup returns
READ_MAX_POSITIONS = 1_024  # positions or spans in one storage Read
WATCH_MAX_TOPICS = 1_024  # topics one dispatch WatchArrivals names
BROKER_NAMES_MAX_COUNT = 1_024  # brokers one CreateTopic names
QUEUE_NUMS_MAX = 1_024  # read/write queues of a topic
RETRY_DELAYS_MAX_COUNT = MAX_DELAY_LEVELS  # a CUSTOMIZED retry policy's delays (a level table)
LOCK_QUEUES_MAX_COUNT = 1_024  # queues one LockQueues / UnlockQueues names (fifo, issue 19)
# -- POP consumption (issue 20, docs/pop.md) ----------------------------------------------
RECEIPT_HANDLE_MAX_CHARS = 512  # a receipt handle the gateway gave out is well under it
ACK_ENTRIES_MAX_COUNT = 1_024  # receipt handles one Ack names (a Receive's most, and more)
# A received message's invisible duration, as RocketMQ 5's proxy bounds it: at least 10 s
# (a shorter one redelivers messages still being consumed), at most 12 h (the revive
# service holds the checkpoint that long).
POP_INVISIBLE_MIN_MS = 10_000
POP_INVISIBLE_MAX_MS = 12 * 3_600_000
# -- broker metadata (slave sync, delivery progress) ---------------------------------------
# The metadata files one GetMetadata returns, together (a master answers RESOURCE_EXHAUSTED
# past it, naming each file's size): the topic and offset tables at their own limits fit.
METADATA_MAX_BYTES = 64 * 1024 * 1024
# A SaveDeliveryProgress's delayOffset.json (64 levels of int64 offsets need under 3 KiB).
DELAY_OFFSETS_MAX_BYTES = 64 * 1024
# A SaveDeliveryProgress's transactionChecks.json (tx, issue 19): one entry per half being
# checked, at most --transaction-halves-max (100,000 by default, at most 1,000,000) of
# about 20 bytes each.
TRANSACTION_CHECKS_MAX_BYTES = 32 * 1024 * 1024
# -- users and ACLs (acl, issue 22; docs/security.md) ----------------------------------
AUTH_KEY_MAX_CHARS = 256  # an access key (128 characters at most are accepted) or secret key
AUTH_WORD_MAX_CHARS = 64  # an operation, user type, decision, action or source range (CIDR)
AUTH_RESOURCE_MAX_CHARS = 300  # "Topic:" / "Group:" and a name (a topic is 255 bytes at most)
AUTH_ENTRIES_MAX_COUNT = 1_000  # policy entries per user (tide.format's POLICY_ENTRIES_MAX)
AUTH_LIST_MAX_COUNT = 64  # actions, or source address ranges, of one policy entry

# Every named limit above (and the name rules') by name: the docs table lists each.
LIMITS: dict[str, int] = {
    "TOPIC_MAX_BYTES": TOPIC_MAX_BYTES,
    "CONSUMER_GROUP_MAX_CHARS": CONSUMER_GROUP_MAX_CHARS,
    "NAME_MAX_CHARS": NAME_MAX_CHARS,
    "ADDRESS_MAX_CHARS": ADDRESS_MAX_CHARS,
    "CLIENT_ID_MAX_CHARS": CLIENT_ID_MAX_CHARS,
    "PRODUCER_ID_MAX_CHARS": PRODUCER_ID_MAX_CHARS,
    "PROPERTIES_MAX_BYTES": PROPERTIES_MAX_BYTES,
    "PROPERTIES_MAX_COUNT": PROPERTIES_MAX_COUNT,
    "TAG_MAX_CHARS": TAG_MAX_CHARS,
    "KEYS_MAX_COUNT": KEYS_MAX_COUNT,
    "KEY_MAX_CHARS": KEY_MAX_CHARS,
    "UNIQUE_KEY_MAX_CHARS": UNIQUE_KEY_MAX_CHARS,
    "SHARDING_KEY_MAX_CHARS": SHARDING_KEY_MAX_CHARS,
    "MSG_ID_MAX_CHARS": MSG_ID_MAX_CHARS,
    "MESSAGE_BODY_MAX_BYTES": MESSAGE_BODY_MAX_BYTES,
    "RECORD_MAX_BYTES": RECORD_MAX_BYTES,
    "PRODUCE_MAX_BYTES": PRODUCE_MAX_BYTES,
    "PRODUCE_MESSAGES_MAX": PRODUCE_MESSAGES_MAX,
    "RECORD_OVERHEAD_MAX_BYTES": RECORD_OVERHEAD_MAX_BYTES,
    "APPEND_MAX_BYTES": APPEND_MAX_BYTES,
    "EXPRESSION_MAX_CHARS": EXPRESSION_MAX_CHARS,
    "EXPRESSION_MAX_TAGS": EXPRESSION_MAX_TAGS,
    "SUBSCRIPTIONS_MAX_COUNT": SUBSCRIPTIONS_MAX_COUNT,
    "PULL_MAX_MESSAGES": PULL_MAX_MESSAGES,
    "READ_MAX_POSITIONS": READ_MAX_POSITIONS,
    "WATCH_MAX_TOPICS": WATCH_MAX_TOPICS,
    "BROKER_NAMES_MAX_COUNT": BROKER_NAMES_MAX_COUNT,
    "QUEUE_NUMS_MAX": QUEUE_NUMS_MAX,
    "RETRY_DELAYS_MAX_COUNT": RETRY_DELAYS_MAX_COUNT,
    "LOCK_QUEUES_MAX_COUNT": LOCK_QUEUES_MAX_COUNT,
    "RECEIPT_HANDLE_MAX_CHARS": RECEIPT_HANDLE_MAX_CHARS,
    "ACK_ENTRIES_MAX_COUNT": ACK_ENTRIES_MAX_COUNT,
    "POP_INVISIBLE_MIN_MS": POP_INVISIBLE_MIN_MS,
    "POP_INVISIBLE_MAX_MS": POP_INVISIBLE_MAX_MS,
    "METADATA_MAX_BYTES": METADATA_MAX_BYTES,
    "DELAY_OFFSETS_MAX_BYTES": DELAY_OFFSETS_MAX_BYTES,
    "TRANSACTION_CHECKS_MAX_BYTES": TRANSACTION_CHECKS_MAX_BYTES,
    "AUTH_KEY_MAX_CHARS": AUTH_KEY_MAX_CHARS,
    "AUTH_WORD_MAX_CHARS": AUTH_WORD_MAX_CHARS,
    "AUTH_RESOURCE_MAX_CHARS": AUTH_RESOURCE_MAX_CHARS,
    "AUTH_ENTRIES_MAX_COUNT": AUTH_ENTRIES_MAX_COUNT,
    "AUTH_LIST_MAX_COUNT": AUTH_LIST_MAX_COUNT,
}

# A field bounded by a service option, checked by its handler (the option names it).
BY_OPTION = "option"

# Field (full proto name) -> the limit's name in LIMITS (string: characters, repeated
# or map: entries), or BY_OPTION. tests/test_limits.py fails for a request field of a
# string, repeated or map type missing here: a new field needs a bound.
FIELD_LIMITS: dict[str, str] = {
    # storage
    "tide.v1.Message.topic": "TOPIC_MAX_BYTES",
    "tide.v1.Message.tags": "TAG_MAX_CHARS",
    "tide.v1.Message.keys": "KEYS_MAX_COUNT",
    "tide.v1.Message.properties": "PROPERTIES_MAX_COUNT",
    "tide.v1.Message.born_host": "ADDRESS_MAX_CHARS",
    "tide.v1.AppendRequest.messages": BY_OPTION,  # --max-batch-messages
    "tide.v1.AppendRequest.records": BY_OPTION,  # --max-batch-messages (records)
    "tide.v1.AppendRequest.producer_id": "PRODUCER_ID_MAX_CHARS",
    "tide.v1.AppendRequest.producer_runs": BY_OPTION,  # one per records entry (checked)
    "tide.v1.ProducerRun.producer_id": "PRODUCER_ID_MAX_CHARS",
    "tide.v1.ReadRequest.positions": "READ_MAX_POSITIONS",
    "tide.v1.ReadRequest.spans": "READ_MAX_POSITIONS",
    "tide.v1.ReplicateRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.TopicConfig.topic_name": "TOPIC_MAX_BYTES",
    "tide.v1.DeleteTopicRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.CommitOffsetRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.CommitOffsetRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.GetOffsetRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.GetOffsetRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.Subscription.topic": "TOPIC_MAX_BYTES",
    "tide.v1.Subscription.expression": "EXPRESSION_MAX_CHARS",
    "tide.v1.ConsumerHeartbeatRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.ConsumerHeartbeatRequest.client_id": "CLIENT_ID_MAX_CHARS",
    "tide.v1.ConsumerHeartbeatRequest.subscriptions": "SUBSCRIPTIONS_MAX_COUNT",
    "tide.v1.UnregisterConsumerRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.UnregisterConsumerRequest.client_id": "CLIENT_ID_MAX_CHARS",
    "tide.v1.GetConsumersRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    # dispatch
    "tide.v1.GetQueueEntriesRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.GetQueueEntriesRequest.tag_codes": "EXPRESSION_MAX_TAGS",
    "tide.v1.GetQueueOffsetsRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.SearchOffsetRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.QueryIndexRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.QueryIndexRequest.key": "KEY_MAX_CHARS",
    "tide.v1.WatchArrivalsRequest.topics": "WATCH_MAX_TOPICS",
    # name server
    "tide.v1.RegisterBrokerRequest.cluster_name": "NAME_MAX_CHARS",
    "tide.v1.RegisterBrokerRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.RegisterBrokerRequest.topics": BY_OPTION,  # --max-topics-per-registration
    "tide.v1.BrokerAddress.storage": "ADDRESS_MAX_CHARS",
    "tide.v1.BrokerAddress.dispatch": "ADDRESS_MAX_CHARS",
    "tide.v1.UnregisterBrokerRequest.cluster_name": "NAME_MAX_CHARS",
    "tide.v1.UnregisterBrokerRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.UnregisterBrokerRequest.storage_address": "ADDRESS_MAX_CHARS",
    "tide.v1.GetTopicRouteRequest.topic": "TOPIC_MAX_BYTES",
    # gateway
    "tide.v1.ProduceRequest.messages": BY_OPTION,  # --max-batch-messages
    "tide.v1.ProduceRequest.producer_id": "PRODUCER_ID_MAX_CHARS",
    "tide.v1.ProduceMessage.topic": "TOPIC_MAX_BYTES",
    "tide.v1.ProduceMessage.tags": "TAG_MAX_CHARS",
    "tide.v1.ProduceMessage.keys": "KEYS_MAX_COUNT",
    "tide.v1.ProduceMessage.properties": "PROPERTIES_MAX_COUNT",
    "tide.v1.ProduceMessage.sharding_key": "SHARDING_KEY_MAX_CHARS",
    "tide.v1.ProduceMessage.unique_key": "UNIQUE_KEY_MAX_CHARS",
    "tide.v1.ProduceMessage.producer_group": "CONSUMER_GROUP_MAX_CHARS",  # tx (issue 19)
    "tide.v1.ProduceMessage.transaction_id": "UNIQUE_KEY_MAX_CHARS",
    "tide.v1.QueueRef.broker_name": "NAME_MAX_CHARS",
    "tide.v1.PullRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.PullRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.PullRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.PullRequest.expression": "EXPRESSION_MAX_CHARS",
    "tide.v1.KeyQuery.topic": "TOPIC_MAX_BYTES",
    "tide.v1.KeyQuery.key": "KEY_MAX_CHARS",
    "tide.v1.UniqueKeyQuery.topic": "TOPIC_MAX_BYTES",
    "tide.v1.UniqueKeyQuery.unique_key": "UNIQUE_KEY_MAX_CHARS",
    "tide.v1.QueryMessageRequest.msg_id": "MSG_ID_MAX_CHARS",
    "tide.v1.QueueOffsetsRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.QueueOffsetsRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.SearchQueueOffsetRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.SearchQueueOffsetRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.CommitConsumerOffsetRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.CommitConsumerOffsetRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.CommitConsumerOffsetRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.GetConsumerOffsetRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.GetConsumerOffsetRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.GetConsumerOffsetRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.CreateTopicRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.CreateTopicRequest.broker_names": "BROKER_NAMES_MAX_COUNT",
    "tide.v1.CreateTopicRequest.cluster_name": "NAME_MAX_CHARS",
    "tide.v1.CreateTopicRequest.message_type": "NAME_MAX_CHARS",
    # delivery (issue 18): topic attributes, group configs, send-back, recall
    "tide.v1.TopicConfig.attributes": "PROPERTIES_MAX_COUNT",
    "tide.v1.GroupConfig.group_name": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.GroupConfig.attributes": "PROPERTIES_MAX_COUNT",
    "tide.v1.RetryPolicy.delays_ms": "RETRY_DELAYS_MAX_COUNT",
    "tide.v1.GetGroupRequest.group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.DeleteGroupRequest.group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.SendBackRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.SendBackRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.SendBackRequest.msg_id": "MSG_ID_MAX_CHARS",
    "tide.v1.RecallMessageRequest.msg_id": "MSG_ID_MAX_CHARS",
    "tide.v1.CreateGroupRequest.broker_names": "BROKER_NAMES_MAX_COUNT",
    "tide.v1.CreateGroupRequest.cluster_name": "NAME_MAX_CHARS",
    # transactions (issue 19, tx)
    "tide.v1.EndTransactionRequest.producer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.EndTransactionRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.EndTransactionRequest.msg_id": "MSG_ID_MAX_CHARS",
    "tide.v1.EndTransactionRequest.transaction_id": "UNIQUE_KEY_MAX_CHARS",
    "tide.v1.TransactionChecksRequest.producer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.ListTransactionsRequest.producer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.DispatchEndTransactionRequest.producer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.DispatchEndTransactionRequest.transaction_id": "UNIQUE_KEY_MAX_CHARS",
    "tide.v1.TakeTransactionChecksRequest.producer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.ListHalfMessagesRequest.producer_group": "CONSUMER_GROUP_MAX_CHARS",
    # fifo (issue 19): queue locks, the puller's client id
    "tide.v1.PullRequest.client_id": "CLIENT_ID_MAX_CHARS",
    # pop (issue 20)
    "tide.v1.ReceiveRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.ReceiveRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.ReceiveRequest.expression": "EXPRESSION_MAX_CHARS",
    "tide.v1.ReceiveRequest.client_id": "CLIENT_ID_MAX_CHARS",
    "tide.v1.AckRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.AckRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.AckRequest.entries": "ACK_ENTRIES_MAX_COUNT",
    "tide.v1.AckEntry.receipt_handle": "RECEIPT_HANDLE_MAX_CHARS",
    "tide.v1.ChangeInvisibleDurationRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.ChangeInvisibleDurationRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.ChangeInvisibleDurationRequest.receipt_handle": "RECEIPT_HANDLE_MAX_CHARS",
    "tide.v1.ForwardToDeadLetterRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.ForwardToDeadLetterRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.ForwardToDeadLetterRequest.receipt_handle": "RECEIPT_HANDLE_MAX_CHARS",
    "tide.v1.GetGroupLagRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.GetGroupLagRequest.topic": "TOPIC_MAX_BYTES",
    # pop (issue 20): the dispatch's POP calls (the gateway's, checked again there)
    "tide.v1.PopMessagesRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.PopMessagesRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.PopMessagesRequest.queue_ids": "QUEUE_NUMS_MAX",
    "tide.v1.PopMessagesRequest.tags": "EXPRESSION_MAX_TAGS",
    "tide.v1.PopAckRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.PopAckRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.PopAckRequest.entries": "ACK_ENTRIES_MAX_COUNT",
    "tide.v1.PopChangeInvisibleRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.PopChangeInvisibleRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.PopDeadLetterRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.PopDeadLetterRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.GetPopLagRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.GetPopLagRequest.topic": "TOPIC_MAX_BYTES",
    "tide.v1.GetPopLagRequest.queue_ids": "QUEUE_NUMS_MAX",
    "tide.v1.LockedQueue.topic": "TOPIC_MAX_BYTES",
    "tide.v1.QueueLockRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.QueueLockRequest.client_id": "CLIENT_ID_MAX_CHARS",
    "tide.v1.QueueLockRequest.queues": "LOCK_QUEUES_MAX_COUNT",
    "tide.v1.BrokerQueueLockRequest.broker_name": "NAME_MAX_CHARS",
    "tide.v1.GetQueueLocksRequest.consumer_group": "CONSUMER_GROUP_MAX_CHARS",
    "tide.v1.GetQueueLocksRequest.topic": "TOPIC_MAX_BYTES",
    # acl (issue 22)
    "tide.v1.AuthUser.access_key": "AUTH_KEY_MAX_CHARS",
    "tide.v1.AuthUser.secret_key": "AUTH_KEY_MAX_CHARS",
    "tide.v1.AuthUser.user_type": "AUTH_WORD_MAX_CHARS",
    "tide.v1.AuthAcl.access_key": "AUTH_KEY_MAX_CHARS",
    "tide.v1.AuthAcl.entries": "AUTH_ENTRIES_MAX_COUNT",
    "tide.v1.AuthPolicyEntry.resource": "AUTH_RESOURCE_MAX_CHARS",
    "tide.v1.AuthPolicyEntry.actions": "AUTH_LIST_MAX_COUNT",
    "tide.v1.AuthPolicyEntry.decision": "AUTH_WORD_MAX_CHARS",
    "tide.v1.AuthPolicyEntry.source_ips": "AUTH_LIST_MAX_COUNT",
    "tide.v1.ChangeAuthRequest.operation": "AUTH_WORD_MAX_CHARS",
    "tide.v1.ListAclsRequest.access_key": "AUTH_KEY_MAX_CHARS",
}

# Streams that answer each request in-band (error_code, error_message) and go on: their
# handlers check each request with request_error (tide.server's RequestStreams, the
# gateway's produce), so a request past a bound is answered like any other bad request
# instead of ending the stream.
IN_BAND_STREAMS = frozenset(
    {
        "/tide.v1.Storage/AppendStream",
        "/tide.v1.Storage/ReadStream",
        "/tide.v1.Dispatch/GetQueueEntriesStream",
        "/tide.v1.Gateway/ProduceStream",
    }
)

# Elements of repeated fields of these types are checked by their handler (the produce
# and append paths check each message's fields first, cheaply, on every call).
CHECKED_BY_HANDLER = frozenset({"tide.v1.ProduceMessage"})

# The elements of a repeated string field and a map's keys and values: their own bound.
_ELEMENT_LIMITS: dict[str, str] = {
    "tide.v1.Message.keys": "KEY_MAX_CHARS",
    "tide.v1.ProduceMessage.keys": "KEY_MAX_CHARS",
    "tide.v1.Message.properties": "PROPERTIES_MAX_BYTES",
    "tide.v1.ProduceMessage.properties": "PROPERTIES_MAX_BYTES",
    "tide.v1.WatchArrivalsRequest.topics": "TOPIC_MAX_BYTES",
    "tide.v1.CreateTopicRequest.broker_names": "NAME_MAX_CHARS",
    "tide.v1.CreateGroupRequest.broker_names": "NAME_MAX_CHARS",
    "tide.v1.TopicConfig.attributes": "PROPERTIES_MAX_BYTES",
    "tide.v1.GroupConfig.attributes": "PROPERTIES_MAX_BYTES",
    "tide.v1.PopMessagesRequest.tags": "TAG_MAX_CHARS",
    "tide.v1.AuthPolicyEntry.actions": "AUTH_WORD_MAX_CHARS",
    "tide.v1.AuthPolicyEntry.source_ips": "AUTH_WORD_MAX_CHARS",
}


def limit_text(name: str) -> str:
    """A limit as an error message names it: ``"127 bytes (TOPIC_MAX_BYTES)"``,
    ``"64 (KEYS_MAX_COUNT)"``."""
    unit = {"BYTES": " bytes", "CHARS": " characters"}.get(name.rpartition("_")[2], "")
    return f"{LIMITS[name]}{unit} ({name})"


def request_error(request: object) -> str | None:
    """The first string too long or repeated field too long in a ``tide.v1`` request,
    said with the field's path and the limit's name; None when every one is in bounds
    (and for anything else: a method may take raw bytes)."""
    if not isinstance(request, Message) or not _walked(request.DESCRIPTOR):
        return None
    return _message_error(request)


def message_error(message: Message, path: str) -> str | None:
    """:func:`request_error` for one message of a type in :data:`CHECKED_BY_HANDLER`
    (its handler calls this before any other check); ``path`` prefixes field names."""
    error = _message_error(message)
    return None if error is None else f"{path}{error}"


# What a set field needs (_plan): nothing, a length check, a walk of its message, a
# check of its entries.
_SKIP, _STRING, _MESSAGE, _REPEATED = range(4)


@cache
def _plan(field: FieldDescriptor) -> tuple[int, int]:
    """(what to do, the length limit of a string field) for ``field``: worked out once
    per field, as this runs per request and per produced message."""
    if field.is_repeated:
        return _REPEATED, 0
    if field.type == FieldDescriptor.TYPE_STRING:
        return _STRING, LIMITS[FIELD_LIMITS[field.full_name]]
    if field.type == FieldDescriptor.TYPE_MESSAGE and _walked(field.message_type):
        return _MESSAGE, 0
    return _SKIP, 0


def _message_error(message: Message) -> str | None:
    """The first field out of bounds, its path relative to ``message``. Paths are
    written only for a field out of bounds (prefixed on the way out of nested messages):
    writing them for every field in bounds was most of this check's cost."""
    for field, value in message.ListFields():  # only the fields set: cheap
        kind, limit = _plan(field)
        if kind == _STRING:
            if len(value) > limit:
                return _too_long(field.name, value, FIELD_LIMITS[field.full_name])
        elif kind == _MESSAGE:
            error = _message_error(value)
            if error is not None:
                return f"{field.name}.{error}"
        elif kind == _REPEATED:
            error = _repeated_error(field, value)
            if error is not None:
                return error
    return None


def _repeated_error(field: FieldDescriptor, items: Any) -> str | None:
    """``items``: the repeated container or the map of ``field``."""
    name = FIELD_LIMITS[field.full_name]
    if name != BY_OPTION and len(items) > LIMITS[name]:
        return f"{field.name} has {len(items)} entries; the limit is {limit_text(name)}"
    element = _ELEMENT_LIMITS.get(field.full_name)
    if _is_map(field):
        bound = element or name
        limit = LIMITS[bound]
        for key, item in items.items():
            if len(key) > limit:
                return _too_long(f"{field.name} key", key, bound)
            if isinstance(item, str) and len(item) > limit:
                return _too_long(f"{field.name}[{quote(key)}]", item, bound)
        return None
    if field.type == FieldDescriptor.TYPE_STRING and element is not None:
        limit = LIMITS[element]
        for index, item in enumerate(items):
            if len(item) > limit:
                return _too_long(f"{field.name}[{index}]", item, element)
        return None
    if field.type == FieldDescriptor.TYPE_MESSAGE and _walked(field.message_type):
        for index, item in enumerate(items):
            error = _message_error(item)
            if error is not None:
                return f"{field.name}[{index}].{error}"
    return None


def _too_long(where: str, value: str, name: str) -> str:
    return f"{where} is {len(value)} characters ({quote(value)}); the limit is {limit_text(name)}"


@cache
def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return entry is not None and bool(entry.GetOptions().map_entry)


@cache
def _walked(descriptor: Descriptor | None) -> bool:
    """Whether a message of this type can hold a string or a repeated field to check
    (positions and spans, say, hold only numbers: not walked element by element)."""
    if descriptor is None or not descriptor.full_name.startswith("tide.v1."):
        return False
    if descriptor.full_name in CHECKED_BY_HANDLER:
        return False
    return _has_bounded_fields(descriptor, frozenset())


def _has_bounded_fields(descriptor: Descriptor | None, seen: frozenset[str]) -> bool:
    if descriptor is None or descriptor.full_name in seen:
        return False
    for field in descriptor.fields:
        if field.is_repeated or field.type == (FieldDescriptor.TYPE_STRING):
            return True
        if field.type == FieldDescriptor.TYPE_MESSAGE and _has_bounded_fields(
            field.message_type, seen | {descriptor.full_name}
        ):
            return True
    return False
