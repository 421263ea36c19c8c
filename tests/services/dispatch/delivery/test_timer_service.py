"""The timer in a real dispatch process beside a real storage: timed messages appended to
the timer topic (as the gateway stores them) arrive at their real topic no earlier than
due and within the precision (plus a slack scaled by the stalls a probe measured in the
same run: tests/_stalls.py); a recall cancels one;
a restart, a dispatch SIGKILL and a storage SIGKILL lose none."""

from __future__ import annotations

import time
from pathlib import Path

from tests._cluster import Cluster
from tests._metrics import families, scrape, total
from tests._service_process import free_port
from tests._stalls import StallProbe
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.dispatch.delivery._timed import (
    PRECISION_MS,
    append_all,
    count_keys,
    delivered,
    recall,
    timed,
)
from tests.services.storage.conftest import StorageLauncher
from tide.format import (
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    TimerCheckpoint,
)
from tide.waiting import wait_until

Launchers = tuple[StorageLauncher, DispatchLauncher]
# A delivery's own cost on a quiet box (an Append and a sync flush: a few ms) with room;
# less than a precision (500 ms), so a whole precision late still fails there.
QUIET_SLACK_MS = 300
# The wake-ups in a row a delivery waits for, each as late as the probe's worst.
STALL_WAKE_UPS = 10


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_timed_messages_arrive_when_due_within_precision(
    launchers: Launchers, tmp_path: Path, topic_name: str
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store", "--flush", "sync")
    dispatch = dispatches.start(
        tmp_path / "dispatch", storage.listen, "--metrics-listen", "127.0.0.1:0"
    )
    now = _now_ms()
    due = {f"k{i}": now + 1500 + i * 97 for i in range(20)}
    due |= {"past0": now - 60_000, "past1": now - 10}  # in the past: delivered now
    with StallProbe() as probe:
        append_all(storage, [timed(topic_name, at, key) for key, at in due.items()])
        wait_until(
            lambda: len(delivered(dispatch, storage, topic_name)) >= len(due),
            f"{len(due)} timed messages delivered to {topic_name}",
            timeout_s=120,  # only there to stop a hung test
            state=lambda: dispatch.status().delivery,
        )
    messages = delivered(dispatch, storage, topic_name)
    assert count_keys(messages) == dict.fromkeys(due, 1)
    # On time: within the precision, plus what the box's stalls in this run may add (a
    # delivery is a few wake-ups in a row: tail, file, wheel, Append, flush); tight on a
    # quiet box (a timer a whole precision late fails), and no failure under load.
    slack_ms = QUIET_SLACK_MS + STALL_WAKE_UPS * probe.worst_ms
    for message in messages:
        key = message.properties[UNIQ_KEY]
        at = max(due[key], now)
        assert message.store_timestamp_ms >= due[key], key  # never early
        late_ms = message.store_timestamp_ms - at
        assert late_ms <= PRECISION_MS + slack_ms, (key, late_ms, probe.worst_ms)
        assert message.body == key.encode() and message.tags == "t"
        assert not {REAL_TOPIC, TIMER_OUT_MS, TIMER_DELIVER_MS} & set(message.properties)
    status = dispatch.status().delivery
    assert status.active and status.timer_precision_ms == PRECISION_MS
    assert status.timer_max_delay_ms == 3 * 86_400_000
    # The read time moves past a slot only once the slot's deliveries are acknowledged
    # (timer_dequeue.py), so the last message can be visible a moment before it does.
    wait_until(
        lambda: dispatch.status().delivery.timer_delivered_to_ms >= max(due.values()),
        "the timer's read time past the last due time",
    )
    wait_until(lambda: dispatch.status().delivery.timer_pending == 0, "no timer pending")
    metrics = str(dispatch.ready["metrics"])
    # The shared histogram (the OpenTelemetry exporter adds the unit to its name).
    lateness = "tide_dispatch_delivery_lateness_milliseconds_count"
    assert total(scrape(metrics), lateness, kind="timer") == len(due)

    def pending_gauge() -> float | None:
        samples = scrape(metrics)
        if "tide_dispatch_timer_pending" not in families(samples):
            return None
        return total(samples, "tide_dispatch_timer_pending")

    # A gauge is sampled every second: it reads 0 once a sample follows the deliveries.
    wait_until(lambda: pending_gauge() == 0, "the pending gauge to read 0", state=pending_gauge)
    checkpoint = TimerCheckpoint.unpack((tmp_path / "dispatch/config/timercheck").read_bytes())
    wait_until(
        lambda: (
            TimerCheckpoint.unpack(
                (tmp_path / "dispatch/config/timercheck").read_bytes()
            ).last_timer_queue_offset
            == len(due)
        ),
        "the checkpoint to record every timer-topic message filed",
        state=lambda: checkpoint,
    )


def test_a_recalled_message_is_not_delivered(
    launchers: Launchers, tmp_path: Path, topic_name: str
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    at = _now_ms() + 3000
    append_all(storage, [timed(topic_name, at, "kept"), timed(topic_name, at, "gone")])
    append_all(storage, [recall(topic_name, at, "gone")])

    wait_until(
        lambda: dispatch.status().delivery.timer_delivered_to_ms > at,
        "the slot of both messages to fire",
        timeout_s=30,
        state=lambda: dispatch.status().delivery,
    )
    wait_until(lambda: delivered(dispatch, storage, topic_name), "the kept message")
    assert count_keys(delivered(dispatch, storage, topic_name)) == {"kept": 1}


def test_restart_delivers_every_pending_timer(
    launchers: Launchers, tmp_path: Path, topic_name: str
) -> None:
    """A clean stop with timers filed and a far one rolled: all delivered after restart."""
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    args = ("--timer-roll-window-slots", "3")  # a timer 6 s ahead is filed, then rolled
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, *args)
    now = _now_ms()
    due = {f"k{i}": now + 4000 + (i % 40) * 50 for i in range(200)} | {"far": now + 6500}
    append_all(storage, [timed(topic_name, at, key) for key, at in due.items()])
    wait_until(
        lambda: dispatch.status().delivery.timer_pending >= len(due),
        "every timer filed",
        state=lambda: dispatch.status().delivery,
    )
    dispatch.stop()
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, *args)
    wait_until(
        lambda: len(count_keys(delivered(dispatch, storage, topic_name))) == len(due),
        "every timer delivered after the restart",
        timeout_s=60,
        state=lambda: dispatch.status().delivery,
    )
    for message in delivered(dispatch, storage, topic_name):
        assert message.store_timestamp_ms >= due[message.properties[UNIQ_KEY]]


def _crash_run(
    launchers: Launchers, tmp_path: Path, topic_name: str, *, kill_storage: bool
) -> None:
    storages, dispatches = launchers
    storage_args = ("--listen", f"127.0.0.1:{free_port()}", "--flush", "sync")
    storage = storages.start(tmp_path / "store", *storage_args)
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    now = _now_ms()
    count = 3000
    due = {f"k{i}": now + 3000 + (i * 7919) % 6000 for i in range(count)}
    append_all(storage, [timed(topic_name, at, key) for key, at in due.items()])
    wait_until(
        lambda: len(delivered(dispatch, storage, topic_name)) >= 100,
        "the first deliveries",
        timeout_s=60,
        state=lambda: dispatch.status().delivery,
    )
    if kill_storage:
        storage.kill()
        storage = storages.start(tmp_path / "store", *storage_args)
    else:
        dispatch.kill()
        dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    wait_until(
        lambda: len(count_keys(delivered(dispatch, storage, topic_name))) == count,
        f"all {count} timers delivered after the SIGKILL",
        timeout_s=120,
        state=lambda: dispatch.status().delivery,
    )
    keys = count_keys(delivered(dispatch, storage, topic_name))
    assert set(keys) == set(due)  # none lost
    duplicates = sum(keys.values()) - count
    print(
        f"{count} timers, SIGKILL of the {'storage' if kill_storage else 'dispatch'}: "
        f"{duplicates} duplicate deliveries (at-least-once)"
    )
    assert dispatch.offsets(TIMER_TOPIC).max_offset == count


def test_dispatch_sigkill_loses_no_timer(
    launchers: Launchers, tmp_path: Path, topic_name: str
) -> None:
    _crash_run(launchers, tmp_path, topic_name, kill_storage=False)


def test_storage_sigkill_loses_no_timer(
    launchers: Launchers, tmp_path: Path, topic_name: str
) -> None:
    _crash_run(launchers, tmp_path, topic_name, kill_storage=True)


def test_the_timer_delivers_beside_a_master_only(tmp_path: Path) -> None:
    """Beside a slave storage the timer holds (active false, nothing filed, nothing
    appended); beside the master it files and delivers."""
    topic = "T_timer_master_only"
    with Cluster(tmp_path, brokers=1, replicas=2) as cluster:
        broker = cluster.brokers[0]
        master, slave = broker.master, broker.slaves[0]
        at = _now_ms() + 2000
        append_all(
            master.storage, [timed(topic, at, "m1"), timed(topic, _now_ms() + 600_000, "m2")]
        )
        wait_until(
            lambda: len(delivered(master.dispatch, master.storage, topic)) == 1,
            "the master's timer to deliver the first message",
            timeout_s=60,
            state=lambda: master.dispatch.status().delivery,
        )
        wait_until(
            lambda: slave.dispatch.offsets(TIMER_TOPIC).max_offset == 2,
            "the slave's dispatch to hold both timed messages in its timer topic queue",
        )
        held = slave.dispatch.status().delivery
        assert master.dispatch.status().delivery.active and not held.active
        assert held.timer_pending == 0  # the slave's timer filed nothing
        assert master.dispatch.status().delivery.timer_pending == 1
