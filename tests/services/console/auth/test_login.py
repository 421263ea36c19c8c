"""Login against a gateway with authentication on: pages ask for it, a wrong key is
refused, a user without permission sees the gateway's denial, logout ends the session,
and the secret key never appears in a page or, in clear, in a cookie."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from services.console.pages.login import next_path
from tests._cluster import Cluster
from tests.auth.conftest import ADMIN
from tests.services.console.conftest import ConsoleProcess
from tide.client import Admin, Credentials, PermissionDenied, PolicyEntry, Unauthenticated
from tide.waiting import wait_until

VIEWER = Credentials("console-viewer", "viewer-secret-9876543210")


def log_in(page: Page, console: ConsoleProcess, credentials: Credentials, path: str) -> None:
    page.goto(f"{console.url}{path}")
    expect(page.get_by_role("heading", level=1)).to_have_text("Log in")
    page.get_by_label("Access key").fill(credentials.access_key)
    page.get_by_label("Secret key").fill(credentials.secret_key)
    page.get_by_role("button", name="Log in").click()


def test_a_page_asks_for_login_then_shows_itself(
    page: Page, auth_console: ConsoleProcess, shot: Callable[[Page, str], Path]
) -> None:
    page.goto(f"{auth_console.url}/topics")
    expect(page).to_have_url(f"{auth_console.url}/login?next=/topics")
    shot(page, "login")
    log_in(page, auth_console, ADMIN, "/topics")
    expect(page.get_by_role("heading", level=1)).to_have_text("Topics")
    expect(page.get_by_role("status")).to_contain_text(f"Signed in as {ADMIN.access_key}")
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Log in")
    page.goto(f"{auth_console.url}/cluster")
    expect(page).to_have_url(f"{auth_console.url}/login?next=/cluster")


def test_a_wrong_secret_key_is_refused(page: Page, auth_console: ConsoleProcess) -> None:
    log_in(page, auth_console, Credentials(ADMIN.access_key, "not-the-secret"), "/login")
    expect(page.locator("#e-secret_key")).to_contain_text("refused")
    expect(page.get_by_label("Secret key")).to_have_value("")  # never sent back


def test_a_user_without_permission_sees_the_denial(
    page: Page, auth_console: ConsoleProcess, auth_console_cluster: Cluster
) -> None:
    with Admin(auth_console_cluster.gateway.listen, credentials=ADMIN) as admin:
        admin.create_user(VIEWER.access_key, VIEWER.secret_key)
    with Admin(auth_console_cluster.gateway.listen, credentials=VIEWER) as viewer:
        # The gateway learns of the user within its refresh interval.
        wait_until(lambda: _known(viewer), "the gateway knows the new user", timeout_s=30)
    log_in(page, auth_console, VIEWER, "/topics")
    expect(page.get_by_role("heading", level=1)).to_have_text("Gateway error")
    expect(page.get_by_role("alert")).to_contain_text("Permission denied")


def _known(admin: Admin) -> bool:
    try:
        admin.list_topics()
    except Unauthenticated:
        return False
    except PermissionDenied:
        return True
    return True


def test_the_secret_key_is_never_in_a_page_or_a_cookie(
    page: Page, auth_console: ConsoleProcess, auth_console_cluster: Cluster
) -> None:
    with Admin(auth_console_cluster.gateway.listen, credentials=ADMIN) as admin:
        admin.create_topic("T_console_auth", read_queue_nums=1)
    log_in(page, auth_console, ADMIN, "/cluster")
    expect(page.get_by_role("heading", level=1)).to_have_text("Cluster")
    for path in (
        "/cluster",
        "/topics",
        "/topics/new",
        "/topics/T_console_auth",
        "/topics/T_console_auth/delete",
        "/groups",
        "/groups/G_console_auth",
        "/login",
    ):
        response = page.goto(f"{auth_console.url}{path}")
        assert response is not None and response.status == 200, path
        assert ADMIN.secret_key not in page.content(), path
        assert ADMIN.secret_key not in str(response.all_headers()), path
    cookies = page.context.cookies()
    assert cookies, "the session cookie"
    for cookie in cookies:
        assert ADMIN.secret_key not in cookie["value"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"


@pytest.mark.parametrize(
    ("asked", "goes_to"),
    [
        ("/topics", "/topics"),
        ("/groups/G?topic=T", "/groups/G?topic=T"),
        ("//evil.example", "/cluster"),
        ("/\\evil.example", "/cluster"),
        ("https://evil.example/", "/cluster"),
        ("/x y", "/cluster"),
        (None, "/cluster"),
    ],
)
def test_after_login_only_a_local_path(asked: object, goes_to: str) -> None:
    assert next_path(asked) == goes_to


READER = Credentials("console-reader", "reader-secret-0123456789")


def test_a_denied_change_is_shown_then_its_forms_are_hidden(
    page: Page, auth_console: ConsoleProcess, auth_console_cluster: Cluster
) -> None:
    gateway = auth_console_cluster.gateway.listen
    with Admin(gateway, credentials=ADMIN) as admin:
        admin.create_topic("T_console_read", read_queue_nums=1)
        admin.create_user(READER.access_key, READER.secret_key)
        admin.create_acl(
            READER.access_key,
            [PolicyEntry("Cluster:*", ["List", "Get"]), PolicyEntry("Topic:*", ["Sub", "Get"])],
        )
    with Admin(gateway, credentials=READER) as reader:
        wait_until(lambda: _can_list(reader), "the gateway knows the reader's ACL", timeout_s=30)
    log_in(page, auth_console, READER, "/topics")
    page.get_by_role("link", name="Create a topic").click()
    page.get_by_label("Topic name").fill("T_console_denied")
    page.get_by_role("button", name="Create topic").click()
    expect(page.get_by_role("alert")).to_contain_text("Permission denied")
    page.goto(f"{auth_console.url}/topics")
    expect(page.get_by_text("Creating a topic is hidden")).to_be_visible()
    expect(page.get_by_role("link", name="Create a topic")).to_have_count(0)
    page.get_by_role("link", name="T_console_read").click()
    expect(page.get_by_text("Changing or deleting this topic is hidden")).to_be_visible()
    expect(page.get_by_role("button", name="Update topic")).to_have_count(0)


def _can_list(admin: Admin) -> bool:
    try:
        admin.list_topics()
    except (Unauthenticated, PermissionDenied):
        return False
    return True
