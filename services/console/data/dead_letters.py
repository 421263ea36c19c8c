"""The dead-letters page's data: a group's ``%DLQ%<group>``, paged and bounded, read with
BrowseQueue (commits nothing)."""

from __future__ import annotations

from dataclasses import dataclass

from services.console.data.limits import DLQ_PAGE_MAX
from services.console.data.messages import MessageView, quote, view
from tide.client import Admin, InvalidArgument, MessageQueue, NotFound, PullStatus, ReceivedMessage
from tide.dead_letters import DLQ_PREFIX, dlq_queues, original_topic
from tide.limits import PULL_MAX_MESSAGES


@dataclass(frozen=True)
class DeadLetter:
    message: MessageView
    original_topic: str
    # The msg id of the first attempt (DLQ_ORIGIN_MESSAGE_ID).
    original_msg_id: str
    # When the first attempt was stored (ORIGIN_STORE_TIME; 0 when not recorded).
    first_stored_ms: int
    # Deliveries it had before it was dead-lettered.
    attempts: int


@dataclass(frozen=True)
class DeadLetterPage:
    group: str
    letters: tuple[DeadLetter, ...]
    # Where the next page starts ("" on the last page): ``broker/queue id/offset``.
    next_cursor: str
    # Dead letters stored in all of the group's DLQ queues (max - min offsets).
    total: int


def dead_letter(message: ReceivedMessage) -> DeadLetter:
    stored = message.properties.get("ORIGIN_STORE_TIME", "")
    return DeadLetter(
        message=view(message),
        original_topic=original_topic(message),
        original_msg_id=message.properties.get("DLQ_ORIGIN_MESSAGE_ID", ""),
        first_stored_ms=int(stored) if stored.isdigit() else 0,
        attempts=message.reconsume_times,
    )


def list_page(
    admin: Admin, group: str, cursor: str = "", page_size: int = DLQ_PAGE_MAX
) -> DeadLetterPage:
    """Up to ``page_size`` dead letters of ``group`` from ``cursor`` (the first page when
    empty), each queue's oldest first."""
    group = group.strip()
    if not group:
        raise InvalidArgument("give the consumer group whose dead letters to list")
    if not 1 <= page_size <= DLQ_PAGE_MAX:
        raise InvalidArgument(f"page size is {page_size}; give 1..{DLQ_PAGE_MAX}")
    queues = dlq_queues(admin, group)
    start, offset = _parse_cursor(cursor, queues)
    letters: list[ReceivedMessage] = []
    next_cursor = ""
    for queue in queues[start:]:
        while True:
            wanted = min(PULL_MAX_MESSAGES, page_size - len(letters))
            if wanted == 0:
                next_cursor = _cursor(queue, offset)
                break
            result = admin.browse_queue(queue, offset, wanted)
            letters.extend(result.messages)
            if result.status is not PullStatus.FOUND or result.next_offset <= offset:
                break
            offset = result.next_offset
        if next_cursor:
            break
        offset = 0
    total = sum(_stored(admin, queue) for queue in queues)
    return DeadLetterPage(group, tuple(dead_letter(m) for m in letters), next_cursor, total)


def find(admin: Admin, group: str, msg_id: str) -> ReceivedMessage:
    """The dead letter with this msg id; NotFound when it is not one of the group's."""
    message = admin.query_id(msg_id)
    if message.queue.topic != DLQ_PREFIX + group:
        raise NotFound(
            f"message {quote(msg_id)} is in topic {message.queue.topic}, not in {DLQ_PREFIX}{group}"
        )
    return message


def _stored(admin: Admin, queue: MessageQueue) -> int:
    # BrowseQueue answers with the queue's offsets: GetQueueOffsets refuses a dead-letter
    # queue (it is not readable by consumers).
    result = admin.browse_queue(queue, 0, 1)
    return max(0, result.max_offset - result.min_offset)


def _cursor(queue: MessageQueue, offset: int) -> str:
    return f"{queue.broker_name}/{queue.queue_id}/{offset}"


def _parse_cursor(cursor: str, queues: list[MessageQueue]) -> tuple[int, int]:
    """(index of the cursor's queue in ``queues``, offset); (0, 0) for no cursor."""
    if not cursor:
        return 0, 0
    broker, _, rest = cursor.partition("/")
    queue_id, _, offset = rest.partition("/")
    if queue_id.isdigit() and offset.isdigit():
        for index, queue in enumerate(queues):
            if (queue.broker_name, queue.queue_id) == (broker, int(queue_id)):
                return index, int(offset)
    raise InvalidArgument(
        f"page cursor {quote(cursor)} names no queue of the group's dead-letter topic; "
        "start from the first page"
    )
