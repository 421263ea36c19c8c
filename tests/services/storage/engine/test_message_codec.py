"""Validation of producer messages: clear errors, and a rejected batch writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from services.storage.engine.errors import (
    InvalidMessageError,
    NotWritableError,
    StoreError,
    TopicNotFoundError,
)
from services.storage.engine.message_codec import MessageInput
from services.storage.engine.message_store import MessageStore
from services.storage.engine.system_topics import KEPT_TOPICS
from services.storage.engine.topic_table import TopicConfig
from tests.services.storage.engine.conftest import (
    FIXED_RECORD_BYTES_V4,
    MAX_BODY_BYTES,
    StoreFactory,
    msg,
    read_records,
)
from tide.limits import KEYS_MAX_COUNT

MAX_PROPERTIES_BYTES = 32_767


def snapshot(store: MessageStore) -> tuple[int, dict[tuple[str, int], int], list[str], int]:
    status = store.status()
    return (
        status.max_offset,
        dict(store.commitlog.offsets.next_offsets),
        [t.topic_name for t in store.topics.list()],
        len(read_records(store)),
    )


def assert_rejected(
    store: MessageStore,
    bad: MessageInput,
    error: type[StoreError],
    match: str,
    *,
    index: int | None = 1,
) -> None:
    """The batch [good, bad, good] fails with ``error`` and changes nothing."""
    before = snapshot(store)
    batch = [msg("T", 0, b"good"), bad, msg("T", 1, b"good")]
    with pytest.raises(error, match=match) as info:
        store.put(batch)
    if index is not None:
        assert str(info.value).startswith(f"message[{index}]: "), str(info.value)
    assert snapshot(store) == before
    # The store still takes writes, and the queue offsets went on where they were.
    assert store.put([msg("T", 0, b"after")]).batch.positions[0][2] == before[1][("T", 0)]


@pytest.fixture
def store(make_store: StoreFactory) -> MessageStore:
    store = make_store()
    store.put([msg("T", 0, b"seed"), msg("T", 1, b"seed")])
    return store


@pytest.mark.parametrize(
    ("topic", "match"),
    [
        ("bad topic", r"contains ' ' at index 3"),
        ("a/b", r"contains '/' at index 1"),
        ("caf\u00e9", r"contains '\u00e9' at index 3"),
        ("", r"topic is empty"),
        ("x" * 128, r"128 bytes in UTF-8; the limit is 127 bytes"),
    ],
)
def test_bad_topic_is_rejected(store: MessageStore, topic: str, match: str) -> None:
    assert_rejected(store, msg(topic), InvalidMessageError, match, index=None)
    assert store.topics.get(topic) is None


def test_longest_topic_is_accepted(store: MessageStore) -> None:
    topic = "%|_-" + "a" * 123
    position = store.put([msg(topic, 0, b"x")]).batch.positions[0]
    record = store.commitlog.read_record(position[0], position[1])
    assert record.topic == topic
    assert position[1] == FIXED_RECORD_BYTES_V4 + 1 + 127


def test_body_over_the_limit_is_rejected(store: MessageStore) -> None:
    assert_rejected(
        store,
        msg(body=b"x" * (MAX_BODY_BYTES + 1)),
        InvalidMessageError,
        rf"body is {MAX_BODY_BYTES + 1} bytes; the limit is {MAX_BODY_BYTES}",
    )
    position = store.put([msg(body=b"y" * MAX_BODY_BYTES)]).batch.positions[0]
    assert store.commitlog.read_record(position[0], position[1]).body == b"y" * MAX_BODY_BYTES


def test_properties_over_the_limit_are_rejected(store: MessageStore) -> None:
    # name \x01 value \x02: 3 bytes of overhead around a one-letter name.
    at_limit = {"p": "v" * (MAX_PROPERTIES_BYTES - 3)}
    over = {"p": "v" * (MAX_PROPERTIES_BYTES - 2)}
    assert_rejected(
        store,
        msg(properties=over),
        InvalidMessageError,
        rf"properties encode to {MAX_PROPERTIES_BYTES + 1} bytes; the limit is "
        rf"{MAX_PROPERTIES_BYTES}",
    )
    # Multi-byte characters count in bytes, and TAGS/KEYS count too.
    assert_rejected(
        store,
        msg(properties={"p": "\u00e9" * 16_000}, tags="t" * 800),
        InvalidMessageError,
        r"properties encode to \d+ bytes",
    )
    position = store.put([msg(properties=at_limit)]).batch.positions[0]
    assert store.commitlog.read_record(position[0], position[1]).properties == at_limit


@pytest.mark.parametrize(
    "fields",
    [
        {"properties": {"na\x01me": "v"}},
        {"properties": {"name": "val\x02ue"}},
        {"properties": {"na\x02me": "v"}},
        {"properties": {"name": "v\x01"}},
        {"keys": ["ok", "k\x02"]},
        {"keys": ["k\x01"]},
    ],
)
def test_reserved_separator_characters_are_rejected(
    store: MessageStore, fields: dict[str, Any]
) -> None:
    assert_rejected(store, msg(**fields), InvalidMessageError, r"reserved \\x01 or \\x02")


@pytest.mark.parametrize("tags", ["A||B", "A|B", "*", "tag\x01", "\x02", " A", "   "])
def test_tags_no_subscription_can_select_are_rejected(store: MessageStore, tags: str) -> None:
    """The gateway's produce rule (tide.naming.tag_error) holds for direct appends too."""
    assert_rejected(store, msg(tags=tags), InvalidMessageError, r"tag ")


def test_more_keys_than_the_index_takes_are_rejected(store: MessageStore) -> None:
    """Every key is indexed (the dispatch takes KEYS_MAX_COUNT): more are refused."""
    keys = [f"k{index}" for index in range(KEYS_MAX_COUNT + 1)]
    assert_rejected(store, msg(keys=keys), InvalidMessageError, r"the limit is 64 \(KEYS_MAX")
    store.put([msg(keys=keys[:KEYS_MAX_COUNT])])


@pytest.mark.parametrize("keys", [["a b"], ["ok", ""], [""], ["k", " "], ["a", "b c", "d"]])
def test_key_with_a_space_or_empty_key_is_rejected(store: MessageStore, keys: list[str]) -> None:
    assert_rejected(
        store, msg(keys=keys), InvalidMessageError, r"a key is empty or contains a space"
    )


def test_empty_property_name_is_rejected(store: MessageStore) -> None:
    """``property_error`` says an empty name is invalid; the encoder must apply it."""
    assert_rejected(
        store, msg(properties={"": "value"}), InvalidMessageError, r"property name is empty"
    )


@pytest.mark.parametrize("queue_id", [-1, 4, 5, 1 << 31])
def test_queue_id_out_of_range_is_rejected(store: MessageStore, queue_id: int) -> None:
    assert_rejected(
        store,
        msg(queue_id=queue_id),
        InvalidMessageError,
        rf"queue_id {queue_id} is outside the 4 write queues of topic 'T' \(0\.\.3\)",
    )


@pytest.mark.parametrize("sys_flag", [1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 11, -1])
def test_reserved_sys_flag_bits_are_rejected(store: MessageStore, sys_flag: int) -> None:
    assert_rejected(
        store, msg(sys_flag=sys_flag), InvalidMessageError, r"sets bits reserved for the store"
    )


def test_producer_sys_flag_bits_are_accepted(store: MessageStore) -> None:
    flags = [1 << 0, 1 << 1, 2 << 2, 1 << 8, 3 << 8, 0b111_0000_1011]
    batch = store.put([msg(sys_flag=f) for f in flags]).batch
    records = [store.commitlog.read_record(o, s) for o, s, _ in batch.positions]
    assert [r.sys_flag for r in records] == flags


@pytest.mark.parametrize("host", ["nohost", "1.2.3.4", "1.2.3.4:99999", "[::1]", "x.y:1"])
def test_bad_born_host_is_rejected(store: MessageStore, host: str) -> None:
    assert_rejected(store, msg(born_host=host), InvalidMessageError, r"born_host: ")


def test_unknown_topic_without_auto_create(make_store: StoreFactory) -> None:
    store = make_store(auto_create_topics=False)
    store.topics.upsert(TopicConfig("T", 4, 4))
    store.put([msg("T", 0, b"seed")])
    before = snapshot(store)
    with pytest.raises(TopicNotFoundError, match=r"topic 'Nope' does not exist"):
        store.put([msg("T", 0, b"good"), msg("Nope", 0, b"x")])
    assert snapshot(store) == before
    assert store.topics.get("Nope") is None


def test_unwritable_topic(store: MessageStore) -> None:
    store.topics.upsert(TopicConfig("ReadOnly", 4, 4, perm=4))
    before = snapshot(store)
    with pytest.raises(NotWritableError, match=r"topic 'ReadOnly' is not writable \(perm 4\)"):
        store.put([msg("T", 0, b"good"), msg("ReadOnly", 0, b"x")])
    assert snapshot(store) == before
    # Read-write again: accepted.
    store.topics.upsert(TopicConfig("ReadOnly", 4, 4, perm=6))
    assert store.put([msg("ReadOnly", 3, b"x")]).batch.positions[0][2] == 0


def test_auto_create_uses_default_queue_nums(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(default_queue_nums=3)
    assert store.topics.get("Fresh") is None
    store.put([msg("Fresh", 2, b"x")])
    cfg = store.topics.get("Fresh")
    assert cfg is not None
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (3, 3, 6)
    doc = json.loads((store_dir / "config" / "topics.json").read_text())
    assert doc["topicConfigTable"]["Fresh"]["writeQueueNums"] == 3
    with pytest.raises(
        InvalidMessageError, match=re.escape("3 write queues of topic 'Fresh' (0..2)")
    ):
        store.put([msg("Fresh", 3, b"x")])
    assert store.status().topic_count == 1 + len(KEPT_TOPICS)  # and the system topics


def test_rejected_batch_does_not_auto_create_topics(store: MessageStore) -> None:
    """'the first invalid message rejects the batch and nothing is written': a topic
    auto-created for the valid message of a rejected batch is something written."""
    before = snapshot(store)
    with pytest.raises(InvalidMessageError, match=r"message\[1\]: body is"):
        store.put([msg("Brand_New", 0, b"ok"), msg("T", 0, b"x" * (MAX_BODY_BYTES + 1))])
    assert store.topics.get("Brand_New") is None
    assert snapshot(store) == before
