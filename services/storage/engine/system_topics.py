"""The system topics a storage holds from its start (RocketMQ's TopicConfigManager).

* ``SCHEDULE_TOPIC_XXXX``: one queue per delay level (queue = level - 1), 18 for the
  default level table. A dispatch may run a longer table (``--message-delay-level``, up
  to 64 levels): an append to a higher queue grows the topic to that queue + 1.
* ``rmq_sys_wheel_timer``: the timer's one queue.
* ``RMQ_SYS_TRANS_HALF_TOPIC`` and ``RMQ_SYS_TRANS_OP_HALF_TOPIC``: one queue each, the
  half messages of transactions and the op records resolving them (issue 19).
* ``rmq_sys_REVIVE_LOG``: one queue, POP checkpoints and acks (issue 20, docs/pop.md).

They are ordinary topics to the store (appends, consume queues, registration); the
gateway keeps ordinary producers off them and listings leave them out
(tide.format.is_hidden_topic).
"""

from __future__ import annotations

import logging

from services.storage.engine.topic_table import TopicConfig, TopicTable
from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    MAX_DELAY_LEVELS,
    REVIVE_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)

log = logging.getLogger("tide.storage.config")

SCHEDULE_QUEUE_NUMS = len(DEFAULT_DELAY_LEVEL_TABLE.delays_ms)  # 18
SCHEDULE_MAX_QUEUE_NUMS = MAX_DELAY_LEVELS  # 64: the longest level table
TIMER_QUEUE_NUMS = 1
TRANSACTION_QUEUE_NUMS = 1  # RocketMQ's half and op topics have one queue each
REVIVE_QUEUE_NUMS = 1  # POP checkpoints and acks (issue 20): an ack follows its checkpoint


# The system topics every store keeps from its start, and their queues.
KEPT_TOPICS: tuple[tuple[str, int], ...] = (
    (SCHEDULE_TOPIC, SCHEDULE_QUEUE_NUMS),
    (TIMER_TOPIC, TIMER_QUEUE_NUMS),
    (TRANS_HALF_TOPIC, TRANSACTION_QUEUE_NUMS),
    (TRANS_OP_HALF_TOPIC, TRANSACTION_QUEUE_NUMS),
    (REVIVE_TOPIC, REVIVE_QUEUE_NUMS),
)


def ensure_system_topics(topics: TopicTable) -> None:
    """Create the schedule, timer and transaction topics when absent (an existing one is
    kept as it is: an operator may have changed it, or it grew)."""
    for topic, queue_nums in KEPT_TOPICS:
        topics.ensure(topic, queue_nums)


def write_queue_count(cfg: TopicConfig) -> int:
    """The queues an append may target: the schedule topic's every possible level."""
    if cfg.topic_name == SCHEDULE_TOPIC:
        return max(cfg.write_queue_nums, SCHEDULE_MAX_QUEUE_NUMS)
    return cfg.write_queue_nums


def grow_schedule_topic(topics: TopicTable, max_queue_id: int) -> None:
    """Give the schedule topic queue ``max_queue_id`` (read and write) if it lacks it,
    so that the level's consume queue is registered and served."""
    cfg = topics.get(SCHEDULE_TOPIC)
    wanted = min(max_queue_id + 1, SCHEDULE_MAX_QUEUE_NUMS)
    if cfg is None or (cfg.read_queue_nums >= wanted and cfg.write_queue_nums >= wanted):
        return
    grown = TopicConfig(
        SCHEDULE_TOPIC,
        max(cfg.read_queue_nums, wanted),
        max(cfg.write_queue_nums, wanted),
        cfg.perm,
        cfg.topic_filter_type,
        cfg.topic_sys_flag,
        cfg.order,
        cfg.attributes,
    )
    topics.upsert(grown)
    log.info("%s grew to %d queues (a delay level past the default table)", SCHEDULE_TOPIC, wanted)
