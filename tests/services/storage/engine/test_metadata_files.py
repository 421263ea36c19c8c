"""The metadata files a master serves and a slave installs (engine/metadata_files.py), on
real files: what is read, what is refused before anything is written, the tables reloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.storage.engine.auth_table import AuthTable
from services.storage.engine.auth_table import installers as auth_installers
from services.storage.engine.consumer_offsets import ConsumerOffsets
from services.storage.engine.group_table import GroupTable
from services.storage.engine.metadata_files import METADATA_FILES, MetadataFiles
from services.storage.engine.producer_state import ProducerStateTable
from services.storage.engine.topic_table import TopicChange, TopicConfig, TopicTable
from tide.auth.model import Action, PolicyEntry, ResourcePattern, ResourceType, User
from tide.files import ConfigFormatError, ConfigLimitError
from tide.format import (
    TIMER_CHECKPOINT_FILE_BYTES,
    BatchEntry,
    DataVersion,
    DelayOffsets,
    SubscriptionGroupConfig,
    TimerCheckpoint,
    encode_delay_offsets,
    encode_transaction_checks,
)
from tide.limits import DELAY_OFFSETS_MAX_BYTES, TRANSACTION_CHECKS_MAX_BYTES


def delay_json(level_offsets: dict[int, int]) -> bytes:
    table = DelayOffsets(level_offsets, DataVersion(0, 1_700_000_000_000, 3))
    return json.dumps(encode_delay_offsets(table)).encode()


def checks_json(checks: dict[int, int]) -> bytes:
    return json.dumps(encode_transaction_checks(checks)).encode()


def checkpoint(last_read_time_ms: int) -> TimerCheckpoint:
    return TimerCheckpoint(last_read_time_ms, 104, 7, 7, 0, 1_700_000_000_000, 3)


class Store:
    """One config dir with the tables a MessageStore wires (no commitlog needed)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "config"
        self.topics = TopicTable(self.dir)
        self.offsets = ConsumerOffsets(self.dir, persist_interval_ms=60_000)
        self.files = MetadataFiles(self.dir, before_read=self.offsets.persist_if_dirty)
        self.files.register("topics.json", self.topics)
        self.files.register("consumerOffset.json", self.offsets)
        self.groups = GroupTable(self.dir)
        self.files.register("subscriptionGroup.json", self.groups)
        self.producers = ProducerStateTable(
            self.dir, window_batches=5, expiry_ms=60_000, max_producers=10
        )
        self.files.register("producerState.json", self.producers)
        # Users and ACL policies (issue 22), as MessageStore registers them.
        self.auth = AuthTable(self.dir)
        self.auth.load()
        for name, installer in auth_installers(self.auth).items():
            self.files.register(name, installer)

    def keep_producer_batch(self, pid: str) -> None:
        """One kept batch of ``pid`` on queue Kept:0, written as the snapshot."""
        self.producers.record(
            pid, ("Kept", 0), 0, BatchEntry(0, 1, 5, [0, 90], [0, 1], [90, 90]), 0
        )
        self.producers.write(self.producers.copy(180))


def test_read_serves_the_files_on_disk_with_unwritten_offsets_persisted(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.files.read() == []  # nothing written yet: nothing served
    store.topics.upsert(TopicConfig("T", 2, 2))
    store.offsets.commit("g", "T", 1, 9)  # in memory only (60 s persist interval)
    store.files.save_delivery_progress(
        delay_json({1: 12}), checkpoint(5).pack(), checks_json({3: 2})
    )
    files = dict(store.files.read())
    assert sorted(files) == sorted(
        set(METADATA_FILES)
        - {"subscriptionGroup.json", "producerState.json", "users.json", "acl.json"}
    )  # never written
    for name, content in files.items():
        assert content == (store.dir / name).read_bytes(), name
    assert json.loads(files["consumerOffset.json"])["offsetTable"] == {"T@g": {"1": 9}}
    assert len(files["timercheck"]) == TIMER_CHECKPOINT_FILE_BYTES  # RocketMQ's 4 KiB page
    assert TimerCheckpoint.unpack(files["timercheck"]) == checkpoint(5)
    assert json.loads(files["transactionChecks.json"])["checks"] == {"3": 2}


def test_read_past_the_limit_names_every_file_and_the_limit(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.topics.upsert(TopicConfig("T", 2, 2))
    size = (store.dir / "topics.json").stat().st_size
    with pytest.raises(ConfigLimitError, match=f"topics.json {size} bytes"):
        store.files.read(max_bytes=size - 1)
    assert dict(store.files.read(max_bytes=size)) == {
        "topics.json": (store.dir / "topics.json").read_bytes()
    }


def test_install_reloads_the_tables_and_tells_the_topic_listeners(tmp_path: Path) -> None:
    master, slave = Store(tmp_path / "m"), Store(tmp_path / "s")
    slave.topics.upsert(TopicConfig("Gone", 1, 1))
    changes: list[TopicChange] = []
    slave.topics.add_listener(changes.append)
    master.topics.upsert(TopicConfig("A", 4, 4))
    master.topics.upsert(TopicConfig("B", 1, 1, perm=4))
    master.offsets.commit("g", "A", 3, 17)
    master.groups.upsert(SubscriptionGroupConfig("g", retry_max_times=5))
    master.keep_producer_batch("p-1")
    master.files.save_delivery_progress(b"", b"", checks_json({7: 4}))
    for name, content in master.files.read():
        assert slave.files.install(name, content)
        assert (slave.dir / name).read_bytes() == content
        assert not slave.files.install(name, content)  # unchanged: nothing done
    assert [cfg.topic_name for cfg in slave.topics.list()] == ["A", "B"]
    assert slave.topics.data_version == master.topics.data_version
    assert [(c.topic, c.config is None) for c in changes] == [
        ("A", False),
        ("B", False),
        ("Gone", True),
    ]
    assert slave.offsets.get("g", "A", 3) == 17
    assert slave.groups.table == master.groups.table
    assert slave.producers.check("p-1", ("Kept", 0), 0, 0, 1) is not None
    # A reopened slave loads what was installed.
    assert ConsumerOffsets(slave.dir).get("g", "A", 3) == 17
    assert TopicTable(slave.dir).get("B") == TopicConfig("B", 1, 1, perm=4)
    assert GroupTable(slave.dir).get("g") == SubscriptionGroupConfig("g", retry_max_times=5)


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("topics.json", b'{"topicConfigTable": {"T": {"topicName": "U"}}}', "not the table key"),
        ("topics.json", b"\xff{", "not valid JSON"),
        ("consumerOffset.json", b'{"offsetTable": {"nogroup": {}}}', "<topic>@<group>"),
        ("subscriptionGroup.json", b'{"subscriptionGroupTable": []}', "JSON object"),
        ("delayOffset.json", b'{"offsetTable": {"99": 1}}', "1..64"),
        ("timercheck", b"\x00" * 55, "55 bytes"),
        ("producerState.json", b'{"version": 9}', "version is not 1"),
        ("transactionChecks.json", b'{"version": 1, "checks": {"x": 1}}', "offset: count"),
    ],
)
def test_install_refuses_what_this_store_could_not_load_and_keeps_its_file(
    tmp_path: Path, name: str, content: bytes, fragment: str
) -> None:
    store = Store(tmp_path)
    store.topics.upsert(TopicConfig("Kept", 1, 1))
    store.offsets.commit("g", "Kept", 0, 1)
    store.offsets.persist()
    store.files.save_delivery_progress(
        delay_json({2: 4}), checkpoint(9).pack(), checks_json({5: 1})
    )
    store.groups.upsert(SubscriptionGroupConfig("g", retry_max_times=5))
    store.keep_producer_batch("p-1")
    store.auth.create_user(User("alice", "alice-secret"))
    store.auth.create_acl(
        "alice",
        (PolicyEntry(ResourcePattern(ResourceType.TOPIC, "Kept"), frozenset({Action.PUB})),),
    )
    before = {n: (store.dir / n).read_bytes() for n in METADATA_FILES}
    with pytest.raises((ConfigFormatError, ConfigLimitError)) as info:
        store.files.install(name, content)
    assert fragment in str(info.value)
    assert {n: (store.dir / n).read_bytes() for n in METADATA_FILES} == before
    assert not list(store.dir.glob("*.tmp"))
    assert store.topics.get("Kept") is not None and store.offsets.get("g", "Kept", 0) == 1
    assert store.groups.get("g") == SubscriptionGroupConfig("g", retry_max_times=5)
    assert store.producers.check("p-1", ("Kept", 0), 0, 0, 1) is not None


def test_install_refuses_a_name_that_is_not_a_metadata_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(ValueError, match="not a metadata file"):
        store.files.install("../lock", b"x")
    assert not (tmp_path / "lock").exists()


def test_save_delivery_progress_checks_both_before_writing_either(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(ValueError, match="timer_checkpoint is 32 bytes; it must be"):
        store.files.save_delivery_progress(delay_json({1: 1}), b"\x00" * 32)
    with pytest.raises(ValueError, match=r"key 0 must be 1\.\.64"):
        store.files.save_delivery_progress(b'{"offsetTable": {"0": 1}}', checkpoint(1).pack())
    too_long = b" " * (DELAY_OFFSETS_MAX_BYTES + 1)
    with pytest.raises(ValueError, match="DELAY_OFFSETS_MAX_BYTES"):
        store.files.save_delivery_progress(too_long, b"")
    with pytest.raises(ValueError, match=r"transaction_checks_json: .*offset: count"):
        store.files.save_delivery_progress(
            delay_json({1: 1}), b"", b'{"version": 1, "checks": {"-1": 1}}'
        )
    too_long = b" " * (TRANSACTION_CHECKS_MAX_BYTES + 1)
    with pytest.raises(ValueError, match="TRANSACTION_CHECKS_MAX_BYTES"):
        store.files.save_delivery_progress(delay_json({1: 1}), b"", too_long)
    assert store.files.read() == []
    # An empty field leaves its file as it is.
    store.files.save_delivery_progress(delay_json({1: 1}), b"")
    store.files.save_delivery_progress(b"", checkpoint(2).pack())
    assert json.loads((store.dir / "delayOffset.json").read_bytes())["offsetTable"] == {"1": 1}
    assert TimerCheckpoint.unpack((store.dir / "timercheck").read_bytes()) == checkpoint(2)
