from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from services.storage.engine.consumer_offsets import ConfigLimitError, ConsumerOffsets
from tide.files import ConfigFileError, ConfigFormatError

# What a RocketMQ 4.x broker writes: fastjson leaves the integer queue ids unquoted.
ROCKETMQ_OFFSETS_JSON = """{
\t"offsetTable":{
\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0
\t\t},
\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:251,2:252,3:253
\t\t}
\t}
}"""


def _offsets(tmp_path: Path, interval_ms: int = 5_000, max_entries: int = 100) -> ConsumerOffsets:
    return ConsumerOffsets(
        tmp_path / "config", persist_interval_ms=interval_ms, max_entries=max_entries
    )


def _write_config(tmp_path: Path, text: str) -> Path:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "consumerOffset.json").write_text(text)
    return config_dir


def test_never_committed_is_minus_one(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path)
    assert offsets.get("g", "t", 0) == -1
    offsets.commit("g", "t", 0, 5)
    assert offsets.get("g", "t", 1) == -1
    assert offsets.get("h", "t", 0) == -1
    assert offsets.get("g", "t", 0) == 5


def test_loads_a_rocketmq_written_file(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(_write_config(tmp_path, ROCKETMQ_OFFSETS_JSON))
    group = "please_rename_unique_group_name_4"
    assert [offsets.get(group, "TopicTest", q) for q in range(5)] == [250, 251, 252, 253, -1]
    assert offsets.get(group, f"%RETRY%{group}", 0) == 0
    assert offsets.entry_count == 5


def test_loads_quoted_keys(tmp_path: Path) -> None:
    text = '{"offsetTable": {"T@g": {"0": 7, "3": 9}}}'
    offsets = ConsumerOffsets(_write_config(tmp_path, text))
    assert offsets.get("g", "T", 0) == 7
    assert offsets.get("g", "T", 3) == 9


def test_written_file_has_the_exact_rocketmq_shape(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path)
    offsets.commit("g1", "TopicA", 1, 20)
    offsets.commit("g1", "TopicA", 0, 10)
    offsets.commit("g2", "TopicA", 0, 30)
    offsets.persist()
    assert json.loads(offsets.path.read_text()) == {
        "offsetTable": {"TopicA@g1": {"0": 10, "1": 20}, "TopicA@g2": {"0": 30}}
    }


def test_persistence_across_reopen(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path)
    offsets.commit("g", "t", 2, 99)
    offsets.close()
    reopened = _offsets(tmp_path)
    assert reopened.get("g", "t", 2) == 99
    assert reopened.entry_count == 1


def test_commits_wait_for_the_interval(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, interval_ms=5_000)
    offsets.commit("g", "t", 0, 1)
    assert not offsets.path.exists()
    assert offsets.maybe_persist(now_ms=100_000) is True  # first call: nothing written yet
    offsets.commit("g", "t", 0, 2)
    assert offsets.maybe_persist(now_ms=104_999) is False
    assert _offsets(tmp_path).get("g", "t", 0) == 1  # a crash now loses the second commit
    assert offsets.maybe_persist(now_ms=105_000) is True
    assert _offsets(tmp_path).get("g", "t", 0) == 2
    assert offsets.maybe_persist(now_ms=200_000) is False  # nothing new to write


def test_interval_zero_persists_every_commit(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, interval_ms=0)
    offsets.commit("g", "t", 0, 1)
    assert _offsets(tmp_path).get("g", "t", 0) == 1
    offsets.commit("g", "t", 0, 2)
    assert _offsets(tmp_path).get("g", "t", 0) == 2
    assert json.loads((offsets.path.parent / "consumerOffset.json.bak").read_text()) == {
        "offsetTable": {"t@g": {"0": 1}}
    }


def test_delete_topic(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, interval_ms=0)
    offsets.commit("g1", "t", 0, 1)
    offsets.commit("g2", "t", 1, 1)
    offsets.commit("g1", "u", 0, 1)
    assert offsets.delete_topic("t") == 2
    assert offsets.delete_topic("t") == 0
    assert offsets.get("g1", "t", 0) == -1
    assert offsets.get("g1", "u", 0) == 1
    assert offsets.entry_count == 1
    assert _offsets(tmp_path).get("g2", "t", 1) == -1


def test_limit(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, max_entries=2)
    offsets.commit("g", "t", 0, 1)
    offsets.commit("g", "t", 1, 1)
    offsets.commit("g", "t", 1, 5)  # updating an existing entry is fine at the limit
    with pytest.raises(ConfigLimitError, match="limit of 2 \\(group, topic, queue\\) entries"):
        offsets.commit("g", "t", 2, 1)
    with pytest.raises(ConfigLimitError):
        offsets.commit("h", "t", 0, 1)
    assert offsets.entry_count == 2
    offsets.delete_topic("t")
    offsets.commit("h", "t", 0, 1)


def test_limit_on_load(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, max_entries=3)
    for queue_id in range(3):
        offsets.commit("g", "t", queue_id, 1)
    offsets.close()
    with pytest.raises(ConfigLimitError, match="more than the limit of 2"):
        _offsets(tmp_path, max_entries=2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "t", 0, 0), "consumer group is empty"),
        (("g h", "t", 0, 0), "consumer group 'g h' contains ' '"),
        (("g", "../t", 0, 0), "topic '../t' contains '.'"),
        (("g", "t" * 128, 0, 0), "128 bytes"),
        (("g", "t", -1, 0), "queue id is -1; it must be 0..1023"),
        (("g", "t", 1024, 0), "queue id is 1024"),
        (("g", "t", 0, -1), "offset is -1"),
        (("g", "t", 0, 2**63), "offset is 9223372036854775808"),
    ],
)
def test_commit_validation(tmp_path: Path, args: tuple[str, str, int, int], message: str) -> None:
    offsets = _offsets(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        offsets.commit(*args)
    assert offsets.entry_count == 0


def test_get_validates(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path)
    with pytest.raises(ValueError, match="queue id is -1"):
        offsets.get("g", "t", -1)
    with pytest.raises(ValueError, match="contains '@'"):
        offsets.get("g@x", "t", 0)


def test_close_persists_and_blocks_commits(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path)
    offsets.commit("g", "t", 0, 3)
    offsets.close()
    offsets.close()
    with pytest.raises(RuntimeError, match="closed"):
        offsets.commit("g", "t", 0, 4)
    assert offsets.get("g", "t", 0) == 3
    assert _offsets(tmp_path).get("g", "t", 0) == 3


def test_failed_persist_is_retried(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path)
    offsets.commit("g", "t", 0, 3)
    blocker = offsets.path.with_name("consumerOffset.json.tmp")
    blocker.mkdir()
    with pytest.raises(IsADirectoryError):
        offsets.close()
    blocker.rmdir()
    offsets.close()
    assert _offsets(tmp_path).get("g", "t", 0) == 3


def test_falls_back_to_backup(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, interval_ms=0)
    offsets.commit("g", "t", 0, 1)
    offsets.commit("g", "t", 0, 2)
    offsets.path.write_text('{"offsetTable": {"t@g": {"0": ')
    assert _offsets(tmp_path).get("g", "t", 0) == 1


def test_both_copies_corrupt_refuses_to_start(tmp_path: Path) -> None:
    config_dir = _write_config(tmp_path, "{")
    (config_dir / "consumerOffset.json.bak").write_text("")
    with pytest.raises(ConfigFileError):
        ConsumerOffsets(config_dir)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "offsetTable must be an object"),
        ('{"offsetTable": {"tg": {}}}', "is not '<topic>@<group>'"),
        ('{"offsetTable": {"t@g@h": {}}}', "contains '@'"),
        ('{"offsetTable": {"t@g": []}}', "must map queue ids to offsets"),
        ('{"offsetTable": {"t@g": {"x": 1}}}', "queue id 'x' is not a number"),
        ('{"offsetTable": {"t@g": {-1: 1}}}', "queue id '-1' is not a number"),
        ('{"offsetTable": {"t@g": {"5000": 1}}}', "queue id 5000 is >= 1024"),
        ('{"offsetTable": {"t@g": {"0": "1"}}}', "queue 0 offset is '1'"),
        ('{"offsetTable": {"t@g": {"0": -5}}}', "queue 0 offset is -5"),
    ],
)
def test_bad_shapes_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigFormatError, match=re.escape(message)):
        ConsumerOffsets(_write_config(tmp_path, text))


def test_concurrent_commits(tmp_path: Path) -> None:
    offsets = _offsets(tmp_path, max_entries=1_000)

    def commit(worker: int) -> None:
        for queue_id in range(50):
            offsets.commit(f"g{worker}", "t", queue_id, queue_id + worker)
            if queue_id % 10 == 0:
                offsets.persist()

    threads = [threading.Thread(target=commit, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    offsets.close()
    assert offsets.entry_count == 200
    reopened = _offsets(tmp_path, max_entries=1_000)
    assert reopened.get("g3", "t", 49) == 52
    assert reopened.entry_count == 200
