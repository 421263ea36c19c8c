"""The consumer groups pages in a real browser: a group's lag falls as it consumes (the
page refreshes itself), its dead-letter count, and a reset of its offsets by time, refused
while a member is online and done once it is gone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from tests._cluster import Cluster
from tests.services.console.conftest import ConsoleProcess
from tide.client import (
    Admin,
    MessageQueue,
    PopMessage,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
)
from tide.waiting import wait_until

TOPIC = "T_console_lag"
GROUP = "G_console_lag"
SENT = 5
LONG_AGO = "2000-01-01T00:00"


def test_lag_falls_as_the_group_consumes_then_a_reset_brings_it_back(
    page: Page,
    console: ConsoleProcess,
    console_cluster: Cluster,
    shot: Callable[[Page, str], Path],
) -> None:
    gateway = console_cluster.gateway.listen
    console_cluster.create_topic(TOPIC, queues=1)
    queue = MessageQueue(TOPIC, "broker-a", 0)
    with Producer(gateway) as producer:
        for index in range(SENT):
            producer.send(TOPIC, f"m{index}".encode())
    console_cluster.wait_dispatched(TOPIC, SENT)
    with Admin(gateway) as admin:
        admin.commit_offset(GROUP, queue, 0)  # a pull group that has read nothing yet

    page.goto(f"{console.url}/groups?group={GROUP}")
    page.get_by_label("Show the lag on a topic").fill(TOPIC)
    page.get_by_role("button", name="Show lag").click()
    ready = page.get_by_test_id(f"ready-{TOPIC}")
    expect(ready).to_have_text(str(SENT))

    consumed: list[ReceivedMessage] = []
    done = threading.Event()

    def handle(message: ReceivedMessage) -> None:
        consumed.append(message)
        if len(consumed) >= SENT:
            done.set()

    consumer = PushConsumer(
        GROUP,
        TOPIC,
        "*",
        handle,
        gateway,
        consume_from="first",
        commit_interval_ms=200,
        heartbeat_interval_ms=500,
        long_poll_timeout_ms=1_000,
    )
    with consumer:
        page.get_by_role("link", name="Refresh every 5 s").click()
        expect(ready).to_have_text("0", timeout=60_000)  # the page reloads itself
        expect(page.get_by_role("row").filter(has_text=TOPIC).first).to_be_visible()
        shot(page, "group")
        # A member is online: the reset is refused unless forced.
        page.get_by_label("Topic", exact=True).fill(TOPIC)
        page.get_by_label("Time (UTC)").fill(LONG_AGO)
        page.get_by_role("button", name="Review the reset").click()
        expect(page.locator("#reset-e-force")).to_contain_text("online")
    with Admin(gateway) as admin:
        wait_until(
            lambda: not admin.consumers(GROUP), "the consumer's membership gone", timeout_s=30
        )
    page.get_by_label("Topic", exact=True).fill(TOPIC)
    page.get_by_label("Time (UTC)").fill(LONG_AGO)
    page.get_by_role("button", name="Review the reset").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Reset offsets of {GROUP}")
    shot(page, "group-reset")
    page.get_by_role("button", name="Confirm the reset").click()
    expect(page.get_by_role("status")).to_contain_text("Reset 1 queue(s)")
    expect(ready).to_have_text(str(SENT))
    with Admin(gateway) as admin:
        assert admin.committed(GROUP, queue) == 0


def test_dead_letters_are_counted(
    page: Page, console: ConsoleProcess, console_cluster: Cluster
) -> None:
    topic, group = "T_console_dlq", "G_console_dlq"
    console_cluster.create_topic(topic, queues=1)
    with Producer(console_cluster.gateway.listen) as producer:
        producer.send(topic, b"poison")
    console_cluster.wait_dispatched(topic, 1)
    with PullConsumer(group, console_cluster.gateway.listen) as puller:
        pulled = puller.pull(MessageQueue(topic, "broker-a", 0), 0)
        puller.send_back(pulled.messages[0], delay_level=-1)  # straight to %DLQ%
    # The dead letter is counted once dispatched: the page refreshes itself until then.
    page.goto(f"{console.url}/groups/{group}?refresh=2")
    expect(page.get_by_test_id("dlq-count")).to_have_text("1")
    expect(page.get_by_test_id("retry-count")).to_contain_text("none")


def test_a_pop_group_shows_its_messages_in_flight(
    page: Page, console: ConsoleProcess, console_cluster: Cluster
) -> None:
    topic, group = "T_console_pop", "G_console_pop"
    console_cluster.create_topic(topic, queues=1)
    with Producer(console_cluster.gateway.listen) as producer:
        for body in (b"one", b"two"):
            producer.send(topic, body)
    console_cluster.wait_dispatched(topic, 2)
    with SimpleConsumer(group, topic, gateway=console_cluster.gateway.listen) as consumer:
        received: list[PopMessage] = []

        def receive_one() -> bool:
            received.extend(consumer.receive(1, 600_000))
            return bool(received)

        wait_until(receive_one, "one POP receive")
        page.goto(f"{console.url}/groups/{group}?topic={topic}")
        caption = page.get_by_test_id(f"lag-{topic}").locator("caption")
        expect(caption).to_contain_text("1 ready, 1 in flight")
        consumer.ack(received[0])
        page.reload()
        expect(caption).to_contain_text("1 ready, 0 in flight")
