"""Workload files: parsing (YAML and TOML), defaults, validation, --set overrides, and the
workloads shipped in bench/workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tide.bench import (
    Workload,
    WorkloadError,
    apply_overrides,
    load_workload,
    parse_workload,
    workload_from_mapping,
)
from tide.bench._workload import field_names, find_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "bench" / "workloads"
SHIPPED = sorted(p for p in WORKLOADS.iterdir() if p.suffix in (".yaml", ".toml"))

YAML = """\
# a comment
name: small
topics: 2
queues_per_topic: 8
message_size: 1024
batch_size: 10
producers_per_topic: 3
inflight: 2
consumers_per_topic: 4
rate: 5000
warmup_s: 1
duration_s: 2.5
"""

TOML = """\
name = "small"
topics = 2
queues_per_topic = 8
message_size = 1024
batch_size = 10
producers_per_topic = 3
inflight = 2
consumers_per_topic = 4
rate = 5000
warmup_s = 1
duration_s = 2.5
"""


def test_yaml_and_toml_give_the_same_workload() -> None:
    from_yaml = parse_workload(YAML, ".yaml")
    assert parse_workload(TOML, ".toml") == from_yaml
    assert from_yaml == Workload(
        name="small",
        topics=2,
        queues_per_topic=8,
        message_size=1024,
        batch_size=10,
        producers_per_topic=3,
        inflight=2,
        consumers_per_topic=4,
        rate=5000.0,
        warmup_s=1.0,
        duration_s=2.5,
    )
    assert isinstance(from_yaml.rate, float)
    assert isinstance(from_yaml.warmup_s, float)
    assert from_yaml.producers == 6
    assert from_yaml.consumers == 8


def test_defaults_and_name_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yml"
    path.write_text("message_size: 64\n")
    workload = load_workload(str(path))
    assert workload.name == "mine"
    assert workload.message_size == 64
    assert workload.topics == 1
    assert workload.queues_per_topic == 4
    assert workload.batch_size == 1
    assert workload.rate == 0.0
    assert workload.duration_s > 0
    assert set(workload.to_dict()) == set(field_names())


def test_an_empty_file_is_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_workload(str(path)) == Workload(name="empty")


def test_find_by_name_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "w1.toml").write_text("topics = 3\n")
    assert find_workload("w1", tmp_path) == tmp_path / "w1.toml"
    assert load_workload("w1", tmp_path).topics == 3
    assert load_workload("w1.toml", tmp_path).topics == 3
    with pytest.raises(WorkloadError, match="no workload file 'nope'"):
        load_workload("nope", tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"topics": 0}, "topics is 0"),
        ({"queues_per_topic": 1025}, "queues_per_topic is 1025"),
        ({"message_size": 15}, "message_size is 15"),
        ({"message_size": 5 << 20}, "message_size"),
        ({"batch_size": 0}, "batch_size is 0"),
        ({"batch_size": 1025}, "batch_size is 1025"),
        ({"producers_per_topic": 0}, "producers_per_topic"),
        ({"consumers_per_topic": -1}, "consumers_per_topic is -1"),
        ({"consumers_per_topic": 0, "consumer_processes": 2}, "more than the 0 consumer"),
        ({"inflight": 0}, "inflight"),
        ({"pull_batch": 2000}, "pull_batch"),
        ({"long_poll_ms": 0}, "long_poll_ms"),
        ({"topics": 1.5}, "topics is 1.5; give an integer"),
        ({"topics": True}, "topics is True"),
        ({"topics": "2"}, "topics is '2'"),
        ({"rate": -1}, "rate is -1"),
        ({"rate": "fast"}, "rate is 'fast'"),
        ({"rate": float("inf")}, "rate is inf"),
        ({"duration_s": 0}, "duration_s is 0"),
        ({"warmup_s": -0.5}, "warmup_s is -0.5"),
        ({"batch_size": 1024, "message_size": 1 << 20}, "batch_size x message_size"),
        ({"name": ""}, "name is ''"),
        ({"name": "has space"}, "name is 'has space'"),
        ({"name": "x" * 81}, "at most 80"),
        ({"description": 3}, "description is 3"),
    ],
)
def test_invalid_values_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(")):
        workload_from_mapping({"name": "w", **changes})


def test_zero_consumers_is_a_producer_only_run() -> None:
    workload = workload_from_mapping({"name": "w", "consumers_per_topic": 0, "topics": 3})
    assert workload.consumers == 0
    assert workload.consumer_processes == 1


def test_unknown_fields_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"unknown field.*partitions"):
        workload_from_mapping({"partitions": 4})
    with pytest.raises(WorkloadError, match="a workload is a mapping"):
        parse_workload("- 1\n- 2\n", ".yaml")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        parse_workload("topics: [1\n", ".yaml")
    with pytest.raises(WorkloadError, match="not valid TOML"):
        parse_workload("topics = \n", ".toml")
    with pytest.raises(WorkloadError, match="unknown workload format"):
        parse_workload("{}", ".json")
    path = tmp_path / "bad.yaml"
    path.write_text("topics: 0\n")
    with pytest.raises(WorkloadError, match=r"bad\.yaml: topics is 0"):
        load_workload(str(path))


def test_overrides() -> None:
    workload = Workload(name="w")
    changed = apply_overrides(workload, ["duration_s=1.5", "topics=3", " rate = 100 "])
    assert (changed.duration_s, changed.topics, changed.rate) == (1.5, 3, 100.0)
    assert apply_overrides(workload, []) is workload
    with pytest.raises(WorkloadError, match="FIELD one of"):
        apply_overrides(workload, ["nope=1"])
    with pytest.raises(WorkloadError, match="give FIELD=VALUE"):
        apply_overrides(workload, ["topics"])
    with pytest.raises(WorkloadError, match="'x' is not a int"):
        apply_overrides(workload, ["topics=x"])
    with pytest.raises(WorkloadError, match="topics is 0"):
        apply_overrides(workload, ["topics=0"])


def test_summary_mentions_the_shape() -> None:
    text = Workload(name="w", rate=5000, batch_size=10).summary()
    assert "5,000 msgs/s" in text
    assert "batches of 10" in text
    assert "as fast as possible" in Workload(name="w").summary()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_workloads_load(path: Path) -> None:
    workload = load_workload(str(path))
    assert workload.name == path.stem
    assert workload.description


def test_the_issue_s_workloads_are_shipped() -> None:
    names = {p.stem for p in SHIPPED}
    assert {
        "1-topic-4-queues-128b-batch100",
        "1-topic-16-queues-1kb",
        "e2e-latency-5k",
        "single-message-1k",
        "single-message-1k-produce-1000",
    } <= names
    assert load_workload("e2e-latency-5k", WORKLOADS).rate == 5000.0
    produce_only = load_workload("single-message-1k-produce-1000", WORKLOADS)
    assert (produce_only.rate, produce_only.batch_size, produce_only.consumers) == (1000.0, 1, 0)
    # target 3 sends as bench.hop_ceiling's client does: requests on one ProduceStream
    single = load_workload("single-message-1k", WORKLOADS)
    assert (single.batch_size, single.produce_api) == (1, "stream")
