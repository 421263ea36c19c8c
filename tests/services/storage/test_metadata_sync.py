"""A slave's metadata sync from its master (RocketMQ's SlaveSynchronize) between real
storage processes and a real name server over real gRPC and real files.

Checked: topics, consumer offsets, group configs (one written on the master's disk before
it started, one upserted) and the delivery progress saved on the master reach the slave
byte for byte within a short sync interval and its tables answer; a later change reaches
it at the next interval, re-registering the slave when its topics changed; a file gone
from the master stays on the slave; a file the slave could not load is refused (status,
metrics and log say why) while the others still arrive; the slave refuses changes; after
a SIGKILL of the master the slave still lists the topics, answers the offsets and group
configs, and the name server still routes the topics to it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests._tmpfs import fill, mounted_tmpfs
from tests.services.nameserver.process import NameServerLauncher, NameServerProcess
from tests.services.storage.conftest import (
    SEGMENT_BYTES,
    StorageLauncher,
    StorageProcess,
    expect_error,
    message,
)
from tide.format import (
    DataVersion,
    DelayOffsets,
    TimerCheckpoint,
    decode_transaction_checks,
    encode_delay_offsets,
    encode_transaction_checks,
)
from tide.limits import TRANSACTION_CHECKS_MAX_BYTES
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

SYNC_INTERVAL_MS = 200
FILES = ("topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json")
# RocketMQ 5's SubscriptionGroupConfig as it writes it (docs/formats.md).
GROUPS = {
    "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 1700000000000},
    "forbiddenTable": {},
    "subscriptionGroupTable": {
        "g1": {
            "consumeEnable": True,
            "groupName": "g1",
            "groupRetryPolicy": {
                "type": "EXPONENTIAL",
                "exponentialRetryPolicy": {"initial": 5000, "max": 7200000, "multiplier": 2},
            },
            "retryMaxTimes": 3,
            "retryQueueNums": 1,
        }
    },
}
# Thresholds at 100 %: the disk's own ENOSPC is what refuses (test_disk_full.py).
FULL_DISK_ARGS = tuple(
    arg
    for name in ("clean", "clean-force", "refuse-writes")
    for arg in (f"--disk-{name}-ratio", "1.0")
)
REGISTER = ("--broker-name", "broker-s", "--register-interval-ms", "600000")


@pytest.fixture
def nameserver(tmp_path: Path) -> Iterator[NameServerProcess]:
    names = NameServerLauncher(tmp_path / "nameservers")
    try:
        yield names.start("--scan-interval-ms", "200")
    finally:
        names.close()


def start_pair(
    launcher: StorageLauncher, tmp_path: Path, nameserver: NameServerProcess
) -> tuple[StorageProcess, StorageProcess]:
    """A master (registered with a short heartbeat timeout, so the name server drops it
    soon after a SIGKILL) and its slave syncing every SYNC_INTERVAL_MS."""
    config = tmp_path / "master" / "config"
    config.mkdir(parents=True)
    (config / "subscriptionGroup.json").write_text(json.dumps(GROUPS, indent=2))
    common = ("--namesrv", nameserver.listen, *REGISTER, "--ha-heartbeat-interval-ms", "500")
    master = launcher.start(tmp_path / "master", *common, "--broker-heartbeat-timeout-ms", "3000")
    slave = launcher.start(
        tmp_path / "slave",
        *common,
        "--role",
        "SLAVE",
        "--broker-id",
        "1",
        "--master",
        master.listen,
        "--metadata-sync-interval-ms",
        str(SYNC_INTERVAL_MS),
        "--metrics-listen",
        "127.0.0.1:0",
    )
    return master, slave


def metric(proc: StorageProcess, name: str) -> float:
    return total(scrape(str(proc.ready["metrics"])), name)


def upsert(proc: StorageProcess, topic: str, queues: int = 4) -> None:
    proc.stub.UpsertTopic(
        pb.UpsertTopicRequest(
            topic=pb.TopicConfig(
                topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
            )
        )
    )


def commit(proc: StorageProcess, topic: str, queue_id: int, offset: int) -> None:
    proc.stub.CommitOffset(
        pb.CommitOffsetRequest(consumer_group="g1", topic=topic, queue_id=queue_id, offset=offset)
    )


def upsert_group(proc: StorageProcess, group: str) -> None:
    config = pb.GroupConfig(group_name=group, consume_enable=True, retry_max_times=7)
    proc.stub.UpsertGroup(pb.UpsertGroupRequest(group=config))


def get_offset(proc: StorageProcess, topic: str, queue_id: int) -> int:
    request = pb.GetOffsetRequest(consumer_group="g1", topic=topic, queue_id=queue_id)
    return int(proc.stub.GetOffset(request).offset)


def topics(proc: StorageProcess) -> list[str]:
    """Every topic, hidden (system) ones included."""
    reply = proc.stub.ListTopics(pb.ListTopicsRequest(include_hidden=True))
    return [t.topic_name for t in reply.topics]


def save_progress(proc: StorageProcess, level_offsets: dict[int, int], read_ms: int) -> None:
    table = DelayOffsets(level_offsets, DataVersion(0, 1_700_000_000_000, read_ms))
    proc.stub.SaveDeliveryProgress(
        pb.SaveDeliveryProgressRequest(
            delay_offsets_json=json.dumps(encode_delay_offsets(table)).encode(),
            timer_checkpoint=TimerCheckpoint(read_ms, 0, 3, 3).pack(),
            # The transaction service's check counts (tx, issue 19): half 7 checked twice.
            transaction_checks_json=json.dumps(encode_transaction_checks({7: 2})).encode(),
        )
    )


def config_files(proc: StorageProcess, names: tuple[str, ...]) -> dict[str, bytes | None]:
    config = proc.store_dir / "config"
    return {n: (config / n).read_bytes() if (config / n).exists() else None for n in names}


def wait_same_files(master: StorageProcess, slave: StorageProcess, what: str) -> None:
    names = (*FILES, "timercheck", "transactionChecks.json")
    wait_until(
        lambda: config_files(slave, names) == config_files(master, names),
        f"the slave's config files byte-identical to the master's ({what})",
        state=lambda: slave.status().replication.metadata_sync_error,
    )


def assert_progress_copied(slave: StorageProcess, timer_read_ms: int) -> None:
    """The slave holds save_progress's timer page and transaction check counts."""
    files = config_files(slave, ("timercheck", "transactionChecks.json"))
    timer_file, checks_file = files["timercheck"], files["transactionChecks.json"]
    assert timer_file is not None and len(timer_file) == 4096
    assert TimerCheckpoint.unpack(timer_file).last_read_time_ms == timer_read_ms
    assert checks_file is not None and decode_transaction_checks(json.loads(checks_file)) == {7: 2}


def registered_topic_counts(nameserver: NameServerProcess) -> dict[int, int]:
    """Broker id -> the topics its latest registration listed."""
    return {b.broker_id: b.topic_count for b in nameserver.cluster_info().brokers}


def test_slave_gets_the_masters_metadata_and_serves_it_after_a_master_sigkill(
    launcher: StorageLauncher, tmp_path: Path, nameserver: NameServerProcess
) -> None:
    master, slave = start_pair(launcher, tmp_path, nameserver)
    upsert(master, "Orders")
    results = master.append([message("Orders", 1) for _ in range(5)])
    commit(master, "Orders", 1, 3)  # in memory: the master persists it for GetMetadata
    save_progress(master, {1: 12, 3: 4}, 1_700_000_090_000)
    wait_same_files(master, slave, "first sync")
    assert get_offset(slave, "Orders", 1) == 3
    before = topics(master)  # the storage's system topics too, if it has any
    assert "Orders" in before and topics(slave) == before
    group = slave.stub.GetGroup(pb.GetGroupRequest(group="g1"))
    assert group.found and group.group.retry_max_times == 3
    assert group.group.retry_policy.type == pb.RetryPolicy.EXPONENTIAL
    assert_progress_copied(slave, 1_700_000_090_000)
    status = slave.status().replication
    assert status.metadata_sync_error == "" and status.metadata_synced_at_ms > 0
    assert status.metadata_synced_at_ms >= results[0].store_timestamp_ms
    wait_until(
        lambda: registered_topic_counts(nameserver) == {0: len(before), 1: len(before)},
        "the slave registered the master's topics",
        state=lambda: registered_topic_counts(nameserver),
    )

    # The slave's copies are changed on the master only.
    for call, fix in (
        (lambda: commit(slave, "Orders", 1, 4), "commit offsets on the master"),
        (lambda: save_progress(slave, {1: 13}, 1), "delivery progress on the master"),
        (lambda: upsert(slave, "Nope"), "change topics on the master"),
        (lambda: upsert_group(slave, "g9"), "change group configs on the master"),
        (
            lambda: slave.stub.GetMetadata(pb.GetMetadataRequest()),
            "not a master: a slave copies its metadata from its master",
        ),
    ):
        expect_error(grpc.StatusCode.FAILED_PRECONDITION, call, master.listen, fix)

    # A change reaches the slave at the next interval, a new topic re-registers it (the
    # register interval is 10 minutes: only the change can do it); a file deleted on the
    # master stays on the slave.
    (master.store_dir / "config" / "delayOffset.json").unlink()
    kept = config_files(slave, ("delayOffset.json",))
    upsert(master, "Payments", 2)
    upsert_group(master, "g2")
    commit(master, "Orders", 1, 5)
    commit(master, "Payments", 0, 0)
    wait_until(lambda: get_offset(slave, "Payments", 0) == 0, "the new offset on the slave")
    assert get_offset(slave, "Orders", 1) == 5
    after = topics(master)
    assert sorted(after) == sorted([*before, "Payments"]) and topics(slave) == after
    assert slave.stub.GetGroup(pb.GetGroupRequest(group="g2")).group.retry_max_times == 7
    wait_until(
        lambda: registered_topic_counts(nameserver) == {0: len(after), 1: len(after)},
        "the slave re-registered with the new topic",
        state=lambda: registered_topic_counts(nameserver),
    )
    assert config_files(slave, ("delayOffset.json",)) == kept
    for name in ("topics.json", "consumerOffset.json", "subscriptionGroup.json"):
        assert config_files(slave, (name,)) == config_files(master, (name,)), name

    # The master's loss: the slave still answers, and the name server still routes the
    # topics to the broker, whose only member is now the slave.
    master.kill()
    wait_until(
        lambda: [b.broker_id for b in nameserver.cluster_info().brokers] == [1],
        "the name server dropped the killed master",
    )
    for topic in ("Orders", "Payments"):
        route = nameserver.route(topic)
        assert [q.broker_name for q in route.queue_datas] == ["broker-s"]
        addresses = route.broker_datas[0].addresses
        assert {i: a.storage for i, a in addresses.items()} == {1: slave.listen}
    assert topics(slave) == after
    assert get_offset(slave, "Orders", 1) == 5
    assert [g.group_name for g in slave.stub.ListGroups(pb.ListGroupsRequest()).groups] == [
        "g1",
        "g2",
    ]
    found = slave.read([(results[4].physical_offset, results[4].size)])
    assert found[0].message.msg_id == results[4].msg_id
    wait_until(
        lambda: "GetMetadata from master" in slave.status().replication.metadata_sync_error,
        "the failed sync in the slave's status",
    )
    assert slave.stderr().count("metadata sync from master") == 1  # once per outage
    wait_until(
        lambda: metric(slave, "tide_storage_metadata_sync_failures_total") >= 2,
        "failed syncs counted",
        interval_s=SCRAPE_INTERVAL_S,
    )
    assert metric(slave, "tide_storage_metadata_syncs_total") >= 2  # before and after changes
    assert slave.stderr().count("metadata sync from master") == 1  # still once


def test_a_file_the_slave_cannot_load_is_refused_and_the_others_still_arrive(
    launcher: StorageLauncher, tmp_path: Path, nameserver: NameServerProcess
) -> None:
    master, slave = start_pair(launcher, tmp_path, nameserver)
    wait_same_files(master, slave, "first sync")
    good = config_files(slave, ("subscriptionGroup.json",))
    # Damaged behind the master's back (it loaded the file at start): served as it is on
    # disk, refused by the slave, which keeps its copy.
    bad = {"subscriptionGroupTable": {"g1": {"groupName": "g1", "retryQueueNums": 0}}}
    (master.store_dir / "config" / "subscriptionGroup.json").write_text(json.dumps(bad))
    upsert(master, "After")
    wait_until(lambda: "After" in topics(slave), "the topic despite the bad group file")
    wait_until(
        lambda: "subscriptionGroup.json" in slave.status().replication.metadata_sync_error,
        "the refusal in the slave's status",
    )
    error = slave.status().replication.metadata_sync_error
    assert "retryQueueNums is 0" in error, error
    assert config_files(slave, ("subscriptionGroup.json",)) == good
    log = slave.stderr()  # written before the status answered (one event loop)
    assert "metadata sync from master" in log and "retryQueueNums is 0" in log

    # Repaired on the master: the next sync installs it and clears the error.
    repaired = json.dumps(GROUPS | {"dataVersion": {"counter": 2}})
    (master.store_dir / "config" / "subscriptionGroup.json").write_text(repaired)
    wait_until(lambda: slave.status().replication.metadata_sync_error == "", "a clean sync again")
    assert config_files(slave, ("subscriptionGroup.json",)) == {
        "subscriptionGroup.json": repaired.encode()
    }
    assert "works again" in slave.stderr()


def test_save_delivery_progress_refuses_bad_input_and_writes_nothing(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = launcher.start(tmp_path / "master")
    for request, fragments in (
        (
            pb.SaveDeliveryProgressRequest(delay_offsets_json=b'{"offsetTable": {"70": 1}}'),
            ("delay_offsets_json", "1..64"),
        ),
        (
            pb.SaveDeliveryProgressRequest(delay_offsets_json=b"{not json"),
            ("delay_offsets_json is not valid JSON",),
        ),
        (
            pb.SaveDeliveryProgressRequest(timer_checkpoint=b"\x01" * 57),
            ("timer_checkpoint is 57 bytes", "56"),
        ),
        (
            pb.SaveDeliveryProgressRequest(delay_offsets_json=b" " * 65537),
            ("DELAY_OFFSETS_MAX_BYTES",),
        ),
        (
            pb.SaveDeliveryProgressRequest(transaction_checks_json=b'{"version": 2}'),
            ("transaction_checks_json", "version 1"),
        ),
        (
            pb.SaveDeliveryProgressRequest(
                transaction_checks_json=b" " * (TRANSACTION_CHECKS_MAX_BYTES + 1)
            ),
            ("TRANSACTION_CHECKS_MAX_BYTES",),
        ),
    ):
        expect_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            functools.partial(master.stub.SaveDeliveryProgress, request),
            *fragments,
        )
    names = [f.name for f in master.stub.GetMetadata(pb.GetMetadataRequest()).files]
    assert "delayOffset.json" not in names and "timercheck" not in names
    assert "transactionChecks.json" not in names


def test_save_delivery_progress_on_a_full_disk_is_resource_exhausted_and_keeps_the_file(
    tmp_path: Path,
) -> None:
    launcher = StorageLauncher(tmp_path / "procs")  # its logs off the small disk
    with mounted_tmpfs(tmp_path / "disk", 8 * SEGMENT_BYTES) as disk:
        try:
            master = launcher.start(disk / "store", *FULL_DISK_ARGS)
            save_progress(master, {1: 1}, 1_700_000_000_000)
            before = config_files(master, ("delayOffset.json", "timercheck"))
            fill(disk / "filler", 0)
            expect_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                lambda: save_progress(master, {1: 2, 2: 9}, 1_700_000_001_000),
                str(disk / "store"),
            )
            assert config_files(master, ("delayOffset.json", "timercheck")) == before
            assert not list((disk / "store" / "config").glob("*.tmp"))
            (disk / "filler").unlink()
            save_progress(master, {1: 2}, 1_700_000_002_000)  # room again: saved
            files = {
                f.name: f.content for f in master.stub.GetMetadata(pb.GetMetadataRequest()).files
            }
            assert json.loads(files["delayOffset.json"])["offsetTable"] == {"1": 2}
        finally:
            launcher.close()  # before the tmpfs is unmounted
