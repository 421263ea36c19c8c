from __future__ import annotations

import dataclasses
import json
import re
import threading
from pathlib import Path

import pytest

from services.storage.engine.topic_table import (
    MAX_QUEUE_NUMS,
    TopicChange,
    TopicConfig,
    TopicTable,
)
from tide.files import (
    ConfigFileError,
    ConfigFormatError,
    ConfigLimitError,
)

# What a RocketMQ 4.x broker writes (fastjson, pretty format), trimmed.
ROCKETMQ_TOPICS_JSON = """{
\t"dataVersion":{
\t\t"counter":7,
\t\t"timestamp":1700000000123
\t},
\t"topicConfigTable":{
\t\t"TopicTest":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TopicTest",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":4
\t\t},
\t\t"%RETRY%please_rename_unique_group_name_4":{
\t\t\t"order":true,
\t\t\t"perm":7,
\t\t\t"readQueueNums":1,
\t\t\t"topicFilterType":"MULTI_TAG",
\t\t\t"topicName":"%RETRY%please_rename_unique_group_name_4",
\t\t\t"topicSysFlag":3,
\t\t\t"writeQueueNums":2,
\t\t\t"attributes":{}
\t\t}
\t}
}"""


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        self.now_ms += 1
        return self.now_ms


def _table(tmp_path: Path) -> TopicTable:
    return TopicTable(tmp_path / "config", clock_ms=FakeClock())


def _cfg(name: str = "TopicA", nums: int = 4) -> TopicConfig:
    return TopicConfig(name, nums, nums)


def test_loads_a_rocketmq_written_file(tmp_path: Path) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "topics.json").write_text(ROCKETMQ_TOPICS_JSON)
    table = TopicTable(config_dir)
    assert table.data_version == (1700000000123, 7)
    assert table.get("TopicTest") == TopicConfig("TopicTest", 4, 4)
    assert table.get("%RETRY%please_rename_unique_group_name_4") == TopicConfig(
        "%RETRY%please_rename_unique_group_name_4",
        read_queue_nums=1,
        write_queue_nums=2,
        perm=7,
        topic_filter_type="MULTI_TAG",
        topic_sys_flag=3,
        order=True,
    )


def test_missing_fields_take_rocketmq_defaults(tmp_path: Path) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "topics.json").write_text('{"topicConfigTable": {"T": {}}}')
    table = TopicTable(config_dir)
    assert table.get("T") == TopicConfig("T", 16, 16, 6, "SINGLE_TAG", 0, False)
    assert table.data_version == (0, 0)


def test_written_file_has_the_exact_rocketmq_shape(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg("TopicA"))
    doc = json.loads(table.path.read_text())
    assert doc == {
        "topicConfigTable": {
            "TopicA": {
                "topicName": "TopicA",
                "readQueueNums": 4,
                "writeQueueNums": 4,
                "perm": 6,
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0,
                "order": False,
            }
        },
        "dataVersion": {"timestamp": 1_001, "counter": 1},
    }


def test_empty_table(tmp_path: Path) -> None:
    table = _table(tmp_path)
    assert table.list() == []
    assert table.get("TopicA") is None
    assert table.data_version == (0, 0)
    assert not table.path.exists()


def test_upsert_get_list_and_reopen(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg("b"))
    table.upsert(_cfg("a", 8))
    table.upsert(_cfg("c"))
    assert [c.topic_name for c in table.list()] == ["a", "b", "c"]
    reopened = _table(tmp_path)
    assert reopened.list() == table.list()
    assert reopened.data_version == table.data_version == (1_003, 3)


def test_every_change_bumps_the_data_version_and_keeps_a_backup(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg())
    table.upsert(dataclasses.replace(_cfg(), perm=4))
    assert table.data_version == (1_002, 2)
    backup = json.loads((table.path.parent / "topics.json.bak").read_text())
    assert backup["dataVersion"] == {"timestamp": 1_001, "counter": 1}
    assert backup["topicConfigTable"]["TopicA"]["perm"] == 6


def test_identical_upsert_changes_nothing(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg())
    table.upsert(_cfg())
    assert table.data_version == (1_001, 1)


def test_delete(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg())
    assert table.delete("TopicA") is True
    assert table.delete("TopicA") is False
    assert table.get("TopicA") is None
    assert table.data_version == (1_002, 2)
    assert _table(tmp_path).list() == []


def test_ensure_creates_once(tmp_path: Path) -> None:
    table = _table(tmp_path)
    created = table.ensure("auto", 8)
    assert created == TopicConfig("auto", 8, 8)
    table.upsert(_cfg("auto", 2))
    assert table.ensure("auto", 8) == _cfg("auto", 2)
    assert table.data_version[1] == 2


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (_cfg("a b"), "contains ' ' at index 1"),
        (_cfg("../x"), "contains '.' at index 0"),
        (_cfg("t" * 128), "128 bytes in UTF-8"),
        (_cfg("t" * 126 + "é"), "128 bytes in UTF-8"),
        (_cfg(""), "topic is empty"),
        (_cfg(nums=0), "read queue count is 0; it must be 1..1024"),
        (_cfg(nums=MAX_QUEUE_NUMS + 1), "queue count is 1025"),
        (TopicConfig("t", 4, 0), "write queue count is 0"),
        (TopicConfig("t", 4, 4, perm=8), "perm is 8; it must be 0..7"),
        (TopicConfig("t", 4, 4, perm=-1), "perm is -1"),
        (TopicConfig("t", 4, 4, topic_filter_type="X"), "topic filter type is 'X'"),
        (TopicConfig("t", 4, 4, topic_sys_flag=-1), "topic sys flag is -1"),
    ],
)
def test_upsert_validation(tmp_path: Path, cfg: TopicConfig, message: str) -> None:
    table = _table(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        table.upsert(cfg)
    assert table.list() == []
    assert not table.path.exists()


def test_queue_num_bounds_are_inclusive(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg("one", 1))
    table.upsert(_cfg("max", MAX_QUEUE_NUMS))
    table.upsert(TopicConfig("perm0", 4, 4, perm=0))
    assert len(table.list()) == 3


def test_ensure_validates(tmp_path: Path) -> None:
    table = _table(tmp_path)
    with pytest.raises(ValueError, match="contains '/'"):
        table.ensure("a/b", 4)
    with pytest.raises(ValueError, match="queue count is 0"):
        table.ensure("ok", 0)


def test_topic_limit(tmp_path: Path) -> None:
    table = TopicTable(tmp_path, max_topics=2)
    table.upsert(_cfg("a"))
    table.upsert(_cfg("b"))
    table.upsert(_cfg("b", 8))  # replacing is fine at the limit
    with pytest.raises(ConfigLimitError, match="limit of 2 topics"):
        table.ensure("c", 4)
    with pytest.raises(ConfigLimitError, match="holds 2 topics; the limit is 1"):
        TopicTable(tmp_path, max_topics=1)


def test_listeners_see_changes_after_they_are_on_disk(tmp_path: Path) -> None:
    table = _table(tmp_path)
    seen: list[TopicChange] = []

    def listener(change: TopicChange) -> None:
        on_disk = json.loads(table.path.read_text())
        assert on_disk["dataVersion"]["counter"] == change.data_version[1]
        seen.append(change)

    table.add_listener(listener)
    table.upsert(_cfg())
    table.upsert(_cfg())  # unchanged: no event
    table.ensure("TopicA", 8)  # exists: no event
    table.delete("TopicA")
    assert seen == [
        TopicChange("TopicA", _cfg(), (1_001, 1)),
        TopicChange("TopicA", None, (1_002, 2)),
    ]


def test_a_failing_listener_does_not_undo_the_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = _table(tmp_path)
    calls: list[str] = []

    def broken(change: TopicChange) -> None:
        raise RuntimeError("name server down")

    table.add_listener(broken)
    table.add_listener(lambda change: calls.append(change.topic))
    table.upsert(_cfg())
    assert table.get("TopicA") == _cfg()
    assert calls == ["TopicA"]
    assert "name server down" in caplog.text


def test_failed_write_leaves_memory_unchanged(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg("a"))
    table.path.with_name("topics.json.tmp").mkdir()  # the write cannot create its temp file
    with pytest.raises(IsADirectoryError):
        table.upsert(_cfg("b"))
    assert [c.topic_name for c in table.list()] == ["a"]
    assert table.data_version == (1_001, 1)


def test_falls_back_to_backup_when_main_is_corrupt(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_cfg("a"))
    table.upsert(_cfg("b"))
    table.path.write_text("{garbage")
    reopened = _table(tmp_path)
    assert [c.topic_name for c in reopened.list()] == ["a"]


def test_both_copies_corrupt_refuses_to_start(tmp_path: Path) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "topics.json").write_text("{")
    (config_dir / "topics.json.bak").write_text("{")
    with pytest.raises(ConfigFileError):
        TopicTable(config_dir)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "the document must be an object"),
        ("{}", "topicConfigTable must be an object"),
        ('{"topicConfigTable": {"a": 1}}', "entry must be an object"),
        ('{"topicConfigTable": {"a": {"topicName": "b"}}}', "topicName is 'b'"),
        ('{"topicConfigTable": {"a": {"perm": "6"}}}', "perm must be int"),
        ('{"topicConfigTable": {"a": {"readQueueNums": true}}}', "readQueueNums must be int"),
        ('{"topicConfigTable": {"a": {"order": 0}}}', "order must be bool"),
        ('{"topicConfigTable": {"a/b": {}}}', "contains '/'"),
        ('{"topicConfigTable": {"a": {"writeQueueNums": 0}}}', "write queue count is 0"),
        ('{"topicConfigTable": {}, "dataVersion": {"counter": "1"}}', "counter must be int"),
    ],
)
def test_bad_shapes_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "topics.json").write_text(text)
    with pytest.raises(ConfigFormatError, match=re.escape(message)):
        TopicTable(config_dir)


def test_concurrent_upserts_all_land(tmp_path: Path) -> None:
    table = _table(tmp_path)

    def create(worker: int) -> None:
        for i in range(10):
            table.upsert(_cfg(f"t{worker}_{i}"))

    threads = [threading.Thread(target=create, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(table.list()) == 40
    assert table.data_version[1] == 40
    assert len(_table(tmp_path).list()) == 40


# -- attributes (RocketMQ 5's topic attributes: the message type) -----------------------
def test_attributes_round_trip_as_rocketmq_5_stores_them(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    fifo = TopicConfig("Fifo", 2, 2, attributes={"message.type": "FIFO"})
    table.upsert(fifo)
    table.upsert(TopicConfig("Plain", 1, 1))
    doc = json.loads((tmp_path / "topics.json").read_text())["topicConfigTable"]
    assert doc["Fifo"]["attributes"] == {"message.type": "FIFO"}
    assert "attributes" not in doc["Plain"]  # as a RocketMQ 4 file: none
    assert TopicTable(tmp_path).get("Fifo") == fifo


def test_an_unknown_message_type_is_refused(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    with pytest.raises(ValueError, match="NORMAL, FIFO, DELAY, TRANSACTION, MIXED"):
        table.upsert(TopicConfig("Bad", 1, 1, attributes={"message.type": "LIFO"}))
    assert table.get("Bad") is None
    doc = {
        "topicConfigTable": {
            "Bad": {"topicName": "Bad", "attributes": {"message.type": "LIFO"}},
        }
    }
    (tmp_path / "topics.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigFormatError, match=re.escape("message.type is 'LIFO'")):
        TopicTable(tmp_path)
    doc["topicConfigTable"]["Bad"]["attributes"] = {"message.type": 3}
    (tmp_path / "topics.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigFormatError, match="attributes must map names to strings"):
        TopicTable(tmp_path)
