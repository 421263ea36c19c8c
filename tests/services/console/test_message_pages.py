"""The messages, dead-letters, pending and charts pages in a real Chromium against the
console package's cluster: find a message by key and open it; resend a dead letter and
see the job reach done and the message back in its topic; a delayed message listed as
pending; the live charts drawing data points."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from tests._cluster import Cluster
from tests.services.console.conftest import ConsoleProcess, start_console
from tide.client import Message, MessageQueue, Producer, PullConsumer, ReceivedMessage
from tide.waiting import wait_until

WAIT_S = 30.0
Shot = Callable[[Page, str], Path]


def test_find_a_message_by_key_and_open_it(
    page: Page, console: ConsoleProcess, console_cluster: Cluster, shot: Shot
) -> None:
    topic = "T_console_page_search"
    console_cluster.create_topic(topic, queues=1)
    with Producer(console_cluster.gateway.listen) as producer:
        sent = producer.send(
            topic, json.dumps({"order": 42}), tags="TagA", keys=["order-42"], properties={"p": "v"}
        )

    page.goto(f"{console.url}/messages")
    page.get_by_label("Find by").select_option("key")
    page.get_by_label("Topic").fill(topic)
    page.get_by_label("Key, unique key or message id").fill("order-42")
    page.get_by_label("Key, unique key or message id").press("Enter")  # the keyboard submits
    link = page.get_by_role("link", name=sent.msg_id)
    for _ in range(3):  # the key index follows the commitlog: search again until it is in
        if link.count():
            break
        page.reload()
    expect(link).to_be_visible()
    shot(page, "messages")

    link.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Message {sent.msg_id}")
    expect(page.get_by_test_id("body-text")).to_have_text('{"order": 42}')
    expect(page.get_by_test_id("body-json")).to_contain_text('"order": 42')
    expect(page.get_by_test_id("body-hex")).to_contain_text("7b 22 6f 72 64 65 72")
    properties = page.get_by_role("table").filter(has_text="UNIQ_KEY")
    expect(properties.get_by_role("row").filter(has_text="KEYS")).to_contain_text("order-42")
    expect(properties.get_by_role("row").filter(has_text="UNIQ_KEY")).to_contain_text(
        sent.unique_key
    )
    where = page.get_by_role("table").filter(has_text="Commitlog offset")
    expect(where.get_by_role("row").filter(has_text="Queue offset")).to_contain_text(
        str(sent.queue_offset)
    )
    expect(where.get_by_role("row").filter(has_text="Broker")).to_contain_text("broker-a")
    shot(page, "message")


def test_bad_search_input_is_a_clear_400(page: Page, console: ConsoleProcess) -> None:
    response = page.goto(
        f"{console.url}/messages?kind=time&topic=T_x&begin=2026-01-02T00:00&end=2026-01-01T00:00"
    )
    assert response is not None and response.status == 400
    expect(page.get_by_role("alert")).to_contain_text("not before its end")
    response = page.goto(f"{console.url}/messages?kind=time&topic=T_x&begin=yesterday")
    assert response is not None and response.status == 400
    expect(page.get_by_role("alert")).to_contain_text("is not a time")


def dead_letter_one(cluster: Cluster, topic: str, group: str) -> ReceivedMessage:
    cluster.create_topic(topic, queues=1)
    with Producer(cluster.gateway.listen) as producer:
        producer.send(topic, "failed twice", keys=["dead-1"])
    queue = MessageQueue(topic, "broker-a", 0)
    with PullConsumer(group, cluster.gateway.listen) as consumer:
        found: list[ReceivedMessage] = []

        def pulled() -> bool:
            found.extend(consumer.pull(queue, 0).messages)
            return bool(found)

        wait_until(pulled, "the message pulled", WAIT_S)
        assert consumer.send_back(found[0], delay_level=-1).dead_lettered
    return found[0]


def test_resend_a_dead_letter_with_progress(
    page: Page, console: ConsoleProcess, console_cluster: Cluster, shot: Shot
) -> None:
    topic, group = "T_console_page_dlq", "G_console_page_dlq"
    original = dead_letter_one(console_cluster, topic, group)

    page.goto(f"{console.url}/dead-letters")
    page.get_by_label("Consumer group").fill(group)
    page.get_by_role("button", name="List").click()
    checkbox = page.get_by_role("checkbox")
    for _ in range(3):  # the dead letter is listed once the route of its topic is known
        if checkbox.count():
            break
        page.reload()
    expect(checkbox).to_have_count(1)
    expect(page.get_by_role("row").filter(has_text=topic)).to_contain_text(original.unique_key)
    shot(page, "dead-letters")
    checkbox.focus()
    page.keyboard.press("Space")  # the keyboard selects
    expect(checkbox).to_be_checked()
    # The job's page polls its progress (resend.js) at once, finished or not.
    with page.expect_response(lambda reply: reply.url.endswith(".json")) as polled:
        page.get_by_role("button", name="Resend selected").click()
    assert polled.value.ok and polled.value.json()["total"] == 1

    status = page.get_by_test_id("resend-status")
    expect(status).to_contain_text("Done")  # the script polls until the job is finished
    expect(status).to_contain_text("1 of 1 handled")
    expect(page.get_by_role("progressbar")).to_have_attribute("value", "1")
    shot(page, "resend-job")

    queue = MessageQueue(topic, "broker-a", 0)
    with PullConsumer("G_console_page_dlq_check", console_cluster.gateway.listen) as consumer:
        wait_until(lambda: consumer.max_offset(queue) == 2, "the message back in its topic", WAIT_S)
        back = consumer.pull(queue, 1).messages[0]
    assert back.body == b"failed twice" and back.unique_key == original.unique_key


def test_pending_lists_a_delayed_message(
    page: Page, console: ConsoleProcess, console_cluster: Cluster, shot: Shot
) -> None:
    topic = "T_console_page_pending"
    console_cluster.create_topic(topic, queues=1, message_type="DELAY")
    with Producer(console_cluster.gateway.listen) as producer:
        sent = producer.send_batch([Message(topic, "later", delay_level=17, keys=["later-1"])])[0]
    page.goto(f"{console.url}/pending")
    page.get_by_label("Topic").fill(topic)
    page.get_by_role("button", name="Show").click()
    row = page.get_by_role("row").filter(has_text=sent.msg_id)
    expect(row).to_contain_text("level 17")
    expect(row).to_contain_text(topic)
    expect(page.locator("dl.counts")).to_contain_text("level 17")
    shot(page, "pending")


def test_charts_draw_data_points(
    page: Page, console: ConsoleProcess, console_cluster: Cluster, shot: Shot
) -> None:
    topic = "T_console_page_charts"
    console_cluster.create_topic(topic, queues=1)
    page.goto(f"{console.url}/charts")
    produced = page.get_by_test_id("chart-produced")
    with Producer(console_cluster.gateway.listen) as producer:
        # Sends while the page samples, so that the latency chart has calls to average.
        def drawn() -> bool:
            producer.send(topic, "charted")
            return produced.locator("circle").count() >= 2

        wait_until(drawn, "two samples of the produce rate drawn", WAIT_S)
    expect(produced.locator("polyline")).to_have_count(1)
    expect(page.get_by_test_id("chart-produce_latency").locator("circle").first).to_be_attached()
    expect(page.get_by_role("figure").filter(has_text="produced messages/s")).to_contain_text(
        "gateway"
    )
    shot(page, "charts")


def test_charts_without_endpoints_say_how_to_configure_them(
    page: Page, console_cluster: Cluster, tmp_path: Path
) -> None:
    with contextlib.contextmanager(start_console)(
        tmp_path / "bare-console", console_cluster.gateway.listen
    ) as bare:
        page.goto(f"{bare.url}/charts")
        expect(page.get_by_role("status").filter(has_text="No metrics endpoint")).to_contain_text(
            "--metrics-endpoint NAME=HOST:PORT"
        )
        expect(page.locator("svg")).to_have_count(0)
