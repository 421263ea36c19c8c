"""The messages page's data: find messages by msg id, key, unique key (client message id)
or store time range on a topic, each search bounded; a message's body preview,
properties and place in the commitlog."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.console.data.bodies import BodyPreview, preview
from services.console.data.limits import (
    QUOTE_MAX_CHARS,
    SEARCH_MAX_BROWSE_CALLS,
    SEARCH_MAX_QUEUES,
    SEARCH_MAX_RESULTS,
)
from tide.client import Admin, InvalidArgument, NotFound, ReceivedMessage
from tide.limits import PULL_MAX_MESSAGES


@dataclass(frozen=True)
class Position:
    """Where a message is: its broker's commitlog and its topic's consume queue."""

    broker: str
    stored_topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size_bytes: int
    store_ms: int
    store_host: str
    born_ms: int
    born_host: str


@dataclass(frozen=True)
class MessageView:
    msg_id: str
    unique_key: str
    # The topic it was produced to (a retry copy's RETRY_TOPIC); ``position.stored_topic``
    # is where this copy is stored.
    topic: str
    tags: str
    keys: tuple[str, ...]
    # Every property as stored, sorted by name.
    properties: tuple[tuple[str, str], ...]
    reconsume_times: int
    position: Position
    body: bytes

    def preview(self) -> BodyPreview:
        return preview(self.body)

    def property(self, name: str) -> str:
        return dict(self.properties).get(name, "")


@dataclass(frozen=True)
class SearchResult:
    messages: tuple[MessageView, ...]
    # Non-empty when the search stopped at a limit: which one, for the page to say.
    truncated: str = ""


def view(message: ReceivedMessage) -> MessageView:
    return MessageView(
        msg_id=message.msg_id,
        unique_key=message.unique_key,
        topic=message.topic,
        tags=message.tags,
        keys=tuple(message.keys),
        properties=tuple(sorted(message.properties.items())),
        reconsume_times=message.reconsume_times,
        position=Position(
            broker=message.queue.broker_name,
            stored_topic=message.queue.topic,
            queue_id=message.queue.queue_id,
            queue_offset=message.queue_offset,
            commitlog_offset=message.physical_offset,
            size_bytes=message.size_bytes,
            store_ms=message.store_timestamp_ms,
            store_host=message.store_host,
            born_ms=message.born_timestamp_ms,
            born_host=message.born_host,
        ),
        body=message.body,
    )


def quote(text: str) -> str:
    """``text`` for an error message, at most QUOTE_MAX_CHARS characters of it."""
    if len(text) <= QUOTE_MAX_CHARS:
        return repr(text)
    return repr(text[:QUOTE_MAX_CHARS]) + f"... ({len(text)} characters)"


def by_id(admin: Admin, msg_id: str) -> SearchResult:
    """The message with this msg id (as a send returned it); none when no broker has it."""
    msg_id = msg_id.strip()
    if not msg_id:
        raise InvalidArgument("give a message id (the msg_id a send returned)")
    try:
        return SearchResult((view(admin.query_id(msg_id)),))
    except NotFound:
        return SearchResult(())


def by_key(admin: Admin, topic: str, key: str, begin_ms: int = 0, end_ms: int = 0) -> SearchResult:
    """Messages of ``topic`` with ``key`` among their keys, newest first, stored in
    [begin_ms, end_ms] (both 0: all time); at most SEARCH_MAX_RESULTS."""
    _check_range(begin_ms, end_ms, required=False)
    found = admin.query_key(
        _topic(topic), key.strip(), max_count=SEARCH_MAX_RESULTS, begin_ms=begin_ms, end_ms=end_ms
    )
    # The index answers at most max_count: as many means there may be more.
    return _result(found, len(found) >= SEARCH_MAX_RESULTS)


def by_unique_key(admin: Admin, topic: str, unique_key: str) -> SearchResult:
    """Messages of ``topic`` with this UNIQ_KEY: the message and copies of it kept there."""
    found = admin.query_unique_key(_topic(topic), unique_key.strip())
    return _result(found[:SEARCH_MAX_RESULTS], len(found) > SEARCH_MAX_RESULTS)


def by_time(admin: Admin, topic: str, begin_ms: int, end_ms: int) -> SearchResult:
    """Messages of ``topic`` stored in [begin_ms, end_ms), oldest first: SearchOffset of
    both ends on each queue, then BrowseQueue between them. Bounded by
    SEARCH_MAX_RESULTS messages, SEARCH_MAX_QUEUES queues and SEARCH_MAX_BROWSE_CALLS
    reads; ``truncated`` says which bound stopped it."""
    _check_range(begin_ms, end_ms, required=True)
    queues = admin.queues(_topic(topic))
    truncated = ""
    if len(queues) > SEARCH_MAX_QUEUES:
        truncated = f"only the first {SEARCH_MAX_QUEUES} of {len(queues)} queues were read"
        queues = queues[:SEARCH_MAX_QUEUES]
    found: list[ReceivedMessage] = []
    calls = 0
    for queue in queues:
        if len(found) > SEARCH_MAX_RESULTS:
            break
        if calls == SEARCH_MAX_BROWSE_CALLS:
            truncated = f"the search stopped after {calls} reads"
            break
        offset = admin.search_offset(queue, begin_ms)
        stop = admin.search_offset(queue, end_ms)
        while offset < stop and len(found) <= SEARCH_MAX_RESULTS:
            if calls == SEARCH_MAX_BROWSE_CALLS:
                truncated = f"the search stopped after {calls} reads"
                break
            calls += 1
            batch = admin.browse_queue(queue, offset, min(PULL_MAX_MESSAGES, stop - offset))
            found.extend(_stored_within(batch.messages, begin_ms, end_ms))
            if batch.next_offset <= offset:
                break
            offset = batch.next_offset
    found.sort(key=lambda m: (m.store_timestamp_ms, m.queue, m.queue_offset))
    if len(found) > SEARCH_MAX_RESULTS:
        truncated = f"only the first {SEARCH_MAX_RESULTS} messages are shown"
    return SearchResult(tuple(view(m) for m in found[:SEARCH_MAX_RESULTS]), truncated)


def _stored_within(
    messages: Iterable[ReceivedMessage], begin_ms: int, end_ms: int
) -> list[ReceivedMessage]:
    # SearchOffset answers by the consume queue's store times; the messages' own are
    # checked again so that the range is exact at its ends.
    return [m for m in messages if begin_ms <= m.store_timestamp_ms < end_ms]


def _result(found: Sequence[ReceivedMessage], more: bool) -> SearchResult:
    truncated = f"only the first {SEARCH_MAX_RESULTS} messages are shown" if more else ""
    return SearchResult(tuple(view(m) for m in found), truncated)


def _topic(topic: str) -> str:
    topic = topic.strip()
    if not topic:
        raise InvalidArgument("give the topic to search")
    return topic


def _check_range(begin_ms: int, end_ms: int, *, required: bool) -> None:
    if begin_ms < 0 or end_ms < 0:
        raise InvalidArgument(f"the time range {begin_ms}..{end_ms} ms has a negative end")
    if required and not end_ms:
        raise InvalidArgument("give the end of the time range")
    if end_ms and begin_ms >= end_ms:
        raise InvalidArgument(f"the range begins at {begin_ms} ms, not before its end {end_ms} ms")
