"""A consumer group's retry topic, created by its first heartbeat (RocketMQ's broker
creates ``%RETRY%<group>`` when a consumer of the group registers).

The topic has the group config's ``retry_queue_nums`` queues (1 by default) and is
registered with the name servers like any topic change (registration.py), so the
group's members find its route at their next rebalance and consume it beside their
topics. A slave creates nothing: it gets the master's topics (RocketMQ's
SlaveSynchronize).
"""

from __future__ import annotations

import logging

from services.storage.engine.message_store import MessageStore
from tide.files import ConfigLimitError
from tide.format import group_topic_error, retry_topic
from tide.naming import topic_error

log = logging.getLogger("tide.storage.retry_topics")


def ensure_retry_topic(store: MessageStore, group: str) -> bool:
    """Create ``%RETRY%<group>`` with the group config's ``retry_queue_nums`` queues
    when the store lacks it; True when it was created. A group whose retry topic would
    not be a valid topic name (too long) gets none: its send-backs are refused."""
    if group_topic_error(group) is not None:
        return False
    topic = retry_topic(group)
    if topic_error(topic) is not None or store.topics.get(topic) is not None:
        return False
    config, _ = store.groups.get_or_default(group)
    queue_nums = config.retry_queue_nums
    try:
        store.topics.ensure(topic, queue_nums)
    except ConfigLimitError as exc:  # the heartbeat itself must not fail for it
        log.error("%s not created: %s", topic, exc)
        return False
    log.info("created %s (%d queues) for the group's first heartbeat", topic, queue_nums)
    return True
