"""A resend the gateway denies (the user may read the dead letters, not produce): the job
shows the denial, then the dead letters page hides the resend form from that login."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN
from tests.services.console.auth.test_login import _can_list, log_in
from tests.services.console.conftest import ConsoleProcess, one_dead_letter_checkbox
from tide.client import (
    Admin,
    Credentials,
    MessageQueue,
    PolicyEntry,
    Producer,
    PullConsumer,
    ReceivedMessage,
)
from tide.waiting import wait_until

WAIT_S = 30.0
LOOKER = Credentials("console-dlq-looker", "looker-secret-0123456789")
TOPIC, GROUP = "T_console_resend_denied", "G_console_resend_denied"


def _dead_letter(gateway: str, monkeypatch: pytest.MonkeyPatch) -> ReceivedMessage:
    with Admin(gateway, credentials=ADMIN) as admin:
        admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
    with Producer(gateway, credentials=ADMIN) as producer:
        producer.send(TOPIC, "refused again", keys=["denied-1"])
    # A PullConsumer signs with TIDE_ACCESS_KEY / TIDE_SECRET_KEY (it takes no credentials).
    monkeypatch.setenv("TIDE_ACCESS_KEY", ADMIN.access_key)
    monkeypatch.setenv("TIDE_SECRET_KEY", ADMIN.secret_key)
    with PullConsumer(GROUP, gateway) as consumer:
        found: list[ReceivedMessage] = []

        def pulled() -> bool:
            found.extend(consumer.pull(MessageQueue(TOPIC, "broker-a", 0), 0).messages)
            return bool(found)

        wait_until(pulled, "the message pulled", WAIT_S)
        assert consumer.send_back(found[0], delay_level=-1).dead_lettered
    return found[0]


def test_a_denied_resend_hides_the_resend_form(
    page: Page,
    auth_console: ConsoleProcess,
    auth_console_cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = auth_console_cluster.gateway.listen
    letter = _dead_letter(gateway, monkeypatch)
    with Admin(gateway, credentials=ADMIN) as admin:
        admin.create_user(LOOKER.access_key, LOOKER.secret_key)
        admin.create_acl(
            LOOKER.access_key,
            [
                PolicyEntry("Cluster:*", ["List", "Get"]),
                PolicyEntry("Topic:*", ["Sub", "Get"]),
                PolicyEntry("Group:*", ["Sub", "Get"]),
            ],
        )
    with Admin(gateway, credentials=LOOKER) as looker:
        wait_until(lambda: _can_list(looker), "the gateway knows the looker's ACL", WAIT_S)
    log_in(page, auth_console, LOOKER, "/cluster")
    expect(page.get_by_role("heading", level=1)).to_have_text("Cluster")
    page.goto(f"{auth_console.url}/dead-letters?group={GROUP}")
    checkbox = one_dead_letter_checkbox(page)
    checkbox.check()
    page.get_by_role("button", name="Resend selected").click()
    status = page.get_by_test_id("resend-status")
    expect(status).to_contain_text("Done")
    expect(status).to_contain_text("failed 1")
    expect(page.locator("[data-field=errors]")).to_contain_text("PERMISSION_DENIED")
    page.goto(f"{auth_console.url}/dead-letters?group={GROUP}")
    expect(page.get_by_text("Resending dead letters is hidden")).to_be_visible()
    expect(page.get_by_role("button", name="Resend selected")).to_have_count(0)
    # Still listed, with a link to the message: only the resend is hidden.
    expect(page.get_by_role("row").filter(has_text=TOPIC)).to_contain_text(letter.unique_key)
