"""The system topics a store holds from its start, and the schedule topic's growth to a
delay level past the default table (both append paths: messages and record runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.storage.engine.errors import InvalidMessageError
from services.storage.engine.message_store import MessageStore
from services.storage.engine.topic_table import TopicConfig
from tests.services.storage.engine.conftest import StoreFactory, msg
from tide.format import RunWriter, encode_properties

SCHEDULE = "SCHEDULE_TOPIC_XXXX"
TIMER = "rmq_sys_wheel_timer"


def queue_nums(store: MessageStore, topic: str) -> tuple[int, int]:
    cfg = store.topics.get(topic)
    assert cfg is not None, topic
    return cfg.read_queue_nums, cfg.write_queue_nums


def test_a_new_store_holds_the_schedule_and_timer_topics(make_store: StoreFactory) -> None:
    store = make_store()
    assert queue_nums(store, SCHEDULE) == (18, 18)
    assert queue_nums(store, TIMER) == (1, 1)
    doc = json.loads(store.topics.path.read_text())["topicConfigTable"]
    assert doc[SCHEDULE]["perm"] == 6 and doc[TIMER]["writeQueueNums"] == 1


def test_an_existing_system_topic_is_kept_as_it_is(
    make_store: StoreFactory, store_dir: Path
) -> None:
    store = make_store()
    store.topics.upsert(TopicConfig(SCHEDULE, 20, 20, perm=4))
    store.close()
    reopened = make_store(store_dir=store_dir)
    cfg = reopened.topics.get(SCHEDULE)
    assert cfg is not None and (cfg.read_queue_nums, cfg.perm) == (20, 4)


def test_an_append_to_a_higher_level_grows_the_schedule_topic(make_store: StoreFactory) -> None:
    store = make_store()
    store.put([msg(SCHEDULE, 2), msg(SCHEDULE, 20), msg("T", 0)])
    assert queue_nums(store, SCHEDULE) == (21, 21)
    store.put([msg(SCHEDULE, 5)])  # lower: nothing changes
    assert queue_nums(store, SCHEDULE) == (21, 21)

    writer = RunWriter(bytes(8))
    writer.add(SCHEDULE, SCHEDULE.encode(), 40, b"b", encode_properties({"K": "V"}), 0, 0, 1)
    store.put_run([writer.getvalue()])
    assert queue_nums(store, SCHEDULE) == (41, 41)

    with pytest.raises(InvalidMessageError, match="outside the 64 write queues"):
        store.put([msg(SCHEDULE, 64)])
    assert queue_nums(store, SCHEDULE) == (41, 41)
    # Other topics keep their own queue count.
    with pytest.raises(InvalidMessageError, match="outside the 1 write queues"):
        store.put([msg(TIMER, 1)])
