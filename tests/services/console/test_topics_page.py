"""The topics pages in a real browser: create a topic with the keyboard only, see its
queues and offsets, field errors next to the field, update, and delete behind a typed
confirmation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from tests._cluster import Cluster
from tests.services.console.conftest import ConsoleProcess
from tide.client import Admin, Producer


def test_create_a_topic_with_the_keyboard_only(
    page: Page,
    console: ConsoleProcess,
    console_cluster: Cluster,
    shot: Callable[[Page, str], Path],
) -> None:
    page.goto(f"{console.url}/topics")
    shot(page, "topics")
    # Tab to the "Create a topic" link; every step is a key press.
    link = page.get_by_role("link", name="Create a topic")
    for _ in range(30):
        page.keyboard.press("Tab")
        if link.evaluate("element => element === document.activeElement"):
            break
    expect(link).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("Create a topic")
    shot(page, "topic-new")
    name = page.get_by_label("Topic name")
    for _ in range(10):
        page.keyboard.press("Tab")
        if name.evaluate("element => element === document.activeElement"):
            break
    expect(name).to_be_focused()
    page.keyboard.type("T_console_keys")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Queues (read and write)")).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    page.keyboard.press("Enter")  # submits the form
    expect(page.get_by_role("heading", level=1)).to_have_text("Topic T_console_keys")
    expect(page.get_by_role("status")).to_contain_text("Created topic T_console_keys")
    with Admin(console_cluster.gateway.listen) as admin:
        assert "T_console_keys" in admin.list_topics()
        assert len(admin.queues("T_console_keys")) == 2


def test_topic_detail_shows_the_offsets_of_each_queue(
    page: Page,
    console: ConsoleProcess,
    console_cluster: Cluster,
    shot: Callable[[Page, str], Path],
) -> None:
    console_cluster.create_topic("T_console_offsets", queues=2)
    with Producer(console_cluster.gateway.listen) as producer:
        for index in range(3):
            producer.send("T_console_offsets", f"m{index}".encode(), sharding_key="one")
    page.goto(f"{console.url}/topics")
    page.get_by_role("link", name="T_console_offsets").click()
    expect(page.get_by_text("3 message(s) stored")).to_be_visible()
    queue_rows = page.get_by_role("table").nth(1).get_by_role("row")
    expect(queue_rows).to_have_count(3)  # a header and two queues
    expect(queue_rows.filter(has_text="3")).to_have_count(1)
    shot(page, "topic")


def test_bad_input_is_shown_next_to_its_field(page: Page, console: ConsoleProcess) -> None:
    page.goto(f"{console.url}/topics/new")
    page.get_by_label("Topic name").fill("bad topic!")
    page.get_by_label("Queues (read and write)").fill("0")
    page.get_by_role("button", name="Create topic").click()
    name = page.get_by_label("Topic name")
    expect(name).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#e-topic")).to_contain_text("letters")
    expect(page.locator("#e-queues")).to_contain_text("1..1024")
    expect(name).to_have_value("bad topic!")  # what was typed stays, to be fixed


def test_update_then_delete_after_typing_the_name(
    page: Page,
    console: ConsoleProcess,
    console_cluster: Cluster,
    shot: Callable[[Page, str], Path],
) -> None:
    console_cluster.create_topic("T_console_delete", queues=2)
    page.goto(f"{console.url}/topics/T_console_delete")
    page.get_by_label("Queues (read and write)").fill("3")
    page.get_by_role("button", name="Update topic").click()
    expect(page.get_by_role("status")).to_contain_text("Updated topic T_console_delete")
    with Admin(console_cluster.gateway.listen) as admin:
        assert len(admin.queues("T_console_delete")) == 3
    page.get_by_role("link", name="Delete this topic").click()
    page.get_by_label("Type the topic's name to confirm").fill("T_console_other")
    page.get_by_role("button", name="Delete topic").click()
    expect(page.locator("#e-confirm")).to_contain_text("exactly")
    shot(page, "topic-delete")
    with Admin(console_cluster.gateway.listen) as admin:
        assert "T_console_delete" in admin.list_topics()
    page.get_by_label("Type the topic's name to confirm").fill("T_console_delete")
    page.get_by_role("button", name="Delete topic").click()
    expect(page.get_by_role("status")).to_contain_text("Deleted topic T_console_delete")
    expect(page.get_by_role("link", name="T_console_delete")).to_have_count(0)
